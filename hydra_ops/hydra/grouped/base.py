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
from hydra_ops.hydra.positions import PositionContext, PositionScores


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

    ``forward(x [M, B, T, D], key_padding_mask [B, T] bool or None, positions=None) ->
    [M, B, T, D]`` (True in the mask = a real token; the same mask for every member). The output
    includes the output projection's bias and is contiguous.

    A family with a relative-position term attaches a
    :class:`~hydra_ops.hydra.positions.PositionScores` (:meth:`attach_position`); ``forward``
    then takes that forward's :class:`~hydra_ops.hydra.positions.PositionContext` as
    ``positions``, and each implementation lays its heads out in :meth:`position_slots` and adds
    the term to the logits (:meth:`_attend_positions`). Without one, nothing changes.
    """

    name: ClassVar[str]
    position: PositionScores | None

    def __init__(self, head_counts: Sequence[int], head_dim: int, hidden_size: int) -> None:
        super().__init__()
        if not head_counts or min(head_counts) < 1:
            raise ValueError(f"head_counts must be >= 1 for every member, got {list(head_counts)}")
        self.head_counts = [int(h) for h in head_counts]
        self.head_dim = int(head_dim)
        self.hidden_size = int(hidden_size)
        self.position = None

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
        converted = impl.from_members(self.member_weights())
        if self.position is not None:
            converted.attach_position(self.position)
        return converted

    # ----- relative-position term ------------------------------------------------------------
    def position_slots(self) -> list[list[int]]:
        """This layout's head slots ``[G][S]``: packed head index per slot, -1 for padding (an
        implementation that runs position scores overrides it, and its forward passes them)."""
        raise ValueError(
            f"attention implementation {self.name!r} does not run relative-position scores"
        )

    def attach_position(self, position: PositionScores) -> None:
        """Add ``position``'s term (over these members' heads) to every forward's logits."""
        if position.head_counts != self.head_counts or position.head_dim != self.head_dim:
            raise ValueError(
                f"position scores cover heads {position.head_counts} of size "
                f"{position.head_dim}; this attention has {self.head_counts} of {self.head_dim}"
            )
        self.position = position
        device = next(iter(self.parameters())).device
        slots = torch.tensor(self.position_slots(), dtype=torch.long, device=device)
        self.register_buffer("position_slot_index", slots, persistent=False)

    def _attend_positions(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None,
        positions: PositionContext,
        pos_qk: tuple[Tensor, Tensor] | None,
        slots: Tensor,
        groups: int,
    ) -> Tensor:
        """:meth:`_attend` with the position term: q, k, v ``[G*B, S, T, dh]`` over ``slots``
        ``[G, S]``; ``pos_qk``: the position embeddings projected by each slot's query and key
        weights, ``[G, 1, S, P, dh]`` each (when the term projects positions)."""
        assert self.position is not None
        gb, _, t, _ = q.shape
        b = gb // groups
        pos_q, pos_k = pos_qk if pos_qk is not None else (None, None)
        scores = self.position(
            slots, q.unflatten(0, (groups, b)), k.unflatten(0, (groups, b)), pos_q, pos_k, positions
        )
        mask = scores
        if key_padding_mask is not None:
            pad = torch.zeros(b, t, dtype=q.dtype, device=q.device)
            pad = pad.masked_fill(~key_padding_mask, float("-inf"))[None, :, None, None, :]
            mask = pad.expand(groups, b, 1, 1, t) if mask is None else mask + pad
        if mask is not None and groups == 1:
            mask = mask[0]  # [B or 1, S or 1, T or 1, T]: broadcast by the kernel, no copy
        elif mask is not None:
            mask = mask.expand(groups, b, *mask.shape[2:]).reshape(gb, *mask.shape[2:])
        scale = self.position.softmax_scale()
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        # a copy with memory [G*B, T, S, dh], as _attend's: the callers flatten the heads as a
        # view, which an exported graph needs whatever layout its attention kernel writes
        return context.transpose(1, 2).clone(memory_format=torch.contiguous_format).transpose(1, 2)

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
