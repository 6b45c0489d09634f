"""The contract of a grouped attention implementation: :class:`GroupedAttention`.

A subclass stores the per-member q/k/v and output projections in its own layout, converts them
from and to per-member :class:`~hydra_ops.adapters.AttentionWeights` (``load_members`` /
``member_weights``) and computes ``[M, B, T, D] -> [M, B, T, D]`` without mixing members.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hydra_ops.adapters.base import AttentionWeights


def _zeros_like_bias(weight: Tensor) -> Tensor:
    return torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)


def _bias_or_zeros(bias: Tensor | None, weight: Tensor) -> Tensor:
    return _zeros_like_bias(weight) if bias is None else bias


def _member_attention(
    qkv: Sequence[tuple[Tensor, Tensor]], o_weight: Tensor, o_bias: Tensor, heads: int, dh: int
) -> AttentionWeights:
    """One member's :class:`AttentionWeights` from the ``(weight, bias)`` of q, k and v (in that
    order) and the output projection's weight and bias, each already sliced out of a layout."""
    (q_weight, q_bias), (k_weight, k_bias), (v_weight, v_bias) = qkv
    fields = (q_weight, q_bias, k_weight, k_bias, v_weight, v_bias, o_weight, o_bias)
    return AttentionWeights(*fields, num_heads=heads, head_dim=dh)


class GroupedAttention(nn.Module, abc.ABC):
    """Self-attention of M members over ``[M, B, T, D]`` streams, one grouped op per projection.

    ``forward(x [M, B, T, D], key_padding_mask [B, T] bool or None) -> [M, B, T, D]`` (True in the
    mask = a real token; the same mask for every member). The output includes the output
    projection's bias and is contiguous.
    """

    name: ClassVar[str]

    def __init__(self, head_counts: Sequence[int], head_dim: int, hidden_size: int) -> None:
        super().__init__()
        if not head_counts or min(head_counts) < 1:
            raise ValueError(f"head_counts must be >= 1 for every member, got {list(head_counts)}")
        self.head_counts = [int(h) for h in head_counts]
        self.head_dim = int(head_dim)
        self.hidden_size = int(hidden_size)

    @property
    def num_members(self) -> int:
        return len(self.head_counts)

    @classmethod
    def from_members(cls, members: Sequence[AttentionWeights]) -> GroupedAttention:
        first = members[0]
        hidden = first.q_weight.shape[1]
        for m, w in enumerate(members):
            if w.head_dim != first.head_dim or w.q_weight.shape[1] != hidden:
                raise ValueError(
                    f"member {m} attention has head_dim={w.head_dim}, "
                    f"hidden={w.q_weight.shape[1]}; "
                    f"member 0 has head_dim={first.head_dim}, hidden={hidden}"
                )
        module = cls([w.num_heads for w in members], first.head_dim, hidden)
        module.to(dtype=first.q_weight.dtype, device=first.q_weight.device)
        module.load_members(members)
        return module

    @abc.abstractmethod
    def load_members(self, members: Sequence[AttentionWeights]) -> None:
        """Copy per-member weights in (head counts must match ``head_counts``)."""

    @abc.abstractmethod
    def member_weights(self) -> list[AttentionWeights]:
        """Per-member weights (copies), inverse of :meth:`load_members`."""

    def num_effective_parameters(self) -> int:
        """Parameters the members really hold (padding and zero blocks not counted)."""
        d, dh = self.hidden_size, self.head_dim
        per_head = 3 * dh * (d + 1) + dh * d
        return sum(h * per_head for h in self.head_counts) + self.num_members * d

    def to_implementation(self, impl: type[GroupedAttention]) -> GroupedAttention:
        """The same attention in implementation ``impl`` (self if already so); the class by name
        is :func:`hydra_ops.hydra.grouped.attention_implementation`."""
        if isinstance(self, impl):
            return self
        return impl.from_members(self.member_weights())

    @staticmethod
    def _attend(
        q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, members: int = 1
    ) -> Tensor:
        """q, k, v ``[members*B, heads, T, dh]`` (member-major batch; any strides with a unit last
        stride) -> context ``[members*B, heads, T, dh]``.

        On CPU, ``scaled_dot_product_attention`` reads strided q/k/v as they are and returns a
        context whose memory is ``[members*B, T, heads, dh]``, so ``context.transpose(1, 2)`` is
        contiguous and flattening its heads is a view.
        """
        mask = None
        if key_padding_mask is not None:
            b, t = key_padding_mask.shape
            mask = key_padding_mask[:, None, None, :]
            if members > 1:  # [B, T] -> [M*B, 1, 1, T]: tiny (bools), the kernel needs 4-D
                mask = mask.expand(members, b, 1, 1, t).reshape(members * b, 1, 1, t)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
