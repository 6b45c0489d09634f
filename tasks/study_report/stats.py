"""Statistics across seeds: the mean with its Student-t interval, and the Pareto front."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: The confidence of every interval across seeds.
CONFIDENCE = 0.95


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """``{"n", "mean", "low", "high"}`` of ``values`` (across seeds): the Student-t interval of the
    mean at ``confidence``; ``low``/``high`` are None for n = 1 (no interval), ``mean`` None for
    n = 0."""
    from scipy.stats import t

    vals = [float(v) for v in values]
    n = len(vals)
    if n == 0:
        return {"n": 0, "mean": None, "low": None, "high": None}
    mean = math.fsum(vals) / n
    if n == 1:
        return {"n": 1, "mean": mean, "low": None, "high": None}
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (n - 1))
    half = float(t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "low": mean - half, "high": mean + half}


def seed_stats(per_seed: Mapping[int, float]) -> dict[str, Any]:
    """:func:`mean_interval` of the per-seed values plus ``per_seed``: ``[{seed, value}]``."""
    seeds = sorted(per_seed)
    return {
        **mean_interval([per_seed[s] for s in seeds]),
        "per_seed": [{"seed": s, "value": per_seed[s]} for s in seeds],
    }


def pareto_front(
    points: Iterable[tuple[str, float, float]], y_greater_is_better: bool
) -> list[str]:
    """Labels of the non-dominated ``(label, x, y)`` points, x (latency) lower is better, sorted
    by x then label. ``q`` dominates ``p`` when it is no worse on both axes and better on one."""
    pts = list(points)

    def better_eq(a: float, b: float) -> bool:
        return a >= b if y_greater_is_better else a <= b

    front = []
    for label, x, y in pts:
        dominated = any(
            qx <= x and better_eq(qy, y) and (qx < x or qy != y)
            for q_label, qx, qy in pts
            if q_label != label
        )
        if not dominated:
            front.append((x, label))
    return [label for _, label in sorted(front)]
