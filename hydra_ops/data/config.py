"""Validated description of a data source (what ``params.yaml``'s ``data:`` block holds)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

BUILTIN_SOURCES = ("bbc-news", "mnist5k", "digits")
USER_SOURCES = ("folder", "csv", "jsonl")
ALL_SOURCES = BUILTIN_SOURCES + USER_SOURCES
TEXT_OOD_VAL = ("word_shuffle",)
IMAGE_OOD_VAL = ("patch_shuffle", "pixel_shuffle")


class OODSourceConfig(BaseModel):
    """A user OOD set: a folder (files, or class sub-folders of files), a CSV or a JSONL of texts.

    Labels in it are ignored; every example is out-of-distribution.
    """

    model_config = ConfigDict(extra="forbid")

    kind: Literal["folder", "csv", "jsonl"]
    path: str
    text_column: str = "text"


class DataSourceConfig(BaseModel):
    """Where the examples come from and how they are split.

    ``name`` is a built-in source (``bbc-news``, ``mnist5k``, ``digits``) or a user source kind
    (``folder``, ``csv``, ``jsonl``; then ``path`` is required).
    """

    model_config = ConfigDict(extra="forbid")

    name: str = "bbc-news"
    path: str | None = None
    text_column: str = "text"
    label_column: str = "label"
    classes: list[str] | None = Field(
        default=None, description="user sources: the allowed labels (default: those present)"
    )
    id_classes: list[str] | None = Field(
        default=None, description="in-distribution classes (default depends on the source)"
    )
    near_ood_classes: list[str] | None = Field(
        default=None, description="held-out classes used as near-OOD (default: all non-ID ones)"
    )
    near_ood: OODSourceConfig | None = None
    far_ood: OODSourceConfig | Literal["kaomoji", "sample_images", "noise"] | None = None
    far_ood_size: int = Field(default=500, ge=1)
    ood_val: OODSourceConfig | Literal["word_shuffle", "patch_shuffle", "pixel_shuffle"] | None = (
        None
    )
    shift_severity: float = Field(default=0.1, ge=0.0, le=1.0)
    shift_kind: Literal["noise", "rotation", "noise+rotation"] = "noise+rotation"
    train_frac: float = Field(default=0.7, gt=0.0, lt=1.0)
    val_frac: float = Field(default=0.15, gt=0.0, lt=1.0)
    test_frac: float = Field(default=0.15, gt=0.0, lt=1.0)
    max_per_split: int | None = Field(default=None, ge=1)
    seed: int = 0
    image_size: int | None = Field(default=None, ge=4, description="resize user images to S x S")
    channels: Literal[1, 3] = 1
    dedupe: bool = True

    @field_validator("name")
    @classmethod
    def _known_name(cls, value: str) -> str:
        if value not in ALL_SOURCES:
            raise ValueError(
                f"unknown data source {value!r}; built-in sources: {', '.join(BUILTIN_SOURCES)}; "
                f"user sources: {', '.join(USER_SOURCES)} (with path)"
            )
        return value

    @field_validator("classes", "id_classes", "near_ood_classes", mode="before")
    @classmethod
    def _as_strings(cls, value: object) -> object:
        if isinstance(value, list | tuple):
            return [str(v) for v in value]
        return value

    @model_validator(mode="after")
    def _consistent(self) -> DataSourceConfig:
        if self.name in USER_SOURCES and not self.path:
            raise ValueError(f"data source {self.name!r} needs 'path'")
        total = self.train_frac + self.val_frac + self.test_frac
        if abs(total - 1.0) > 1e-6:
            raise ValueError(
                f"train_frac + val_frac + test_frac must be 1, got {total:.4f} "
                f"({self.train_frac}, {self.val_frac}, {self.test_frac})"
            )
        for key in ("classes", "id_classes", "near_ood_classes"):
            names = getattr(self, key) or []
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ValueError(f"{key} lists {twice} more than once")
        if self.id_classes is not None and len(set(self.id_classes)) < 2:
            raise ValueError(f"id_classes needs at least 2 distinct classes, got {self.id_classes}")
        if self.id_classes and self.near_ood_classes:
            both = sorted(set(self.id_classes) & set(self.near_ood_classes))
            if both:
                raise ValueError(f"near_ood_classes overlap id_classes: {both}")
        if isinstance(self.ood_val, OODSourceConfig):
            tests = [o for o in (self.near_ood, self.far_ood) if isinstance(o, OODSourceConfig)]
            if any(o.path == self.ood_val.path for o in tests):
                raise ValueError(
                    "ood_val must not be an OOD test set: its path equals near_ood/far_ood's path"
                )
        return self
