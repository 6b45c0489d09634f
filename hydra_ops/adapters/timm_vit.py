"""Adapter for timm ``VisionTransformer`` with the standard pre-norm ``Block``.

Layout: ``patch_embed`` -> prefix tokens (``cls_token``, ``reg_token``) and ``pos_embed`` ->
``norm_pre``; block ``l`` is ``model.blocks[l]``: ``norm1``, ``attn`` (fused ``qkv [3*h*dh, D]``
packed as [q heads | k heads | v heads], ``proj``), optional LayerScale ``ls1``, ``norm2``,
``mlp.{fc1,act,fc2}``, optional ``ls2``; then ``norm``, pooling (``token`` or ``avg``), ``fc_norm``
and ``head``.

LayerScale ``gamma * f(x)`` is folded into the preceding dense layer (``proj`` or ``fc2``) when
weights are read for the merge, which is exact in real arithmetic.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from timm.layers import PatchEmbed
from timm.models.vision_transformer import Block, VisionTransformer
from torch import Tensor, nn

from .base import (
    AttentionWeights,
    BlockWeights,
    ClassifierWeights,
    EmbeddingStage,
    LayerNormWeights,
    MLPWeights,
    ModelAdapter,
    UnsupportedModelError,
    detached,
    layer_norm_weights,
    linear_from,
)


def _timm_activation(act: nn.Module) -> str:
    if isinstance(act, nn.GELU):
        return "gelu_tanh" if act.approximate == "tanh" else "gelu"
    for cls, name in ((nn.ReLU, "relu"), (nn.SiLU, "silu")):
        if isinstance(act, cls):
            return name
    raise UnsupportedModelError(
        f"timm MLP activation {type(act).__name__} is not supported (GELU, ReLU, SiLU are)"
    )


def _layer_scale(module: nn.Module) -> Tensor | None:
    if isinstance(module, nn.Identity):
        return None
    gamma = getattr(module, "gamma", None)
    if gamma is None:
        raise UnsupportedModelError(f"unsupported layer-scale module {type(module).__name__}")
    return gamma.detach()


class TimmViTEmbeddingStage(EmbeddingStage):
    """timm ViT input stage: ``PatchEmbed``, prefix tokens, absolute positions, ``norm_pre``."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        self._config = dict(config)
        c = self._config
        dim = int(c["embed_dim"])
        self.patch_embed = PatchEmbed(
            img_size=c["img_size"],
            patch_size=c["patch_size"],
            in_chans=c["in_chans"],
            embed_dim=dim,
            bias=c["patch_bias"],
        )
        num_patches = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if c["class_token"] else None
        reg = int(c["reg_tokens"])
        self.reg_token = nn.Parameter(torch.zeros(1, reg, dim)) if reg else None
        self.num_prefix_tokens = int(c["class_token"]) + reg
        self.no_embed_class = bool(c["no_embed_class"])
        embed_len = num_patches if self.no_embed_class else num_patches + self.num_prefix_tokens
        self.pos_embed = nn.Parameter(torch.zeros(1, embed_len, dim)) if c["pos_embed"] else None
        self.norm_pre = (
            nn.LayerNorm(dim, eps=c["norm_pre_eps"]) if c["norm_pre_eps"] is not None else None
        )

    def forward(
        self,
        inputs: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        x = self.patch_embed(inputs)
        prefix = []
        if self.cls_token is not None:
            prefix.append(self.cls_token.expand(x.shape[0], -1, -1))
        if self.reg_token is not None:
            prefix.append(self.reg_token.expand(x.shape[0], -1, -1))
        if self.pos_embed is None:
            x = torch.cat([*prefix, x], dim=1)
        elif self.no_embed_class:
            x = torch.cat([*prefix, x + self.pos_embed], dim=1)
        else:
            x = torch.cat([*prefix, x], dim=1) + self.pos_embed
        return x if self.norm_pre is None else self.norm_pre(x)

    def config(self) -> dict[str, Any]:
        return dict(self._config)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TimmViTEmbeddingStage:
        return cls(config)


class TimmViTAdapter(ModelAdapter):
    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        problems = []
        if getattr(model, "dynamic_img_size", False):
            problems.append("dynamic_img_size=True")
        if getattr(model, "attn_pool", None) is not None:
            problems.append("attention pooling (global_pool='map')")
        if model.global_pool not in ("token", "avg"):
            problems.append(f"global_pool={model.global_pool!r} (token or avg are supported)")
        for i, block in enumerate(model.blocks):
            if type(block) is not Block:
                problems.append(
                    f"block {i} is {type(block).__name__}, only timm Block is supported"
                )
                continue
            attn = block.attn
            if getattr(attn, "gate", None) is not None:
                problems.append(f"block {i} uses gated attention")
            for name in ("q_norm", "k_norm", "norm"):
                if not isinstance(getattr(attn, name, nn.Identity()), nn.Identity):
                    problems.append(f"block {i} attention has {name} (qk/scale norm)")
            if not isinstance(getattr(block.mlp, "norm", nn.Identity()), nn.Identity):
                problems.append(f"block {i} MLP has a hidden norm")
            if not hasattr(block.mlp, "fc1"):
                problems.append(f"block {i} MLP is {type(block.mlp).__name__} (only Mlp)")
        if problems:
            raise UnsupportedModelError(
                "unsupported timm VisionTransformer: " + "; ".join(problems)
            )

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, VisionTransformer)

    def block(self, layer: int) -> nn.Module:
        return self.model.blocks[layer]

    def embedding_parameters(self) -> list[nn.Parameter]:
        """``patch_embed``, ``cls_token``, ``reg_token``, ``pos_embed`` and ``norm_pre``."""
        m = self.model
        params = list(m.patch_embed.parameters())
        for name in ("cls_token", "reg_token", "pos_embed"):
            if getattr(m, name, None) is not None:
                params.append(getattr(m, name))
        params.extend(m.norm_pre.parameters())
        return params

    @property
    def num_layers(self) -> int:
        return len(self.model.blocks)

    @property
    def hidden_size(self) -> int:
        return int(self.model.embed_dim)

    @property
    def head_dim(self) -> int:
        return int(self.block(0).attn.head_dim)

    @property
    def num_classes(self) -> int:
        return int(self.model.head.out_features)

    def num_heads(self, layer: int) -> int:
        return int(self.block(layer).attn.num_heads)

    def out_proj(self, layer: int) -> nn.Linear:
        return self.block(layer).attn.proj

    def attention_weights(self, layer: int) -> AttentionWeights:
        attn = self.block(layer).attn
        w = attn.qkv.weight.detach()
        b = detached(attn.qkv.bias)
        q_w, k_w, v_w = w.chunk(3, dim=0)
        q_b, k_b, v_b = (None, None, None) if b is None else b.chunk(3, dim=0)
        return AttentionWeights(
            q_weight=q_w,
            q_bias=q_b,
            k_weight=k_w,
            k_bias=k_b,
            v_weight=v_w,
            v_bias=v_b,
            o_weight=attn.proj.weight.detach(),
            o_bias=detached(attn.proj.bias),
            num_heads=self.num_heads(layer),
            head_dim=self.head_dim,
        )

    def set_attention_weights(self, layer: int, weights: AttentionWeights) -> None:
        attn = self.block(layer).attn
        qkv_w = torch.cat([weights.q_weight, weights.k_weight, weights.v_weight], dim=0)
        qkv_b = None
        if weights.q_bias is not None:
            qkv_b = torch.cat([weights.q_bias, weights.k_bias, weights.v_bias], dim=0)
        attn.qkv = linear_from(qkv_w, qkv_b, attn.qkv)
        attn.proj = linear_from(weights.o_weight, weights.o_bias, attn.proj)
        attn.num_heads = weights.num_heads
        attn.attn_dim = weights.num_heads * weights.head_dim

    def block_weights(self, layer: int) -> BlockWeights:
        block = self.block(layer)
        fc2_w = block.mlp.fc2.weight.detach()
        fc2_b = detached(block.mlp.fc2.bias)
        gamma = _layer_scale(block.ls2)
        if gamma is not None:
            fc2_w = fc2_w * gamma[:, None]
            fc2_b = None if fc2_b is None else fc2_b * gamma
        return BlockWeights(
            norm_first=True,
            attn_norm=layer_norm_weights(block.norm1),
            mlp_norm=layer_norm_weights(block.norm2),
            mlp=MLPWeights(
                fc1_weight=block.mlp.fc1.weight.detach(),
                fc1_bias=detached(block.mlp.fc1.bias),
                fc2_weight=fc2_w,
                fc2_bias=fc2_b,
                activation=_timm_activation(block.mlp.act),
            ),
        )

    def merge_attention_weights(self, layer: int) -> AttentionWeights:
        """``attention_weights`` with LayerScale ``ls1`` folded into the output projection."""
        weights = self.attention_weights(layer)
        gamma = _layer_scale(self.block(layer).ls1)
        if gamma is None:
            return weights
        weights.o_weight = weights.o_weight * gamma[:, None]
        if weights.o_bias is not None:
            weights.o_bias = weights.o_bias * gamma
        return weights

    def classifier_weights(self) -> ClassifierWeights:
        m = self.model
        final_norm: LayerNormWeights | None = None
        if not isinstance(m.norm, nn.Identity):
            final_norm = layer_norm_weights(m.norm)
        fc_norm = None if isinstance(m.fc_norm, nn.Identity) else layer_norm_weights(m.fc_norm)
        if not isinstance(m.head, nn.Linear):
            raise UnsupportedModelError("timm ViT without a linear classification head")
        return ClassifierWeights(
            final_norm=final_norm,
            pool="cls" if m.global_pool == "token" else "mean",
            num_prefix_tokens=int(m.num_prefix_tokens),
            pre_classifier_weight=None,
            pre_classifier_bias=None,
            pre_activation=None,
            fc_norm=fc_norm,
            classifier_weight=m.head.weight.detach(),
            classifier_bias=detached(m.head.bias),
        )

    def _embedding_config(self) -> dict[str, Any]:
        m = self.model
        pe = m.patch_embed
        norm_pre_eps = None
        if not isinstance(m.norm_pre, nn.Identity):
            norm_pre_eps = layer_norm_weights(m.norm_pre).eps
        return {
            "img_size": list(pe.img_size),
            "patch_size": list(pe.patch_size),
            "in_chans": int(pe.proj.in_channels),
            "embed_dim": int(m.embed_dim),
            "patch_bias": pe.proj.bias is not None,
            "class_token": m.cls_token is not None,
            "reg_tokens": 0 if m.reg_token is None else int(m.reg_token.shape[1]),
            "no_embed_class": bool(m.no_embed_class),
            "pos_embed": m.pos_embed is not None,
            "norm_pre_eps": norm_pre_eps,
        }

    def embedding_stage(self) -> EmbeddingStage:
        m = self.model
        if not isinstance(m.patch_embed.norm, nn.Identity):
            raise UnsupportedModelError("timm PatchEmbed with a norm layer is not supported")
        stage = TimmViTEmbeddingStage(self._embedding_config())
        with torch.no_grad():
            stage.patch_embed.load_state_dict(m.patch_embed.state_dict())
            for name in ("cls_token", "reg_token", "pos_embed"):
                if getattr(stage, name) is not None:
                    getattr(stage, name).copy_(getattr(m, name))
            if stage.norm_pre is not None:
                stage.norm_pre.load_state_dict(m.norm_pre.state_dict())
        return stage.to(m.head.weight.device).eval()

    def architecture_config(self) -> dict[str, Any]:
        return {**self._embedding_config(), "depth": self.num_layers}

    @classmethod
    def model_config(cls, model: nn.Module) -> dict[str, Any]:
        """The ``VisionTransformer`` constructor kwargs recorded by
        :func:`hydra_ops.models.factory.build_timm_vit` (``hydra_init_kwargs``), else recovered from
        the module's shapes."""
        recorded = getattr(model, "hydra_init_kwargs", None)
        if recorded is not None:
            return dict(recorded)
        patch = model.patch_embed
        blocks = list(model.blocks)
        embed_dim = int(model.embed_dim)
        return {
            "img_size": int(patch.img_size[0]),
            "patch_size": int(patch.patch_size[0]),
            "in_chans": int(patch.proj.in_channels),
            "num_classes": int(model.num_classes),
            "embed_dim": embed_dim,
            "depth": len(blocks),
            # head_dim survives pruning, the head count does not
            "num_heads": embed_dim // int(blocks[0].attn.head_dim),
            "mlp_ratio": blocks[0].mlp.fc1.out_features / embed_dim,
            "class_token": model.cls_token is not None,
            "global_pool": model.global_pool,
            "qkv_bias": blocks[0].attn.qkv.bias is not None,
            # LayerScale present or not; its values come from the weights file
            "init_values": None if isinstance(blocks[0].ls1, nn.Identity) else 1.0,
        }

    @classmethod
    def build_model(cls, config: Mapping[str, Any]) -> nn.Module:
        model = VisionTransformer(**config)
        model.hydra_init_kwargs = dict(config)
        return model

    def logits(self, batch: Mapping[str, Tensor]) -> Tensor:
        return self.model(batch["pixel_values"])
