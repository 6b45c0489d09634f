"""Splitting by group: examples that share a group (passages of one document) stay together."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hydra_ops.data.splits import stratified_split


def grouped_stratified_split(
    labels: np.ndarray,
    groups: np.ndarray,
    fractions: Sequence[float],
    seed: int,
    names: Sequence[str] | None = None,
) -> list[np.ndarray]:
    """Indices of each part, whole groups to a part, stratified by label over groups.

    Every group must hold one label (ValueError naming the first mixed group). The groups of each
    class are split by ``fractions`` like :func:`~hydra_ops.data.splits.stratified_split` splits
    examples (so a class needs at least ``max(2, len(fractions))`` groups); every example follows
    its group, so no group spans two parts. Deterministic under ``seed``; sorted index arrays.
    """
    labels = np.asarray(labels)
    groups = np.asarray(groups)
    _, first, inverse = np.unique(groups, return_index=True, return_inverse=True)
    group_label = labels[first]
    mixed = np.flatnonzero(group_label[inverse] != labels)
    if mixed.size:
        raise ValueError(f"group {str(groups[mixed[0]])!r} holds examples of more than one class")
    try:
        parts = stratified_split(group_label, fractions, seed, names=names)
    except ValueError as exc:
        raise ValueError(str(exc).replace("example(s)", "group(s)")) from None
    return [np.flatnonzero(np.isin(inverse, part)) for part in parts]
