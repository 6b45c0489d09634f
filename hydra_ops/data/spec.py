"""What a data source is and how it is split: frozen dataclasses the builders take.

Plain Python (no pydantic): ``DataSpec(name="csv", path="my.csv")`` works as it is, and
``__post_init__`` checks what the builders rely on, raising a ``ValueError`` that names the field.
A params schema (pydantic) can take these classes as its ``data:`` section as they are, so both
sides validate the same way. Which sources exist, and what each declares (modality, classes,
defaults), is the registry :data:`hydra_ops.data.catalog.DATA_SOURCES`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hydra_ops.data.file_kinds import FAR_OOD_BUILTINS

#: The kinds of a user OOD set (``data.near_ood``, ``data.far_ood``, ``data.ood_val``).
OOD_SOURCE_KINDS = ("folder", "csv", "jsonl")
TEXT_OOD_VAL = ("word_shuffle",)
IMAGE_OOD_VAL = ("patch_shuffle", "pixel_shuffle")
SHIFT_KINDS = ("noise", "rotation", "noise+rotation")

# a schema validator reading these dataclasses (pydantic in the pipeline) refuses unknown keys
# and reads numeric class names as strings (``near_ood_classes: [8]``, as ``__post_init__`` does)
_FORBID_EXTRA = {"extra": "forbid", "coerce_numbers_to_str": True}
_CLASS_LISTS = ("classes", "id_classes", "near_ood_classes")


def _one_of(name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))}; got {value!r}")


def _fraction(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and 0.0 < value < 1.0):
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")


@dataclass(frozen=True)
class OODSource:
    """A user OOD set: a folder (files, or class sub-folders of files), a CSV or a JSONL of texts.

    Labels in it are ignored; every example is out-of-distribution.
    """

    __pydantic_config__ = _FORBID_EXTRA

    kind: Literal["folder", "csv", "jsonl"]
    path: str
    text_column: str = "text"

    def __post_init__(self) -> None:
        _one_of("kind", self.kind, OOD_SOURCE_KINDS)
        if not self.path:
            raise ValueError("an OOD source needs 'path'")


@dataclass(frozen=True)
class DataSpec:
    """Where the examples come from and how they are split.

    ``name`` is a source of :data:`hydra_ops.data.catalog.DATA_SOURCES`: a built-in one
    (``bbc-news``, ``mnist5k``, ``digits``, ``brown-genres``, ``fashion-mnist``) or a user source
    kind (``folder``, ``csv``, ``jsonl``; then ``path`` is required). ``classes``: for user sources,
    the allowed labels (default: those present); ``id_classes``: the in-distribution classes
    (default depends on the source); ``near_ood_classes``: held-out classes used as near-OOD
    (default: all non-ID ones). ``image_size``: resize user images to S x S.
    """

    __pydantic_config__ = _FORBID_EXTRA

    name: str = "bbc-news"
    path: str | None = None
    text_column: str = "text"
    label_column: str = "label"
    classes: list[str] | None = None
    id_classes: list[str] | None = None
    near_ood_classes: list[str] | None = None
    near_ood: OODSource | None = None
    far_ood: OODSource | Literal["kaomoji", "sample_images", "noise", "mnist"] | None = None
    far_ood_size: int = 500
    ood_val: OODSource | Literal["word_shuffle", "patch_shuffle", "pixel_shuffle"] | None = None
    shift_severity: float = 0.1
    shift_kind: Literal["noise", "rotation", "noise+rotation"] = "noise+rotation"
    train_frac: float = 0.7
    val_frac: float = 0.15
    test_frac: float = 0.15
    max_per_split: int | None = None
    seed: int = 0
    image_size: int | None = None
    channels: Literal[1, 3] = 1
    dedupe: bool = True

    def __post_init__(self) -> None:
        from hydra_ops.data.catalog import data_source

        if data_source(self.name).needs_path and not self.path:
            raise ValueError(f"data source {self.name!r} needs 'path'")
        for key in _CLASS_LISTS:
            names = getattr(self, key)
            if names is not None:
                names = [str(n) for n in names]
                object.__setattr__(self, key, names)
                twice = sorted({n for n in names if names.count(n) > 1})
                if twice:
                    raise ValueError(f"{key} lists {twice} more than once")
        for key, value in (("near_ood", self.near_ood), ("far_ood", self.far_ood)):
            if isinstance(value, dict):
                object.__setattr__(self, key, OODSource(**value))
        if isinstance(self.ood_val, dict):
            object.__setattr__(self, "ood_val", OODSource(**self.ood_val))
        if isinstance(self.far_ood, str):
            _one_of("far_ood", self.far_ood, FAR_OOD_BUILTINS)
        if isinstance(self.ood_val, str):
            _one_of("ood_val", self.ood_val, TEXT_OOD_VAL + IMAGE_OOD_VAL)
        _one_of("shift_kind", self.shift_kind, SHIFT_KINDS)
        _one_of("channels", self.channels, (1, 3))
        if not 0.0 <= self.shift_severity <= 1.0:
            raise ValueError(f"shift_severity must be in [0, 1], got {self.shift_severity!r}")
        if self.far_ood_size < 1:
            raise ValueError(f"far_ood_size must be >= 1, got {self.far_ood_size!r}")
        if self.max_per_split is not None and self.max_per_split < 1:
            raise ValueError(f"max_per_split must be >= 1 or None, got {self.max_per_split!r}")
        if self.image_size is not None and self.image_size < 4:
            raise ValueError(f"image_size must be >= 4 or None, got {self.image_size!r}")
        for key in ("train_frac", "val_frac", "test_frac"):
            _fraction(key, getattr(self, key))
        total = self.train_frac + self.val_frac + self.test_frac
        if not math.isclose(total, 1.0, abs_tol=1e-6):
            raise ValueError(
                f"train_frac + val_frac + test_frac must be 1, got {total:.4f} "
                f"({self.train_frac}, {self.val_frac}, {self.test_frac})"
            )
        if self.id_classes is not None and len(set(self.id_classes)) < 2:
            raise ValueError(f"id_classes needs at least 2 distinct classes, got {self.id_classes}")
        if self.id_classes and self.near_ood_classes:
            both = sorted(set(self.id_classes) & set(self.near_ood_classes))
            if both:
                raise ValueError(f"near_ood_classes overlap id_classes: {both}")
        if isinstance(self.ood_val, OODSource):
            tests = [o for o in (self.near_ood, self.far_ood) if isinstance(o, OODSource)]
            if any(o.path == self.ood_val.path for o in tests):
                raise ValueError(
                    "ood_val must not be an OOD test set: its path equals near_ood/far_ood's path"
                )

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> DataSpec:
        """Build from plain data (e.g. parsed JSON); unknown keys are a ``ValueError``."""
        allowed = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(raw) - set(allowed))
        if unknown:
            raise ValueError(f"unknown data key(s) {unknown}; allowed: {', '.join(allowed)}")
        return cls(**raw)

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready plain data (nested OOD sources as dicts)."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def replace(self, **changes: Any) -> DataSpec:
        return dataclasses.replace(self, **changes)


def known_classes(spec: DataSpec) -> list[str] | None:
    """The source's class names when they are known without reading its examples, else ``None``.

    Built-in sources: fixed; user sources: ``classes`` when given, else a folder's class
    sub-folders (hidden ones skipped); a CSV/JSONL's labels need the file read (``None``).
    """
    from hydra_ops.data.catalog import data_source

    fixed = data_source(spec.name).classes
    if fixed is not None:
        return list(fixed)
    if spec.classes is not None:
        return list(spec.classes)
    if spec.name == "folder" and spec.path and Path(spec.path).is_dir():
        return sorted(
            p.name for p in Path(spec.path).iterdir() if p.is_dir() and not p.name.startswith(".")
        )
    return None


def near_ood_problem(spec: DataSpec) -> tuple[str, str] | None:
    """``(key, message)`` when ``spec`` is known to build no ``near_ood`` split, else ``None``.

    A near-OOD split comes from ``near_ood`` (a user set) or from held-out classes: those in
    ``near_ood_classes``, or by default every class outside the ID classes (a built-in source
    holds some out; a user source's default ID classes are all of its classes, so it holds none
    out). A CSV/JSONL with ``id_classes`` but without ``classes`` passes: its labels are unknown
    until the file is read. The library builds splits without near-OOD; the pipeline needs one.
    """
    if spec.near_ood is not None:
        return None
    fix = (
        "hold out classes (data.near_ood_classes: [...]) or give data.near_ood "
        "({kind: folder|csv|jsonl, path})"
    )
    if spec.near_ood_classes is not None:
        if spec.near_ood_classes:
            return None
        return "data.near_ood_classes", f"is empty and data.near_ood is not set: {fix}"
    from hydra_ops.data.catalog import data_source

    if spec.id_classes is None:
        if data_source(spec.name).default_id_classes is not None:
            return None
        return (
            "data.near_ood_classes",
            f"source {spec.name!r} needs a near-OOD set (every class is in-distribution by "
            f"default): {fix}",
        )
    classes = known_classes(spec)
    if classes is None or set(classes) - set(spec.id_classes):
        return None
    return (
        "data.id_classes",
        f"{spec.id_classes} cover every class of source {spec.name!r}, which leaves no "
        f"near-OOD set: {fix}",
    )


def _plain(value: Any) -> Any:
    if isinstance(value, OODSource):
        return dataclasses.asdict(value)
    if isinstance(value, list):
        return list(value)
    return value
