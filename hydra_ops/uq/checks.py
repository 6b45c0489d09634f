"""Input checks shared by the metrics, calibration and OOD thresholds (errors name the argument).

A leaf module (torch only), so code that only needs a check does not import the metrics.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


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
