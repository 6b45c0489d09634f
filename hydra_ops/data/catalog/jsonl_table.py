"""``jsonl``: the user's JSONL file of texts and labels (``data.text_column``,
``data.label_column``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hydra_ops.data.catalog.base import DataSource, register_source

if TYPE_CHECKING:
    from hydra_ops.data.raw import RawData
    from hydra_ops.data.spec import DataSpec


def load(spec: DataSpec) -> RawData:
    from hydra_ops.data.user_sources import load_table

    assert spec.path is not None
    return load_table(spec.path, "jsonl", spec.text_column, spec.label_column, spec.classes)


SOURCE = register_source(
    DataSource(
        name="jsonl",
        modality="text",
        load=load,
        description="a JSONL file of text and label columns (data.path)",
        needs_path=True,
    )
)
