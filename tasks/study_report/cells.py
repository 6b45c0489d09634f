"""Markdown cells and tables: numbers, mean [low, high] intervals, signed differences."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tasks.params import CLASSIFICATION_METRICS, GREATER_IS_BETTER, OOD_METRICS


def fmt_value(v: float | None, key: str = "") -> str:
    """A number as the tables print it (``key`` picks the parameters / latency format)."""
    if v is None:
        return "-"
    if key.endswith("parameters"):
        return f"{v:,.0f}"
    if key.endswith("latency_ms"):
        return f"{v:.2f}"
    return f"{v:.4f}" if abs(v) < 100 else f"{v:,.1f}"


def stat_cell(st: Mapping[str, Any] | None, key: str = "") -> str:
    """``mean [low, high]`` of a :func:`~tasks.study_report.stats.mean_interval` result."""
    if st is None:
        return "-"
    if st["low"] is None:
        return f"{fmt_value(st['mean'], key)} (n=1, no interval)"
    if key.endswith("parameters") and st["low"] == st["high"]:
        return fmt_value(st["mean"], key)  # the same at every seed
    return (
        f"{fmt_value(st['mean'], key)} [{fmt_value(st['low'], key)}, {fmt_value(st['high'], key)}]"
    )


def diff_cell(st: Mapping[str, Any]) -> str:
    """A signed difference ``+mean [+low, +high]``."""
    if st["low"] is None:
        return f"{st['mean']:+.4f} (n=1, no interval)"
    return f"{st['mean']:+.4f} [{st['low']:+.4f}, {st['high']:+.4f}]"


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
