"""``disentangled``: DeBERTa-v2/v3's content-to-position (c2p) and position-to-content (p2c)
attention terms, with query/key projections shared by tokens and positions (``share_att_key``).

Per head, with ``r(i, j)`` the log-bucketed ``i - j`` (Hugging Face's ``build_relative_position``),
``span`` the position-embedding half size and ``E`` the (normalised) relative embeddings:

* c2p ``[i, j] = q_i . K(E)[clamp(r(i, j) + span)]``;
* p2c ``[i, j] = k_j . Q(E)[clamp(-r(j, i) + span)]``;

each divided by ``sqrt(head_dim * scale_factor)`` (``scale_factor = 1 + number of terms``), the
same scale as ``q . k``. ``K`` / ``Q`` are the head's own key / query projections, so the term has
no parameters of its own: the grouped attention projects ``E`` with its member weights.
``config``: ``{"terms": ["c2p", "p2c"] (a subset), "span", "position_buckets",
"max_relative_positions", "scale_factor"}``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from .base import PositionContext, PositionScores


class DisentangledScores(PositionScores):
    name = "disentangled"

    def __init__(
        self, head_counts: Sequence[int], head_dim: int, config: Mapping[str, Any]
    ) -> None:
        super().__init__(head_counts, head_dim, config)
        self.projects_positions = bool(self.config["terms"])

    def softmax_scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim * int(self.config["scale_factor"]))

    @classmethod
    def context(
        cls,
        config: Mapping[str, Any],
        length: int,
        device: torch.device,
        embeddings: Tensor | None,
    ) -> PositionContext:
        from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

        if not config["terms"]:
            return PositionContext()
        span = int(config["span"])
        tokens = torch.empty(length, 0, device=device)  # build_relative_position reads sizes only
        relative = build_relative_position(
            tokens,
            tokens,
            bucket_size=int(config["position_buckets"]),
            max_position=int(config["max_relative_positions"]),
        )[0]
        if embeddings is None:
            raise ValueError("disentangled position scores need relative embeddings")
        return PositionContext(
            indices={
                "c2p": torch.clamp(relative + span, 0, 2 * span - 1),
                "p2c": torch.clamp(-relative + span, 0, 2 * span - 1),
            },
            embeddings=embeddings[:, : 2 * span],
        )

    def forward(
        self,
        slots: Tensor,
        q: Tensor,
        k: Tensor,
        pos_q: Tensor | None,
        pos_k: Tensor | None,
        context: PositionContext,
    ) -> Tensor | None:
        terms = self.config["terms"]
        if not terms:
            return None
        score: Tensor | None = None
        if "c2p" in terms:
            c2p = torch.matmul(q, pos_k.transpose(-1, -2))  # [G, B, S, T, P]
            index = context.indices["c2p"].expand(*c2p.shape[:-1], q.shape[-2])
            score = c2p.gather(-1, index)
        if "p2c" in terms:
            p2c = torch.matmul(k, pos_q.transpose(-1, -2))  # [G, B, S, T(key), P]
            index = context.indices["p2c"].expand(*p2c.shape[:-1], k.shape[-2])
            p2c = p2c.gather(-1, index).transpose(-1, -2)
            score = p2c if score is None else score + p2c
        return score * self.softmax_scale()
