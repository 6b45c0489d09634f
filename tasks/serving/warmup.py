"""Warming a served model on every batch shape it will meet, before it answers a request.

A compiled artifact (and the eager model's kernels) pays for a batch shape the first time it
meets it: a request that arrives with a new shape waits for that. The prediction service meets a
finite set of shapes: each forward pass holds 1..``max_batch`` inputs (the service splits larger
requests), and text batches are padded to one of a few lengths
(:meth:`tasks.release.preprocessing.Preprocessing.pad_lengths`). :func:`serving_shapes` lists them
and :func:`warm_up` runs the model once on each, logging its progress, so ``/health`` says ``ok``
only when no request will wait on a first call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("hydra_ens")

#: ``(batch size, sequence length)``; the length is None for images (fixed size).
Shape = tuple[int, int | None]


def serving_shapes(preprocessing: Any, max_batch: int) -> list[Shape]:
    """Every ``(batch, length)`` a service with forward passes of at most ``max_batch`` inputs
    meets: batch sizes ``1..max_batch`` times each pad length (text), or times the one image
    size (``length`` None)."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    lengths: tuple[int | None, ...] = preprocessing.pad_lengths() or (None,)
    return [(b, n) for b in range(1, max_batch + 1) for n in lengths]


def shape_batch(preprocessing: Any, shape: Shape) -> dict[str, Any]:
    """A model batch of ``shape`` made as the service makes its batches (the bundle's tokenizer,
    keys and dtypes; image pixel values of the bundle's size and channels); its values do not
    matter, its shape does.

    Shape: text ``input_ids`` etc. ``[B, L]``; images ``pixel_values`` ``[B, C, S, S]``.
    """
    import torch

    batch_size, length = shape
    record = preprocessing.record
    if length is None:
        size, channels = int(record["image_size"]), int(record["channels"])
        return {"pixel_values": torch.zeros(batch_size, channels, size, size)}
    words = " ".join(["warm"] * int(record["max_length"]))
    full = preprocessing.batch([words] * batch_size)  # padded to max_length, every token real
    return {k: v[:, :length].contiguous() for k, v in full.items()}


def warm_up(
    forward: Callable[[dict[str, Any]], Any],
    preprocessing: Any,
    max_batch: int,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Call ``forward(batch)`` once on a batch of every shape of :func:`serving_shapes`, longest
    length first within a batch size; log the progress (every batch size) and call
    ``progress(done, total)`` after each shape. Returns the number of shapes."""
    shapes = serving_shapes(preprocessing, max_batch)
    t0 = time.perf_counter()
    log.info("warm-up: %d batch shapes (batch 1..%d%s)", len(shapes), max_batch, _lengths(shapes))
    ordered = sorted(shapes, key=lambda s: (s[0], -(s[1] or 0)))
    for i, shape in enumerate(ordered, start=1):
        forward(shape_batch(preprocessing, shape))
        if progress is not None:
            progress(i, len(shapes))
        if i == len(ordered) or ordered[i][0] != shape[0]:
            log.info(
                "warm-up: batch %d/%d done (%d of %d shapes, %.1f s)",
                shape[0],
                max_batch,
                i,
                len(shapes),
                time.perf_counter() - t0,
            )
    return len(shapes)


def _lengths(shapes: list[Shape]) -> str:
    lengths = sorted({n for _, n in shapes if n is not None})
    return f" x lengths {', '.join(map(str, lengths))}" if lengths else ""
