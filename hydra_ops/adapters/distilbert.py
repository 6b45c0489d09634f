"""Adapter for Hugging Face ``DistilBertForSequenceClassification``.

Layout: ``model.distilbert.embeddings`` (word + position embeddings, learned or sinusoidal, and a
LayerNorm; no token types: a batch's ``token_type_ids`` are ignored); layer ``l`` is
``model.distilbert.transformer.layer[l]`` (post-norm) with
``attention.{q_lin,k_lin,v_lin,out_lin}``, ``sa_layer_norm``, ``ffn.lin1`` + ``config.activation``
+ ``ffn.lin2``, ``output_layer_norm``; then
``model.pre_classifier`` + ReLU on token 0 and ``model.classifier``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor, nn
from transformers import DistilBertConfig, DistilBertForSequenceClassification
from transformers.models.distilbert.modeling_distilbert import Embeddings

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


class DistilBertEmbeddingStage(EmbeddingStage):
    """DistilBERT's ``Embeddings`` (word + position, LayerNorm); ``token_type_ids`` unused."""

    def __init__(self, config: DistilBertConfig, embeddings: nn.Module | None = None) -> None:
        super().__init__()
        self._config = config
        self.embeddings = Embeddings(config) if embeddings is None else embeddings

    def forward(
        self,
        inputs: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        return self.embeddings(inputs)

    def config(self) -> dict[str, Any]:
        return self._config.to_dict()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> DistilBertEmbeddingStage:
        return cls(DistilBertConfig.from_dict(dict(config)))


class DistilBertAdapter(HuggingFaceAdapter):
    hf_classes: ClassVar[dict[str, tuple[Any, Any]]] = {
        "distilbert": (DistilBertConfig, DistilBertForSequenceClassification)
    }
    new_weight_prefixes = ("pre_classifier.", "classifier.")

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        config = model.config
        if getattr(config, "problem_type", None) not in (None, "single_label_classification"):
            raise UnsupportedModelError(
                f"problem_type={config.problem_type!r}; only single-label classification"
            )
        hf_activation(config.activation)

    def block(self, layer: int) -> nn.Module:
        return self.model.distilbert.transformer.layer[layer]

    def embedding_parameters(self) -> list[nn.Parameter]:
        return list(self.model.distilbert.embeddings.parameters())

    @property
    def num_layers(self) -> int:
        return len(self.model.distilbert.transformer.layer)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.dim)

    @property
    def head_dim(self) -> int:
        return int(self.block(0).attention.attention_head_size)

    @property
    def num_classes(self) -> int:
        return int(self.model.classifier.out_features)

    def num_heads(self, layer: int) -> int:
        return int(self.block(layer).attention.n_heads)

    def out_proj(self, layer: int) -> nn.Linear:
        return self.block(layer).attention.out_lin

    def attention_weights(self, layer: int) -> AttentionWeights:
        a = self.block(layer).attention
        return AttentionWeights.from_linears(
            a.q_lin, a.k_lin, a.v_lin, a.out_lin, self.num_heads(layer), self.head_dim
        )

    def set_attention_weights(self, layer: int, weights: AttentionWeights) -> None:
        a = self.block(layer).attention
        a.q_lin, a.k_lin, a.v_lin, a.out_lin = weights.to_linears(
            a.q_lin, a.k_lin, a.v_lin, a.out_lin
        )
        # the forward reshapes by attention_head_size; n_heads keeps the module's record true
        a.n_heads = weights.num_heads

    def block_weights(self, layer: int) -> BlockWeights:
        block = self.block(layer)
        return BlockWeights(
            norm_first=False,
            attn_norm=layer_norm_weights(block.sa_layer_norm),
            mlp_norm=layer_norm_weights(block.output_layer_norm),
            mlp=MLPWeights.from_linears(
                block.ffn.lin1, block.ffn.lin2, hf_activation(self.model.config.activation)
            ),
        )

    def classifier_weights(self) -> ClassifierWeights:
        pre, classifier = self.model.pre_classifier, self.model.classifier
        return ClassifierWeights(
            final_norm=None,
            pool="cls",
            num_prefix_tokens=1,
            pre_classifier_weight=pre.weight.detach(),
            pre_classifier_bias=detached(pre.bias),
            pre_activation="relu",
            fc_norm=None,
            classifier_weight=classifier.weight.detach(),
            classifier_bias=detached(classifier.bias),
        )

    def embedding_stage(self) -> EmbeddingStage:
        embeddings = copy.deepcopy(self.model.distilbert.embeddings)
        return DistilBertEmbeddingStage(self.model.config, embeddings).eval()

    def logits(self, batch: Mapping[str, Tensor]) -> Tensor:
        kwargs = {"input_ids": batch["input_ids"]}
        if batch.get("attention_mask") is not None:
            kwargs["attention_mask"] = batch["attention_mask"]
        return self.model(**kwargs).logits
