"""Writing splits to disk with a hash manifest, and reading them back verified.

Layout of ``out_dir``::

    manifest.json            classes, per-split counts per class, sha256 per file, source
    train.jsonl ...          text splits: one {"text": str, "label": int} per line
    train.safetensors ...    image splits: "images" uint8 [N, H, W(, C)], "labels" int64 [N]

``label`` is the index into ``manifest.classes`` for ID splits (train/val/test/shift) and -1 for
OOD splits (near_ood/far_ood/ood_val). Files are byte-deterministic given the config.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hydra_ops.atomic import atomic_write_dir
from hydra_ops.data.build import ID_SPLITS, SplitData, build_splits
from hydra_ops.data.spec import DataSpec
from hydra_ops.hashing import sha256_file

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


class DataIntegrityError(ValueError):
    """A split file is missing, truncated, corrupted or does not match its manifest hash."""


@dataclass
class SplitInfo:
    file: str
    sha256: str
    count: int
    kind: str  # "id" | "ood"
    counts_per_class: dict[str, int]
    description: str


@dataclass
class Manifest:
    """What :func:`materialise_splits` wrote. ``splits`` maps split name -> :class:`SplitInfo`."""

    modality: str
    classes: list[str]
    splits: dict[str, SplitInfo]
    source: dict[str, Any]
    ood_val_provenance: str
    image_shape: list[int] | None = None
    duplicates_removed: int = 0
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Manifest:
        d = dict(d)
        d["splits"] = {k: SplitInfo(**v) for k, v in d["splits"].items()}
        return cls(**d)


@dataclass
class Split:
    """A split read back by :func:`load_split`.

    ``labels`` [N] int64: ID class index, or -1 for OOD splits. ``texts`` (list of N str) or
    ``images`` (uint8 [N, H, W] or [N, H, W, C]) is set according to ``modality``.
    """

    name: str
    modality: str
    classes: list[str]
    labels: np.ndarray
    texts: list[str] | None = None
    images: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def _write_split(split: SplitData, directory: Path, modality: str) -> str:
    if modality == "text":
        assert split.texts is not None
        name = f"{split.name}.jsonl"
        with open(directory / name, "w", encoding="utf-8", newline="\n") as fh:
            for text, label in zip(split.texts, split.labels.tolist(), strict=True):
                fh.write(json.dumps({"text": text, "label": int(label)}, ensure_ascii=False))
                fh.write("\n")
    else:
        from safetensors.numpy import save_file

        assert split.images is not None
        name = f"{split.name}.safetensors"
        save_file(
            {
                "images": np.ascontiguousarray(split.images, dtype=np.uint8),
                "labels": np.ascontiguousarray(split.labels, dtype=np.int64),
            },
            str(directory / name),
        )
    return name


def materialise_splits(
    source_config: DataSpec | Mapping[str, Any],
    out_dir: str | os.PathLike[str],
    require: Sequence[str] = (),
) -> Manifest:
    """Build every split of ``source_config`` and write them with ``manifest.json`` to ``out_dir``.

    Written atomically: everything goes to a temporary folder next to ``out_dir`` which then
    replaces it. Returns the :class:`Manifest` (also on disk). ValueError, before anything is
    written, when a split named in ``require`` is not built (e.g. ``near_ood`` when the ID
    classes cover every class of the data and no near-OOD set is given).
    """
    cfg = (
        source_config if isinstance(source_config, DataSpec) else DataSpec.from_dict(source_config)
    )
    built = build_splits(cfg)
    if missing := [name for name in require if name not in built.splits]:
        raise ValueError(
            f"data source {cfg.name!r} builds no {', '.join(missing)} split: its classes "
            f"{built.classes} are all in-distribution; hold out classes "
            "(data.near_ood_classes: [...]) or give data.near_ood"
        )
    out = Path(out_dir)
    with atomic_write_dir(out) as tmp:
        infos: dict[str, SplitInfo] = {}
        for name, split in built.splits.items():
            file = _write_split(split, tmp, built.modality)
            kind = "id" if name in ID_SPLITS else "ood"
            counts = (
                {c: int((split.labels == i).sum()) for i, c in enumerate(built.classes)}
                if kind == "id"
                else {}
            )
            infos[name] = SplitInfo(
                file=file,
                sha256=sha256_file(tmp / file),
                count=len(split),
                kind=kind,
                counts_per_class=counts,
                description=split.description,
            )
        first = built.splits["train"]
        manifest = Manifest(
            modality=built.modality,
            classes=built.classes,
            splits=infos,
            source={
                "name": cfg.name,
                "description": built.source_description,
                "config": cfg.to_dict(),
            },
            ood_val_provenance=built.splits["ood_val"].description,
            image_shape=list(first.images.shape[1:]) if first.images is not None else None,
            duplicates_removed=built.duplicates_removed,
            extra={k: v for k, v in built.extra.items() if v is not None},
        )
        with open(tmp / MANIFEST, "w", encoding="utf-8") as fh:
            json.dump(manifest.to_dict(), fh, indent=2, sort_keys=True)
            fh.write("\n")
    return manifest


def load_manifest(out_dir: str | os.PathLike[str]) -> Manifest:
    """Read ``out_dir/manifest.json`` (DataIntegrityError if missing or malformed)."""
    path = Path(out_dir) / MANIFEST
    if not path.is_file():
        raise DataIntegrityError(f"no manifest at {str(path)!r}; run materialise_splits first")
    try:
        return Manifest.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, TypeError, KeyError, UnicodeDecodeError) as exc:
        raise DataIntegrityError(f"manifest {str(path)!r} is malformed: {exc}") from None


def load_split(out_dir: str | os.PathLike[str], name: str, verify: bool = True) -> Split:
    """Read split ``name`` back, checking its sha256 against the manifest first.

    Raises:
        ValueError: unknown split name (the message lists the available ones).
        DataIntegrityError: the file is missing, its hash differs, or it cannot be parsed.
    """
    manifest = load_manifest(out_dir)
    if name not in manifest.splits:
        raise ValueError(
            f"split {name!r} not in {str(out_dir)!r}; available: {sorted(manifest.splits)}"
        )
    info = manifest.splits[name]
    path = Path(out_dir) / info.file
    if not path.is_file():
        raise DataIntegrityError(f"split file {str(path)!r} is missing")
    if verify:
        digest = sha256_file(path)
        if digest != info.sha256:
            raise DataIntegrityError(
                f"split file {str(path)!r} is corrupted or was modified: sha256 {digest[:12]}... "
                f"!= manifest {info.sha256[:12]}...; re-run prepare_data"
            )
    try:
        if manifest.modality == "text":
            texts, labels = [], []
            with open(path, encoding="utf-8") as fh:
                for line in fh:
                    row = json.loads(line)
                    texts.append(str(row["text"]))
                    labels.append(int(row["label"]))
            split = Split(name, "text", manifest.classes, np.asarray(labels, np.int64), texts=texts)
        else:
            from safetensors.numpy import load_file

            arrays = load_file(str(path))
            split = Split(
                name,
                "image",
                manifest.classes,
                arrays["labels"].astype(np.int64),
                images=arrays["images"],
            )
    except Exception as exc:
        raise DataIntegrityError(f"split file {str(path)!r} cannot be read: {exc}") from None
    if len(split) != info.count:
        raise DataIntegrityError(
            f"split file {str(path)!r} has {len(split)} examples, manifest says {info.count}"
        )
    return split
