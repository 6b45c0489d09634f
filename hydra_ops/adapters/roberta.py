"""Adapter for Hugging Face ``RobertaForSequenceClassification`` and its copies
``XLMRobertaForSequenceClassification`` and ``CamembertForSequenceClassification`` (same modules
under other names).

The encoder ``model.roberta`` has BERT's layout (:class:`~.bert.BertLayoutAdapter`) and no pooler.
Two details differ from BERT:

* positions: ``RobertaEmbeddings`` numbers the real tokens ``padding_idx + 1, padding_idx + 2, ...``
  from ``input_ids`` (a token equal to ``pad_token_id`` gets ``padding_idx``), so a padded row's
  positions depend on its padding; the embedding stage keeps that module and passes ``input_ids``;
* the head ``model.classifier``: ``dense`` + tanh on token 0, then ``out_proj``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor, nn
from transformers import (
    CamembertConfig,
    CamembertForSequenceClassification,
    RobertaConfig,
    RobertaForSequenceClassification,
    XLMRobertaConfig,
    XLMRobertaForSequenceClassification,
)
from transformers.models.roberta.modeling_roberta import RobertaEmbeddings

from .base import ClassifierWeights, EmbeddingStage, detached
from .bert import BertLayoutAdapter


class RobertaEmbeddingStage(EmbeddingStage):
    """``RobertaEmbeddings`` (word + padding-offset position + token type, LayerNorm)."""

    def __init__(self, config: RobertaConfig, embeddings: nn.Module | None = None) -> None:
        super().__init__()
        self._config = config
        self.embeddings = RobertaEmbeddings(config) if embeddings is None else embeddings

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
    def from_config(cls, config: Mapping[str, Any]) -> RobertaEmbeddingStage:
        return cls(RobertaConfig.from_dict(dict(config)))


class RobertaAdapter(BertLayoutAdapter):
    hf_classes: ClassVar[dict[str, tuple[Any, Any]]] = {
        "roberta": (RobertaConfig, RobertaForSequenceClassification),
        "xlm-roberta": (XLMRobertaConfig, XLMRobertaForSequenceClassification),
        "camembert": (CamembertConfig, CamembertForSequenceClassification),
    }
    encoder_attribute = "roberta"

    @property
    def num_classes(self) -> int:
        return int(self.model.classifier.out_proj.out_features)

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
        embeddings = copy.deepcopy(self.model.roberta.embeddings)
        return RobertaEmbeddingStage(self.model.config, embeddings).eval()
