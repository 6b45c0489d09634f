"""Predictive entropy: a spread-out prediction looks out-of-distribution."""

from __future__ import annotations

from torch import Tensor

from hydra_ops.uq.ood_criteria.base import OodCriterion, OodInputs
from hydra_ops.uq.uncertainty import entropy


class PredictiveEntropy(OodCriterion):
    """``H[probs]`` in nats, in ``[0, ln C]``.

    Shape: probs [N, C] -> [N].
    """

    meaning = "entropy of the calibrated prediction (= entropy), nats"

    def statistic(self, inputs: OodInputs) -> Tensor:
        return entropy(inputs.probs)
