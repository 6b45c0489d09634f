"""Maximum softmax probability: a confident prediction is in-distribution."""

from __future__ import annotations

from torch import Tensor

from hydra_ops.uq.ood_criteria.base import OodCriterion, OodInputs


class MaxSoftmaxProbability(OodCriterion):
    """``max_c probs``; the score is its negative, in ``[-1, -1/C]``.

    Shape: probs [N, C] -> [N].
    """

    higher_is_ood = False
    meaning = "-(max calibrated prob) = -prob, in [-1, -1/C]"

    def statistic(self, inputs: OodInputs) -> Tensor:
        return inputs.probs.max(dim=1).values
