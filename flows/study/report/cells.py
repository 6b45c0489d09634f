"""Markdown cells and tables: numbers, mean [low, high] intervals, signed differences."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tasks.params import CLASSIFICATION_METRICS, GREATER_IS_BETTER, OOD_METRICS

#: The range of each metric (None: unbounded); a displayed interval is clipped to it. Brier is
#: the multi-class score (sum over classes), in [0, 2]; unknown metrics are not clipped.
METRIC_RANGE: dict[str, tuple[float | None, float | None]] = {
    **{m: (0.0, 1.0) for m in (*CLASSIFICATION_METRICS, *OOD_METRICS)},
    "brier": (0.0, 2.0),
    "nll": (0.0, None),
    "latency_ms": (0.0, None),
    "parameters": (0.0, None),
    "cost_ratio": (0.0, None),
    "flops": (0.0, None),
}


def metric_range(key: str, difference: bool = False) -> tuple[float | None, float | None]:
    """The range of ``key`` (``split.metric`` or a metric name); of a difference of two values
    of it when ``difference`` (``[lo - hi, hi - lo]``, unbounded where the metric is)."""
    lo, hi = METRIC_RANGE.get(key.rsplit(".", 1)[-1], (None, None))
    if not difference:
        return lo, hi
    if lo is None or hi is None:
        return None, None
    return lo - hi, hi - lo


def clip(value: float, rng: tuple[float | None, float | None]) -> float:
    lo, hi = rng
    if lo is not None:
        value = max(lo, value)
    if hi is not None:
        value = min(hi, value)
    return value


def fmt_value(v: float | None, key: str = "") -> str:
    """A number as the tables print it (``key`` picks the parameters / latency format)."""
    if v is None:
        return "-"
    if key.endswith("parameters"):
        return f"{v:,.0f}"
    if key.endswith(("latency_ms", "cost_ratio")):
        return f"{v:.2f}"
    if key.endswith("flops"):
        return f"{v:.3g}"
    return f"{v:.4f}" if abs(v) < 100 else f"{v:,.1f}"


def stat_cell(st: Mapping[str, Any] | None, key: str = "", mark: str = "") -> str:
    """``mean [low, high]`` of a :func:`~flows.study.report.stats.mean_interval` result, the
    interval clipped to the metric's range (:func:`metric_range` of ``key``), then ``mark``."""
    if st is None:
        return "-"
    if st["low"] is None:
        return f"{fmt_value(st['mean'], key)} (n=1, no interval)"
    if key.endswith(("parameters", "flops")) and st["low"] == st["high"]:
        return fmt_value(st["mean"], key)  # the same at every seed
    rng = metric_range(key)
    lo, hi = clip(st["low"], rng), clip(st["high"], rng)
    return f"{fmt_value(st['mean'], key)} [{fmt_value(lo, key)}, {fmt_value(hi, key)}]{mark}"


def diff_cell(st: Mapping[str, Any], key: str = "", mark: str = "", decimals: int = 4) -> str:
    """A signed difference ``+mean [+low, +high]`` at ``decimals``, the interval clipped to the
    range of a difference of ``key`` (:func:`metric_range`), then ``mark``."""
    d = decimals
    if st["low"] is None:
        return f"{st['mean']:+.{d}f} (n=1, no interval)"
    rng = metric_range(key, difference=True)
    lo, hi = clip(st["low"], rng), clip(st["high"], rng)
    return f"{st['mean']:+.{d}f} [{lo:+.{d}f}, {hi:+.{d}f}]{mark}"


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A Markdown pipe table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def ordered_metrics(keys: Iterable[str], split: str) -> list[str]:
    """The metrics of ``split`` in ``split.metric`` keys: the known ones in order, then the rest."""
    found = {k.split(".", 1)[1] for k in keys if k.startswith(f"{split}.")}
    known = [m for m in (*CLASSIFICATION_METRICS, *OOD_METRICS) if m in found]
    return known + sorted(found - set(known))


def arrow(metric: str) -> str:
    """`` (higher better)`` / `` (lower better)`` for a column header; empty when unknown."""
    gib = GREATER_IS_BETTER.get(metric)
    return "" if gib is None else (" (higher better)" if gib else " (lower better)")
