"""The merged network: :class:`HydraEnsemble`, M pruned members run as one model.

Streams are laid out member-major, ``[M, B, T, D]``, from the embedding to the classifier, so every
per-member projection, MLP and norm reads the previous one's output as it is (no transposed copies).
Per layer, every member's q/k/v and output projections run as ONE grouped op (see
:mod:`hydra_ops.hydra.grouped`); attention never mixes members; one forward returns member logits
``[B, M, C]``.

The network is built from its ``architecture`` description alone (what
:func:`~hydra_ops.hydra.merge.merge_members` writes and ``hydra.json`` stores): per block, the
attention head counts and implementation and whether each norm / MLP layer is per member; the
embedding stage(s); the head; for a family whose attention has a relative-position term,
``positions`` (``{"kind", "config"}``, a :data:`~hydra_ops.hydra.positions.POSITION_SCORES` entry:
every block's attention gets one, and its per-forward context is built once). A per-member layer
holds ``[M, ...]`` parameters; a shared one is stored once and run once per stream. With a shared
trunk (``shared_layers = k``) the first ``k`` blocks run once on ``[1, B, T, D]`` and the streams
fork after them (an expanded view, no copy).

The network is for inference: it has no dropout.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from hydra_ops.adapters import ACTIVATIONS, embedding_stage_from_config
from hydra_ops.heads.plans import HeadPlan
from hydra_ops.uq.calibration import ensemble_probs
from hydra_ops.uq.uncertainty import decompose

from .grouped import (
    GroupedAttention,
    GroupedLayerNorm,
    GroupedLinear,
    GroupedMLP,
    attention_implementation,
)
from .positions import PositionContext, position_scores_class


class HydraBlock(nn.Module):
    """One transformer block over ``[M, B, T, D]`` streams (pre- or post-norm, see BlockWeights)."""

    def __init__(
        self,
        norm_first: bool,
        attention: GroupedAttention,
        attn_norm: GroupedLayerNorm,
        mlp: GroupedMLP,
        mlp_norm: GroupedLayerNorm,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.attention = attention
        self.attn_norm = attn_norm
        self.mlp = mlp
        self.mlp_norm = mlp_norm

    def forward(
        self, x: Tensor, key_padding_mask: Tensor | None, positions: PositionContext | None = None
    ) -> Tensor:
        if self.norm_first:
            x = x + self.attention(self.attn_norm(x), key_padding_mask, positions=positions)
            return x + self.mlp(self.mlp_norm(x))
        x = self.attn_norm(x + self.attention(x, key_padding_mask, positions=positions))
        return self.mlp_norm(x + self.mlp(x))


class HydraClassifier(nn.Module):
    """Classification head over ``[M, B, T, D]`` -> ``[M, B, C]`` (see ClassifierWeights)."""

    def __init__(
        self,
        final_norm: GroupedLayerNorm | None,
        pool: str,
        num_prefix_tokens: int,
        pre_classifier: GroupedLinear | None,
        pre_activation: str | None,
        fc_norm: GroupedLayerNorm | None,
        classifier: GroupedLinear,
    ) -> None:
        super().__init__()
        self.final_norm = final_norm
        self.pool = pool
        self.num_prefix_tokens = num_prefix_tokens
        self.pre_classifier = pre_classifier
        self.pre_activation = pre_activation
        self.fc_norm = fc_norm
        self.classifier = classifier

    def forward(self, x: Tensor) -> Tensor:
        if self.final_norm is not None:
            x = self.final_norm(x)
        x = x[:, :, 0] if self.pool == "cls" else x[:, :, self.num_prefix_tokens :].mean(dim=2)
        if self.pre_classifier is not None:
            x = self.pre_classifier(x)
            if self.pre_activation is not None:
                x = ACTIVATIONS[self.pre_activation](x)
        if self.fc_norm is not None:
            x = self.fc_norm(x)
        return self.classifier(x)


class HydraEnsemble(nn.Module):
    """M pruned members fused into one network.

    ``forward(inputs, attention_mask=None, token_type_ids=None) -> member logits [B, M, C]``, where
    ``inputs`` is ``input_ids [B, T]`` (text) or ``pixel_values [B, C, H, W]`` (images) and
    ``attention_mask [B, T]`` marks real tokens with 1.

    Build it with :func:`hydra_ops.hydra.merge.merge_members`, or from a saved directory with
    :func:`hydra_ops.hydra.serialization.load_hydra`.
    """

    def __init__(self, architecture: dict[str, Any], embeddings: nn.Module | None = None) -> None:
        """Build the (untrained) network described by ``architecture``; ``embeddings``, when
        given, is used as the embedding stage(s) instead of building new ones."""
        super().__init__()
        self.architecture = architecture
        arch = architecture
        m = int(arch["num_members"])
        self.num_members = m
        self.family = arch["family"]
        self.modality = arch["modality"]
        self.mode = arch["mode"]
        self.plans = [HeadPlan.from_dict(p) for p in arch["plans"]]
        self.positions = arch.get("positions")
        emb = arch["embedding"]
        if embeddings is not None:
            self.embeddings = embeddings
        elif emb["per_member"]:
            self.embeddings: nn.Module = nn.ModuleList(
                embedding_stage_from_config(self.family, emb["config"]) for _ in range(m)
            )
        else:
            self.embeddings = embedding_stage_from_config(self.family, emb["config"])
        self.trunk = nn.ModuleList(_block_from_arch(b, arch) for b in arch["trunk"])
        self.blocks = nn.ModuleList(_block_from_arch(b, arch) for b in arch["blocks"])
        self.head = _head_from_arch(arch["head"], arch)
        self.register_buffer("temperature", torch.ones(()), persistent=True)
        self.eval()

    # ----- properties ------------------------------------------------------------------------
    @property
    def shared_layers(self) -> int:
        return len(self.trunk)

    @property
    def attention_implementation(self) -> str:
        return self.blocks[0].attention.name

    @property
    def class_names(self) -> list[str] | None:
        return self.architecture.get("class_names")

    def num_parameters(self, effective: bool = True) -> int:
        """Parameter count; ``effective`` skips the zeros that attention padding or
        block-diagonal storage adds (what the members really hold)."""
        if not effective:
            return sum(p.numel() for p in self.parameters())
        total = 0
        for module in self.modules():
            if isinstance(module, GroupedAttention):
                total += module.num_effective_parameters()
            else:
                total += sum(p.numel() for p in module.parameters(recurse=False))
        return total

    def set_temperature(self, temperature: float) -> None:
        """Set the calibration temperature used by :meth:`predict_proba` (must be > 0)."""
        value = float(temperature)
        if not value > 0 or value != value:
            raise ValueError(f"temperature must be a positive number, got {temperature!r}")
        self.temperature.fill_(value)

    def set_attention_implementation(self, name: str) -> HydraEnsemble:
        """Switch every layer's grouped attention to implementation ``name`` (in place)."""
        impl = attention_implementation(name)
        for block in [*self.trunk, *self.blocks]:
            block.attention = block.attention.to_implementation(impl)
        for block_arch in [*self.architecture["trunk"], *self.architecture["blocks"]]:
            block_arch["attention"]["implementation"] = name
        return self

    # ----- forward -----------------------------------------------------------------------------
    def forward(
        self,
        inputs: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        mask = None if attention_mask is None else attention_mask.to(torch.bool)
        # streams [M, B, T, D] (member-major, see hydra_ops.hydra.grouped)
        if isinstance(self.embeddings, nn.ModuleList):
            x = torch.stack(
                [stage(inputs, attention_mask, token_type_ids) for stage in self.embeddings]
            )
        else:
            x = self.embeddings(inputs, attention_mask, token_type_ids).unsqueeze(0)
        positions = None if self.positions is None else self._position_context(x.shape[2], x)
        if not isinstance(self.embeddings, nn.ModuleList):
            for block in self.trunk:
                x = block(x, mask, positions=positions)
            x = x.expand(self.num_members, -1, -1, -1)
        for block in self.blocks:
            x = block(x, mask, positions=positions)
        return self.head(x).transpose(0, 1).contiguous()

    def _position_context(self, length: int, like: Tensor) -> PositionContext:
        """The relative-position context every block's attention shares in one forward."""
        stages = (
            self.embeddings if isinstance(self.embeddings, nn.ModuleList) else [self.embeddings]
        )
        relative = [stage.relative_embeddings() for stage in stages]
        embeddings = None if relative[0] is None else torch.stack(relative).to(like.dtype)
        spec = self.positions
        return position_scores_class(spec["kind"]).context(
            spec["config"], length, like.device, embeddings
        )

    def batch_logits(self, batch: dict[str, Tensor]) -> Tensor:
        """Member logits ``[B, M, C]`` of one contract batch (``pixel_values``, or ``input_ids``
        with optional ``attention_mask`` / ``token_type_ids``; ``labels`` ignored): what
        :func:`hydra_ops.models.inference.logits` calls."""
        if "pixel_values" in batch:
            return self(batch["pixel_values"])
        if "input_ids" not in batch:
            raise ValueError(
                f"batch must hold 'input_ids' or 'pixel_values', got keys {sorted(batch)}"
            )
        return self(
            batch["input_ids"],
            attention_mask=batch.get("attention_mask"),
            token_type_ids=batch.get("token_type_ids"),
        )

    @torch.no_grad()
    def predict_proba(
        self,
        inputs: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        """Ensemble probabilities ``[B, C]``: mean of member softmax, then the calibration
        temperature applied to its log (``softmax(log(mean_p) / T)``; identity at ``T = 1``), by
        :func:`hydra_ops.uq.calibration.ensemble_probs`, the one definition."""
        member_logits = self(inputs, attention_mask, token_type_ids)
        return ensemble_probs(member_logits, float(self.temperature))

    @torch.no_grad()
    def uncertainty(
        self,
        inputs: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> dict[str, Tensor]:
        """Per-example uncertainty ``[B]`` tensors: ``total_entropy``, ``expected_entropy``,
        ``mutual_information``, ``disagreement`` (from the member softmaxes) and ``confidence``
        (max calibrated ensemble probability)."""
        member_logits = self(inputs, attention_mask, token_type_ids)
        result = decompose(member_logits.softmax(dim=-1))
        result["confidence"] = ensemble_probs(member_logits, float(self.temperature)).amax(dim=-1)
        return result


# ----- building from the architecture description ------------------------------------------
def _build_norm(arch: dict[str, Any] | None, m: int) -> GroupedLayerNorm | None:
    if arch is None:
        return None
    return GroupedLayerNorm(
        arch["dim"], arch["eps"], m if arch["per_member"] else None, arch["bias"]
    )


def _block_from_arch(block: dict[str, Any], arch: dict[str, Any]) -> HydraBlock:
    m = 1 if block["trunk"] else int(arch["num_members"])
    att = block["attention"]
    attention = attention_implementation(att["implementation"])(
        att["head_counts"], arch["head_dim"], arch["hidden_size"]
    )
    if arch.get("positions") is not None:
        spec = arch["positions"]
        position = position_scores_class(spec["kind"])
        attention.attach_position(position(att["head_counts"], arch["head_dim"], spec["config"]))
    mlp_arch = block["mlp"]
    mlp = GroupedMLP(
        arch["hidden_size"],
        mlp_arch["hidden"],
        mlp_arch["activation"],
        m if mlp_arch["fc1_per_member"] else None,
        m if mlp_arch["fc2_per_member"] else None,
        mlp_arch["bias"],
    )
    return HydraBlock(
        block["norm_first"],
        attention,
        _build_norm(block["attn_norm"], m),
        mlp,
        _build_norm(block["mlp_norm"], m),
    )


def _head_from_arch(head: dict[str, Any], arch: dict[str, Any]) -> HydraClassifier:
    m = int(arch["num_members"])
    d = int(arch["hidden_size"])
    pre = None
    if head["pre_classifier"] is not None:
        p = head["pre_classifier"]
        pre = GroupedLinear(d, d, m if p["per_member"] else None, p["bias"])
    c = head["classifier"]
    classifier = GroupedLinear(
        d, int(arch["num_classes"]), m if c["per_member"] else None, c["bias"]
    )
    return HydraClassifier(
        _build_norm(head["final_norm"], m),
        head["pool"],
        int(head["num_prefix_tokens"]),
        pre,
        head["pre_activation"],
        _build_norm(head["fc_norm"], m),
        classifier,
    )
