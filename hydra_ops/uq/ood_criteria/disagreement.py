"""Member disagreement: the fraction of members that do not vote for the ensemble's class."""

from __future__ import annotations

from torch import Tensor

from hydra_ops.uq.ood_criteria.base import OodCriterion, OodInputs


class Disagreement(OodCriterion):
    """``1 - (1/M) #{m : argmax p_m = argmax probs}``, in ``[0, (M - 1) / M]`` (ensemble-only;
    ties in an argmax go to the lowest class index).

    Shape: probs [N, C], member_probs [N, M, C] -> [N].
    """

    needs = frozenset({"members"})
    meaning = "fraction of members whose top class is not the predicted class"

    def statistic(self, inputs: OodInputs) -> Tensor:
        assert inputs.member_probs is not None
        votes = inputs.member_probs.argmax(dim=-1) == inputs.probs.argmax(dim=-1)[:, None]
        return 1.0 - votes.to(inputs.probs.dtype).mean(dim=1)
