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

:func:`calibrated_uncertainty` gives every per-example column of ``hydra-ens predict`` from member
logits ``l_m`` and the calibration temperature ``T``, all from ONE distribution, the calibrated
prediction the gates judge (``p_m = softmax(l_m)``, ``pbar = mean_m p_m``)::

    p_cal              = softmax(log(pbar) / T)
    predicted, prob    = argmax p_cal, max p_cal
    entropy            = H[p_cal]                                 (in [0, ln C])
    q_m                = p_m * w / a_m,  w = p_cal / pbar,  a_m = sum_c p_m[c] w[c]
    pi_m               = a_m / M                                  (sum_m pi_m = 1)
    expected_entropy   = sum_m pi_m H[q_m]
    mutual_information = entropy - expected_entropy = sum_m pi_m KL(q_m || p_cal)
    disagreement       = (1/M) * #{m : argmax p_m != predicted}
    ood_score          = the evaluate stage's score (:func:`calibrated_ood_score`)

Why ``q_m``: the ensemble is the joint ``P(m, y) = p_m(y) / M`` of member index and class, with
class marginal ``pbar``. Calibration replaces that marginal by ``p_cal`` and keeps which members
favour each class, ``P(m | y) = p_m(y) / (M pbar(y))``; the recalibrated joint is
``P(m, y) = pi_m q_m(y)`` with class marginal exactly ``sum_m pi_m q_m = p_cal``. So ``entropy`` =
``expected_entropy + mutual_information`` exactly, as at ``T = 1`` (where ``q_m = p_m``,
``pi_m = 1/M`` and the columns equal :func:`decompose`), and ``mutual_information = I(Y; member)``
of that joint: ``0 <= mutual_information <= min(entropy, ln M)``, 0 when all members agree exactly
(then ``q_m = p_cal``). ``disagreement`` counts member votes, which ``T`` does not change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "PROB_ATOL",
    "CalibratedUncertainty",
    "calibrated_ood_score",
    "calibrated_uncertainty",
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


def calibrated_ood_score(member_logits: Tensor, temperature: float, kind: str = "msp") -> Tensor:
    """The OOD score the evaluate stage (and so the gates) uses; higher = more OOD.

    ``hydra_ops.metrics.ood_scores(p_cal, member_probs=softmax(l), logits=l / T, kind=kind)``
    with ``p_cal = softmax(log(mean_m softmax(l_m)) / T)``: ``msp`` = ``-max p_cal``, ``entropy``
    = ``H[p_cal]``, ``mutual_information`` of the *untempered* member softmaxes, ``energy`` = mean
    member ``-logsumexp(l_m / T)``, ``disagreement`` = the fraction of members whose top class is
    not ``argmax p_cal`` (votes: ``T`` does not change it).

    Args:
        member_logits: [N, M, C] member logits.
        temperature: calibration temperature ``T > 0`` (1.0 = raw).
        kind: ``msp``, ``entropy``, ``mutual_information``, ``energy`` or ``disagreement``
            (:data:`hydra_ops.uq.ood_criteria.OOD_SCORE_KINDS`).

    Returns:
        [N] scores.
    """
    # deferred: hydra_ops.metrics and hydra_ops.uq.calibration import this module
    from hydra_ops.uq.calibration import ensemble_probs
    from hydra_ops.uq.ood_criteria import ood_scores

    probs = ensemble_probs(member_logits, temperature)
    return ood_scores(
        probs,
        member_probs=member_logits.softmax(-1),
        logits=member_logits / float(temperature),
        kind=kind,  # type: ignore[arg-type]
    )


@dataclass(frozen=True)
class CalibratedUncertainty:
    """Per-example columns of one calibrated prediction (see the module docstring).

    ``probs`` is [N, C]; every other tensor is [N] (``predicted`` int64, the rest floating).
    Invariants: ``prob = probs[n, predicted[n]] = max probs[n]``; ``0 <= entropy <= ln C``;
    ``entropy = expected_entropy + mutual_information``;
    ``0 <= mutual_information <= min(entropy, ln M)``; ``disagreement`` in ``[0, (M - 1) / M]``.
    """

    probs: Tensor
    predicted: Tensor
    prob: Tensor
    entropy: Tensor
    expected_entropy: Tensor
    mutual_information: Tensor
    disagreement: Tensor
    ood_score: Tensor
    ood_score_kind: str
    temperature: float

    @property
    def num_classes(self) -> int:
        return int(self.probs.shape[-1])

    @property
    def max_entropy(self) -> float:
        """``ln C``: the entropy of the uniform prediction, in nats."""
        return math.log(self.num_classes)


def _recalibrated_split(
    member_log_probs: Tensor, log_mean: Tensor, log_p_cal: Tensor
) -> tuple[Tensor, Tensor]:
    """Entropy of ``p_cal`` and its aleatoric part ``sum_m pi_m H[q_m]`` (module docstring).

    Args: [N, M, C] ``log p_m``, [N, C] ``log pbar``, [N, C] ``log p_cal`` (all float64).
    Returns: two [N] tensors.
    """
    log_w = log_p_cal - log_mean  # [N, C]
    tilted = member_log_probs + log_w[:, None, :]  # log(p_m * w), [N, M, C]
    log_a = torch.logsumexp(tilted, dim=-1, keepdim=True)  # [N, M, 1]
    log_q = tilted - log_a
    pi = log_a.squeeze(-1).exp() / member_log_probs.shape[1]  # [N, M]
    member_entropy = -(log_q.exp() * log_q).nan_to_num(0.0).sum(dim=-1)  # 0 * -inf = 0
    total = -(log_p_cal.exp() * log_p_cal).nan_to_num(0.0).sum(dim=-1)
    return total, (pi * member_entropy).sum(dim=-1)


def calibrated_uncertainty(
    member_logits: Tensor, temperature: float, ood_score_kind: str = "msp"
) -> CalibratedUncertainty:
    """Prediction, probability, entropy, MI, disagreement and OOD score, all from one ``T``.

    Args:
        member_logits: [N, M, C] member logits (finite, floating).
        temperature: calibration temperature ``T > 0``.
        ood_score_kind: score of :func:`calibrated_ood_score` (``msp``, ``entropy``,
            ``mutual_information``, ``energy``, ``disagreement``).

    Returns:
        :class:`CalibratedUncertainty` in ``member_logits``' dtype; definitions in the module
        docstring (the entropies are computed in float64, then cast).
    """
    from hydra_ops.uq.calibration import apply_temperature, ensemble_log_probs
    from hydra_ops.uq.ood_criteria import OOD_SCORE_KINDS

    if ood_score_kind not in OOD_SCORE_KINDS:
        raise ValueError(
            f"ood_score_kind must be one of {list(OOD_SCORE_KINDS)}, got {ood_score_kind!r}"
        )
    log_mean = ensemble_log_probs(member_logits)  # validates member_logits
    p_cal = apply_temperature(log_mean, temperature)  # validates temperature; evaluate's probs
    t = float(temperature)
    predicted = p_cal.argmax(dim=1)
    prob = p_cal.gather(1, predicted[:, None]).squeeze(1)
    log_mean64 = log_mean.double()
    total, expected = _recalibrated_split(
        member_logits.double().log_softmax(dim=-1),
        log_mean64,
        torch.log_softmax(log_mean64 / t, dim=1),
    )
    total = total.clamp(0.0, math.log(p_cal.shape[1]))
    expected = expected.clamp(0.0).minimum(total)
    disagreement = (member_logits.argmax(dim=-1) != predicted[:, None]).to(p_cal.dtype).mean(dim=1)
    dtype = p_cal.dtype
    return CalibratedUncertainty(
        probs=p_cal,
        predicted=predicted,
        prob=prob,
        entropy=total.to(dtype),
        expected_entropy=expected.to(dtype),
        mutual_information=(total - expected).to(dtype),
        disagreement=disagreement,
        ood_score=calibrated_ood_score(member_logits, t, ood_score_kind),
        ood_score_kind=ood_score_kind,
        temperature=t,
    )
