"""Architecture adapters: one small protocol over the supported model families.

Supported families (``SUPPORTED_FAMILIES``):

* ``bert``: Hugging Face ``BertForSequenceClassification`` (MiniLM-L6 included);
* ``hf_vit``: Hugging Face ``ViTForImageClassification``;
* ``timm_vit``: timm ``VisionTransformer`` (fused ``qkv``).
"""

from __future__ import annotations

from torch import nn

from .base import (
    ACTIVATIONS,
    AttentionWeights,
    BlockWeights,
    ClassifierWeights,
    EmbeddingStage,
    HuggingFaceAdapter,
    LayerNormWeights,
    MLPWeights,
    ModelAdapter,
    UnsupportedModelError,
)
from .bert import BertAdapter, BertEmbeddingStage
from .hf_vit import HFViTAdapter, HFViTEmbeddingStage
from .timm_vit import TimmViTAdapter, TimmViTEmbeddingStage

ADAPTERS: dict[str, type[ModelAdapter]] = {
    "bert": BertAdapter,
    "hf_vit": HFViTAdapter,
    "timm_vit": TimmViTAdapter,
}
EMBEDDING_STAGES: dict[str, type[EmbeddingStage]] = {
    "bert": BertEmbeddingStage,
    "hf_vit": HFViTEmbeddingStage,
    "timm_vit": TimmViTEmbeddingStage,
}
SUPPORTED_FAMILIES = (
    "bert (transformers BertForSequenceClassification, e.g. MiniLM-L6)",
    "hf_vit (transformers ViTForImageClassification)",
    "timm_vit (timm VisionTransformer)",
)


def adapter_class(model: nn.Module) -> type[ModelAdapter]:
    """The adapter class of ``model``'s family, found without checking the model's variant (the
    one family dispatch: :func:`get_adapter` and :mod:`hydra_ops.checkpoints` use it).
    ``UnsupportedModelError`` (a ``ValueError``) names the supported families otherwise."""
    for adapter_cls in ADAPTERS.values():
        if adapter_cls.matches(model):
            return adapter_cls
    raise UnsupportedModelError(
        f"unsupported model type {type(model).__name__}; supported families: "
        + "; ".join(SUPPORTED_FAMILIES)
    )


def get_adapter(model: nn.Module) -> ModelAdapter:
    """The adapter for ``model``; ``UnsupportedModelError`` (a ``ValueError``) names the supported
    families when ``model`` is none of them, or a variant of one the adapter cannot handle."""
    return adapter_class(model)(model)


def embedding_stage_from_config(family: str, config: dict) -> EmbeddingStage:
    """Rebuild a family's (untrained) embedding stage from ``EmbeddingStage.config()``."""
    if family not in EMBEDDING_STAGES:
        raise ValueError(f"family must be one of {sorted(EMBEDDING_STAGES)}, got {family!r}")
    return EMBEDDING_STAGES[family].from_config(config)


__all__ = [
    "ACTIVATIONS",
    "ADAPTERS",
    "SUPPORTED_FAMILIES",
    "AttentionWeights",
    "BlockWeights",
    "ClassifierWeights",
    "EmbeddingStage",
    "HuggingFaceAdapter",
    "LayerNormWeights",
    "MLPWeights",
    "ModelAdapter",
    "UnsupportedModelError",
    "adapter_class",
    "embedding_stage_from_config",
    "get_adapter",
]
