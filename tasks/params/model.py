"""The model-side sections: ``model`` (with ``model.vit``), ``finetune``, ``runtime``; the data
modality and the text model's shape they derive from."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_serializer

from hydra_ops.data.spec import IMAGE_EXTENSIONS, DataSpec
from hydra_ops.models.shapes import VIT_DEFAULTS, text_model_shape
from tasks.params.base import Strict

IMAGE_SOURCES = ("mnist5k", "digits", "fashion-mnist")

#: Heads per layer / layers of the built-in text model (MiniLM-L6).
MINILM_LAYERS, MINILM_HEADS = 6, 12


def _text_model_shape(path: str | None) -> tuple[int, int]:
    """``(layers, heads per layer)`` of the text model: MiniLM-L6's without ``path``, else
    :func:`hydra_ops.models.shapes.text_model_shape` of its folder (ValueError, one line, no
    key)."""
    return (MINILM_LAYERS, MINILM_HEADS) if path is None else text_model_shape(path)


def data_modality(data: DataSpec) -> str:
    """``"image"`` for the built-in image sources and folders of images, else ``"text"``."""
    if data.name in IMAGE_SOURCES:
        return "image"
    if data.name == "folder" and data.path and Path(data.path).is_dir():
        for f in Path(data.path).rglob("*"):
            if f.is_file():
                return "image" if f.suffix.lower() in IMAGE_EXTENSIONS else "text"
    return "text"


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
    """``auto`` (from the data's modality) or one of ``hydra_ops.models.factory.BASE_FAMILIES``."""
    path: str | None = None
    max_length: int = Field(default=64, ge=8, le=512)
    vit: VitConfig = VitConfig()


class FinetuneConfig(Strict):
    epochs: int = Field(default=3, ge=1)
    batch_size: int = Field(default=16, ge=1)
    lr: float | None = Field(default=None, gt=0)
    """``None``: 5e-5 for MiniLM (fine-tuning), 1e-3 for the from-scratch timm ViT."""
    weight_decay: float = Field(default=0.01, ge=0)
    warmup_ratio: float = Field(default=0.1, ge=0, lt=1)
    seed: int = 0
    random_shift: int = Field(default=0, ge=0)
    """Image data only: translate each training image by up to this many pixels per axis (random
    per image and epoch, zero fill; :func:`hydra_ops.data.augment.random_shift`); 0 = off. Left
    out of the dump while 0, so text runs keep their ``params.yaml`` and unit fingerprints."""

    @model_serializer(mode="wrap")
    def _omit_off_shift(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        if self.random_shift == 0:
            out.pop("random_shift", None)
        return out


class RuntimeConfig(Strict):
    """Where and in which precision the model-running stages run
    (:mod:`hydra_ops.models.runtime`)."""

    device: str = "auto"
    """``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``."""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """``auto``: each model stage resolves it (:mod:`tasks.precision`): fp32 where bf16 is not
    native (no ``amx_bf16`` / ``avx512_bf16``, CUDA < 8.0), else bf16 when a short probe on the
    stage's model and batch finds it clearly faster (>= 1.15x, every bf16 round faster than fp32's
    fastest: :mod:`hydra_ops.margin`; and, for inference, agreeing with fp32 within
    ``compile.tolerance_low_precision``), measured once per machine kind and shape and kept in the
    project's hardware record (:mod:`tasks.hardware`); compile decides the precision it ships.
    Pin ``fp32`` (or ``bf16``) to reproduce a version's weights on another machine."""

    @field_validator("device")
    @classmethod
    def _device_spec(cls, value: str) -> str:
        if not re.fullmatch(r"auto|cpu|cuda|cuda:\d+", value):
            raise ValueError(f"unknown device {value!r}; allowed: auto, cpu, cuda, cuda:N")
        return value
