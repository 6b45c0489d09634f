"""Which training examples each ensemble member is fine-tuned on.

Modes (:data:`MEMBER_DATA_MODES`), for a training split of ``n`` examples and ``M`` members:

- ``full``: every member sees the whole split (the indices ``0..n-1`` in order).
- ``bootstrap``: member ``m`` sees ``n`` examples drawn uniformly with replacement (Breiman 1996,
  "Bagging Predictors"), from a generator seeded by ``(seed, m)``: about ``1 - 1/e = 63.2%`` of
  the examples are distinct, the rest repeats; members draw independently.
- ``shards``: the split is cut into ``M`` disjoint shards, stratified by label: each class's
  examples are permuted by a generator seeded by ``seed`` (the same for every member) and dealt
  round-robin, so every shard holds ``floor`` or ``ceil`` of ``n_c / M`` of class ``c``. Member
  ``m`` sees shard ``m`` only: ``~n / M`` examples, no example shared.

The indices are what :func:`subset` takes; a member's batches are then shuffled per epoch as the
full split's are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from hydra_ops.data.store import Split

MEMBER_DATA_MODES: tuple[str, ...] = ("full", "bootstrap", "shards")

__all__ = ["MEMBER_DATA_MODES", "member_indices", "subset"]


def member_indices(
    labels: Sequence[int] | np.ndarray, num_members: int, member: int, mode: str, seed: int
) -> np.ndarray:
    """The training indices of ``member`` under ``mode`` (module docstring).

    Shape: labels [n] (class indices) -> int64 [k]: ``k = n`` for ``full`` and ``bootstrap``,
    ``floor`` or ``ceil`` of ``n / M`` summed over classes for ``shards``; sorted for ``shards``
    and ``full``, in draw order for ``bootstrap``. Deterministic in its arguments.
    """
    if mode not in MEMBER_DATA_MODES:
        raise ValueError(f"mode={mode!r} is unknown; allowed: {', '.join(MEMBER_DATA_MODES)}")
    if isinstance(num_members, bool) or not isinstance(num_members, int) or num_members < 1:
        raise ValueError(f"num_members must be an int >= 1, got {num_members!r}")
    if not 0 <= member < num_members:
        raise ValueError(f"member={member} is out of range: allowed 0..{num_members - 1}")
    labels = np.asarray(labels)
    n = int(labels.shape[0])
    if n < 1:
        raise ValueError("labels is empty: the training split has no examples")
    if mode == "full":
        return np.arange(n, dtype=np.int64)
    if mode == "bootstrap":
        rng = np.random.default_rng([int(seed), int(member)])
        return rng.integers(0, n, size=n, dtype=np.int64)
    if n < num_members:
        raise ValueError(f"shards: {n} training examples cannot make {num_members} shards")
    rng = np.random.default_rng(int(seed))
    chosen: list[np.ndarray] = []
    dealt = 0  # round-robin continues across classes, so shard sizes differ by at most one
    for cls in np.unique(labels):
        where = np.flatnonzero(labels == cls)
        order = where[rng.permutation(where.shape[0])]
        positions = (dealt + np.arange(order.shape[0])) % num_members
        chosen.append(order[positions == member])
        dealt += order.shape[0]
    return np.sort(np.concatenate(chosen)).astype(np.int64)


def subset(split: Split, indices: np.ndarray) -> Split:
    """``split`` restricted to ``indices`` (in that order, repeats kept).

    Shape: indices int [k] in 0..len(split)-1 -> a Split of k examples.
    """
    indices = np.asarray(indices, dtype=np.int64)
    if indices.ndim != 1 or indices.shape[0] < 1:
        raise ValueError(f"indices must be a non-empty 1-D array, got shape {indices.shape}")
    if int(indices.min()) < 0 or int(indices.max()) >= len(split):
        raise ValueError(f"indices must lie in 0..{len(split) - 1} (the split {split.name!r})")
    texts = None if split.texts is None else [split.texts[i] for i in indices.tolist()]
    images = None if split.images is None else split.images[indices]
    return dataclasses.replace(split, labels=split.labels[indices], texts=texts, images=images)
