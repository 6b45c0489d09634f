"""A model family's registration: every fact the library and the pipeline need about it, in one
:class:`ModelFamily`, registered once in :data:`FAMILIES` (``hydra_ops/adapters/__init__.py``).

This module imports neither torch nor a model library: the params schema reads a family's
modality, default learning rate and ``model_type`` s without loading a model, and the adapter and
embedding-stage classes are imported on first use, so a text run never imports timm.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Literal

from hydra_ops.registry import Registry

Modality = Literal["text", "image"]

__all__ = [
    "FAMILIES",
    "Modality",
    "ModelFamily",
    "UnsupportedModelError",
    "default_family",
    "family_of_model_type",
    "model_types",
    "register_family",
]


class UnsupportedModelError(ValueError):
    """The model is not one of the supported families (or uses an unsupported variant)."""


def _load(ref: str | type, package: str) -> Any:
    """``ref`` itself, or the attribute a ``"module:Attr"`` path names (relative to ``package``)."""
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module, package), attr)


@dataclass(frozen=True)
class ModelFamily:
    """One family of models the library can prune, merge and save, and the pipeline can train.

    Attributes:
        name: the family's name (``model.family``, checkpoints' and Hydra files' ``family``).
        modality: ``"text"`` (inputs ``input_ids [B, T]``) or ``"image"`` (``pixel_values``).
        library: the top-level package its model classes come from (``transformers``, ``timm``):
            only families whose library defines a class of a model's MRO are asked whether they
            handle it, so dispatching a BERT never imports timm.
        adapter: the :class:`~hydra_ops.adapters.base.ModelAdapter` subclass, or its
            ``"module:Class"`` path (relative to :mod:`hydra_ops.adapters`), imported on first use.
        embedding_stage: the :class:`~hydra_ops.adapters.base.EmbeddingStage` subclass (or path).
        classes: the model classes it handles, as their users name them (docs and messages).
        model_types: the ``config.json`` ``model_type`` values of a local folder it loads as a
            base (``model.path``); empty: it is never loaded from a folder.
        shape_keys: the ``config.json`` keys of its layer count and heads per layer.
        lr: the base fine-tune's default learning rate (``finetune.lr: null``).
        builder: ``"module:function"`` that builds a new pipeline base,
            ``(class_names, *, seed, model_path, **vit) -> nn.Module``; None: the pipeline cannot
            build one (the library still prunes, merges and saves it).
        default_folder: ``"module:function"`` returning the folder used when ``model.path`` is
            unset (the bundled MiniLM-L6 for ``bert``); None: ``model.path`` is required, or the
            family builds from scratch.
        default_for_modality: ``model.family: auto`` picks this family for its modality when
            ``model.path`` is unset (one per modality).
    """

    name: str
    modality: Modality
    library: str
    adapter: str | type
    embedding_stage: str | type
    classes: tuple[str, ...]
    model_types: tuple[str, ...] = ()
    shape_keys: tuple[str, str] = ("num_hidden_layers", "num_attention_heads")
    lr: float = 5e-5
    builder: str | None = None
    default_folder: str | None = None
    default_for_modality: bool = False
    _loaded: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def from_folder(self) -> bool:
        """True when the pipeline's base is a local pretrained folder (``model.path`` or
        :attr:`default_folder`), False when it is built from scratch (``model.vit``)."""
        return bool(self.model_types)

    def adapter_class(self) -> Any:
        """The adapter class (imported once), its ``family`` and ``modality`` set from here."""
        if "adapter" not in self._loaded:
            cls = _load(self.adapter, __package__)
            cls.family, cls.modality = self.name, self.modality
            self._loaded["adapter"] = cls
        return self._loaded["adapter"]

    def embedding_stage_class(self) -> Any:
        """The embedding-stage class (imported once), its ``family`` set from here."""
        if "stage" not in self._loaded:
            cls = _load(self.embedding_stage, __package__)
            cls.family = self.name
            self._loaded["stage"] = cls
        return self._loaded["stage"]

    def build_base(self, class_names: Any, *, seed: int, model_path: Any, **vit: Any) -> Any:
        """A new pipeline base (:attr:`builder`); ValueError when the family has none."""
        if self.builder is None:
            raise ValueError(
                f"model.family={self.name!r} cannot be a pipeline base; base families: "
                + ", ".join(name for name, fam in FAMILIES.items() if fam.builder)
            )
        return _load(self.builder, __package__)(
            class_names, seed=seed, model_path=model_path, **vit
        )

    def default_path(self) -> str | None:
        """The folder used when ``model.path`` is unset (None without :attr:`default_folder`)."""
        if self.default_folder is None:
            return None
        return str(_load(self.default_folder, __package__)())


#: ``name -> ModelFamily`` in registration order (the one table of supported families).
FAMILIES: Registry[ModelFamily] = Registry("model family", reserved=("auto",))


def register_family(family: ModelFamily) -> ModelFamily:
    """Add ``family`` to :data:`FAMILIES` (ValueError if its name or a ``model_type`` is taken,
    or its modality already has a default family); returns it."""
    if family.name in FAMILIES:
        raise ValueError(f"model family {family.name!r} is already registered")
    for other in FAMILIES.items():
        taken = set(family.model_types) & set(other[1].model_types)
        if taken:
            raise ValueError(f"model_type {sorted(taken)} is already registered to {other[0]!r}")
        same_modality = other[1].modality == family.modality
        if family.default_for_modality and other[1].default_for_modality and same_modality:
            raise ValueError(f"{family.modality} already has a default family: {other[0]!r}")
    return FAMILIES.register(family.name, family)


def model_types() -> dict[str, str]:
    """``model_type -> family name`` over every registered family."""
    return {t: name for name, fam in FAMILIES.items() for t in fam.model_types}


def family_of_model_type(model_type: object, where: str) -> ModelFamily:
    """The family registered for a ``config.json`` ``model_type``; ValueError (one line, naming
    ``where`` and the known types) otherwise."""
    known = model_types()
    if not isinstance(model_type, str) or model_type not in known:
        raise ValueError(
            f"{where} has model_type {model_type!r}, not a supported one: "
            + ", ".join(f"{t} ({f})" for t, f in known.items())
        )
    return FAMILIES[known[model_type]]


def default_family(modality: str) -> ModelFamily:
    """The family ``model.family: auto`` picks for ``modality`` without ``model.path``."""
    for _, fam in FAMILIES.items():
        if fam.default_for_modality and fam.modality == modality:
            return fam
    raise ValueError(f"no default model family for {modality} data")
