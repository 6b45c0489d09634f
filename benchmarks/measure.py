"""Timing, memory and FLOP measurement for benchmark rows.

* Latency: rows of one case are timed round-robin (each round runs every row once), so slow drifts
  in machine load hit all rows alike; per row: median, 25th/75th percentile and min over rounds.
  Rounds continue until the case's time budget is spent (at least ``min_rounds``).
* Peak memory, CPU: ``tracemalloc`` does not see torch's allocator, so we sample the process RSS
  (psutil, every 2 ms, in a thread) during one warm call after ``gc.collect()`` and glibc
  ``malloc_trim(0)``, and report peak minus the RSS before the call (activation + workspace
  memory; weights are already resident). CUDA: ``torch.cuda.max_memory_allocated`` delta.
* FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` (matmul / bmm / baddbmm / addmm / conv / SDPA
  FLOPs from shapes) on one call at batch 1, times the batch (FLOPs are linear in batch).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _trim() -> None:
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def peak_memory_mb(fn: Callable[[], object], device: torch.device) -> float:
    """Extra memory (MiB) one call of ``fn`` needs at its peak (see module docstring)."""
    if device.type == "cuda":
        _trim()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        fn()
        _sync(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    import psutil

    process = psutil.Process()
    _trim()
    before = process.memory_info().rss
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.002)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        fn()
    finally:
        done.set()
        thread.join()
    peak[0] = max(peak[0], process.memory_info().rss)
    return max(0.0, (peak[0] - before) / 2**20)


def count_flops(fn: Callable[[], object]) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


@dataclass
class Timing:
    samples_s: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float | int | None]:
        if not self.samples_s:
            return {
                "latency_ms_median": None,
                "latency_ms_p25": None,
                "latency_ms_p75": None,
                "latency_ms_min": None,
                "repeats": 0,
            }
        ms = sorted(1e3 * s for s in self.samples_s)
        q = statistics.quantiles(ms, n=4, method="inclusive") if len(ms) > 1 else [ms[0]] * 3
        return {
            "latency_ms_median": statistics.median(ms),
            "latency_ms_p25": q[0],
            "latency_ms_p75": q[2],
            "latency_ms_min": ms[0],
            "repeats": len(ms),
        }


def time_round_robin(
    fns: Sequence[Callable[[], Tensor]],
    device: torch.device,
    budget_s: float,
    min_rounds: int,
    max_rounds: int,
) -> list[Timing]:
    """Round-robin timing of already warmed-up callables (see module docstring)."""
    timings = [Timing() for _ in fns]
    start = time.perf_counter()
    rounds = 0
    while rounds < max_rounds and (rounds < min_rounds or time.perf_counter() - start < budget_s):
        for fn, timing in zip(fns, timings, strict=True):
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            timing.samples_s.append(time.perf_counter() - t0)
        rounds += 1
    return timings


def warm_up(fn: Callable[[], object], device: torch.device, calls: int = 1) -> float:
    """Run ``fn`` ``calls`` times (compiles, caches); returns the seconds it took."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync(device)
    return time.perf_counter() - t0
