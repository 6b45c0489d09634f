"""Input validation shared by the metric families (errors name the argument)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from hydra_ops.uq.checks import validate_labels, validate_scores  # noqa: F401 (re-exported)
from hydra_ops.uq.uncertainty import validate_probs

DEFAULT_N_BINS: int = 15


def prep(probs: Any, labels: Any) -> tuple[Tensor, Tensor]:
    """Validate a ([N, C] probs, [N] labels) pair; probs come back float64 and clamped to [0, 1]."""
    probs = validate_probs(probs, "probs", ndim=2)
    labels = validate_labels(labels, probs.shape[0], probs.shape[1])
    # rounding can leave [0, 1] by an ulp; NLL, Brier and the ECE bins assume it does not
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
