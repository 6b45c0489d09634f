"""Calibrated uncertainty: every per-example column of ``hydra-ens predict`` from one temperature.

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
``pi_m = 1/M`` and the columns equal :func:`hydra_ops.uq.uncertainty.decompose`), and
``mutual_information = I(Y; member)`` of that joint: ``0 <= mutual_information <= min(entropy,
ln M)``, 0 when all members agree exactly (then ``q_m = p_cal``). ``disagreement`` counts member
votes, which ``T`` does not change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from hydra_ops.uq.calibration import apply_temperature, ensemble_log_probs, ensemble_probs
from hydra_ops.uq.ood_criteria.base import ood_criterion, ood_scores

__all__ = ["CalibratedUncertainty", "calibrated_ood_score", "calibrated_uncertainty"]


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
        kind: a criterion of :data:`hydra_ops.uq.ood_criteria.OOD_CRITERIA` (``msp``,
            ``entropy``, ``energy``, ``mutual_information``, ``disagreement``...).

    Returns:
        [N] scores.
    """
    probs = ensemble_probs(member_logits, temperature)
    return ood_scores(
        probs,
        member_probs=member_logits.softmax(-1),
        logits=member_logits / float(temperature),
        kind=kind,
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
        ood_score_kind: a criterion of :data:`hydra_ops.uq.ood_criteria.OOD_CRITERIA`.

    Returns:
        :class:`CalibratedUncertainty` in ``member_logits``' dtype; definitions in the module
        docstring (the entropies are computed in float64, then cast).
    """
    ood_criterion(ood_score_kind, "ood_score_kind")
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
