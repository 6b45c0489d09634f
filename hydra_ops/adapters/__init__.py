"""Architecture adapters: one small protocol over the supported model families.

Supported families (``SUPPORTED_FAMILIES``):

* ``bert``: Hugging Face ``BertForSequenceClassification`` (MiniLM-L6 included);
* ``hf_vit``: Hugging Face ``ViTForImageClassification``;
* ``timm_vit``: timm ``VisionTransformer`` (fused ``qkv``);
* ``mpnet``: Hugging Face ``MPNetForSequenceClassification`` (all-mpnet-base-v2; relative
  position bias);
* ``deberta_v2``: Hugging Face ``DebertaV2ForSequenceClassification`` (DeBERTa-v2/v3;
  disentangled relative attention).
"""

from __future__ import annotations

from torch import nn

from hydra_ops.registry import Registry

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


def _lazy(kind: str, paths: dict[str, str]) -> Registry:
    registry: Registry = Registry(kind, package=__name__)
    for family, path in paths.items():
        registry.register_lazy(family, path)
    return registry


#: ``family -> adapter class``, each imported from its ``".module:Class"`` path on first use: a
#: family's library (transformers, timm) is imported only when a model of that family is used, so
#: a text pipeline's stages never import timm.
ADAPTERS: Registry[type[ModelAdapter]] = _lazy(
    "family",
    {
        "bert": ".bert:BertAdapter",
        "hf_vit": ".hf_vit:HFViTAdapter",
        "timm_vit": ".timm_vit:TimmViTAdapter",
    },
)
EMBEDDING_STAGES: Registry[type[EmbeddingStage]] = _lazy(
    "family",
    {
        "bert": ".bert:BertEmbeddingStage",
        "hf_vit": ".hf_vit:HFViTEmbeddingStage",
        "timm_vit": ".timm_vit:TimmViTEmbeddingStage",
    },
)
#: The top-level package each family's model classes come from: only the families whose library
#: defines a class of a model's MRO are asked whether they match it (a model of a library that is
#: not imported cannot exist, and asking would import it).
LIBRARIES = {"bert": "transformers", "hf_vit": "transformers", "timm_vit": "timm"}
SUPPORTED_FAMILIES = (
    "bert (transformers BertForSequenceClassification, e.g. MiniLM-L6)",
    "hf_vit (transformers ViTForImageClassification)",
    "timm_vit (timm VisionTransformer)",
)

# ----- relative-position families: mpnet, deberta_v2 (model_type values: each module's
# MODEL_TYPES; merged attention term: each adapter's position_scores()) -----------------------
ADAPTERS.register_lazy("mpnet", ".mpnet:MPNetAdapter")
EMBEDDING_STAGES.register_lazy("mpnet", ".mpnet:MPNetEmbeddingStage")
LIBRARIES["mpnet"] = "transformers"
ADAPTERS.register_lazy("deberta_v2", ".deberta_v2:DebertaV2Adapter")
EMBEDDING_STAGES.register_lazy("deberta_v2", ".deberta_v2:DebertaV2EmbeddingStage")
LIBRARIES["deberta_v2"] = "transformers"
SUPPORTED_FAMILIES += (
    "mpnet (transformers MPNetForSequenceClassification, e.g. all-mpnet-base-v2)",
    "deberta_v2 (transformers DebertaV2ForSequenceClassification, DeBERTa-v2/v3)",
)


def adapter_class(model: nn.Module) -> type[ModelAdapter]:
    """The adapter class of ``model``'s family, found without checking the model's variant (the
    one family dispatch: :func:`get_adapter` and :mod:`hydra_ops.models.checkpoints` use it).
    ``UnsupportedModelError`` (a ``ValueError``) names the supported families otherwise."""
    libraries = {cls.__module__.partition(".")[0] for cls in type(model).__mro__}
    for family, library in LIBRARIES.items():
        if library in libraries and (adapter_cls := ADAPTERS[family]).matches(model):
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
    return EMBEDDING_STAGES.get(family, "family").from_config(config)


__all__ = [
    "ACTIVATIONS",
    "ADAPTERS",
    "EMBEDDING_STAGES",
    "LIBRARIES",
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
