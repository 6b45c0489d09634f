"""``member_gemm``: per-member weights, each projection M plain GEMMs on the slices ``x[m]``; and
:class:`MemberGemmMLP`, the same idea for the MLP (measured by the benchmark, not merged)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hydra_ops.adapters.base import AttentionWeights
from hydra_ops.hydra.positions import PositionContext

from .base import GroupedAttention, _bias_or_zeros
from .layers import GroupedLinear, GroupedMLP, _activate


class MemberGemmAttention(GroupedAttention):
    """Per-member weights with no padding; each projection is M plain GEMMs (``F.linear``).

    On small-core CPUs M separate GEMMs can beat one ``bmm`` over ``[M, B*T, D]`` (see
    docs/benchmarks.md). Member ``m`` holds ``qkv_weight_{m} [3*h_m*dh, D]`` (rows: q heads,
    then k, then v), ``qkv_bias_{m}``, ``out_weight_{m} [D, h_m*dh]`` and ``out_bias_{m} [D]``.
    Exactly the same computation as the other implementations; attention is one
    ``scaled_dot_product_attention`` per member.
    """

    name = "member_gemm"

    def __init__(self, head_counts: Sequence[int], head_dim: int, hidden_size: int) -> None:
        super().__init__(head_counts, head_dim, hidden_size)
        d, dh = self.hidden_size, self.head_dim
        # Plain attributes (not ParameterList) so parameter counting sees them on this module.
        for m, h in enumerate(self.head_counts):
            self.register_parameter(f"qkv_weight_{m}", nn.Parameter(torch.zeros(3 * h * dh, d)))
            self.register_parameter(f"qkv_bias_{m}", nn.Parameter(torch.zeros(3 * h * dh)))
            self.register_parameter(f"out_weight_{m}", nn.Parameter(torch.zeros(d, h * dh)))
            self.register_parameter(f"out_bias_{m}", nn.Parameter(torch.zeros(d)))

    def _member(self, m: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(qkv_weight, qkv_bias, out_weight, out_bias)`` of member ``m``."""
        return (
            getattr(self, f"qkv_weight_{m}"),
            getattr(self, f"qkv_bias_{m}"),
            getattr(self, f"out_weight_{m}"),
            getattr(self, f"out_bias_{m}"),
        )

    def load_members(self, members: Sequence[AttentionWeights]) -> None:
        with torch.no_grad():
            for m, w in enumerate(members):
                if w.num_heads != self.head_counts[m]:
                    raise ValueError(
                        f"member {m} has {w.num_heads} heads, expected {self.head_counts[m]}"
                    )
                qkv_weight, qkv_bias, out_weight, out_bias = self._member(m)
                qkv_weight.copy_(torch.cat([w.q_weight, w.k_weight, w.v_weight]))
                qkv_bias.copy_(
                    torch.cat(
                        [
                            _bias_or_zeros(w.q_bias, w.q_weight),
                            _bias_or_zeros(w.k_bias, w.k_weight),
                            _bias_or_zeros(w.v_bias, w.v_weight),
                        ]
                    )
                )
                out_weight.copy_(w.o_weight)
                out_bias.copy_(_bias_or_zeros(w.o_bias, w.o_weight))

    def member_weights(self) -> list[AttentionWeights]:
        result = []
        for m, count in enumerate(self.head_counts):
            n = count * self.head_dim
            qkv, bias, out_weight, out_bias = (p.detach() for p in self._member(m))
            result.append(
                AttentionWeights(
                    q_weight=qkv[:n].clone(),
                    q_bias=bias[:n].clone(),
                    k_weight=qkv[n : 2 * n].clone(),
                    k_bias=bias[n : 2 * n].clone(),
                    v_weight=qkv[2 * n :].clone(),
                    v_bias=bias[2 * n :].clone(),
                    o_weight=out_weight.clone(),
                    o_bias=out_bias.clone(),
                    num_heads=count,
                    head_dim=self.head_dim,
                )
            )
        return result

    def position_slots(self) -> list[list[int]]:
        # one row per member (G = 1 per call), padded with -1 to the longest; each call slices
        # its member's row to its head count
        h = max(self.head_counts)
        offsets = [sum(self.head_counts[:m]) for m in range(self.num_members)]
        return [
            [offsets[m] + i if i < count else -1 for i in range(h)]
            for m, count in enumerate(self.head_counts)
        ]

    def _member_positions(
        self, member: int, qkv_weight: Tensor, qkv_bias: Tensor, positions: PositionContext
    ) -> tuple[Tensor, Tensor]:
        """Member ``member``'s view of the position embeddings through its q and k:
        ``[1, 1, h_m, P, dh]`` each."""
        h, dh = self.head_counts[member], self.head_dim
        embeddings = positions.embeddings
        rows = 2 * h * dh
        own = embeddings[member if embeddings.shape[0] > 1 else 0]
        projected = F.linear(own, qkv_weight[:rows], qkv_bias[:rows])
        pos_q, pos_k = projected.view(-1, 2, h, dh).permute(1, 2, 0, 3).unbind(0)
        return pos_q[None, None], pos_k[None, None]

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = None,
        positions: PositionContext | None = None,
    ) -> Tensor:
        _, b, t, _ = x.shape
        dh = self.head_dim
        outs = []
        for member, h in enumerate(self.head_counts):
            qkv_weight, qkv_bias, out_weight, out_bias = self._member(member)
            qkv = F.linear(x[member], qkv_weight, qkv_bias)
            q, k, v = qkv.view(b, t, 3, h, dh).permute(2, 0, 3, 1, 4).unbind(0)
            if self.position is None:
                context = self._attend(q, k, v, key_padding_mask)
            else:
                assert positions is not None, "a position-scored attention needs its context"
                pos_qk = None
                if self.position.projects_positions:
                    pos_qk = self._member_positions(member, qkv_weight, qkv_bias, positions)
                slots = self.position_slot_index[member : member + 1, :h]
                context = self._attend_positions(
                    q, k, v, key_padding_mask, positions, pos_qk, slots, 1
                )
            context = context.transpose(1, 2).reshape(b, t, h * dh)
            outs.append(F.linear(context, out_weight, out_bias))
        return torch.stack(outs)


class MemberGemmMLP(nn.Module):
    """A per-member MLP run as M plain GEMM pairs (alternative to :class:`GroupedMLP`'s ``bmm``).

    Built from a :class:`GroupedMLP` (``MemberGemmMLP.from_grouped``); ``forward(x [M, B, T, D])``
    computes exactly what that module computes. Shared (non-per-member) layers stay one GEMM over
    all streams. Not wired into the merge: the benchmark swaps it in to measure it.
    """

    def __init__(self, grouped: GroupedMLP) -> None:
        super().__init__()
        self.activation = grouped.activation
        self.fc1 = grouped.fc1
        self.fc2 = grouped.fc2

    @classmethod
    def from_grouped(cls, grouped: GroupedMLP) -> MemberGemmMLP:
        return cls(grouped)

    @staticmethod
    def _apply(layer: GroupedLinear, x: Tensor) -> Tensor:
        if not layer.per_member:
            return F.linear(x, layer.weight, layer.bias)
        outs = [
            F.linear(x[m], layer.weight[m], None if layer.bias is None else layer.bias[m])
            for m in range(x.shape[0])
        ]
        return torch.stack(outs)

    def forward(self, x: Tensor) -> Tensor:
        return self._apply(self.fc2, _activate(self.activation, self._apply(self.fc1, x)))
