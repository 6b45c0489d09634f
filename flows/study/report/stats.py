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


def t_test_p(values: Sequence[float]) -> float | None:
    """Two-sided p-value of the one-sample Student t-test of mean 0 (the test that the
    :func:`mean_interval` at ``1 - p`` inverts); None for fewer than 2 values; 1.0 when every
    value is the same (a zero-width interval is no evidence of a difference)."""
    from scipy.stats import t

    vals = [float(v) for v in values]
    n = len(vals)
    if n < 2:
        return None
    mean = math.fsum(vals) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (n - 1))
    if sd == 0 or not math.isfinite(sd):
        return 1.0
    return float(2 * t.sf(abs(mean) / (sd / math.sqrt(n)), n - 1))


def holm(pvalues: Mapping[str, float | None], alpha: float = 1 - CONFIDENCE) -> dict[str, Any]:
    """Holm's step-down over the family ``pvalues`` (a None p-value is a comparison that could
    not be made: it counts in the family and is never rejected): ``{key: {"p", "p_holm",
    "rejected"}}`` with the Holm-adjusted p-values (monotone, capped at 1)."""
    m = len(pvalues)
    order = sorted(pvalues, key=lambda k: (math.inf if pvalues[k] is None else pvalues[k], k))
    out: dict[str, Any] = {}
    running, stopped = 0.0, False
    for i, key in enumerate(order):
        p = pvalues[key]
        if p is None:
            out[key] = {"p": None, "p_holm": None, "rejected": False}
            continue
        running = max(running, min(1.0, (m - i) * p))
        stopped = stopped or running > alpha
        out[key] = {"p": p, "p_holm": running, "rejected": not stopped}
    return out
