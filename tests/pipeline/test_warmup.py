"""tasks.serving.warmup and the pad lengths of tasks.release.preprocessing: the finite set of batch
shapes a service meets, and a batch of each."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from tasks.release.preprocessing import pad_lengths, pad_to
from tasks.serving.warmup import serving_shapes, shape_batch, warm_up


class _Text:
    """A text preprocessing stand-in: max_length 32, batches padded to its longest."""

    record: ClassVar[dict] = {"modality": "text", "max_length": 32}

    def pad_lengths(self):
        return pad_lengths(32)

    def batch(self, inputs):
        n = 32
        return {
            "input_ids": torch.ones(len(inputs), n, dtype=torch.long),
            "attention_mask": torch.ones(len(inputs), n, dtype=torch.long),
        }


class _Image:
    record: ClassVar[dict] = {"modality": "image", "image_size": 12, "channels": 1}

    def pad_lengths(self):
        return ()


@pytest.mark.parametrize(
    ("max_length", "lengths"),
    [
        (64, (8, 16, 32, 64)),
        (8, (8,)),
        (100, (8, 16, 32, 64, 100)),
        (512, (8, 16, 32, 64, 128, 256, 512)),
    ],
)
def test_pad_lengths(max_length, lengths):
    assert pad_lengths(max_length) == lengths


def test_pad_to_adds_masked_pad_tokens_and_refuses_to_cut():
    batch = {
        "input_ids": torch.tensor([[101, 7, 102]]),
        "attention_mask": torch.tensor([[1, 1, 1]]),
        "token_type_ids": torch.tensor([[0, 0, 0]]),
    }
    padded = pad_to(batch, 8, pad_id=0)
    assert padded["input_ids"].tolist() == [[101, 7, 102, 0, 0, 0, 0, 0]]
    assert padded["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0, 0, 0]]
    assert padded["token_type_ids"].shape == (1, 8)
    assert pad_to(batch, 3, pad_id=0) is batch
    with pytest.raises(ValueError, match="length 3 > 2"):
        pad_to(batch, 2, pad_id=0)


def test_serving_shapes_and_a_batch_of_each():
    shapes = serving_shapes(_Text(), 3)
    assert shapes == [(b, n) for b in (1, 2, 3) for n in (8, 16, 32)]
    assert shape_batch(_Text(), (2, 16))["input_ids"].shape == (2, 16)
    assert serving_shapes(_Image(), 2) == [(1, None), (2, None)]
    assert shape_batch(_Image(), (2, None))["pixel_values"].shape == (2, 1, 12, 12)
    with pytest.raises(ValueError, match="max_batch"):
        serving_shapes(_Text(), 0)


def test_warm_up_calls_the_model_once_per_shape_and_reports_progress():
    seen, progress = [], []
    count = warm_up(
        lambda b: seen.append(tuple(b["input_ids"].shape)),
        _Text(),
        2,
        progress=lambda d, t: progress.append((d, t)),
    )
    assert count == 6 and sorted(seen) == sorted(serving_shapes(_Text(), 2))
    assert progress[-1] == (6, 6) and len(progress) == 6
