"""Logits of a model over contract batches: one call for a plain classifier and a Hydra model.

A model that reads a contract batch itself has a ``batch_logits(batch)`` method
(:class:`~hydra_ops.hydra.ensemble.HydraEnsemble`: ``[B, M, C]`` member logits); any other goes
through :func:`hydra_ops.models.training.model_logits` (``[B, C]``). The check is by that method,
not by class, so this module imports nothing of the merge: a stage that only trains does not
depend on the merge, the ensemble or the UQ code.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from hydra_ops.models.runtime import autocast, model_device, move_batch, resolve_device
from hydra_ops.models.training import model_logits

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
    for a model with ``batch_logits`` (a :class:`~hydra_ops.hydra.ensemble.HydraEnsemble`),
    ``[N, C]`` for a classifier of a supported family (through its adapter,
    :func:`hydra_ops.models.training.model_logits`). ``labels`` are ignored. ValueError when
    ``batches`` is empty or ``device`` / ``precision`` is not valid.
    """
    dev = model_device(model) if device is None else resolve_device(device)
    autocast(dev, precision)  # a bad precision fails before the model moves
    model.to(dev)
    own = getattr(model, "batch_logits", None)
    forward = own if callable(own) else functools.partial(model_logits, model)
    was_training = model.training
    model.eval()
    try:
        out = []
        for batch in batches:
            with autocast(dev, precision):
                member_logits = forward(move_batch(batch, dev))
            out.append(member_logits.float().cpu())
    finally:
        model.train(was_training)
    if not out:
        raise ValueError("batches is empty; pass at least one batch")
    return torch.cat(out)
