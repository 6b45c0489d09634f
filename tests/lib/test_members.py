"""hydra_ops.data.members: each member's training data (full split, bootstrap resample, stratified
shard)."""

from __future__ import annotations

import numpy as np
import pytest

from hydra_ops.data.members import member_indices, subset
from hydra_ops.data.store import Split

# ----- per-member training data ------------------------------------------------------------------
LABELS = np.array([0] * 10 + [1] * 7 + [2] * 5)


def test_full_gives_every_member_the_whole_split():
    idx = [member_indices(LABELS, 3, m, "full", seed=7) for m in range(3)]
    assert all(np.array_equal(i, np.arange(len(LABELS))) for i in idx)


def test_bootstrap_resamples_differ_between_members_and_repeat_for_a_seed():
    idx = [member_indices(LABELS, 3, m, "bootstrap", seed=7) for m in range(3)]
    assert all(len(i) == len(LABELS) and i.min() >= 0 and i.max() < len(LABELS) for i in idx)
    assert not np.array_equal(idx[0], idx[1]) and not np.array_equal(idx[1], idx[2])
    assert all(len(np.unique(i)) < len(LABELS) for i in idx)  # drawn with replacement
    assert np.array_equal(idx[1], member_indices(LABELS, 3, 1, "bootstrap", seed=7))
    assert not np.array_equal(idx[1], member_indices(LABELS, 3, 1, "bootstrap", seed=8))


def test_shards_are_disjoint_stratified_and_cover_the_split():
    idx = [member_indices(LABELS, 3, m, "shards", seed=7) for m in range(3)]
    together = np.concatenate(idx)
    assert np.array_equal(np.sort(together), np.arange(len(LABELS)))  # disjoint and complete
    assert sorted(len(i) for i in idx) == [7, 7, 8]
    for i in idx:
        counts = np.bincount(LABELS[i], minlength=3)
        assert all(counts[c] in (n // 3, -(-n // 3)) for c, n in enumerate(np.bincount(LABELS)))
    with pytest.raises(ValueError, match="cannot make 5 shards"):
        member_indices(LABELS[:4], 5, 0, "shards", seed=0)
    with pytest.raises(ValueError, match="allowed: full, bootstrap, shards"):
        member_indices(LABELS, 3, 0, "bagging", seed=0)


def test_subset_keeps_the_chosen_examples_in_order():
    texts = [f"t{i}" for i in range(5)]
    split = Split("train", "text", ["a", "b"], np.array([0, 1, 0, 1, 0]), texts=texts)
    sub = subset(split, np.array([4, 1, 1]))
    assert sub.texts == ["t4", "t1", "t1"] and sub.labels.tolist() == [0, 1, 1]
    images = np.arange(5 * 4, dtype=np.uint8).reshape(5, 2, 2)
    isplit = Split("train", "image", ["a", "b"], np.array([0, 1, 0, 1, 0]), images=images)
    assert np.array_equal(subset(isplit, np.array([3, 0])).images, images[[3, 0]])
    with pytest.raises(ValueError, match=r"indices must lie in 0..4"):
        subset(split, np.array([5]))
