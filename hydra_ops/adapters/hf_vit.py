"""Adapter for Hugging Face ``ViTForImageClassification`` (transformers 5 layout).

Layout: ``model.vit.embeddings`` (patches + [CLS] + positions); layer ``l`` is
``model.vit.layers[l]`` (pre-norm): ``layernorm_before``, ``attention.{q,k,v,o}_proj``,
``layernorm_after``, ``mlp.{fc1,fc2}``; then ``model.vit.layernorm`` and ``model.classifier``
on token 0.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor, nn
from transformers import ViTConfig, ViTForImageClassification
from transformers.models.vit.modeling_vit import ViTEmbeddings

from .base import (
    AttentionWeights,
    BlockWeights,
    ClassifierWeights,
    EmbeddingStage,
    HuggingFaceAdapter,
    MLPWeights,
    UnsupportedModelError,
    detached,
    layer_norm_weights,
)
from .bert import hf_activation


class HFViTEmbeddingStage(EmbeddingStage):
    """``ViTEmbeddings`` without a mask token; inputs are ``pixel_values [B, C, H, W]``."""

    def __init__(self, config: ViTConfig, embeddings: ViTEmbeddings | None = None) -> None:
        super().__init__()
        self._config = config
        self.embeddings = (
            ViTEmbeddings(config, use_mask_token=False) if embeddings is None else embeddings
        )

    def forward(
        self,
        inputs: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        weight = self.embeddings.patch_embeddings.projection.weight
        return self.embeddings(inputs.to(weight.dtype))

    def config(self) -> dict[str, Any]:
        return self._config.to_dict()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> HFViTEmbeddingStage:
        return cls(ViTConfig.from_dict(dict(config)))


class HFViTAdapter(HuggingFaceAdapter):
    hf_classes: ClassVar[dict[str, tuple[Any, Any]]] = {
        "vit": (ViTConfig, ViTForImageClassification)
    }

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        if getattr(model.vit.embeddings, "mask_token", None) is not None:
            raise UnsupportedModelError(
                "ViT with a mask token (masked image modelling) is not supported"
            )
        hf_activation(model.config.hidden_act)

    def block(self, layer: int) -> nn.Module:
        return self.model.vit.layers[layer]

    def embedding_parameters(self) -> list[nn.Parameter]:
        return list(self.model.vit.embeddings.parameters())

    @property
    def num_layers(self) -> int:
        return len(self.model.vit.layers)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def head_dim(self) -> int:
        return int(self.block(0).attention.head_dim)

    @property
    def num_classes(self) -> int:
        return int(self.model.classifier.out_features)

    def num_heads(self, layer: int) -> int:
        return int(self.block(layer).attention.num_attention_heads)

    def out_proj(self, layer: int) -> nn.Linear:
        return self.block(layer).attention.o_proj

    def attention_weights(self, layer: int) -> AttentionWeights:
        a = self.block(layer).attention
        return AttentionWeights.from_linears(
            a.q_proj, a.k_proj, a.v_proj, a.o_proj, self.num_heads(layer), self.head_dim
        )

    def set_attention_weights(self, layer: int, weights: AttentionWeights) -> None:
        a = self.block(layer).attention
        a.q_proj, a.k_proj, a.v_proj, a.o_proj = weights.to_linears(
            a.q_proj, a.k_proj, a.v_proj, a.o_proj
        )
        a.num_attention_heads = weights.num_heads

    def block_weights(self, layer: int) -> BlockWeights:
        block = self.block(layer)
        return BlockWeights(
            norm_first=True,
            attn_norm=layer_norm_weights(block.layernorm_before),
            mlp_norm=layer_norm_weights(block.layernorm_after),
            mlp=MLPWeights.from_linears(
                block.mlp.fc1, block.mlp.fc2, hf_activation(self.model.config.hidden_act)
            ),
        )

    def classifier_weights(self) -> ClassifierWeights:
        classifier = self.model.classifier
        return ClassifierWeights(
            final_norm=layer_norm_weights(self.model.vit.layernorm),
            pool="cls",
            num_prefix_tokens=1,
            pre_classifier_weight=None,
            pre_classifier_bias=None,
            pre_activation=None,
            fc_norm=None,
            classifier_weight=classifier.weight.detach(),
            classifier_bias=detached(classifier.bias),
        )

    def embedding_stage(self) -> EmbeddingStage:
        embeddings = copy.deepcopy(self.model.vit.embeddings)
        return HFViTEmbeddingStage(self.model.config, embeddings).eval()

    def logits(self, batch: Mapping[str, Tensor]) -> Tensor:
        return self.model(pixel_values=batch["pixel_values"]).logits
