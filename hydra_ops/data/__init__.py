"""Data sources, stratified splits and verified on-disk manifests.

The sources are registered in :data:`DATA_SOURCES` (:mod:`hydra_ops.data.catalog`, one module
each): built-in ``bbc-news`` (default, text), ``brown-genres`` (text: Brown corpus passages,
split by document), ``mnist5k``, ``digits`` and ``fashion-mnist`` (images); the user's
``folder`` (class sub-folders of text or image files), ``csv`` and ``jsonl`` (text,label). See
docs/data.md. A loaded split becomes contract batches with :func:`split_batches`.

The names below are imported on first use, like :mod:`hydra_ops`'s: importing a submodule without
torch (``hydra_ops.data.spec``, which the pipeline's params read) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "split_batches": "hydra_ops.data.batching",
    "split_labels": "hydra_ops.data.batching",
    "text_tokenizer": "hydra_ops.data.batching",
    "ID_SPLITS": "hydra_ops.data.build",
    "OOD_SPLITS": "hydra_ops.data.build",
    "SPLIT_NAMES": "hydra_ops.data.build",
    "build_splits": "hydra_ops.data.build",
    "MissingAssetError": "hydra_ops.data.assets",
    "grouped_stratified_split": "hydra_ops.data.groups",
    "bbc_news_folder": "hydra_ops.data.sources",
    "kaomoji_texts": "hydra_ops.data.sources",
    "DATA_SOURCES": "hydra_ops.data.catalog",
    "DataSource": "hydra_ops.data.catalog",
    "data_modality": "hydra_ops.data.catalog",
    "register_source": "hydra_ops.data.catalog",
    "DataSpec": "hydra_ops.data.spec",
    "OODSource": "hydra_ops.data.spec",
    "stratified_cap": "hydra_ops.data.splits",
    "stratified_split": "hydra_ops.data.splits",
    "DataIntegrityError": "hydra_ops.data.store",
    "Manifest": "hydra_ops.data.store",
    "Split": "hydra_ops.data.store",
    "SplitInfo": "hydra_ops.data.store",
    "load_manifest": "hydra_ops.data.store",
    "load_split": "hydra_ops.data.store",
    "materialise_splits": "hydra_ops.data.store",
    "sha256_file": "hydra_ops.data.store",
    "char_noise": "hydra_ops.data.transforms",
    "image_shift": "hydra_ops.data.transforms",
    "patch_shuffle": "hydra_ops.data.transforms",
    "pixel_shuffle": "hydra_ops.data.transforms",
    "word_shuffle": "hydra_ops.data.transforms",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hydra_ops.data' has no attribute {name!r}")
