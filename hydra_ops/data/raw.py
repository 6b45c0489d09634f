"""Raw examples of a source (no splitting here): the :class:`RawData` record and its text checks.

Texts are ``list[str]``; images are ``uint8`` arrays [N, H, W] (grayscale) or [N, H, W, 3].
Labels are int indices into ``names``. The sources that produce them: the user's folders and
tables (:mod:`hydra_ops.data.user_sources`) and the built-in data sets
(:mod:`hydra_ops.data.sources`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class RawData:
    """All labelled examples of a source. Exactly one of ``texts`` / ``images`` is set."""

    names: list[str]
    labels: np.ndarray  # [N] int64, indices into names
    texts: list[str] | None = None
    images: np.ndarray | None = None  # [N, H, W] or [N, H, W, 3] uint8
    description: str = ""
    duplicates_removed: int = 0
    #: [N] ids of the documents the examples were cut from (``None``: every example its own);
    #: splits keep a group whole, so no document spans two splits
    groups: np.ndarray | None = None

    @property
    def modality(self) -> str:
        return "text" if self.texts is not None else "image"

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def _first(items: list[int] | list[str], k: int = 5) -> str:
    shown = ", ".join(str(i) for i in items[:k])
    return shown + (", ..." if len(items) > k else "")


def check_texts(texts: list[str], where: list[str], what: str, source: str) -> None:
    """ValueError when a text is empty or whitespace-only, naming how many and where.

    ``where[i]`` says where ``texts[i]`` came from (a line number or a file name).
    """
    empty = [where[i] for i, t in enumerate(texts) if not t.strip()]
    if empty:
        raise ValueError(
            f"{what}: {source} has {len(empty)} empty or whitespace-only text(s) at "
            f"{_first(empty)}; fill or remove them (empty texts cannot be classified)"
        )


def dedupe_texts(raw: RawData) -> RawData:
    """Drop exact duplicate texts (first occurrence kept) so no text is in two splits."""
    assert raw.texts is not None
    seen: set[str] = set()
    keep = []
    for i, t in enumerate(raw.texts):
        if t not in seen:
            seen.add(t)
            keep.append(i)
    removed = len(raw.texts) - len(keep)
    return RawData(
        names=raw.names,
        labels=raw.labels[keep],
        texts=[raw.texts[i] for i in keep],
        description=raw.description,
        duplicates_removed=raw.duplicates_removed + removed,
        groups=None if raw.groups is None else raw.groups[keep],
    )
