"""Energy score (Liu et al., 2020): low log-partition of the logits looks out-of-distribution."""

from __future__ import annotations

import torch
from torch import Tensor

from hydra_ops.uq.ood_criteria.base import OodCriterion, OodInputs


class Energy(OodCriterion):
    """``-logsumexp_c logits``; for member logits the mean member energy.

    Shape: logits [N, C] or [N, M, C] -> [N].
    """

    needs = frozenset({"logits"})
    meaning = "mean member -logsumexp(logits / T)"

    def statistic(self, inputs: OodInputs) -> Tensor:
        assert inputs.logits is not None
        energy = -torch.logsumexp(inputs.logits, dim=-1)
        return energy.mean(dim=1) if energy.ndim == 2 else energy
