"""Calibration: the shared confidence binning, ECE (and its resampled twin), adaptive ECE and the
reliability diagram's rows."""

from __future__ import annotations

import torch
from torch import Tensor

from hydra_ops.metrics._checks import (
    DEFAULT_N_BINS,
    check_idx,
    check_n_bins,
    prep,
    validate_labels,
)
from hydra_ops.uq.uncertainty import validate_probs


def calibration_bins(confidences: Tensor, n_bins: int = DEFAULT_N_BINS) -> Tensor:
    """The bin of each top-label confidence: [N] in [0, 1] -> [N] long in ``0..n_bins``.

    The one binning of :func:`ece`, :func:`ece_resampled` and :func:`reliability_bins`, which is
    torchmetrics' (``multiclass_calibration_error``): confidences as float32, bucketed on
    ``linspace(0, 1, n_bins + 1)`` so bin ``k < n_bins`` is ``[k / n_bins, (k + 1) / n_bins)``
    and a confidence of exactly 1.0 gets bin ``n_bins``, the last, of its own.
    """
    check_n_bins(n_bins)
    conf = confidences.float()
    boundaries = torch.linspace(0, 1, n_bins + 1, dtype=conf.dtype, device=conf.device)
    return torch.bucketize(conf, boundaries, right=True) - 1


def _top_label(probs: Tensor, labels: Tensor, n_bins: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(confidence, correct, bin)``, each [N] (float32, float32, long), of :func:`prep`-ed
    ``probs`` [N, C] and ``labels`` [N]."""
    conf, pred = probs.max(dim=1)
    conf = conf.float()
    return conf, pred.eq(labels).float(), calibration_bins(conf, n_bins)


def ece(probs: Tensor, labels: Tensor, n_bins: int = DEFAULT_N_BINS) -> float:
    """Top-label L1 expected calibration error over ``n_bins`` equal-width bins.

    probs [N, C], labels [N] -> float in [0, 1]. Bins of :func:`calibration_bins` (confidence 1.0
    in the last bin, of its own); the same float32 arithmetic as torchmetrics'
    ``multiclass_calibration_error``, hence the same value to the bit.
    """
    check_n_bins(n_bins)
    probs, labels = prep(probs, labels)
    conf, correct, bins = _top_label(probs, labels, n_bins)
    count = torch.zeros(n_bins + 1, dtype=conf.dtype, device=conf.device)
    conf_mean, acc_mean = torch.zeros_like(count), torch.zeros_like(count)
    count.scatter_add_(0, bins, torch.ones_like(conf))
    conf_mean = torch.nan_to_num(conf_mean.scatter_add_(0, bins, conf) / count)
    acc_mean = torch.nan_to_num(acc_mean.scatter_add_(0, bins, correct) / count)
    return float(torch.sum(torch.abs(acc_mean - conf_mean) * (count / count.sum())))


def ece_resampled(
    probs: Tensor, labels: Tensor, idx: Tensor, n_bins: int = DEFAULT_N_BINS
) -> Tensor:
    """:func:`ece` of R resamples: probs [N, C], labels [N], idx [R, N'] -> [R].

    The bins of :func:`calibration_bins` (confidence 1.0 in slot ``n_bins`` of its own), per-bin
    sums over each resample at once.
    """
    check_n_bins(n_bins)
    probs, labels = prep(probs, labels)
    idx = check_idx(idx, probs.shape[0]).to(probs.device)
    conf, correct, example_bin = _top_label(probs, labels, n_bins)
    slots = n_bins + 1
    r, m = idx.shape
    flat = (example_bin[idx] + torch.arange(r, device=idx.device)[:, None] * slots).flatten()
    conf_sum = torch.zeros(r * slots, dtype=conf.dtype, device=conf.device)
    correct_sum = torch.zeros_like(conf_sum)
    conf_sum.scatter_add_(0, flat, conf[idx].flatten())
    correct_sum.scatter_add_(0, flat, correct[idx].flatten())
    return (correct_sum - conf_sum).view(r, slots).abs().sum(dim=1).double() / m


def adaptive_ece(probs: Tensor, labels: Tensor, n_bins: int = DEFAULT_N_BINS) -> float:
    """Top-label L1 calibration error over ``n_bins`` equal-mass bins (see module docstring).

    probs [N, C], labels [N] -> float in [0, 1].
    """
    check_n_bins(n_bins)
    probs, labels = prep(probs, labels)
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


def reliability_bins(
    probs: Tensor, labels: Tensor, n_bins: int = DEFAULT_N_BINS
) -> list[dict[str, float | int]]:
    """The reliability diagram: one row per non-empty bin of :func:`calibration_bins`, in bin
    order, ``{"confidence": mean top-label confidence, "accuracy": fraction correct, "count"}``.

    probs [N, C], labels [N]; the counts sum to N. Means are taken in ``probs``' dtype.
    """
    check_n_bins(n_bins)
    probs = validate_probs(probs, "probs", ndim=2)
    labels = validate_labels(labels, probs.shape[0], probs.shape[1]).to(probs.device)
    conf, pred = probs.max(dim=1)
    correct = (pred == labels).float()
    bins = calibration_bins(conf, n_bins)
    rows: list[dict[str, float | int]] = []
    for b in range(n_bins + 1):
        mask = bins == b
        if mask.any():
            rows.append(
                {
                    "confidence": float(conf[mask].mean()),
                    "accuracy": float(correct[mask].mean()),
                    "count": int(mask.sum()),
                }
            )
    return rows
