"""``disentangled``: DeBERTa-v2/v3's content-to-position (c2p) and position-to-content (p2c)
attention terms.

Per head, with ``r(i, j)`` the log-bucketed ``i - j`` (Hugging Face's ``build_relative_position``),
``span`` the position-embedding half size and ``E`` the (normalised) relative embeddings:

* c2p ``[i, j] = q_i . K(E)[clamp(r(i, j) + span)]``;
* p2c ``[i, j] = k_j . Q(E)[clamp(-r(j, i) + span)]``;

each divided by ``sqrt(head_dim * scale_factor)`` (``scale_factor = 1 + number of terms``), the
same scale as ``q . k``. With ``share_att_key`` (DeBERTa-v3) ``K`` / ``Q`` are the head's own key
/ query projections, so the term has no parameters of its own: the grouped attention projects
``E`` with its member weights. Otherwise (``separate_projections``) each head has its own position
projections, ``pos_key_weight [sum h, dh, D]`` / ``pos_key_bias [sum h, dh]`` for c2p and
``pos_query_*`` for p2c (packed), from ``AttentionWeights.position`` under the same names.
``config``: ``{"terms": ["c2p", "p2c"] (a subset), "span", "position_buckets",
"max_relative_positions", "scale_factor", "separate_projections", "hidden_size"}``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from hydra_ops.adapters.base import AttentionWeights

from .base import PositionContext, PositionScores, packed_offsets

#: term -> the projection of the relative embeddings it reads
_PROJECTIONS = {"c2p": "pos_key", "p2c": "pos_query"}


class DisentangledScores(PositionScores):
    name = "disentangled"

    def __init__(
        self, head_counts: Sequence[int], head_dim: int, config: Mapping[str, Any]
    ) -> None:
        super().__init__(head_counts, head_dim, config)
        separate = bool(self.config.get("separate_projections", False))
        self.projects_positions = bool(self.config["terms"]) and not separate
        self.projections: list[str] = []
        if separate:
            total, d = sum(self.head_counts), int(self.config["hidden_size"])
            for term in self.config["terms"]:
                name = _PROJECTIONS[term]
                self.register_parameter(
                    f"{name}_weight", nn.Parameter(torch.zeros(total, head_dim, d))
                )
                self.register_parameter(f"{name}_bias", nn.Parameter(torch.zeros(total, head_dim)))
                self.projections.append(name)
            members = [m for m, h in enumerate(self.head_counts) for _ in range(h)]
            self.register_buffer("member_of_head", torch.tensor(members), persistent=False)

    def load_members(self, members: Sequence[AttentionWeights]) -> None:
        offsets = packed_offsets(self.head_counts)
        with torch.no_grad():
            for m, w in enumerate(members):
                for name in self.projections:
                    for part in ("weight", "bias"):
                        key = f"{name}_{part}"
                        if w.position is None or key not in w.position:
                            raise ValueError(f"member {m} attention has no {key} position weights")
                        getattr(self, key)[offsets[m] : offsets[m + 1]] = w.position[key]

    def member_weights(self) -> list[dict[str, Tensor] | None]:
        if not self.projections:
            return super().member_weights()
        offsets = packed_offsets(self.head_counts)
        return [
            {
                f"{name}_{part}": getattr(self, f"{name}_{part}")[lo:hi].detach().clone()
                for name in self.projections
                for part in ("weight", "bias")
            }
            for lo, hi in itertools.pairwise(offsets)
        ]

    def _own_projection(self, name: str, slots: Tensor, embeddings: Tensor) -> Tensor:
        """``embeddings [E, P, D]`` through projection ``name`` of every slot's head:
        ``[G, 1, S, P, dh]`` (zeros for padding slots)."""
        own = embeddings[self.member_of_head] if embeddings.shape[0] > 1 else embeddings
        weight, bias = getattr(self, f"{name}_weight"), getattr(self, f"{name}_bias")
        projected = torch.einsum("hpd,hkd->hpk", own.expand(weight.shape[0], -1, -1), weight)
        projected = projected + bias[:, None, :]
        padded = torch.cat([projected, projected.new_zeros(1, *projected.shape[1:])])
        return padded[slots].unsqueeze(1)

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
        if self.projections:
            if "c2p" in terms:
                pos_k = self._own_projection("pos_key", slots, context.embeddings)
            if "p2c" in terms:
                pos_q = self._own_projection("pos_query", slots, context.embeddings)
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
