"""Logits of a model over contract batches: one call for a plain classifier and a Hydra model."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

Batch = dict[str, Tensor]


@torch.no_grad()
def logits(model: nn.Module, batches: Iterable[Batch]) -> Tensor:
    """Run ``model`` without grad, in eval mode (its mode is restored after), over ``batches``.

    Returns float32 logits concatenated over the batches: ``[N, M, C]`` member logits for a
    :class:`hydra_ops.merge.HydraEnsemble`, ``[N, C]`` for a classifier of a supported family
    (through its adapter, :func:`hydra_ops.training.model_logits`). ``labels`` are ignored.
    ValueError when ``batches`` is empty.
    """
    from hydra_ops.merge import HydraEnsemble
    from hydra_ops.training import model_logits

    run = _hydra_logits if isinstance(model, HydraEnsemble) else model_logits
    was_training = model.training
    model.eval()
    try:
        out = [run(model, batch).float() for batch in batches]
    finally:
        model.train(was_training)
    if not out:
        raise ValueError("batches is empty; pass at least one batch")
    return torch.cat(out)


def _hydra_logits(hydra: nn.Module, batch: Batch) -> Tensor:
    """``[B, M, C]``: ``hydra(inputs, attention_mask, token_type_ids)`` on one contract batch."""
    if "pixel_values" in batch:
        return hydra(batch["pixel_values"])
    if "input_ids" not in batch:
        raise ValueError(f"batch must hold 'input_ids' or 'pixel_values', got keys {sorted(batch)}")
    return hydra(
        batch["input_ids"],
        attention_mask=batch.get("attention_mask"),
        token_type_ids=batch.get("token_type_ids"),
    )
