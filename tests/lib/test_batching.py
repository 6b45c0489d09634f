"""hydra_ops.data.batching: a split as contract batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hydra_ops.data import Split, split_batches, split_labels


def test_split_batches_limit_labels_and_tokenizer_required():
    images = np.arange(5 * 4 * 4, dtype=np.uint8).reshape(5, 4, 4)
    split = Split("val", "image", ["a", "b"], np.array([0, 1, 1, 0, 1]), images=images)
    batches = split_batches(split, 2, image_size=8, limit=3)
    assert [b["pixel_values"].shape for b in batches] == [(2, 1, 8, 8), (1, 1, 8, 8)]
    assert torch.cat([b["labels"] for b in batches]).tolist() == [0, 1, 1]
    assert "labels" not in split_batches(split, 5, with_labels=False)[0]
    assert split_labels(split).tolist() == [0, 1, 1, 0, 1]
    text = Split("val", "text", ["a", "b"], np.array([0, 1]), texts=["x", "y"])
    with pytest.raises(ValueError, match="tokenizer is required"):
        split_batches(text, 2)


needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")


@needs_no_cuda
def test_pinning_batches_needs_cuda():
    from hydra_ops.data import split_batches
    from hydra_ops.data.store import Split

    images = torch.zeros(2, 8, 8, dtype=torch.uint8).numpy()
    split = Split("val", "image", ["a", "b"], torch.tensor([0, 1]).numpy(), images=images)
    with pytest.raises(ValueError, match="pin_memory: needs CUDA"):
        split_batches(split, 2, pin_memory=True)
