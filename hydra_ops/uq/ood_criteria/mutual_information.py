"""Mutual information between the prediction and the member: members that disagree in their
distributions mark an input the ensemble has not seen."""

from __future__ import annotations

from torch import Tensor

from hydra_ops.uq.ood_criteria.base import OodCriterion, OodInputs
from hydra_ops.uq.uncertainty import decompose


class MutualInformation(OodCriterion):
    """``H[mean_m p_m] - mean_m H[p_m]`` of the member probabilities, nats (ensemble-only).

    Shape: member_probs [N, M, C] -> [N].
    """

    needs = frozenset({"members"})
    meaning = "mutual information of the uncalibrated member softmaxes, nats"

    def statistic(self, inputs: OodInputs) -> Tensor:
        assert inputs.member_probs is not None
        return decompose(inputs.member_probs)["mutual_information"]
