"""hydra_ops.data.augment.random_shift and split_batches(random_shift=...): seeded integer
translations with zero fill, training batches only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hydra_ops.data import Split, split_batches
from hydra_ops.data.augment import random_shift


def dots(n: int, size: int = 9) -> torch.Tensor:
    """[n, 1, size, size] zeros with one pixel (value i+1) at the centre of image i."""
    x = torch.zeros(n, 1, size, size)
    x[:, 0, size // 2, size // 2] = torch.arange(1, n + 1, dtype=torch.float32)
    return x


def test_each_image_moves_by_at_most_k_pixels_with_zero_fill():
    k, x = 2, dots(64)
    out = random_shift(x, k, torch.Generator().manual_seed(0))
    assert out.shape == x.shape and out.dtype == x.dtype
    moves = set()
    for i in range(len(x)):
        (r, c), value = torch.nonzero(out[i, 0])[0].tolist(), float(i + 1)
        assert torch.count_nonzero(out[i]) == 1 and out[i, 0, r, c] == value  # moved, not blurred
        moves.add((r - 4, c - 4))
    assert moves <= {(dr, dc) for dr in range(-k, k + 1) for dc in range(-k, k + 1)}
    assert len(moves) > 10  # offsets vary per image
    full = torch.ones(8, 3, 6, 6)
    shifted = random_shift(full, 1, torch.Generator().manual_seed(1))
    assert set(shifted.unique().tolist()) <= {0.0, 1.0}
    assert torch.equal(shifted[:, 0], shifted[:, 2])  # channels move together


def test_same_generator_state_same_shifts_and_zero_is_identity():
    x = torch.rand(16, 1, 8, 8)
    a = random_shift(x, 1, torch.Generator().manual_seed(5))
    b = random_shift(x, 1, torch.Generator().manual_seed(5))
    c = random_shift(x, 1, torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert random_shift(x, 0, torch.Generator()) is x


@pytest.mark.parametrize(
    ("k", "shape", "words"),
    [
        (-1, (2, 1, 8, 8), "integer >= 0"),
        (1.5, (2, 1, 8, 8), "integer >= 0"),
        (8, (2, 1, 8, 8), "smaller than the image size"),
        (1, (1, 8, 8), "[B, C, H, W]"),
    ],
)
def test_bad_arguments(k, shape, words):
    with pytest.raises(ValueError, match=r"max_shift|pixel_values") as info:
        random_shift(torch.zeros(shape), k, torch.Generator())
    assert words in str(info.value)


def test_split_batches_shifts_training_images_reproducibly():
    rng = np.random.default_rng(0)
    split = Split(
        name="train",
        modality="image",
        labels=np.arange(10) % 2,
        images=rng.integers(0, 256, size=(10, 8, 8), dtype=np.uint8),
        classes=["a", "b"],
    )
    plain = split_batches(split, 4, shuffle=True, seed=3)
    one = split_batches(split, 4, shuffle=True, seed=3, random_shift=1)
    again = split_batches(split, 4, shuffle=True, seed=3, random_shift=1)
    other = split_batches(split, 4, shuffle=True, seed=4, random_shift=1)
    assert [b["labels"].tolist() for b in one] == [b["labels"].tolist() for b in plain]
    assert all(
        torch.equal(a["pixel_values"], b["pixel_values"]) for a, b in zip(one, again, strict=True)
    )
    assert not all(
        torch.equal(a["pixel_values"], b["pixel_values"]) for a, b in zip(one, plain, strict=True)
    )
    assert len(other) == len(one)
    text = Split("train", "text", ["x"], np.zeros(2, dtype=np.int64), texts=["a", "b"])
    with pytest.raises(ValueError, match="random_shift: only image splits"):
        split_batches(text, 2, tokenizer=object(), random_shift=1)
