"""The prepared data as the stages read it: the manifest and verified splits (read once per process)
and contract batches built with the params' tokenizer, ``max_length`` and image size."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra_ops.data import Manifest, Split, load_manifest, load_split, split_batches, text_tokenizer
from tasks.params.core import CoreConfig
from tasks.runtime.layout import DATA


@functools.cache
def _manifest(data_dir: str) -> Manifest:
    return load_manifest(data_dir)


@functools.cache
def _split(data_dir: str, name: str) -> Split:
    return load_split(data_dir, name)


def manifest(root: Path) -> Manifest:
    """The prepared data's manifest (``DataIntegrityError`` if missing or malformed)."""
    return _manifest(str(Path(root) / DATA))


def split(root: Path, name: str) -> Split:
    """A prepared split, its file verified against the manifest's sha256."""
    return _split(str(Path(root) / DATA), name)


def batches(cfg: CoreConfig, data: Split, batch_size: int, **kwargs: Any) -> list[dict]:
    """``data`` as contract batches (:func:`hydra_ops.data.split_batches`; ``kwargs``: shuffle,
    seed, with_labels, limit)."""
    tokenizer = text_tokenizer(cfg.model_folder) if data.texts is not None else None
    return split_batches(
        data,
        batch_size,
        tokenizer=tokenizer,
        max_length=cfg.model.max_length,
        image_size=cfg.model.vit.image_size,
        **kwargs,
    )


def train_batches(
    cfg: CoreConfig, root: Path, seed: int, *, pin_memory: bool = False
) -> Callable[[int], list[dict]]:
    """``epoch -> batches`` of the training split, reshuffled (and, with
    ``finetune.random_shift``, its images shifted) per epoch from ``seed + epoch`` (what
    :func:`hydra_ops.models.training.fine_tune` takes); ``pin_memory`` for a CUDA run."""
    train = split(root, "train")

    def epoch_batches(epoch: int) -> list[dict]:
        return batches(
            cfg,
            train,
            cfg.finetune.batch_size,
            shuffle=True,
            seed=seed + epoch,
            pin_memory=pin_memory,
            random_shift=cfg.finetune.random_shift,
        )

    return epoch_batches
