"""The data sources, one module each, every one registered once in :data:`DATA_SOURCES` with
its modality, its classes and its defaults; ``DataSpec``, the params schema, the data builder and
the stages read the registry. Importing this package imports no numpy or torch.

Built-in: ``bbc-news`` (text, the default), ``brown-genres`` (text), ``mnist5k``, ``digits``,
``fashion-mnist`` (images). The user's: ``folder`` (class sub-folders of text or image files),
``csv`` and ``jsonl`` (text and label columns).
"""

from __future__ import annotations

from hydra_ops.data.catalog import (  # noqa: F401  (each module registers its source)
    bbc_news,
    brown_genres,
    csv_table,
    digits,
    fashion_mnist,
    folder,
    jsonl_table,
    mnist5k,
)
from hydra_ops.data.catalog.base import (
    DATA_SOURCES,
    MODALITIES,
    DataSource,
    Modality,
    data_modality,
    data_source,
    register_source,
)

__all__ = [
    "DATA_SOURCES",
    "MODALITIES",
    "DataSource",
    "Modality",
    "data_modality",
    "data_source",
    "register_source",
]
