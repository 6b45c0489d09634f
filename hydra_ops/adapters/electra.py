"""Adapter for Hugging Face ``ElectraForSequenceClassification``.

The encoder ``model.electra`` has BERT's layout (:class:`~.bert.BertLayoutAdapter`) and no pooler.
Two details differ from BERT:

* the embeddings are ``embedding_size`` wide; when that differs from ``hidden_size``,
  ``model.electra.embeddings_project`` (a dense layer) maps them to the hidden size before block 0,
  so the embedding stage (and a shared trunk) holds both;
* the head ``model.classifier``: ``dense`` + GELU (exact) on token 0, then ``out_proj``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, ClassVar

from torch import Tensor, nn
from transformers import ElectraConfig, ElectraForSequenceClassification
from transformers.models.electra.modeling_electra import ElectraEmbeddings

from .base import ClassifierWeights, EmbeddingStage, detached
from .bert import BertLayoutAdapter


class ElectraEmbeddingStage(EmbeddingStage):
    """``ElectraEmbeddings`` then ``embeddings_project`` when ``embedding_size != hidden_size``."""

    def __init__(
        self,
        config: ElectraConfig,
        embeddings: nn.Module | None = None,
        project: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self._config = config
        self.embeddings = ElectraEmbeddings(config) if embeddings is None else embeddings
        if config.embedding_size != config.hidden_size:
            self.project = (
                nn.Linear(config.embedding_size, config.hidden_size) if project is None else project
            )
        else:
            self.project = None

    def forward(
        self,
        inputs: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        x = self.embeddings(input_ids=inputs, token_type_ids=token_type_ids)
        return x if self.project is None else self.project(x)

    def config(self) -> dict[str, Any]:
        return self._config.to_dict()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ElectraEmbeddingStage:
        return cls(ElectraConfig.from_dict(dict(config)))


class ElectraAdapter(BertLayoutAdapter):
    hf_classes: ClassVar[dict[str, tuple[Any, Any]]] = {
        "electra": (ElectraConfig, ElectraForSequenceClassification)
    }
    encoder_attribute = "electra"

    @property
    def num_classes(self) -> int:
        return int(self.model.classifier.out_proj.out_features)

    def embedding_parameters(self) -> list[nn.Parameter]:
        params = list(self.model.electra.embeddings.parameters())
        project = getattr(self.model.electra, "embeddings_project", None)
        return params + ([] if project is None else list(project.parameters()))

    def classifier_weights(self) -> ClassifierWeights:
        head = self.model.classifier
        return ClassifierWeights(
            final_norm=None,
            pool="cls",
            num_prefix_tokens=1,
            pre_classifier_weight=head.dense.weight.detach(),
            pre_classifier_bias=detached(head.dense.bias),
            pre_activation="gelu",
            fc_norm=None,
            classifier_weight=head.out_proj.weight.detach(),
            classifier_bias=detached(head.out_proj.bias),
        )

    def embedding_stage(self) -> EmbeddingStage:
        electra = self.model.electra
        project = getattr(electra, "embeddings_project", None)
        stage = ElectraEmbeddingStage(
            self.model.config,
            copy.deepcopy(electra.embeddings),
            None if project is None else copy.deepcopy(project),
        )
        return stage.eval()
