"""Temperature scaling.

One temperature ``T > 0`` is fitted on validation data by minimising the NLL of
``softmax(z / T)``. For a single model ``z`` are its logits; for the ensemble it scales the log of
the mean member probabilities (``z = ensemble_log_probs(member_logits)``), i.e. the calibrated
ensemble prediction is ``softmax(log(mean_m softmax(l_m)) / T)``.

The fit is a golden-section search over ``log T`` inside ``bounds``. The NLL is convex in
``1 / T`` (a mean of log-sum-exps of linear functions), hence unimodal in ``log T``, so the search
finds the bounded minimiser without a starting point, learning rate or randomness: the same inputs
always give the same temperature.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from hydra_ops.uq.checks import validate_labels

__all__ = [
    "DEFAULT_BOUNDS",
    "apply_temperature",
    "ensemble_log_probs",
    "ensemble_probs",
    "fit_temperature",
]

DEFAULT_BOUNDS: tuple[float, float] = (0.05, 20.0)
_INV_PHI = (math.sqrt(5.0) - 1.0) / 2.0


def _validate_scores(z: Any, name: str) -> Tensor:
    """[N, C] logits or log-probabilities: floating, no NaN / +inf (``-inf`` = probability 0)."""
    if not isinstance(z, Tensor):
        z = torch.as_tensor(z)
    if not z.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {z.dtype}")
    if z.ndim != 2 or z.shape[0] == 0 or z.shape[1] < 2:
        raise ValueError(f"{name} must have shape [N, C] with N >= 1, C >= 2, got {tuple(z.shape)}")
    if bool(torch.isnan(z).any()) or bool((z == float("inf")).any()):
        raise ValueError(f"{name} contains NaN or +inf values")
    if bool(torch.isneginf(z).all(dim=1).any()):
        raise ValueError(f"{name} has a row where every entry is -inf")
    return z


def _validate_temperature(temperature: Any) -> float:
    try:
        t = float(temperature)
    except (TypeError, ValueError):
        raise ValueError(
            f"temperature must be a positive finite number, got {temperature!r}"
        ) from None
    if not math.isfinite(t) or t <= 0:
        raise ValueError(f"temperature must be a positive finite number, got {temperature!r}")
    return t


def nll_at_temperature(z: Tensor, labels: Tensor, temperature: float = 1.0) -> float:
    """Mean NLL of ``softmax(z / T)``: the objective :func:`fit_temperature` minimises.

    Args:
        z: [N, C] logits, or the log of mean member probabilities.
        labels: [N] class ids.
    """
    log_probs = torch.log_softmax(z / temperature, dim=1)
    return float(-log_probs.gather(1, labels[:, None]).mean())


def fit_temperature(
    logits_or_log_probs: Tensor,
    labels: Tensor,
    *,
    max_iter: int = 100,
    bounds: tuple[float, float] = DEFAULT_BOUNDS,
    tol: float = 1e-6,
) -> float:
    """Temperature minimising the validation NLL of ``softmax(z / T)``.

    Args:
        logits_or_log_probs: [N, C] logits, or for the ensemble the log of the mean member
            probabilities (see :func:`ensemble_log_probs`).
        labels: [N] integer class ids.
        max_iter: maximum golden-section iterations (each shrinks the ``log T`` interval by
            0.618; 100 is far more than ``tol`` needs).
        bounds: ``(low, high)`` with ``0 < low < high``; the result lies in this interval (an
            optimum outside it is returned as the nearer bound).
        tol: stop once the ``log T`` bracket is narrower than this.

    Returns:
        T as a Python float.
    """
    z = _validate_scores(logits_or_log_probs, "logits_or_log_probs").to(torch.float64)
    labels = validate_labels(labels, z.shape[0], z.shape[1]).to(z.device)
    if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
        raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")
    try:
        low, high = (float(b) for b in bounds)
    except (TypeError, ValueError):
        raise ValueError(f"bounds must be a pair (low, high), got {bounds!r}") from None
    if not (0 < low < high < math.inf):
        raise ValueError(f"bounds must satisfy 0 < low < high < inf, got {bounds!r}")
    if not tol > 0:
        raise ValueError(f"tol must be positive, got {tol!r}")

    def objective(log_t: float) -> float:
        return nll_at_temperature(z, labels, math.exp(log_t))

    a, b = math.log(low), math.log(high)
    c, d = b - _INV_PHI * (b - a), a + _INV_PHI * (b - a)
    fc, fd = objective(c), objective(d)
    for _ in range(max_iter):
        if b - a < tol:
            break
        if fc <= fd:  # minimum in [a, d]
            b, d, fd = d, c, fc
            c = b - _INV_PHI * (b - a)
            fc = objective(c)
        else:  # minimum in [c, b]
            a, c, fc = c, d, fd
            d = a + _INV_PHI * (b - a)
            fd = objective(d)
    best = (a + b) / 2.0
    # The bracket never reaches the bounds themselves; compare so a boundary optimum is exact.
    candidates = [
        (objective(best), best),
        (objective(math.log(low)), math.log(low)),
        (objective(math.log(high)), math.log(high)),
    ]
    return math.exp(min(candidates, key=lambda pair: pair[0])[1])


def apply_temperature(logits_or_log_probs: Tensor, temperature: float) -> Tensor:
    """``softmax(z / T)``: [N, C] logits or log-probabilities -> [N, C] probabilities."""
    z = _validate_scores(logits_or_log_probs, "logits_or_log_probs")
    t = _validate_temperature(temperature)
    return torch.softmax(z / t, dim=1)


def ensemble_log_probs(member_logits: Tensor) -> Tensor:
    """Log of the mean member softmax, computed stably.

    Args:
        member_logits: [N, M, C] logits of M members.

    Returns:
        [N, C] ``log(mean_m softmax(member_logits[:, m]))`` =
        ``logsumexp_m(log_softmax(member_logits[:, m])) - log M``.
    """
    if not isinstance(member_logits, Tensor):
        member_logits = torch.as_tensor(member_logits)
    if not member_logits.is_floating_point():
        raise ValueError(
            f"member_logits must be a floating-point tensor, got {member_logits.dtype}"
        )
    if member_logits.ndim != 3 or 0 in member_logits.shape or member_logits.shape[2] < 2:
        raise ValueError(
            f"member_logits must have shape [N, M, C] with C >= 2, got {tuple(member_logits.shape)}"
        )
    if not bool(torch.isfinite(member_logits).all()):
        raise ValueError("member_logits contains NaN or infinite values")
    log_probs = torch.log_softmax(member_logits, dim=2)
    return torch.logsumexp(log_probs, dim=1) - math.log(member_logits.shape[1])


def ensemble_probs(member_logits: Tensor, temperature: float = 1.0) -> Tensor:
    """The calibrated ensemble prediction: ``softmax(log(mean_m softmax(member_logits)) / T)``.

    Shape:
        member_logits ``[N, M, C]`` -> ``[N, C]`` probabilities (``T = 1``: the mean of the
        members' softmax).
    """
    return apply_temperature(ensemble_log_probs(member_logits), temperature)
