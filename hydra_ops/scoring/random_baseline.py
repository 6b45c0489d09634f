"""``random``: a baseline, seeded uniform noise of the model's ``[L, H]`` shape.

(Named ``random_baseline`` so that neither the stdlib ``random`` nor :func:`random_scores` is
shadowed by a module of the same name.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hydra_ops.adapters import get_adapter
from hydra_ops.heads.scores import HeadScores

from .base import HeadImportance
from .inputs import uniform_heads


def random_scores(model: nn.Module, *, seed: int = 0) -> HeadScores:
    """Uniform(0, 1) scores of the model's shape from ``torch.Generator().manual_seed(seed)``."""
    adapter = get_adapter(model)
    num_layers, num_heads = uniform_heads(adapter)
    gen = torch.Generator().manual_seed(seed)
    return HeadScores(
        torch.rand(num_layers, num_heads, generator=gen), "random", meta={"seed": seed}
    )


@dataclass(frozen=True)
class RandomImportance(HeadImportance):
    """``random`` as a criterion: ``RandomImportance(seed=0)(model)``; no data."""

    name = "random"

    seed: int = 0

    def __call__(self, model: nn.Module) -> HeadScores:
        return random_scores(model, seed=self.seed)
