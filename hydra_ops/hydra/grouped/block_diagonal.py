"""``block_diagonal``: the members' heads packed without padding; every projection is one dense
matmul with a block-diagonal weight over the feature-concatenated streams ``[B, T, M*D]``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hydra_ops.adapters.base import AttentionWeights
from hydra_ops.hydra.positions import PositionContext

from .base import GroupedAttention, _bias_or_zeros, _member_attention


class BlockDiagonalAttention(GroupedAttention):
    """Packed heads (no padding); q/k/v and output are dense matmuls with block-diagonal weights."""

    name = "block_diagonal"

    def __init__(self, head_counts: Sequence[int], head_dim: int, hidden_size: int) -> None:
        super().__init__(head_counts, head_dim, hidden_size)
        m, dh, d = self.num_members, self.head_dim, self.hidden_size
        self.total_heads = sum(self.head_counts)
        n = self.total_heads * dh
        # qkv_weight rows: [q of all packed heads | k | v]; head offsets follow member order.
        self.qkv_weight = nn.Parameter(torch.zeros(3 * n, m * d))
        self.qkv_bias = nn.Parameter(torch.zeros(3 * n))
        self.out_weight = nn.Parameter(torch.zeros(m * d, n))
        self.out_bias = nn.Parameter(torch.zeros(m * d))

    def _offsets(self) -> list[int]:
        offsets = [0]
        for count in self.head_counts:
            offsets.append(offsets[-1] + count * self.head_dim)
        return offsets

    def load_members(self, members: Sequence[AttentionWeights]) -> None:
        d, n = self.hidden_size, self.total_heads * self.head_dim
        offsets = self._offsets()
        with torch.no_grad():
            self.qkv_weight.zero_()
            self.qkv_bias.zero_()
            self.out_weight.zero_()
            for m, w in enumerate(members):
                if w.num_heads != self.head_counts[m]:
                    raise ValueError(
                        f"member {m} has {w.num_heads} heads, expected {self.head_counts[m]}"
                    )
                lo, hi = offsets[m], offsets[m + 1]
                cols = slice(m * d, (m + 1) * d)
                for part, (weight, bias) in enumerate(
                    ((w.q_weight, w.q_bias), (w.k_weight, w.k_bias), (w.v_weight, w.v_bias))
                ):
                    self.qkv_weight[part * n + lo : part * n + hi, cols] = weight
                    self.qkv_bias[part * n + lo : part * n + hi] = _bias_or_zeros(bias, weight)
                self.out_weight[cols, lo:hi] = w.o_weight
                self.out_bias[cols] = _bias_or_zeros(w.o_bias, w.o_weight)

    def member_weights(self) -> list[AttentionWeights]:
        d, n, dh = self.hidden_size, self.total_heads * self.head_dim, self.head_dim
        offsets = self._offsets()
        result = []
        for m, count in enumerate(self.head_counts):
            lo, hi = offsets[m], offsets[m + 1]
            cols = slice(m * d, (m + 1) * d)
            parts = [
                (
                    self.qkv_weight[p * n + lo : p * n + hi, cols].detach().clone(),
                    self.qkv_bias[p * n + lo : p * n + hi].detach().clone(),
                )
                for p in range(3)
            ]
            result.append(
                _member_attention(
                    parts,
                    self.out_weight[cols, lo:hi].detach().clone(),
                    self.out_bias[cols].detach().clone(),
                    count,
                    dh,
                )
            )
        return result

    def position_slots(self) -> list[list[int]]:
        return [list(range(self.total_heads))]

    def _project_positions(self, embeddings: Tensor) -> tuple[Tensor, Tensor]:
        """``embeddings [1 or M, P, D]`` through every packed head's q and k:
        ``[1, 1, sum(h_m), P, dh]`` each."""
        m, d = self.num_members, self.hidden_size
        heads, dh = self.total_heads, self.head_dim
        rows = 2 * heads * dh
        p = embeddings.shape[1]
        streams = embeddings.expand(m, p, d).transpose(0, 1).reshape(p, m * d)
        projected = F.linear(streams, self.qkv_weight[:rows], self.qkv_bias[:rows])
        pos_q, pos_k = projected.view(p, 2, heads, dh).permute(1, 2, 0, 3).unbind(0)
        return pos_q[None, None], pos_k[None, None]

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = None,
        positions: PositionContext | None = None,
    ) -> Tensor:
        m, b, t, d = x.shape
        heads, dh = self.total_heads, self.head_dim
        streams = x.permute(1, 2, 0, 3).reshape(b, t, m * d)  # the copy in
        qkv = F.linear(streams, self.qkv_weight, self.qkv_bias)
        q, k, v = qkv.view(b, t, 3, heads, dh).permute(2, 0, 3, 1, 4).unbind(0)
        if self.position is None:
            context = self._attend(q, k, v, key_padding_mask)
        else:
            assert positions is not None, "a position-scored attention needs its PositionContext"
            pos_qk = None
            if self.position.projects_positions:
                pos_qk = self._project_positions(positions.embeddings)
            context = self._attend_positions(
                q, k, v, key_padding_mask, positions, pos_qk, self.position_slot_index, 1
            )
        context = context.transpose(1, 2).reshape(b, t, heads * dh)
        out = F.linear(context, self.out_weight, self.out_bias)
        return out.view(b, t, m, d).permute(2, 0, 1, 3).contiguous()  # the copy out
