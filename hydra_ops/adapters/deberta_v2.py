"""Adapter for Hugging Face ``DebertaV2ForSequenceClassification`` (DeBERTa-v2 and -v3).

Layout: ``model.deberta.embeddings`` (word, optional absolute positions and token types, optional
projection, LayerNorm, padding zeroed); ``model.deberta.encoder.rel_embeddings`` and its optional
``encoder.LayerNorm`` (``norm_rel_ebd: layer_norm``), shared by every layer; layer ``l`` is
``model.deberta.encoder.layer[l]`` (post-norm) with ``attention.self.{query,key,value}_proj``,
``attention.output.{dense,LayerNorm}``, ``intermediate.dense``, ``output.{dense,LayerNorm}``;
then ``model.pooler.dense`` + ``pooler_hidden_act`` on token 0 and ``model.classifier``.

Attention is disentangled: besides ``q . k`` each head adds content-to-position and
position-to-content terms read from the shared relative embeddings projected by *the head's own*
query and key weights (``share_att_key``, as in every DeBERTa-v3 checkpoint), so pruning q/k/v
rows prunes the position terms with them; without ``share_att_key`` the layer's separate
``pos_key_proj`` / ``pos_query_proj`` rows are per head too and travel in
``AttentionWeights.position`` (``pos_key_weight [h, dh, D]``, ``pos_key_bias [h, dh]``, same for
``pos_query``). The merge adds the same terms through ``disentangled`` position scores; the
relative embeddings travel with the embedding stage.

Unsupported (one-line :class:`UnsupportedModelError`): the convolution layer
(``conv_kernel_size > 0``), attention types other than ``c2p`` / ``p2c``, head sizes that do not
tile the hidden size, and a pooler whose size differs from the hidden size.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor, nn
from transformers import DebertaV2Config, DebertaV2ForSequenceClassification
from transformers.models.deberta_v2.modeling_deberta_v2 import DebertaV2Embeddings

from .base import (
    ACTIVATIONS,
    AttentionWeights,
    BlockWeights,
    ClassifierWeights,
    EmbeddingStage,
    HuggingFaceAdapter,
    MLPWeights,
    UnsupportedModelError,
    detached,
    layer_norm_weights,
    linear_from,
)
from .bert import HF_ACTIVATIONS, hf_activation

_TERMS = ("c2p", "p2c")
#: term -> the separate position projection it reads (without ``share_att_key``)
_PROJECTIONS = {"c2p": "pos_key", "p2c": "pos_query"}


def _pooler_activation(name: Any) -> str:
    canonical = HF_ACTIVATIONS.get(name, name) if isinstance(name, str) else None
    if canonical not in ACTIVATIONS:
        raise UnsupportedModelError(
            f"pooler_hidden_act={name!r} is not supported; supported: "
            f"{sorted({*HF_ACTIVATIONS, 'tanh'})}"
        )
    return canonical


def _rel_norm(config: DebertaV2Config) -> bool:
    kinds = [x.strip() for x in getattr(config, "norm_rel_ebd", "none").lower().split("|")]
    return "layer_norm" in kinds


class DebertaV2EmbeddingStage(EmbeddingStage):
    """``DebertaV2Embeddings`` plus the encoder's relative embeddings (and their LayerNorm), which
    every layer's attention reads (:meth:`relative_embeddings`)."""

    def __init__(
        self,
        config: DebertaV2Config,
        embeddings: DebertaV2Embeddings | None = None,
        rel_embeddings: nn.Embedding | None = None,
        rel_norm: nn.LayerNorm | None = None,
    ) -> None:
        super().__init__()
        self._config = config
        self.embeddings = DebertaV2Embeddings(config) if embeddings is None else embeddings
        self.rel_embeddings = rel_embeddings
        self.rel_norm = rel_norm
        if rel_embeddings is None and getattr(config, "relative_attention", False):
            span = _span(config)
            self.rel_embeddings = nn.Embedding(2 * span, config.hidden_size)
            if _rel_norm(config):
                self.rel_norm = nn.LayerNorm(config.hidden_size, config.layer_norm_eps)

    def forward(
        self,
        inputs: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        return self.embeddings(input_ids=inputs, token_type_ids=token_type_ids, mask=attention_mask)

    def relative_embeddings(self) -> Tensor | None:
        if self.rel_embeddings is None:
            return None
        weight = self.rel_embeddings.weight
        return weight if self.rel_norm is None else self.rel_norm(weight)

    def config(self) -> dict[str, Any]:
        return self._config.to_dict()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> DebertaV2EmbeddingStage:
        return cls(DebertaV2Config.from_dict(dict(config)))


def _span(config: DebertaV2Config) -> int:
    """Half the relative embedding rows, as ``DebertaV2Encoder`` sizes them."""
    max_relative = getattr(config, "max_relative_positions", -1)
    if max_relative < 1:
        max_relative = config.max_position_embeddings
    buckets = getattr(config, "position_buckets", -1)
    return buckets if buckets > 0 else max_relative


class DebertaV2Adapter(HuggingFaceAdapter):
    hf_classes: ClassVar[dict[str, tuple[Any, Any]]] = {
        "deberta-v2": (DebertaV2Config, DebertaV2ForSequenceClassification)
    }
    new_weight_prefixes: ClassVar[tuple[str, ...]] = ("classifier.", "pooler.")

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        config = model.config
        if getattr(config, "problem_type", None) not in (None, "single_label_classification"):
            raise UnsupportedModelError(
                f"problem_type={config.problem_type!r}; only single-label classification"
            )
        if getattr(config, "conv_kernel_size", 0) > 0:
            raise UnsupportedModelError(
                f"DeBERTa with a convolution layer (conv_kernel_size={config.conv_kernel_size}) "
                "is not supported"
            )
        terms = list(config.pos_att_type or [])
        if any(t not in _TERMS for t in terms):
            raise UnsupportedModelError(
                f"DeBERTa pos_att_type={terms}: only {list(_TERMS)} are supported"
            )
        s = model.deberta.encoder.layer[0].attention.self
        if s.attention_head_size * config.num_attention_heads != config.hidden_size:
            raise UnsupportedModelError(
                f"DeBERTa attention_head_size={s.attention_head_size} x "
                f"{config.num_attention_heads} heads != hidden_size={config.hidden_size}"
            )
        if config.pooler_hidden_size != config.hidden_size:
            raise UnsupportedModelError(
                f"DeBERTa pooler_hidden_size={config.pooler_hidden_size} != "
                f"hidden_size={config.hidden_size}"
            )
        _pooler_activation(config.pooler_hidden_act)
        hf_activation(config.hidden_act)

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, DebertaV2ForSequenceClassification)

    @property
    def _encoder(self) -> nn.Module:
        return self.model.deberta.encoder

    def _rel_modules(self) -> tuple[nn.Embedding | None, nn.LayerNorm | None]:
        encoder = self._encoder
        rel = getattr(encoder, "rel_embeddings", None) if encoder.relative_attention else None
        norm = (
            encoder.LayerNorm if rel is not None and "layer_norm" in encoder.norm_rel_ebd else None
        )
        return rel, norm

    def block(self, layer: int) -> nn.Module:
        return self._encoder.layer[layer]

    def embedding_parameters(self) -> list[nn.Parameter]:
        # the relative embeddings are read by every layer: freezing a trunk must freeze them too
        params = list(self.model.deberta.embeddings.parameters())
        for module in self._rel_modules():
            if module is not None:
                params.extend(module.parameters())
        return params

    @property
    def num_layers(self) -> int:
        return len(self._encoder.layer)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def head_dim(self) -> int:
        return int(self.block(0).attention.self.attention_head_size)

    @property
    def num_classes(self) -> int:
        return int(self.model.classifier.out_features)

    def num_heads(self, layer: int) -> int:
        return int(self.block(layer).attention.self.num_attention_heads)

    def out_proj(self, layer: int) -> nn.Linear:
        return self.block(layer).attention.output.dense

    def _separate_projections(self, layer: int) -> list[str]:
        """The separate position projections ``layer`` has (``pos_key`` / ``pos_query``)."""
        s = self.block(layer).attention.self
        if not s.relative_attention or s.share_att_key:
            return []
        return [_PROJECTIONS[t] for t in _TERMS if t in s.pos_att_type]

    def _position_parts(self, layer: int) -> dict[str, Tensor] | None:
        s = self.block(layer).attention.self
        h, dh = self.num_heads(layer), self.head_dim
        parts = {}
        for name in self._separate_projections(layer):
            proj = getattr(s, f"{name}_proj")
            parts[f"{name}_weight"] = proj.weight.detach().view(h, dh, -1)
            parts[f"{name}_bias"] = proj.bias.detach().view(h, dh)
        return parts or None

    def attention_weights(self, layer: int) -> AttentionWeights:
        attn = self.block(layer).attention
        s = attn.self
        return AttentionWeights.from_linears(
            s.query_proj,
            s.key_proj,
            s.value_proj,
            attn.output.dense,
            self.num_heads(layer),
            self.head_dim,
            position=self._position_parts(layer),
        )

    def set_attention_weights(self, layer: int, weights: AttentionWeights) -> None:
        attn = self.block(layer).attention
        s = attn.self
        s.query_proj, s.key_proj, s.value_proj, attn.output.dense = weights.to_linears(
            s.query_proj, s.key_proj, s.value_proj, attn.output.dense
        )
        for name in self._separate_projections(layer):
            weight = weights.position[f"{name}_weight"] if weights.position else None
            if weight is None or weight.shape[0] != weights.num_heads:
                raise ValueError(f"DeBERTa attention weights must carry position['{name}_*']")
            proj = getattr(s, f"{name}_proj")
            new = linear_from(
                weight.reshape(-1, weight.shape[-1]),
                weights.position[f"{name}_bias"].reshape(-1),
                proj,
            )
            setattr(s, f"{name}_proj", new)
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

    def classifier_weights(self) -> ClassifierWeights:
        pooler = self.model.pooler.dense
        classifier = self.model.classifier
        return ClassifierWeights(
            final_norm=None,
            pool="cls",
            num_prefix_tokens=1,
            pre_classifier_weight=pooler.weight.detach(),
            pre_classifier_bias=detached(pooler.bias),
            pre_activation=_pooler_activation(self.model.config.pooler_hidden_act),
            fc_norm=None,
            classifier_weight=classifier.weight.detach(),
            classifier_bias=detached(classifier.bias),
        )

    def embedding_stage(self) -> EmbeddingStage:
        rel, norm = (copy.deepcopy(m) for m in self._rel_modules())
        embeddings = copy.deepcopy(self.model.deberta.embeddings)
        return DebertaV2EmbeddingStage(self.model.config, embeddings, rel, norm).eval()

    def architecture_config(self) -> dict[str, Any]:
        return self.model.config.to_dict()

    def position_scores(self) -> dict[str, Any]:
        s = self.block(0).attention.self
        relative = bool(s.relative_attention)
        terms = [t for t in _TERMS if t in s.pos_att_type]
        return {
            "kind": "disentangled",
            "config": {
                "terms": terms if relative else [],
                "scale_factor": 1 + len(terms),
                "span": int(s.pos_ebd_size) if relative else 0,
                "position_buckets": int(s.position_buckets) if relative else -1,
                "max_relative_positions": int(s.max_relative_positions) if relative else -1,
                "separate_projections": bool(self._separate_projections(0)),
                "hidden_size": self.hidden_size,
            },
        }

    def logits(self, batch: Mapping[str, Tensor]) -> Tensor:
        kwargs = {"input_ids": batch["input_ids"]}
        for key in ("attention_mask", "token_type_ids"):
            if batch.get(key) is not None:
                kwargs[key] = batch[key]
        return self.model(**kwargs).logits


__all__ = ["DebertaV2Adapter", "DebertaV2EmbeddingStage"]
