"""What a criterion reads: the model's shape and device, its batches cached once, eval mode."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn

Batch = Mapping[str, Tensor]


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (CPU for a model without parameters)."""
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def uniform_heads(adapter: Any) -> tuple[int, int]:
    """``(L, H)`` of an unpruned model; ValueError if the layers' head counts differ."""
    heads = adapter.heads_per_layer()
    if len(set(heads)) != 1:
        raise ValueError(
            f"model: head scoring needs the unpruned model (equal heads per layer), got {heads}"
        )
    return adapter.num_layers, heads[0]


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Run the block with ``model`` in eval mode (dropout off), then restore its train mode."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def materialise(
    batches: Iterable[Batch] | None,
    name: str,
    device: torch.device,
    *,
    need_labels: bool,
    max_batches: int | None,
) -> list[dict[str, Tensor]]:
    """Cache a batch iterable as a list of dicts on ``device`` (run once, reused by every eval)."""
    if batches is None:
        raise ValueError(f"{name} is required for this method (an iterable of batch dicts)")
    if isinstance(batches, Mapping):
        batches = [batches]
    out: list[dict[str, Tensor]] = []
    for batch in batches:
        if max_batches is not None and len(out) >= max_batches:
            break
        if not isinstance(batch, Mapping):
            raise ValueError(f"{name} must yield dicts of tensors, got {type(batch).__name__}")
        if need_labels and "labels" not in batch:
            raise ValueError(f"{name}: every batch needs 'labels' [B] for this method")
        out.append({k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()})
    if not out:
        raise ValueError(f"{name} is empty; pass at least one batch")
    return out


def batch_size(batch: Mapping[str, Any]) -> int:
    """``B`` of a contract batch, read from ``input_ids``, ``pixel_values`` or ``labels``."""
    for key in ("input_ids", "pixel_values", "labels"):
        if key in batch:
            return int(batch[key].shape[0])
    raise ValueError("batch has none of input_ids, pixel_values, labels; cannot tell its size")


def select_rows(batch: Mapping[str, Any], rows: Tensor) -> dict[str, Any]:
    """The batch cut to ``rows`` (``[B']`` long): every tensor whose first dim is ``B``."""
    size = batch_size(batch)
    return {
        k: v.index_select(0, rows.to(v.device))
        if isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == size
        else v
        for k, v in batch.items()
    }
