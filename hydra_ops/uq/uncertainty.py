"""Predictive-uncertainty decomposition of ensemble member probabilities.

Conventions (shared with :mod:`hydra_ops.metrics`):

- Entropies use the natural log (nats) and ``0 * log 0 = 0``.
- ``argmax`` ties resolve to the lowest class index (``torch.argmax`` returns the first maximum).
- A probability tensor is valid when it is finite, every entry lies in ``[0, 1]`` (up to
  :data:`PROB_ATOL`), and every row sums to 1 within :data:`PROB_ATOL`.

:func:`decompose` splits the total predictive uncertainty of an M-member ensemble::

    total_entropy      = H[ mean_m p_m ]                 (entropy of the mean prediction)
    expected_entropy   = mean_m H[ p_m ]                 (aleatoric part)
    mutual_information = max(total - expected, 0)        (epistemic part, Jensen gap >= 0)
    disagreement       = (1/M) * #{m : argmax p_m != argmax mean_m p_m}

``disagreement`` is the fraction of members whose top class differs from the ensemble's top class
(``0`` when every member agrees with the ensemble, at most ``(M - 1) / M``).

The calibrated columns of ``hydra-ens predict`` (one temperature for all of them) are in
:mod:`hydra_ops.uq.calibrated`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = [
    "PROB_ATOL",
    "decompose",
    "entropy",
    "validate_probs",
]

PROB_ATOL: float = 1e-3
"""Absolute tolerance for "rows sum to 1" and for entries lying in ``[0, 1]``."""


def validate_probs(probs: Any, name: str, ndim: int) -> Tensor:
    """Return ``probs`` as a floating tensor, or raise a ValueError naming ``name``.

    Args:
        probs: probabilities whose last dimension is the class dimension (C >= 2).
        name: argument name used in error messages.
        ndim: required number of dimensions (e.g. 2 for [N, C], 3 for [N, M, C]).

    Returns:
        The same values as a floating-point tensor (integer inputs are rejected).
    """
    if not isinstance(probs, Tensor):
        probs = torch.as_tensor(probs)
    if not probs.is_floating_point():
        raise ValueError(
            f"{name} must be a floating-point tensor of probabilities, got {probs.dtype}"
        )
    if probs.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(probs.shape)}")
    if probs.shape[-1] < 2:
        raise ValueError(
            f"{name} must have at least 2 classes in its last dimension, got shape "
            f"{tuple(probs.shape)}"
        )
    if probs.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(probs.shape)})")
    if not bool(torch.isfinite(probs).all()):
        raise ValueError(f"{name} contains NaN or infinite values")
    if bool((probs < -PROB_ATOL).any()) or bool((probs > 1 + PROB_ATOL).any()):
        raise ValueError(
            f"{name} must lie in [0, 1]; got min {probs.min().item():.4g}, "
            f"max {probs.max().item():.4g}"
        )
    row_err = (probs.sum(dim=-1) - 1).abs().max().item()
    if row_err > PROB_ATOL:
        raise ValueError(
            f"{name} must sum to 1 over its last dimension (tolerance {PROB_ATOL}); "
            f"worst row is off by {row_err:.4g}"
        )
    return probs


def _entropy(probs: Tensor) -> Tensor:
    # xlogy(0, 0) == 0 gives the 0 * log 0 = 0 convention; the clamp removes round-off negatives
    # (allowed by PROB_ATOL) that would make xlogy return NaN.
    probs = probs.clamp_min(0.0)
    return -torch.special.xlogy(probs, probs).sum(dim=-1)


def entropy(probs: Tensor) -> Tensor:
    """Shannon entropy in nats of each row.

    Args:
        probs: [B, C] probabilities (rows sum to 1).

    Returns:
        [B] entropies, each in ``[0, log C]``.
    """
    probs = validate_probs(probs, "probs", ndim=2)
    return _entropy(probs)


def decompose(member_probs: Tensor) -> dict[str, Tensor]:
    """Split ensemble uncertainty into total / expected entropy, mutual information, disagreement.

    Args:
        member_probs: [B, M, C] per-member probabilities (each member's row sums to 1).

    Returns:
        dict of [B] tensors with keys ``total_entropy``, ``expected_entropy``,
        ``mutual_information`` (``total - expected`` clamped at 0, guarding against round-off)
        and ``disagreement`` (fraction of the M members whose argmax differs from the argmax of
        the mean probabilities; ties go to the lowest class index). See the module docstring.
    """
    member_probs = validate_probs(member_probs, "member_probs", ndim=3)
    mean_probs = member_probs.mean(dim=1)  # [B, C]
    total = _entropy(mean_probs)
    expected = _entropy(member_probs).mean(dim=1)
    mutual_information = (total - expected).clamp_min(0.0)
    ensemble_top = mean_probs.argmax(dim=-1)  # [B]
    member_top = member_probs.argmax(dim=-1)  # [B, M]
    disagreement = (member_top != ensemble_top[:, None]).to(member_probs.dtype).mean(dim=1)
    return {
        "total_entropy": total,
        "expected_entropy": expected,
        "mutual_information": mutual_information,
        "disagreement": disagreement,
    }
