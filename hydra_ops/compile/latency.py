"""Timing a compiled (or eager) call: one warm-up, then the median of repeated calls."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor


def latency_rounds_ms(
    call: Callable[[], Tensor], repeats: int, device: torch.device | None = None
) -> tuple[Tensor, list[float]]:
    """``(output of one warm-up call, milliseconds of each of repeats further calls)``, no grad;
    as :func:`median_latency_ms`, every round kept (the margin rule compares rounds)."""

    def timed_call() -> Tensor:
        out = call()
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
        return out

    with torch.no_grad():
        output = timed_call()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            timed_call()
            times.append((time.perf_counter() - t0) * 1e3)
    return output, times


def median_latency_ms(
    call: Callable[[], Tensor], repeats: int, device: torch.device | None = None
) -> tuple[Tensor, float]:
    """``(output of one warm-up call, median milliseconds of repeats further calls)``, no grad.

    The warm-up is where inductor compiles and ONNX Runtime allocates its arena; on CUDA each call
    is synchronised before the clock stops.
    """

    output, rounds = latency_rounds_ms(call, repeats, device)
    return output, statistics.median(rounds)
