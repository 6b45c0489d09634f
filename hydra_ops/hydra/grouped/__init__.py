"""Grouped (block-diagonal) layers over M member streams.

Every tensor of streams is laid out member-major, ``[M, B, T, D]``: member, batch, token, feature
(contiguous). Member ``m``'s stream only ever meets member ``m``'s weights; nothing here mixes
members. Member-major is what a batched matmul over members reads and writes directly:
``[M, B, T, D]`` is ``[M, B*T, D]`` without a copy, so per-member projections, MLPs and norms go
from one to the next without materialising a transposed copy of the activations.

Attention implementations (``ATTENTION_IMPLEMENTATIONS``, selected by name), all exact:

* ``padded_bmm``: every member's heads are zero-padded to ``H = max_m h_m`` heads; q/k/v of all
  members is ONE batched matmul ``[M, B*T, D] x [M, D, 3*H*dh]``, attention runs on strided views
  ``[M*B, H, T, dh]`` of its output and the output projection is one more batched matmul that reads
  the attention output in place. A padded head has zero q/k/v weights and bias, so its context is
  exactly 0, and its output-projection columns are 0: padding changes nothing but wastes
  ``(M*H - sum h_m)`` heads of work when counts differ. No layout copy at all.
* ``member_gemm``: per-member weights, no padding; each projection is M plain GEMMs on the
  contiguous slices ``x[m]``; one stack of the M outputs per layer.
* ``block_diagonal``: the streams are concatenated along features (``[B, T, M*D]``: one permuting
  copy in, one out) and the heads of all members are packed without padding (``sum h_m`` heads);
  q/k/v is ONE dense matmul with a block-diagonal ``[3*sum(h_m)*dh, M*D]`` weight and the output
  projection one with a block-diagonal ``[M*D, sum(h_m)*dh]`` weight. No padding, but the zero
  blocks are multiplied.

All read and write the same per-member :class:`~hydra_ops.adapters.AttentionWeights`, so a model
can switch implementation (``to_implementation``) without changing what it computes.

Files: ``base.py`` (the :class:`GroupedAttention` contract), one file per implementation
(``padded_bmm.py``, ``member_gemm.py``, ``block_diagonal.py``) and ``layers.py`` (the per-member
linear, norm and MLP layers every implementation shares).
"""

from __future__ import annotations

from hydra_ops.registry import Registry

from .base import GroupedAttention
from .block_diagonal import BlockDiagonalAttention
from .layers import GroupedLayerNorm, GroupedLinear, GroupedMLP
from .member_gemm import MemberGemmAttention, MemberGemmMLP
from .padded_bmm import PaddedBmmAttention

__all__ = [
    "ATTENTION_IMPLEMENTATIONS",
    "BlockDiagonalAttention",
    "GroupedAttention",
    "GroupedLayerNorm",
    "GroupedLinear",
    "GroupedMLP",
    "MemberGemmAttention",
    "MemberGemmMLP",
    "PaddedBmmAttention",
    "attention_implementation",
]

#: The grouped attention implementations by name (``ATTENTION_IMPLEMENTATIONS.register(name,
#: cls)`` adds one: a :class:`GroupedAttention` subclass).
ATTENTION_IMPLEMENTATIONS: Registry[type[GroupedAttention]] = Registry("attention")
for _implementation in (PaddedBmmAttention, BlockDiagonalAttention, MemberGemmAttention):
    ATTENTION_IMPLEMENTATIONS.register(_implementation.name, _implementation)


def attention_implementation(name: str) -> type[GroupedAttention]:
    """The grouped attention class registered as ``name`` (ValueError naming them otherwise)."""
    return ATTENTION_IMPLEMENTATIONS.get(name, "attention")
