"""``padded_bmm``: heads zero-padded to the largest member's count; every projection is one
batched matmul over members and attention reads strided views of it (no layout copy)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from hydra_ops.adapters.base import AttentionWeights
from hydra_ops.hydra.positions import PositionContext

from .base import GroupedAttention, _bias_or_zeros, _member_attention


class PaddedBmmAttention(GroupedAttention):
    """Heads zero-padded to ``H = max(head_counts)``; q/k/v and output are batched matmuls."""

    name = "padded_bmm"

    def __init__(self, head_counts: Sequence[int], head_dim: int, hidden_size: int) -> None:
        super().__init__(head_counts, head_dim, hidden_size)
        m, h, dh, d = self.num_members, max(self.head_counts), self.head_dim, self.hidden_size
        self.max_heads = h
        # qkv_weight[m] rows: [q heads 0..H-1 | k heads | v heads], each head dh rows.
        self.qkv_weight = nn.Parameter(torch.zeros(m, 3 * h * dh, d))
        self.qkv_bias = nn.Parameter(torch.zeros(m, 3 * h * dh))
        self.out_weight = nn.Parameter(torch.zeros(m, d, h * dh))
        self.out_bias = nn.Parameter(torch.zeros(m, d))

    def load_members(self, members: Sequence[AttentionWeights]) -> None:
        h, dh = self.max_heads, self.head_dim
        with torch.no_grad():
            self.qkv_weight.zero_()
            self.qkv_bias.zero_()
            self.out_weight.zero_()
            for m, w in enumerate(members):
                n = w.num_heads * dh
                if w.num_heads != self.head_counts[m]:
                    raise ValueError(
                        f"member {m} has {w.num_heads} heads, expected {self.head_counts[m]}"
                    )
                for part, (weight, bias) in enumerate(
                    ((w.q_weight, w.q_bias), (w.k_weight, w.k_bias), (w.v_weight, w.v_bias))
                ):
                    start = part * h * dh
                    self.qkv_weight[m, start : start + n] = weight
                    self.qkv_bias[m, start : start + n] = _bias_or_zeros(bias, weight)
                self.out_weight[m, :, :n] = w.o_weight
                self.out_bias[m] = _bias_or_zeros(w.o_bias, w.o_weight)

    def member_weights(self) -> list[AttentionWeights]:
        h, dh = self.max_heads, self.head_dim
        result = []
        for m, count in enumerate(self.head_counts):
            n = count * dh
            parts = [
                (
                    self.qkv_weight[m, p * h * dh : p * h * dh + n].detach().clone(),
                    self.qkv_bias[m, p * h * dh : p * h * dh + n].detach().clone(),
                )
                for p in range(3)
            ]
            result.append(
                _member_attention(
                    parts,
                    self.out_weight[m, :, :n].detach().clone(),
                    self.out_bias[m].detach().clone(),
                    count,
                    dh,
                )
            )
        return result

    def position_slots(self) -> list[list[int]]:
        h = self.max_heads
        offsets = [sum(self.head_counts[:m]) for m in range(self.num_members)]
        return [
            [offsets[m] + i if i < count else -1 for i in range(h)]
            for m, count in enumerate(self.head_counts)
        ]

    def _project_positions(self, embeddings: Tensor) -> tuple[Tensor, Tensor]:
        """``embeddings [1 or M, P, D]`` through every member's q and k: ``[M, 1, H, P, dh]``."""
        m, h, dh = self.num_members, self.max_heads, self.head_dim
        rows = 2 * h * dh
        projected = torch.baddbmm(
            self.qkv_bias[:, :rows].unsqueeze(1),
            embeddings.expand(m, -1, -1),
            self.qkv_weight[:, :rows].transpose(1, 2),
        )
        pos_q, pos_k = projected.view(m, 1, -1, 2, h, dh).permute(3, 0, 1, 4, 2, 5).unbind(0)
        return pos_q, pos_k

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = None,
        positions: PositionContext | None = None,
    ) -> Tensor:
        m, b, t, d = x.shape
        h, dh = self.max_heads, self.head_dim
        streams = x.reshape(m, b * t, d)  # a view (also of the expanded trunk output)
        qkv = torch.baddbmm(self.qkv_bias.unsqueeze(1), streams, self.qkv_weight.transpose(1, 2))
        # [M, B*T, 3*H*dh] is [M*B, T, 3, H, dh]: q, k, v are strided [M*B, H, T, dh] views
        q, k, v = qkv.view(m * b, t, 3, h, dh).permute(2, 0, 3, 1, 4).unbind(0)
        if self.position is None:
            context = self._attend(q, k, v, key_padding_mask, m)
        else:
            assert positions is not None, "a position-scored attention needs its PositionContext"
            pos_qk = None
            if self.position.projects_positions:
                pos_qk = self._project_positions(positions.embeddings)
            context = self._attend_positions(
                q, k, v, key_padding_mask, positions, pos_qk, self.position_slot_index, m
            )
        context = context.transpose(1, 2).reshape(m, b * t, h * dh)
        out = torch.baddbmm(self.out_bias.unsqueeze(1), context, self.out_weight.transpose(1, 2))
        return out.view(m, b, t, d)
