"""``relative_bias``: MPNet's learned relative position bias, one scalar per (head, bucket).

Hugging Face MPNet keeps one ``relative_attention_bias`` table ``[buckets, heads]`` shared by every
layer and buckets the signed distance ``key - query`` with
``MPNetEncoder.relative_position_bucket`` (at its default 32 buckets, which is what
``MPNetEncoder.compute_position_bias`` uses whatever the config says). A pruned layer reads its
kept heads' columns, so the merged layer stores those columns per member head:
``bias [sum(h_m), buckets]`` (packed), from ``AttentionWeights.position["relative_bias"]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hydra_ops.adapters.base import AttentionWeights

from .base import PositionContext, PositionScores, packed_offsets

#: The bucket count ``MPNetEncoder.compute_position_bias`` passes to the bucketing.
HF_MPNET_BUCKETS = 32


class RelativeBiasScores(PositionScores):
    """``config``: ``{"num_buckets": rows of the bias table}``; parameter ``bias [sum h, rows]``."""

    name = "relative_bias"

    def __init__(
        self, head_counts: Sequence[int], head_dim: int, config: Mapping[str, Any]
    ) -> None:
        super().__init__(head_counts, head_dim, config)
        self.bias = nn.Parameter(torch.zeros(sum(self.head_counts), int(config["num_buckets"])))

    @classmethod
    def context(
        cls,
        config: Mapping[str, Any],
        length: int,
        device: torch.device,
        embeddings: Tensor | None,
    ) -> PositionContext:
        from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

        position = torch.arange(length, dtype=torch.long, device=device)
        relative = position[None, :] - position[:, None]  # key - query
        bucket = MPNetEncoder.relative_position_bucket(relative, num_buckets=HF_MPNET_BUCKETS)
        return PositionContext(indices={"bucket": bucket})

    def load_members(self, members: Sequence[AttentionWeights]) -> None:
        offsets = packed_offsets(self.head_counts)
        with torch.no_grad():
            for m, w in enumerate(members):
                if w.position is None or "relative_bias" not in w.position:
                    raise ValueError(f"member {m} attention has no relative_bias position weights")
                self.bias[offsets[m] : offsets[m + 1]] = w.position["relative_bias"]

    def member_weights(self) -> list[dict[str, Tensor] | None]:
        offsets = packed_offsets(self.head_counts)
        return [
            {"relative_bias": self.bias[offsets[m] : offsets[m + 1]].detach().clone()}
            for m in range(len(self.head_counts))
        ]

    def forward(
        self,
        slots: Tensor,
        q: Tensor,
        k: Tensor,
        pos_q: Tensor | None,
        pos_k: Tensor | None,
        context: PositionContext,
    ) -> Tensor:
        table = F.pad(self.bias, (0, 0, 0, 1))  # a zero row: padding slots (-1) read it
        return table[slots][..., context.indices["bucket"]].unsqueeze(1)  # [G, 1, S, T, T]
