"""Logits of a model over contract batches: one call for a plain classifier and a Hydra model."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

Batch = dict[str, Tensor]


@torch.no_grad()
def logits(
    model: nn.Module,
    batches: Iterable[Batch],
    *,
    device: str | torch.device | None = None,
    precision: str = "fp32",
) -> Tensor:
    """Run ``model`` without grad, in eval mode (its mode is restored after), over ``batches``.

    ``device``: None runs where the model is (each batch is moved there); a
    :func:`hydra_ops.models.runtime.resolve_device` spec or a device moves the model there, in
    place, and it stays there. Batch copies from pinned memory are non-blocking. ``precision``:
    ``fp32`` (no autocast: the same numbers as without these arguments), ``bf16`` or ``fp16`` (the
    forward under ``torch.autocast``).

    Returns float32 logits on the CPU, concatenated over the batches: ``[N, M, C]`` member logits
    for a :class:`hydra_ops.hydra.merge.HydraEnsemble`, ``[N, C]`` for a classifier of a supported
    family (through its adapter, :func:`hydra_ops.models.training.model_logits`). ``labels`` are
    ignored. ValueError when ``batches`` is empty or ``device`` / ``precision`` is not valid.
    """
    from hydra_ops.hydra.merge import HydraEnsemble
    from hydra_ops.models.runtime import autocast, model_device, move_batch, resolve_device
    from hydra_ops.models.training import model_logits

    dev = model_device(model) if device is None else resolve_device(device)
    autocast(dev, precision)  # a bad precision fails before the model moves
    model.to(dev)
    run = _hydra_logits if isinstance(model, HydraEnsemble) else model_logits
    was_training = model.training
    model.eval()
    try:
        out = []
        for batch in batches:
            with autocast(dev, precision):
                member_logits = run(model, move_batch(batch, dev))
            out.append(member_logits.float().cpu())
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
