"""OOD detection metrics, OOD the positive class: AUROC / AUPR-In / AUPR-Out / FPR@95%TPR, a
cheap rank-sum AUROC and ROC-curve points. The per-example scores (higher = more OOD) are
:mod:`hydra_ops.uq.ood_criteria` (re-exported by :mod:`hydra_ops.metrics`)."""

from __future__ import annotations

import torch
from torch import Tensor

from hydra_ops.metrics._checks import check_idx, validate_scores

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


def auroc_resampled(
    id_scores: Tensor, ood_scores: Tensor, id_idx: Tensor, ood_idx: Tensor
) -> Tensor:
    """:func:`auroc` of R resamples at once, tied ID/OOD pairs counting 1/2.

    A resample's AUROC is ``sum over its OOD draws of (#ID draws below + #ID draws tied / 2)``
    over ``N' K'``. The ID scores are sorted once; each resample's draw counts, cumulated in that
    order, give every OOD score's count below and tied by two lookups (``searchsorted``), so the
    cost is O(R (N + K)) memory and time, not R sorts. Every count is an integer (or a half)
    summed in float64: the result equals :func:`auroc` on the same indices up to float rounding.

    Shape:
        id_scores [N], ood_scores [K], id_idx [R, N'] indices into the ID scores,
        ood_idx [R, K'] into the OOD scores -> [R] float64.
    """
    id_scores = validate_scores(id_scores, "id_scores")
    ood_scores = validate_scores(ood_scores, "ood_scores").to(id_scores.device)
    id_idx = check_idx(id_idx, len(id_scores)).to(id_scores.device)
    ood_idx = check_idx(ood_idx, len(ood_scores)).to(id_scores.device)
    if id_idx.shape[0] != ood_idx.shape[0]:
        raise ValueError(
            f"id_idx and ood_idx must hold the same number of resamples, got "
            f"{id_idx.shape[0]} and {ood_idx.shape[0]}"
        )
    r, n = id_idx.shape
    k = ood_idx.shape[1]
    sorted_id, order = torch.sort(id_scores)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=order.device)
    counts = torch.zeros(r, len(id_scores) + 1, dtype=torch.float64, device=id_scores.device)
    counts.scatter_add_(1, rank[id_idx] + 1, torch.ones_like(id_idx, dtype=torch.float64))
    cumulative = counts.cumsum(dim=1)  # [R, N + 1]: column j = draws among the j lowest
    below = torch.searchsorted(sorted_id, ood_scores, right=False)[ood_idx]
    at_most = torch.searchsorted(sorted_id, ood_scores, right=True)[ood_idx]
    n_below = cumulative.gather(1, below)
    n_tied = cumulative.gather(1, at_most) - n_below
    return (n_below + 0.5 * n_tied).sum(dim=1) / (n * k)


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
