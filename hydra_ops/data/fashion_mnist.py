"""Fashion-MNIST from the Debian package ``dataset-fashion-mnist`` (gzipped idx files).

The 60,000 training and 10,000 test images are pooled (the pipeline draws its own stratified
splits per seed); labels 0-9 index
``hydra_ops.data.catalog.fashion_mnist.CLASSES``.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

_MAGIC = {1: 2049, 3: 2051}  # idx magic number of uint8 labels (1 dim) / images (3 dims)


def read_idx(path: Path, ndim: int, limit: int | None = None) -> np.ndarray:
    """A gzipped idx file of uint8 values: labels [N] (``ndim`` 1) or images [N, H, W] (3).

    ``limit`` reads only the first ``limit`` items. A wrong magic number or a short file is a
    one-line ValueError naming the file.
    """
    with gzip.open(path, "rb") as fh:
        header = fh.read(4 + 4 * ndim)
        if len(header) < 4 + 4 * ndim:
            raise ValueError(f"fashion-mnist: {str(path)!r} is too short for an idx header")
        magic, *dims = np.frombuffer(header, dtype=">u4").tolist()
        if magic != _MAGIC[ndim]:
            raise ValueError(
                f"fashion-mnist: {str(path)!r} has idx magic {magic}, expected {_MAGIC[ndim]}"
            )
        n = dims[0] if limit is None else min(limit, dims[0])
        size = n * int(np.prod(dims[1:], dtype=np.int64))
        data = fh.read(size)
    if len(data) != size:
        raise ValueError(f"fashion-mnist: {str(path)!r} holds {len(data)} of {size} bytes")
    return np.frombuffer(data, dtype=np.uint8).reshape(n, *dims[1:])


def load(folder: Path, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(images uint8 [N, 28, 28], labels int64 [N])``: the training set, then the test set.

    ``limit`` reads at most that many of each (tests read a slice).
    """
    images, labels = [], []
    for part in ("train", "t10k"):
        x = read_idx(folder / f"{part}-images-idx3-ubyte.gz", 3, limit)
        y = read_idx(folder / f"{part}-labels-idx1-ubyte.gz", 1, limit)
        if len(x) != len(y):
            raise ValueError(f"fashion-mnist: {part} has {len(x)} images but {len(y)} labels")
        images.append(x)
        labels.append(y.astype(np.int64))
    return np.concatenate(images), np.concatenate(labels)
