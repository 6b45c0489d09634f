"""Data sources, stratified splits and verified on-disk manifests.

Built-in sources: ``bbc-news`` (default, text), ``mnist5k`` and ``digits`` (images); user sources:
``folder`` (class sub-folders of text or image files), ``csv`` and ``jsonl`` (text,label). See
docs/data.md. A loaded split becomes contract batches with :func:`split_batches`.
"""

from hydra_ops.data.batching import split_batches, split_labels, text_tokenizer
from hydra_ops.data.build import ID_SPLITS, OOD_SPLITS, SPLIT_NAMES, build_splits
from hydra_ops.data.sources import bbc_news_folder, kaomoji_texts
from hydra_ops.data.spec import (
    ALL_SOURCES,
    BUILTIN_SOURCES,
    USER_SOURCES,
    DataSpec,
    OODSource,
)
from hydra_ops.data.splits import stratified_cap, stratified_split
from hydra_ops.data.store import (
    DataIntegrityError,
    Manifest,
    Split,
    SplitInfo,
    load_manifest,
    load_split,
    materialise_splits,
    sha256_file,
)
from hydra_ops.data.transforms import (
    char_noise,
    image_shift,
    patch_shuffle,
    pixel_shuffle,
    word_shuffle,
)

__all__ = [
    "ALL_SOURCES",
    "BUILTIN_SOURCES",
    "ID_SPLITS",
    "OOD_SPLITS",
    "SPLIT_NAMES",
    "USER_SOURCES",
    "DataIntegrityError",
    "DataSpec",
    "Manifest",
    "OODSource",
    "Split",
    "SplitInfo",
    "bbc_news_folder",
    "build_splits",
    "char_noise",
    "image_shift",
    "kaomoji_texts",
    "load_manifest",
    "load_split",
    "materialise_splits",
    "patch_shuffle",
    "pixel_shuffle",
    "sha256_file",
    "split_batches",
    "split_labels",
    "stratified_cap",
    "stratified_split",
    "text_tokenizer",
    "word_shuffle",
]
