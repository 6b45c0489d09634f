"""``magnitude``: a baseline, the Frobenius norm of each head's attention weights."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from hydra_ops.adapters import get_adapter
from hydra_ops.heads.scores import HeadScores

from .base import HeadImportance
from .inputs import uniform_heads


def magnitude_scores(model: nn.Module) -> HeadScores:
    """Per-head weight norm: ``sqrt(|Wq_h|^2 + |Wk_h|^2 + |Wv_h|^2 + |Wo_h|^2)`` (Frobenius).

    ``Wq_h`` etc. are head ``h``'s ``head_dim`` rows of the query/key/value weights and ``Wo_h`` its
    columns of the output projection (``adapter.attention_weights(layer)``); biases are ignored.
    Returns ``scores`` ``[L, H]``, all >= 0; no data needed.
    """
    adapter = get_adapter(model)
    num_layers, num_heads = uniform_heads(adapter)
    rows = []
    for layer in range(num_layers):
        w = adapter.attention_weights(layer)
        dh = w.head_dim

        def per_head(t: Tensor, dh: int = dh) -> Tensor:
            return t.detach().float().reshape(num_heads, dh, -1).pow(2).sum(dim=(1, 2))

        sq = per_head(w.q_weight) + per_head(w.k_weight) + per_head(w.v_weight)
        sq = sq + per_head(w.o_weight.t().contiguous())
        rows.append(sq.sqrt().cpu())
    return HeadScores(torch.stack(rows), "magnitude", meta={"norm": "l2", "biases": False})


@dataclass(frozen=True)
class MagnitudeImportance(HeadImportance):
    """``magnitude`` as a criterion: ``MagnitudeImportance()(model)``; no options, no data."""

    name = "magnitude"

    def __call__(self, model: nn.Module) -> HeadScores:
        return magnitude_scores(model)
