"""Deterministic stratified splitting and per-split size caps."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _allocate(n: int, fractions: Sequence[float]) -> list[int]:
    """Split ``n`` items into len(fractions) parts: largest-remainder rounding, each part >= 1."""
    raw = [n * f for f in fractions]
    counts = [max(1, int(np.floor(r))) for r in raw]
    order = np.argsort([-(r - np.floor(r)) for r in raw], kind="stable")
    k = 0
    while sum(counts) < n:
        counts[int(order[k % len(order)])] += 1
        k += 1
    while sum(counts) > n:  # the >= 1 floors overshot: take from the largest part
        counts[int(np.argmax(counts))] -= 1
    return counts


def stratified_split(
    labels: np.ndarray,
    fractions: Sequence[float],
    seed: int,
    names: Sequence[str] | None = None,
) -> list[np.ndarray]:
    """Indices of each part, stratified by label, deterministic under ``seed``.

    Every class is split by the same ``fractions`` (largest-remainder rounding) and every class
    appears in every part, so a class needs at least ``max(2, len(fractions))`` examples
    (ValueError naming the class otherwise). Returned index arrays are sorted.
    """
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    parts: list[list[int]] = [[] for _ in fractions]
    need = max(2, len(fractions))
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        if len(idx) < need:
            name = names[int(c)] if names is not None else str(c)
            raise ValueError(
                f"class {name!r} has {len(idx)} example(s); stratified train/val/test splitting "
                f"needs at least {need} per class"
            )
        idx = idx[rng.permutation(len(idx))]
        start = 0
        for part, count in zip(parts, _allocate(len(idx), fractions), strict=True):
            part.extend(idx[start : start + count].tolist())
            start += count
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def stratified_cap(labels: np.ndarray, cap: int | None, seed: int) -> np.ndarray:
    """Sorted indices of at most ``cap`` items keeping class proportions (each class >= 1 when
    ``cap`` allows). ``cap=None`` or ``cap >= len`` keeps everything."""
    labels = np.asarray(labels)
    n = len(labels)
    if cap is None or cap >= n:
        return np.arange(n)
    classes, counts = np.unique(labels, return_counts=True)
    if cap < len(classes):
        raise ValueError(
            f"max_per_split {cap} is smaller than the number of classes {len(classes)}"
        )
    quota = _allocate(cap, counts / counts.sum())
    quota = [min(q, c) for q, c in zip(quota, counts, strict=True)]
    rng = np.random.default_rng(seed)
    keep: list[int] = []
    for c, q in zip(classes, quota, strict=True):
        idx = np.flatnonzero(labels == c)
        keep.extend(idx[rng.permutation(len(idx))[:q]].tolist())
    return np.sort(np.asarray(keep, dtype=np.int64))


def random_cap(n: int, cap: int | None, seed: int) -> np.ndarray:
    """Sorted indices of at most ``cap`` of ``n`` items (unlabelled OOD sets)."""
    if cap is None or cap >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=cap, replace=False))
