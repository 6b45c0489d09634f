"""The contract of a relative-position attention term: :class:`PositionScores`.

Some families add a position-dependent term to every layer's attention scores (MPNet's relative
position bias, DeBERTa's disentangled content-to-position and position-to-content terms). The
family's adapter names one (``ModelAdapter.position_scores()``: ``{"kind", "config"}``), the merge
writes it to the merged network's ``architecture["positions"]``, and every grouped attention layer
then holds one :class:`PositionScores` over its members' heads.

A :class:`PositionScores` is layout-free: it holds its per-head parameters packed (member 0's
heads, then member 1's, ...). A grouped attention implementation lays its heads out in *slots*
``[G, S]`` (G groups of S slots; each slot is a packed head index, or -1 for a padding head) and
asks for the scores of those slots; the result is added to the attention logits before softmax
(as ``scaled_dot_product_attention``'s float mask).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from hydra_ops.adapters.base import AttentionWeights


@dataclass
class PositionContext:
    """What one forward's attention layers share, built once per forward by
    :meth:`PositionScores.context`.

    ``indices``: the family's ``[T, T]`` long index tensors (relative-position buckets).
    ``embeddings``: relative-position embeddings ``[E, P, D]`` (E = 1, or one per member) that
    the attention projects with each member's query/key weights, or None.
    """

    indices: dict[str, Tensor] = field(default_factory=dict)
    embeddings: Tensor | None = None


class PositionScores(nn.Module, abc.ABC):
    """The additive position term of one grouped attention layer.

    ``forward(slots [G, S], q, k [G, B, S, T, dh], pos_q, pos_k [G, 1, S, P, dh] or None,
    context) -> [G, B or 1, S, T, T]`` (or None: no additive term), to be added to the attention
    logits ``q . k * softmax_scale()``. ``pos_q`` / ``pos_k`` are ``context.embeddings``
    projected by each slot's own query / key weights, given when :attr:`projects_positions`.
    """

    name: ClassVar[str]
    #: Whether the attention must project ``context.embeddings`` with its query/key weights.
    projects_positions: bool = False

    def __init__(
        self, head_counts: Sequence[int], head_dim: int, config: Mapping[str, Any]
    ) -> None:
        super().__init__()
        self.head_counts = [int(h) for h in head_counts]
        self.head_dim = int(head_dim)
        self.config = dict(config)

    @classmethod
    @abc.abstractmethod
    def context(
        cls,
        config: Mapping[str, Any],
        length: int,
        device: torch.device,
        embeddings: Tensor | None,
    ) -> PositionContext:
        """The per-forward context for sequences of ``length`` tokens (``embeddings [E, P, D]``:
        the embedding stages' :meth:`~hydra_ops.adapters.EmbeddingStage.relative_embeddings`)."""

    def softmax_scale(self) -> float:
        """The factor of ``q . k`` in the attention logits (default ``1 / sqrt(head_dim)``)."""
        return 1.0 / math.sqrt(self.head_dim)

    def load_members(self, members: Sequence[AttentionWeights]) -> None:
        """Copy each member's ``AttentionWeights.position`` in (families with parameters)."""

    def member_weights(self) -> list[dict[str, Tensor] | None]:
        """Per-member ``position`` parts (copies), inverse of :meth:`load_members`."""
        return [None for _ in self.head_counts]

    @abc.abstractmethod
    def forward(
        self,
        slots: Tensor,
        q: Tensor,
        k: Tensor,
        pos_q: Tensor | None,
        pos_k: Tensor | None,
        context: PositionContext,
    ) -> Tensor | None: ...


def packed_offsets(head_counts: Sequence[int]) -> list[int]:
    """Start of each member's heads in the packed order (and the total at the end)."""
    offsets = [0]
    for count in head_counts:
        offsets.append(offsets[-1] + int(count))
    return offsets
