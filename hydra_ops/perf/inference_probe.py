"""The inference half of :mod:`hydra_ops.perf.precision_probe`: bf16 against fp32 on a model's
forward.

Apart from the training probe so that a training stage does not import the compile code (the
agreement check is compile's :func:`~hydra_ops.compile.verify.compare_logits`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from hydra_ops.perf.precision_probe import DEFAULT_STEPS, Batch, Timings, alternating_timings

__all__ = ["time_inference"]


@torch.no_grad()
def time_inference(
    model: nn.Module,
    batches: Sequence[Batch],
    device: torch.device | str,
    *,
    tolerance: float,
    min_agreement: float,
    steps: int = DEFAULT_STEPS,
    warmup: int = 1,
) -> tuple[Timings, dict[str, Any]]:
    """``(timings, check)``: seconds per forward of ``model`` on ``batches[0]`` in fp32 and bf16
    (alternating; :func:`hydra_ops.models.inference.logits`: eval mode, no grad, a Hydra's ``[B, M,
    C]`` or a classifier's ``[B, C]``), and the agreement of bf16's logits with fp32's over every
    batch (:func:`~hydra_ops.compile.verify.compare_logits`: max |dp| of the (ensemble)
    probabilities <= ``tolerance``, argmax agreement >= ``min_agreement``). The model's mode is
    restored; it moves to ``device`` in place (where the stage runs it anyway)."""
    from hydra_ops.compile.verify import compare_logits
    from hydra_ops.models.inference import logits
    from hydra_ops.models.runtime import move_batch

    device = torch.device(device)
    if not batches:
        raise ValueError("time_inference: no batches")
    model.to(device)
    moved = [move_batch(b, device) for b in batches]

    def forward(precision: str, batch: Batch) -> torch.Tensor:
        return logits(model, [batch], device=device, precision=precision)

    timings = alternating_timings(lambda p: forward(p, moved[0]), device, steps, warmup)
    ref = torch.cat([forward("fp32", b) for b in moved])
    low = torch.cat([forward("bf16", b) for b in moved])
    if ref.ndim == 2:  # a single model's [N, C]: one member
        ref, low = ref.unsqueeze(1), low.unsqueeze(1)
    return timings, compare_logits(ref, low, tolerance, min_agreement)
