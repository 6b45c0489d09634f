"""OOD detection metrics, OOD the positive class: AUROC / AUPR-In / AUPR-Out / FPR@95%TPR, a
cheap rank-sum AUROC and ROC-curve points. The per-example scores (higher = more OOD) are
:mod:`hydra_ops.uq.ood_criteria` (re-exported by :mod:`hydra_ops.metrics`)."""

from __future__ import annotations

import torch
from torch import Tensor

from hydra_ops.metrics._checks import validate_scores

_TPR_LEVEL = 0.95


def ood_metrics(id_scores: Tensor, ood_scores: Tensor) -> dict[str, float]:
    """OOD-detection metrics with OOD as the positive class (scores: higher = more OOD).

    Args:
        id_scores: [N] scores of in-distribution examples.
        ood_scores: [K] scores of out-of-distribution examples.

    Returns:
        ``{"auroc", "aupr_in", "aupr_out", "fpr_at_95_tpr"}`` -> float in [0, 1]: sklearn's
        ``roc_auc_score`` / ``average_precision_score`` / ``roc_curve`` on the float64 scores.
    """
    from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

    id_scores = validate_scores(id_scores, "id_scores")
    ood_scores = validate_scores(ood_scores, "ood_scores").to(id_scores.device)
    scores = torch.cat([id_scores, ood_scores]).to(torch.float64).cpu().numpy()
    target = torch.cat(
        [
            torch.zeros(len(id_scores), dtype=torch.long),
            torch.ones(len(ood_scores), dtype=torch.long),
        ]
    ).numpy()
    fpr, tpr, _ = roc_curve(target, scores, drop_intermediate=False)
    return {
        "auroc": float(roc_auc_score(target, scores)),
        "aupr_in": float(average_precision_score(1 - target, -scores)),
        "aupr_out": float(average_precision_score(target, scores)),
        "fpr_at_95_tpr": float(fpr[tpr >= _TPR_LEVEL - 1e-12].min()),
    }


def auroc(id_scores: Tensor, ood_scores: Tensor) -> float:
    """AUROC (OOD positive) by the rank-sum identity, tied ID/OOD pairs counting 1/2.

    id_scores [N], ood_scores [K] -> float in [0, 1]: ``ood_metrics(...)["auroc"]`` up to float
    rounding, cheap enough to run for every bootstrap resample.
    """
    from scipy.stats import rankdata

    id_scores = validate_scores(id_scores, "id_scores")
    ood_scores = validate_scores(ood_scores, "ood_scores")
    n, k = len(id_scores), len(ood_scores)
    ranks = rankdata(torch.cat([id_scores, ood_scores.to(id_scores.device)]).cpu().numpy())
    return float((ranks[n:].sum() - k * (k + 1) / 2) / (n * k))


def roc_points(
    id_scores: Tensor, ood_scores: Tensor, max_points: int = 200
) -> list[tuple[float, float]]:
    """``(fpr, tpr)`` points of the ROC curve (OOD positive; sklearn's ``roc_curve`` without its
    collinear points), thinned to every ``len // max_points``-th point plus the last, ``(1, 1)``:
    at most about ``2 * max_points`` points, for plots."""
    from sklearn.metrics import roc_curve

    if isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 1:
        raise ValueError(f"max_points must be a positive integer, got {max_points!r}")
    id_scores = validate_scores(id_scores, "id_scores")
    ood_scores = validate_scores(ood_scores, "ood_scores").to(id_scores.device)
    target = torch.cat([torch.zeros(len(id_scores)), torch.ones(len(ood_scores))]).numpy()
    fpr, tpr, _ = roc_curve(target, torch.cat([id_scores, ood_scores]).cpu().numpy())
    step = max(1, len(fpr) // max_points)
    return [(float(fpr[i]), float(tpr[i])) for i in [*range(0, len(fpr), step), len(fpr) - 1]]
