"""The model-side sections: ``model`` (with ``model.vit``), ``finetune``, ``runtime``; the data
modality and the model family and shape they derive from."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_serializer

from hydra_ops.adapters import FAMILIES, ModelFamily, default_family
from hydra_ops.data.catalog import data_modality as source_modality
from hydra_ops.data.spec import DataSpec
from hydra_ops.models.shapes import VIT_DEFAULTS, read_model_folder
from tasks.params.base import Strict


def resolve_family(name: str, path: str | None, modality: str) -> ModelFamily:
    """The registered family of ``model.family`` = ``name``; ``auto``: the family of the folder
    ``path`` (its ``config.json`` ``model_type``), else the default family of ``modality``.
    ValueError (one line, no key) for an unknown name or an unreadable folder."""
    if name != "auto":
        return FAMILIES.get(name, "model.family")
    if path is not None and Path(path).exists():
        return read_model_folder(path)[1]
    return default_family(modality)


def data_modality(data: DataSpec) -> str:
    """``"text"`` or ``"image"``: the modality the data source declares in
    ``hydra_ops.data.catalog.DATA_SOURCES`` (a folder's: its files')."""
    return source_modality(data)


class VitConfig(Strict):
    """The from-scratch ViT's shape; defaults: :data:`hydra_ops.models.factory.VIT_DEFAULTS`."""

    image_size: int = Field(default=VIT_DEFAULTS.image_size, ge=4)
    patch_size: int = Field(default=VIT_DEFAULTS.patch_size, ge=1)
    embed_dim: int = Field(default=VIT_DEFAULTS.embed_dim, ge=8)
    depth: int = Field(default=VIT_DEFAULTS.depth, ge=1)
    num_heads: int = Field(default=VIT_DEFAULTS.num_heads, ge=1)
    mlp_ratio: float = Field(default=VIT_DEFAULTS.mlp_ratio, gt=0)


class ModelConfig(Strict):
    family: str = "auto"
    """``auto`` (from ``path``'s ``config.json`` ``model_type``, else the data's modality) or a
    family of ``hydra_ops.adapters.FAMILIES`` that has a builder."""
    path: str | None = None
    max_length: int = Field(default=64, ge=8, le=512)
    vit: VitConfig = VitConfig()


class FinetuneConfig(Strict):
    epochs: int = Field(default=3, ge=1)
    batch_size: int = Field(default=16, ge=1)
    lr: float | None = Field(default=None, gt=0)
    """``None``: the family's default (``ModelFamily.lr``: 5e-5 to fine-tune a pretrained text
    encoder, 1e-3 for the from-scratch timm ViT)."""
    weight_decay: float = Field(default=0.01, ge=0)
    warmup_ratio: float = Field(default=0.1, ge=0, lt=1)
    seed: int = 0
    random_shift: int = Field(default=0, ge=0)
    """Image data only: translate each training image by up to this many pixels per axis (random
    per image and epoch, zero fill; :func:`hydra_ops.data.augment.random_shift`); 0 = off. Left
    out of the dump while 0, so text runs keep their ``params.yaml`` and unit fingerprints."""
    from_checkpoint: bool = False
    """``model.path`` is the user's fine-tuned classifier (``*ForSequenceClassification`` with
    ``id2label``): it becomes ``models/base`` as it is, with its labels matched to the data's
    classes, and the base fine-tune is skipped (:mod:`hydra_ops.models.fine_tuned`). Left out of
    the dump while false."""

    @model_serializer(mode="wrap")
    def _omit_off_options(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        if self.random_shift == 0:
            out.pop("random_shift", None)
        if not self.from_checkpoint:
            out.pop("from_checkpoint", None)
        return out


class RuntimeConfig(Strict):
    """Where and in which precision the model-running stages run
    (:mod:`hydra_ops.models.runtime`)."""

    device: str = "auto"
    """``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``."""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """``auto``: each model stage resolves it (:mod:`tasks.runtime.precision`): fp32 where bf16 is
    not native (no ``amx_bf16`` / ``avx512_bf16``, CUDA < 8.0), else bf16 when a short probe on the
    stage's model and batch finds it clearly faster (>= 1.15x, every bf16 round faster than fp32's
    fastest: :mod:`hydra_ops.margin`; and, for inference, agreeing with fp32 within
    ``compile.tolerance_low_precision``), measured once per machine kind and shape and kept in the
    project's hardware record (:mod:`tasks.runtime.hardware`); compile decides the precision it
    ships.
    Pin ``fp32`` (or ``bf16``) to reproduce a version's weights on another machine."""

    @field_validator("device")
    @classmethod
    def _device_spec(cls, value: str) -> str:
        if not re.fullmatch(r"auto|cpu|cuda|cuda:\d+", value):
            raise ValueError(f"unknown device {value!r}; allowed: auto, cpu, cuda, cuda:N")
        return value
