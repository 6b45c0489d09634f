"""Input validation shared by the metric families (errors name the argument)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from hydra_ops.uncertainty import validate_probs

DEFAULT_N_BINS: int = 15


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


def prep(probs: Any, labels: Any) -> tuple[Tensor, Tensor]:
    """Validate a ([N, C] probs, [N] labels) pair; probs come back float64 and clamped to [0, 1]."""
    probs = validate_probs(probs, "probs", ndim=2)
    labels = validate_labels(labels, probs.shape[0], probs.shape[1])
    # Clamping matters: torchmetrics applies softmax when any entry leaves [0, 1].
    return probs.to(torch.float64).clamp(0.0, 1.0), labels.to(probs.device)


def check_n_bins(n_bins: int) -> None:
    if isinstance(n_bins, bool) or not isinstance(n_bins, int) or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer, got {n_bins!r}")


def check_idx(idx: Tensor, n: int) -> Tensor:
    if idx.ndim != 2 or idx.is_floating_point():
        raise ValueError(
            f"idx must be an integer tensor [R, N], got {idx.dtype} {tuple(idx.shape)}"
        )
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
        raise ValueError(f"idx must index the {n} examples, got values outside [0, {n})")
    return idx.long()


def validate_scores(scores: Any, name: str) -> Tensor:
    if not isinstance(scores, Tensor):
        scores = torch.as_tensor(scores)
    if not scores.is_floating_point():
        scores = scores.to(torch.float64)
    if scores.ndim != 1 or scores.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 1-D tensor, got shape {tuple(scores.shape)}")
    if not bool(torch.isfinite(scores).all()):
        raise ValueError(f"{name} contains NaN or infinite values")
    return scores.to(torch.float64)
