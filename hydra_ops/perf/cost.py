"""Cost of models measured side by side: interleaved timing rounds, FLOPs, ratios with intervals.

Timing models one after the other lets the machine's state drift between them (frequency,
caches, other processes); a ratio of two such numbers carries that drift. :func:`interleaved_ms`
times every model once per round, in a fresh seeded order each round, so each round is a paired
observation; :func:`ratio_interval` bootstraps the ratio of medians over rounds (resampling
whole rounds keeps the pairing). :func:`count_flops` counts one call's floating-point operations
with ``torch.utils.flop_counter.FlopCounterMode`` (matmuls, convolutions, attention: the ops
PyTorch has FLOP formulas for; elementwise ops count 0).
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

Call = Callable[[], Any]


def interleaved_ms(
    calls: Mapping[str, Call], rounds: int, device: torch.device | None = None, seed: int = 0
) -> dict[str, list[float]]:
    """``{name: [ms of round r]}``: each call once for warm-up, then ``rounds`` rounds in which
    every call runs once, in an order shuffled per round (``seed``), no grad; on a CUDA ``device``
    each call is synchronised before the clock stops."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    names = sorted(calls)
    sync = device is not None and device.type == "cuda"

    def once(name: str) -> float:
        t0 = time.perf_counter()
        calls[name]()
        if sync:
            torch.cuda.synchronize(device)
        return (time.perf_counter() - t0) * 1e3

    rng = random.Random(seed)
    times: dict[str, list[float]] = {n: [] for n in names}
    with torch.no_grad():
        for name in names:
            once(name)
        for _ in range(rounds):
            order = names[:]
            rng.shuffle(order)
            for name in order:
                times[name].append(once(name))
    return times


def ratio_interval(
    numerator: Sequence[float],
    denominator: Sequence[float],
    n_resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, float]:
    """``{"ratio", "low", "high"}``: median(numerator) / median(denominator) over paired rounds
    and its percentile bootstrap interval, resampling rounds (pairs) with replacement. With one
    round the interval is the ratio itself (zero width: no evidence of spread)."""
    if len(numerator) != len(denominator) or not numerator:
        raise ValueError("numerator and denominator need the same, non-zero number of rounds")
    point = statistics.median(numerator) / statistics.median(denominator)
    n = len(numerator)
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n, (n_resamples, n), generator=gen)
    num = torch.tensor(numerator, dtype=torch.float64)[idx].median(dim=1).values
    den = torch.tensor(denominator, dtype=torch.float64)[idx].median(dim=1).values
    ratios = num / den
    alpha = (1 - confidence) / 2
    lo, hi = torch.quantile(ratios, torch.tensor([alpha, 1 - alpha], dtype=torch.float64))
    return {"ratio": point, "low": min(float(lo), point), "high": max(float(hi), point)}


def count_flops(call: Call) -> int:
    """Floating-point operations of one ``call()`` (no grad), as FlopCounterMode counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        call()
    return int(counter.get_total_flops())
