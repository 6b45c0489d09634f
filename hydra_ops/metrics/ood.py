"""OOD detection (OOD is the positive class, scores: higher = more OOD): per-example scores,
AUROC / AUPR-In / AUPR-Out / FPR@95%TPR, a cheap rank-sum AUROC and ROC-curve points."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor
from torchmetrics.functional.classification import (
    binary_auroc,
    binary_average_precision,
    binary_roc,
)

from hydra_ops.metrics._checks import validate_scores
from hydra_ops.uncertainty import decompose, entropy, validate_probs

OOD_SCORE_KINDS: tuple[str, ...] = ("msp", "entropy", "mutual_information", "energy")
OodScoreKind = Literal["msp", "entropy", "mutual_information", "energy"]
_TPR_LEVEL = 0.95


def ood_scores(
    probs: Tensor,
    member_probs: Tensor | None = None,
    logits: Tensor | None = None,
    kind: OodScoreKind = "msp",
) -> Tensor:
    """Per-example OOD scores, higher = more OOD.

    Args:
        probs: [N, C] (ensemble) probabilities; always validated.
        member_probs: [N, M, C] member probabilities; required for ``mutual_information``.
        logits: [N, C] or [N, M, C] logits; required for ``energy``.
        kind: ``msp`` (``-max_c probs``), ``entropy`` (``H[probs]``, nats),
            ``mutual_information`` (of ``member_probs``), ``energy`` (``-logsumexp(logits)``;
            averaged over members for [N, M, C]).

    Returns:
        [N] float tensor.
    """
    if kind not in OOD_SCORE_KINDS:
        raise ValueError(f"kind must be one of {list(OOD_SCORE_KINDS)}, got {kind!r}")
    probs = validate_probs(probs, "probs", ndim=2)
    n, c = probs.shape
    if kind == "msp":
        return -probs.max(dim=1).values
    if kind == "entropy":
        return entropy(probs)
    if kind == "mutual_information":
        if member_probs is None:
            raise ValueError("member_probs [N, M, C] is required for kind='mutual_information'")
        member_probs = validate_probs(member_probs, "member_probs", ndim=3)
        if member_probs.shape[0] != n or member_probs.shape[2] != c:
            raise ValueError(
                f"member_probs must have shape [{n}, M, {c}] to match probs, "
                f"got {tuple(member_probs.shape)}"
            )
        return decompose(member_probs)["mutual_information"]
    if logits is None:
        raise ValueError("logits [N, C] or [N, M, C] are required for kind='energy'")
    if not isinstance(logits, Tensor):
        logits = torch.as_tensor(logits)
    if not logits.is_floating_point() or logits.ndim not in (2, 3):
        raise ValueError(
            f"logits must be a floating tensor of shape [N, C] or [N, M, C], got "
            f"{logits.dtype} {tuple(logits.shape)}"
        )
    if logits.shape[0] != n or logits.shape[-1] != c:
        raise ValueError(
            f"logits must have N={n} rows and C={c} classes to match probs, "
            f"got {tuple(logits.shape)}"
        )
    if not bool(torch.isfinite(logits).all()):
        raise ValueError("logits contains NaN or infinite values")
    energy = -torch.logsumexp(logits, dim=-1)
    return energy.mean(dim=1) if energy.ndim == 2 else energy


def ood_metrics(id_scores: Tensor, ood_scores: Tensor) -> dict[str, float]:
    """OOD-detection metrics with OOD as the positive class (scores: higher = more OOD).

    Args:
        id_scores: [N] scores of in-distribution examples.
        ood_scores: [K] scores of out-of-distribution examples.

    Returns:
        ``{"auroc", "aupr_in", "aupr_out", "fpr_at_95_tpr"}`` -> float in [0, 1].
    """
    id_scores = validate_scores(id_scores, "id_scores")
    ood_scores = validate_scores(ood_scores, "ood_scores").to(id_scores.device)
    scores = torch.cat([id_scores, ood_scores])
    # Dense ranks in [0, 1]: same order and ties as the scores, already in torchmetrics' [0, 1].
    _, rank = torch.unique(scores, sorted=True, return_inverse=True)
    preds = rank.to(torch.float64) / max(int(rank.max()), 1)
    target = torch.cat(
        [
            torch.zeros(id_scores.shape[0], dtype=torch.long, device=scores.device),
            torch.ones(ood_scores.shape[0], dtype=torch.long, device=scores.device),
        ]
    )
    auroc = binary_auroc(preds, target, validate_args=False)
    aupr_out = binary_average_precision(preds, target, validate_args=False)
    aupr_in = binary_average_precision(1.0 - preds, 1 - target, validate_args=False)
    fpr, tpr, _ = binary_roc(preds, target, validate_args=False)
    fpr_at_95 = fpr[tpr >= _TPR_LEVEL - 1e-12].min()
    return {
        "auroc": float(auroc),
        "aupr_in": float(aupr_in),
        "aupr_out": float(aupr_out),
        "fpr_at_95_tpr": float(fpr_at_95),
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
