"""Adapter for Hugging Face ``MPNetForSequenceClassification`` (all-mpnet-base-v2 is one).

Layout: ``model.mpnet.embeddings`` (word + position embeddings, positions counted from the padding
index like RoBERTa; no token types), ``model.mpnet.encoder.relative_attention_bias`` (an
``Embedding(buckets, heads)`` shared by every layer: the encoder buckets the relative positions
once per forward and adds the table's column of each head to that head's attention scores in
every layer); layer ``l`` is ``model.mpnet.encoder.layer[l]`` (post-norm) with
``attention.attn.{q,k,v,o}``, ``attention.LayerNorm``, ``intermediate.dense``,
``output.{dense,LayerNorm}``; then ``model.classifier`` (``dense`` + tanh on token 0, ``out_proj``).

Head surgery: the encoder still computes the bias of every original head, so a pruned layer's
self-attention is replaced by :class:`HeadSubsetMPNetSelfAttention`, which reads its kept heads'
columns (``bias_heads``, a non-persistent buffer: state dicts keep their keys). The merge reads
those columns as ``AttentionWeights.position["relative_bias"]`` (``relative_bias`` position
scores).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import Tensor, nn
from transformers import MPNetConfig, MPNetForSequenceClassification
from transformers.models.mpnet.modeling_mpnet import MPNetEmbeddings, MPNetSelfAttention

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

#: ``MPNetEncoder.compute_position_bias`` buckets relative positions into 32 buckets.
_BUCKETS_USED = 32


class HeadSubsetMPNetSelfAttention(MPNetSelfAttention):
    """An MPNet self-attention holding a subset of the original heads: it reads the columns
    ``bias_heads [h]`` of the position bias ``[B, heads, T, T]`` the encoder computes for all
    heads, then runs exactly as ``MPNetSelfAttention`` (its weights keep their names)."""

    def __init__(self, source: MPNetSelfAttention, bias_heads: Tensor) -> None:
        nn.Module.__init__(self)
        self.num_attention_heads = int(bias_heads.numel())
        self.attention_head_size = source.attention_head_size
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.q, self.k, self.v, self.o = source.q, source.k, source.v, source.o
        self.dropout = source.dropout
        self.register_buffer("bias_heads", bias_heads.detach().clone(), persistent=False)
        self.train(source.training)

    def forward(
        self,
        hidden_states: Tensor,
        attention_mask: Tensor | None = None,
        position_bias: Tensor | None = None,
        output_attentions: bool = False,
        **kwargs: Any,
    ) -> tuple[Tensor, ...]:
        if position_bias is not None:
            position_bias = position_bias.index_select(1, self.bias_heads)
        return super().forward(
            hidden_states, attention_mask, position_bias, output_attentions, **kwargs
        )


class MPNetEmbeddingStage(EmbeddingStage):
    """``MPNetEmbeddings`` (word + padding-offset position, LayerNorm); no token types."""

    def __init__(self, config: MPNetConfig, embeddings: MPNetEmbeddings | None = None) -> None:
        super().__init__()
        self._config = config
        self.embeddings = MPNetEmbeddings(config) if embeddings is None else embeddings

    def forward(
        self,
        inputs: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        return self.embeddings(input_ids=inputs)

    def config(self) -> dict[str, Any]:
        return self._config.to_dict()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> MPNetEmbeddingStage:
        return cls(MPNetConfig.from_dict(dict(config)))


class MPNetAdapter(HuggingFaceAdapter):
    hf_classes: ClassVar[dict[str, tuple[Any, Any]]] = {
        "mpnet": (MPNetConfig, MPNetForSequenceClassification)
    }

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        config = model.config
        if getattr(config, "problem_type", None) not in (None, "single_label_classification"):
            raise UnsupportedModelError(
                f"problem_type={config.problem_type!r}; only single-label classification"
            )
        buckets = int(config.relative_attention_num_buckets)
        if buckets < _BUCKETS_USED:
            raise UnsupportedModelError(
                f"MPNet relative_attention_num_buckets={buckets}: transformers' MPNet buckets "
                f"relative positions into {_BUCKETS_USED}, so the table needs at least that many"
            )
        hf_activation(config.hidden_act)

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, MPNetForSequenceClassification)

    @property
    def _bias_table(self) -> nn.Embedding:
        return self.model.mpnet.encoder.relative_attention_bias

    def block(self, layer: int) -> nn.Module:
        return self.model.mpnet.encoder.layer[layer]

    def embedding_parameters(self) -> list[nn.Parameter]:
        # the bias table is read by every layer: freezing a trunk must freeze it too
        return [*self.model.mpnet.embeddings.parameters(), *self._bias_table.parameters()]

    @property
    def num_layers(self) -> int:
        return len(self.model.mpnet.encoder.layer)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def head_dim(self) -> int:
        return int(self.block(0).attention.attn.attention_head_size)

    @property
    def num_classes(self) -> int:
        return int(self.model.classifier.out_proj.out_features)

    def num_heads(self, layer: int) -> int:
        return int(self.block(layer).attention.attn.num_attention_heads)

    def out_proj(self, layer: int) -> nn.Linear:
        return self.block(layer).attention.attn.o

    def _bias_heads(self, layer: int) -> Tensor:
        """The original heads (bias table columns) ``layer`` holds, in order."""
        attn = self.block(layer).attention.attn
        if isinstance(attn, HeadSubsetMPNetSelfAttention):
            return attn.bias_heads
        return torch.arange(attn.num_attention_heads, device=attn.q.weight.device)

    def attention_weights(self, layer: int) -> AttentionWeights:
        s = self.block(layer).attention.attn
        return AttentionWeights.from_linears(
            s.q,
            s.k,
            s.v,
            s.o,
            self.num_heads(layer),
            self.head_dim,
            position={"bias_heads": self._bias_heads(layer)},
        )

    def merge_attention_weights(self, layer: int) -> AttentionWeights:
        weights = self.attention_weights(layer)
        columns = self._bias_table.weight.detach().index_select(1, self._bias_heads(layer))
        weights.position = {"relative_bias": columns.t()}
        return weights

    def set_attention_weights(self, layer: int, weights: AttentionWeights) -> None:
        attention = self.block(layer).attention
        s = attention.attn
        if weights.position is None or "bias_heads" not in weights.position:
            raise ValueError("MPNet attention weights must carry position['bias_heads']")
        heads = weights.position["bias_heads"].to(device=s.q.weight.device, dtype=torch.long)
        if heads.numel() != weights.num_heads:
            raise ValueError(
                f"position['bias_heads'] names {heads.numel()} heads, the weights hold "
                f"{weights.num_heads}"
            )
        q, k, v, o = weights.to_linears(s.q, s.k, s.v, s.o)
        all_heads = int(self.model.config.num_attention_heads)
        if torch.equal(heads.cpu(), torch.arange(all_heads)) and not isinstance(
            s, HeadSubsetMPNetSelfAttention
        ):
            s.q, s.k, s.v, s.o = q, k, v, o
            return
        subset = HeadSubsetMPNetSelfAttention(s, heads)
        subset.q, subset.k, subset.v, subset.o = q, k, v, o
        attention.attn = subset

    def block_weights(self, layer: int) -> BlockWeights:
        block = self.block(layer)
        return BlockWeights(
            norm_first=False,
            attn_norm=layer_norm_weights(block.attention.LayerNorm),
            mlp_norm=layer_norm_weights(block.output.LayerNorm),
            mlp=MLPWeights.from_linears(
                block.intermediate.dense,
                block.output.dense,
                hf_activation(self.model.config.hidden_act),
            ),
        )

    def classifier_weights(self) -> ClassifierWeights:
        head = self.model.classifier
        return ClassifierWeights(
            final_norm=None,
            pool="cls",
            num_prefix_tokens=1,
            pre_classifier_weight=head.dense.weight.detach(),
            pre_classifier_bias=detached(head.dense.bias),
            pre_activation="tanh",
            fc_norm=None,
            classifier_weight=head.out_proj.weight.detach(),
            classifier_bias=detached(head.out_proj.bias),
        )

    def embedding_stage(self) -> EmbeddingStage:
        embeddings = copy.deepcopy(self.model.mpnet.embeddings)
        return MPNetEmbeddingStage(self.model.config, embeddings).eval()

    def architecture_config(self) -> dict[str, Any]:
        return self.model.config.to_dict()

    def position_scores(self) -> dict[str, Any]:
        return {
            "kind": "relative_bias",
            "config": {"num_buckets": int(self.model.config.relative_attention_num_buckets)},
        }

    def logits(self, batch: Mapping[str, Tensor]) -> Tensor:
        kwargs = {"input_ids": batch["input_ids"]}
        if batch.get("attention_mask") is not None:
            kwargs["attention_mask"] = batch["attention_mask"]
        return self.model(**kwargs).logits
