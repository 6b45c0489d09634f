"""The Pareto panels: latency against an uncertainty metric, one PNG per panel."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

from tasks.params import GREATER_IS_BETTER
from tasks.study_report.collect import Collected
from tasks.study_report.stats import pareto_front

#: Pareto panels: (file stem, y metric key, y label).
PARETO = (
    ("pareto_near_ood_auroc", "near_ood.auroc", "near-OOD AUROC (higher is better)"),
    ("pareto_nll", "id_test.nll", "ID test NLL (lower is better)"),
)
FIGSIZE = (7.0, 5.0)
DPI = 100


def _pareto_figure(
    entries: Sequence[Mapping[str, Any]], front: Sequence[str], ylabel: str
) -> bytes:
    """PNG bytes: one error-barred point per model at its mean (squares: Hydra variants), the
    Pareto front filled red and joined."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    names_at: dict[tuple[float, float], list[str]] = {}
    for e in entries:
        on_front = e["label"] in front
        ax.errorbar(
            e["x"],
            e["y"],
            xerr=e["xerr"],
            yerr=e["yerr"],
            fmt="s" if e["label"].startswith("hydra[") else "o",
            color="tab:red" if on_front else "tab:blue",
            mfc="tab:red" if on_front else "white",
            capsize=3,
        )
        names_at.setdefault((e["x"], e["y"]), []).append(e["label"])
    for (x, y), names in names_at.items():  # models at the same point share one label
        ax.annotate(", ".join(names), (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    by_label = {e["label"]: e for e in entries}
    if len(front) > 1:
        ax.plot(
            [by_label[f]["x"] for f in front],
            [by_label[f]["y"] for f in front],
            "--",
            color="tab:red",
            label="Pareto front",
        )
        ax.legend(loc="best", fontsize=8)
    ax.set_xlabel("latency (ms per batch, mean across seeds)")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _err(st: Mapping[str, Any] | None) -> list[list[float]] | None:
    if st is None or st["low"] is None:
        return None
    return [[st["mean"] - st["low"]], [st["high"] - st["mean"]]]


def pareto_panels(col: Collected) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Per :data:`PARETO` panel, its summary (figure path, front, plotted points, models left
    out for lack of a latency or metric) and ``{"figures/<stem>.png": PNG bytes}``."""
    summary: dict[str, Any] = {}
    figures: dict[str, bytes] = {}
    for stem, key, ylabel in PARETO:
        entries, missing = [], []
        for label in col.labels():
            xs, ys = col.stats(label, "model.latency_ms"), col.stats(label, key)
            if xs is None or ys is None:
                missing.append(label)
                continue
            entries.append(
                {
                    "label": label,
                    "x": xs["mean"],
                    "y": ys["mean"],
                    "xerr": _err(xs),
                    "yerr": _err(ys),
                }
            )
        metric = key.split(".", 1)[1]
        front = pareto_front(
            ((e["label"], e["x"], e["y"]) for e in entries), GREATER_IS_BETTER[metric]
        )
        path = f"figures/{stem}.png"
        figures[path] = _pareto_figure(entries, front, ylabel)
        summary[key] = {
            "figure": path,
            "front": front,
            "points": [{k: e[k] for k in ("label", "x", "y")} for e in entries],
            "missing": missing,
        }
    return summary, figures
