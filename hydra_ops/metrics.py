"""Classification, calibration, selective-prediction and OOD-detection metrics.

Conventions (also in ``docs/metrics.md``):

- Inputs: ``probs`` [N, C] are probabilities (rows sum to 1 within
  :data:`hydra_ops.uncertainty.PROB_ATOL`), ``labels`` [N] integer class ids in ``[0, C)``.
  Bad shapes, dtypes, NaN/inf, rows not summing to 1 or labels out of range raise ValueError naming
  the argument. Results are Python floats.
- Prediction = ``argmax`` of ``probs``; ties go to the lowest class index. Confidence = top
  probability (maximum softmax probability, MSP).
- Log base: natural log (NLL and entropies in nats). NLL clamps ``p[label]`` at :data:`NLL_EPS`
  so a zero probability costs ``-log(1e-12) ~= 27.6`` instead of ``inf``.
- Brier: ``mean_n sum_c (p[n, c] - onehot(label_n)[c])^2`` (sum over classes, mean over examples;
  range ``[0, 2]``).
- ECE: top-label, L1, 15 equal-width bins over ``[0, 1]`` (torchmetrics
  ``multiclass_calibration_error``). Bins are left-closed, ``[k/15, (k+1)/15)``; a confidence of
  exactly 1.0 falls in a bin of its own. ``ECE = sum_b (n_b / N) |acc_b - conf_b|``.
- Adaptive ECE: same formula over 15 equal-mass bins: after a stable ascending sort of the
  confidences, the example at sorted position ``i`` goes to bin ``floor(i * B / N)`` (bin sizes
  differ by at most one; tied confidences may straddle a bin edge, split in input order; with
  ``N < B`` only ``N`` bins are non-empty).
- AURC: area under the risk-coverage curve with MSP confidence,
  ``AURC = (1/N) sum_{k=1..N} risk(k)`` where ``risk(k)`` is the error rate of the ``k`` most
  confident examples. Tied confidences are handled by taking the expectation over a random order
  within each tie group (errors spread evenly across the group), so the result does not depend on
  input order.
- AUGRC (Traub et al., 2024): area under the generalized risk-coverage curve, generalized risk =
  (accepted and wrong) / N, trapezoidal from coverage 0 (risk 0) to 1; ties as for AURC.
- OOD detection: OOD is the POSITIVE class and scores are "higher = more OOD". AUROC and AUPR-Out
  use OOD as positive; AUPR-In uses ID as positive with the score negated; FPR@95%TPR is the
  smallest fraction of ID examples flagged among thresholds ``t`` (flag when ``score >= t``, ``t``
  ranging over the observed scores) that flag at least 95% of the OOD examples. Tied scores are
  never split: AUROC counts a tied ID/OOD pair as 1/2 (as sklearn's ``roc_auc_score``), average
  precision is the step-wise sum over distinct thresholds (as sklearn's
  ``average_precision_score``). Scores are rank-transformed before torchmetrics sees them, so
  its sigmoid of out-of-range inputs never runs and cannot create float32 ties.
- OOD scores (:func:`ood_scores`): ``msp`` ``-max_c p``, ``entropy`` ``H[p]``,
  ``mutual_information`` from member probabilities, ``energy`` ``-logsumexp(logits)`` (for
  [N, M, C] logits the mean member energy).

Only torchmetrics *functional* forms are used (never stateful metric objects).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor
from torchmetrics.functional.classification import (
    binary_auroc,
    binary_average_precision,
    binary_roc,
    multiclass_accuracy,
    multiclass_calibration_error,
)

from hydra_ops.uncertainty import decompose, entropy, validate_probs

__all__ = [
    "DEFAULT_N_BINS",
    "NLL_EPS",
    "OOD_SCORE_KINDS",
    "RESAMPLED_METRICS",
    "accuracy",
    "accuracy_resampled",
    "adaptive_ece",
    "augrc",
    "aurc",
    "brier",
    "brier_resampled",
    "classification_metrics",
    "ece",
    "ece_resampled",
    "nll",
    "nll_resampled",
    "ood_metrics",
    "ood_scores",
    "validate_labels",
]

DEFAULT_N_BINS: int = 15
NLL_EPS: float = 1e-12
OOD_SCORE_KINDS: tuple[str, ...] = ("msp", "entropy", "mutual_information", "energy")
OodScoreKind = Literal["msp", "entropy", "mutual_information", "energy"]
_TPR_LEVEL = 0.95


def validate_labels(
    labels: Any, num_examples: int, num_classes: int, name: str = "labels"
) -> Tensor:
    """Return ``labels`` as a [N] long tensor, or raise a ValueError naming ``name``.

    Args:
        labels: [N] integer class ids.
        num_examples: required N.
        num_classes: C; every label must lie in ``[0, C)``.
    """
    if not isinstance(labels, Tensor):
        labels = torch.as_tensor(labels)
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor of class ids, got {labels.dtype}")
    if labels.ndim != 1 or labels.shape[0] != num_examples:
        raise ValueError(
            f"{name} must have shape [{num_examples}] to match probs, got {tuple(labels.shape)}"
        )
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(
            f"{name} must lie in [0, {num_classes}), got values in "
            f"[{int(labels.min())}, {int(labels.max())}]"
        )
    return labels.long()


def _prep(probs: Any, labels: Any) -> tuple[Tensor, Tensor]:
    """Validate a ([N, C] probs, [N] labels) pair; probs come back float64 and clamped to [0, 1]."""
    probs = validate_probs(probs, "probs", ndim=2)
    labels = validate_labels(labels, probs.shape[0], probs.shape[1])
    # Clamping matters: torchmetrics applies softmax when any entry leaves [0, 1].
    return probs.to(torch.float64).clamp(0.0, 1.0), labels.to(probs.device)


def _check_n_bins(n_bins: int) -> None:
    if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer, got {n_bins!r}")


def accuracy(probs: Tensor, labels: Tensor) -> float:
    """Top-1 accuracy. probs [N, C], labels [N] -> float in [0, 1]."""
    probs, labels = _prep(probs, labels)
    value = multiclass_accuracy(
        probs, labels, num_classes=probs.shape[1], average="micro", validate_args=False
    )
    return float(value)


def nll(probs: Tensor, labels: Tensor) -> float:
    """Mean negative log-likelihood in nats; ``p[label]`` clamped at :data:`NLL_EPS`.

    probs [N, C], labels [N] -> float >= 0.
    """
    probs, labels = _prep(probs, labels)
    p_true = probs.gather(1, labels[:, None]).squeeze(1)
    return float(-p_true.clamp_min(NLL_EPS).log().mean())


def brier(probs: Tensor, labels: Tensor) -> float:
    """Brier score: sum over classes of squared error, mean over examples.

    probs [N, C], labels [N] -> float in [0, 2].
    """
    probs, labels = _prep(probs, labels)
    onehot = torch.nn.functional.one_hot(labels, probs.shape[1]).to(probs.dtype)
    return float(((probs - onehot) ** 2).sum(dim=1).mean())


def ece(probs: Tensor, labels: Tensor, n_bins: int = DEFAULT_N_BINS) -> float:
    """Top-label L1 expected calibration error over ``n_bins`` equal-width bins.

    probs [N, C], labels [N] -> float in [0, 1]. Computed by torchmetrics'
    ``multiclass_calibration_error`` (bins ``[k/B, (k+1)/B)``; confidence 1.0 in its own bin).
    """
    _check_n_bins(n_bins)
    probs, labels = _prep(probs, labels)
    value = multiclass_calibration_error(
        probs,
        labels,
        num_classes=probs.shape[1],
        n_bins=n_bins,
        norm="l1",
        validate_args=False,
    )
    return float(value)


def adaptive_ece(probs: Tensor, labels: Tensor, n_bins: int = DEFAULT_N_BINS) -> float:
    """Top-label L1 calibration error over ``n_bins`` equal-mass bins (see module docstring).

    probs [N, C], labels [N] -> float in [0, 1].
    """
    _check_n_bins(n_bins)
    probs, labels = _prep(probs, labels)
    conf, pred = probs.max(dim=1)
    correct = (pred == labels).to(probs.dtype)
    n = conf.shape[0]
    order = torch.sort(conf, stable=True).indices
    bins = torch.arange(n, device=conf.device) * n_bins // n  # [N], bin of each sorted position
    count = torch.zeros(n_bins, dtype=probs.dtype, device=conf.device)
    conf_sum = torch.zeros_like(count)
    correct_sum = torch.zeros_like(count)
    count.scatter_add_(0, bins, torch.ones_like(conf))
    conf_sum.scatter_add_(0, bins, conf[order])
    correct_sum.scatter_add_(0, bins, correct[order])
    # |acc_b - conf_b| * n_b / N == |correct_sum_b - conf_sum_b| / N; empty bins contribute 0.
    return float((correct_sum - conf_sum).abs().sum() / n)


def _expected_errors(probs: Tensor, labels: Tensor) -> Tensor:
    """``E[k-1]`` = expected number of errors among the ``k`` most confident examples, ``[N]``.

    Confidence = MSP; tied confidences are ordered at random, so within a tie group the errors are
    spread evenly (``E`` is linear across the group) and the result does not depend on input order.
    """
    conf, pred = probs.max(dim=1)
    errors = (pred != labels).to(probs.dtype)
    order = torch.sort(conf, descending=True, stable=True).indices
    conf_sorted, err_sorted = conf[order], errors[order]
    _, group, counts = torch.unique_consecutive(
        conf_sorted, return_inverse=True, return_counts=True
    )
    group_err = torch.zeros(counts.shape[0], dtype=probs.dtype, device=probs.device)
    group_err.scatter_add_(0, group, err_sorted)
    group_end = counts.cumsum(0)
    group_start = group_end - counts
    err_before = group_err.cumsum(0) - group_err
    k = torch.arange(1, conf.shape[0] + 1, dtype=probs.dtype, device=probs.device)
    return err_before[group] + (k - group_start[group]) * group_err[group] / counts[group]


def aurc(probs: Tensor, labels: Tensor) -> float:
    """Area under the risk-coverage curve with MSP confidence (tie-invariant; module docstring).

    ``AURC = (1/N) sum_{k=1..N} E_k / k``, ``E_k`` the expected errors among the ``k`` most
    confident examples. probs [N, C], labels [N] -> float in [0, 1]; lower is better.
    """
    probs, labels = _prep(probs, labels)
    expected_err = _expected_errors(probs, labels)
    k = torch.arange(1, probs.shape[0] + 1, dtype=probs.dtype, device=probs.device)
    return float((expected_err / k).mean())


def augrc(probs: Tensor, labels: Tensor) -> float:
    """Area under the generalized risk-coverage curve (Traub et al., 2024), MSP confidence.

    The generalized risk at coverage ``k/N`` is ``E_k / N``: the fraction of *all* examples that
    are accepted and wrong (``E_k`` = expected errors among the ``k`` most confident, ties ordered
    at random as in :func:`aurc`). The curve starts at ``(0, 0)`` (nothing accepted, no risk) and
    is integrated with the trapezoidal rule over coverages ``0, 1/N, ..., 1``:
    ``AUGRC = (sum_{k=1..N} E_k - E_N / 2) / N^2``. Equivalently
    ``AUGRC = (1 - AUROC_f) * acc * (1 - acc) + (1 - acc)^2 / 2`` with ``AUROC_f`` the AUROC of the
    confidence separating correct (positive) from wrong predictions, ties counting 1/2; a perfect
    ranking gives ``(1 - acc)^2 / 2``.

    probs [N, C], labels [N] -> float in [0, 0.5]; lower is better.
    """
    probs, labels = _prep(probs, labels)
    expected_err = _expected_errors(probs, labels)
    n = probs.shape[0]
    return float((expected_err.sum() - expected_err[-1] / 2) / (n * n))


def _check_idx(idx: Tensor, n: int) -> Tensor:
    if idx.ndim != 2 or idx.is_floating_point():
        raise ValueError(
            f"idx must be an integer tensor [R, N], got {idx.dtype} {tuple(idx.shape)}"
        )
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
        raise ValueError(f"idx must index the {n} examples, got values outside [0, {n})")
    return idx.long()


def accuracy_resampled(probs: Tensor, labels: Tensor, idx: Tensor) -> Tensor:
    """:func:`accuracy` of R resamples: probs [N, C], labels [N], idx [R, N'] -> [R]."""
    probs, labels = _prep(probs, labels)
    idx = _check_idx(idx, probs.shape[0]).to(probs.device)
    return (probs.argmax(dim=1) == labels).to(torch.float64)[idx].mean(dim=1)


def nll_resampled(probs: Tensor, labels: Tensor, idx: Tensor) -> Tensor:
    """:func:`nll` of R resamples: probs [N, C], labels [N], idx [R, N'] -> [R]."""
    probs, labels = _prep(probs, labels)
    idx = _check_idx(idx, probs.shape[0]).to(probs.device)
    loss = -probs.gather(1, labels[:, None]).squeeze(1).clamp_min(NLL_EPS).log()
    return loss[idx].mean(dim=1)


def brier_resampled(probs: Tensor, labels: Tensor, idx: Tensor) -> Tensor:
    """:func:`brier` of R resamples: probs [N, C], labels [N], idx [R, N'] -> [R]."""
    probs, labels = _prep(probs, labels)
    idx = _check_idx(idx, probs.shape[0]).to(probs.device)
    onehot = torch.nn.functional.one_hot(labels, probs.shape[1]).to(probs.dtype)
    return ((probs - onehot) ** 2).sum(dim=1)[idx].mean(dim=1)


def ece_resampled(
    probs: Tensor, labels: Tensor, idx: Tensor, n_bins: int = DEFAULT_N_BINS
) -> Tensor:
    """:func:`ece` of R resamples: probs [N, C], labels [N], idx [R, N'] -> [R].

    Reproduces torchmetrics' binning exactly (float32 confidences, ``bucketize(right=True)`` on
    ``linspace(0, 1, n_bins + 1)``, so a confidence of 1.0 gets slot ``n_bins`` of its own).
    """
    _check_n_bins(n_bins)
    probs, labels = _prep(probs, labels)
    idx = _check_idx(idx, probs.shape[0]).to(probs.device)
    conf64, pred = probs.max(dim=1)
    conf = conf64.float()
    correct = (pred == labels).float()
    slots = n_bins + 1
    boundaries = torch.linspace(0, 1, slots, dtype=conf.dtype, device=conf.device)
    example_bin = torch.bucketize(conf, boundaries, right=True) - 1  # [N]
    r, m = idx.shape
    flat = (example_bin[idx] + torch.arange(r, device=idx.device)[:, None] * slots).flatten()
    conf_sum = torch.zeros(r * slots, dtype=conf.dtype, device=conf.device)
    correct_sum = torch.zeros_like(conf_sum)
    conf_sum.scatter_add_(0, flat, conf[idx].flatten())
    correct_sum.scatter_add_(0, flat, correct[idx].flatten())
    return (correct_sum - conf_sum).view(r, slots).abs().sum(dim=1).double() / m


def classification_metrics(
    probs: Tensor, labels: Tensor, *, n_bins: int = DEFAULT_N_BINS
) -> dict[str, float]:
    """All classification metrics at once.

    Args:
        probs: [N, C] predicted probabilities.
        labels: [N] integer class ids.
        n_bins: bins for ``ece`` and ``adaptive_ece``.

    Returns:
        ``{"accuracy", "nll", "brier", "ece", "adaptive_ece", "aurc"}`` -> float.
    """
    _check_n_bins(n_bins)
    probs, labels = _prep(probs, labels)
    return {
        "accuracy": accuracy(probs, labels),
        "nll": nll(probs, labels),
        "brier": brier(probs, labels),
        "ece": ece(probs, labels, n_bins),
        "adaptive_ece": adaptive_ece(probs, labels, n_bins),
        "aurc": aurc(probs, labels),
    }


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


def _validate_scores(scores: Any, name: str) -> Tensor:
    if not isinstance(scores, Tensor):
        scores = torch.as_tensor(scores)
    if not scores.is_floating_point():
        scores = scores.to(torch.float64)
    if scores.ndim != 1 or scores.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 1-D tensor, got shape {tuple(scores.shape)}")
    if not bool(torch.isfinite(scores).all()):
        raise ValueError(f"{name} contains NaN or infinite values")
    return scores.to(torch.float64)


def ood_metrics(id_scores: Tensor, ood_scores: Tensor) -> dict[str, float]:
    """OOD-detection metrics with OOD as the positive class (scores: higher = more OOD).

    Args:
        id_scores: [N] scores of in-distribution examples.
        ood_scores: [K] scores of out-of-distribution examples.

    Returns:
        ``{"auroc", "aupr_in", "aupr_out", "fpr_at_95_tpr"}`` -> float in [0, 1].
    """
    id_scores = _validate_scores(id_scores, "id_scores")
    ood_scores = _validate_scores(ood_scores, "ood_scores").to(id_scores.device)
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


RESAMPLED_METRICS: dict[Callable[..., float], Callable[..., Tensor]] = {
    accuracy: accuracy_resampled,
    nll: nll_resampled,
    brier: brier_resampled,
    ece: ece_resampled,
}
"""Vectorised twins ``(probs [N, C], labels [N], idx [R, N]) -> [R]``; the bootstrap uses them."""
