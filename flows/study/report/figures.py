"""The Pareto panels: latency against an uncertainty metric, one PNG per panel."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

from flows.study.report.cells import clip, metric_range
from flows.study.report.collect import Collected
from flows.study.report.stats import pareto_front
from tasks.params import GREATER_IS_BETTER

#: Pareto panels: (file stem, y metric key, y label).
PARETO = (
    ("pareto_near_ood_auroc", "near_ood.auroc", "near-OOD AUROC (higher is better)"),
    ("pareto_nll", "id_test.nll", "ID test NLL (lower is better)"),
    ("pareto_shift_nll", "shift.nll", "shift NLL (lower is better)"),
)
FIGSIZE = (8.0, 5.5)
DPI = 100
#: One colour and marker per model kind (colour-blind-safe Okabe-Ito colours).
KIND_STYLE = {
    "hydra": ("#D55E00", "s"),
    "single": ("#000000", "o"),
    "naive_pruned": ("#0072B2", "v"),
    "control": ("#009E73", "D"),
    "deep_ensemble": ("#CC79A7", "^"),
    "mc_dropout": ("#E69F00", "P"),
    "lora_ensemble": ("#56B4E9", "*"),
    "batch_ensemble": ("#F0E442", "h"),
}
_OTHER_STYLE = ("#999999", "X")
#: Tick marks of the cost-ratio axis.
_RATIO_TICKS = (0.125, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4, 6, 8, 12, 16, 32, 64)
#: Candidate offsets (points) of a point's number label, tried in order.
_OFFSETS = ((6, 4), (6, -12), (-12, 4), (-12, -12), (6, 14), (-12, 14), (6, -22), (-12, -22))


def kind_of(label: str) -> str:
    """The model kind of a report label: ``hydra[fast]`` -> ``hydra``."""
    return label.split("[", 1)[0]


def _label_offsets(xy: Sequence[tuple[float, float]], clear: float = 14.0) -> list[tuple[int, int]]:
    """Per point (display pixels), the first of :data:`_OFFSETS` whose label lands at least
    ``clear`` pixels from every point and label placed so far (else the one farthest from
    them): numbers next to their point that do not sit on each other."""
    placed: list[tuple[float, float]] = list(xy)
    chosen = []
    for x, y in xy:

        def room(o: tuple[int, int], x: float = x, y: float = y) -> float:
            return min((abs(x + o[0] - px) + abs(y + o[1] - py) for px, py in placed), default=1e9)

        best = next((o for o in _OFFSETS if room(o) >= clear), max(_OFFSETS, key=room))
        chosen.append(best)
        placed.append((x + best[0], y + best[1]))
    return chosen


def _pareto_figure(
    entries: Sequence[Mapping[str, Any]], front: Sequence[str], ylabel: str
) -> bytes:
    """PNG bytes: one error-barred point per model at its mean, colour and marker by model kind
    (legend), the Pareto front joined by a dashed line and ringed; each point numbered (offset so
    numbers do not overlap), the numbers listed beside the plot. x is the cost ratio to the
    single model on a log axis."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullFormatter

    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.09, 0.11, 0.58, 0.82))
    kinds = []
    for e in entries:
        colour, marker = KIND_STYLE.get(kind_of(e["label"]), _OTHER_STYLE)
        if kind_of(e["label"]) not in kinds:
            kinds.append(kind_of(e["label"]))
        ax.errorbar(
            e["x"],
            e["y"],
            xerr=e["xerr"],
            yerr=e["yerr"],
            fmt=marker,
            color=colour,
            ms=7,
            capsize=3,
            mec="red" if e["label"] in front else colour,
            mew=2 if e["label"] in front else 1,
        )
    by_label = {e["label"]: e for e in entries}
    if len(front) > 1:
        ax.plot(
            [by_label[f]["x"] for f in front],
            [by_label[f]["y"] for f in front],
            "--",
            color="red",
            lw=1,
        )
    ax.set_xscale("log")
    lo = min(e["x"] - (e["xerr"][0][0] if e["xerr"] else 0) for e in entries)
    hi = max(e["x"] + (e["xerr"][1][0] if e["xerr"] else 0) for e in entries)
    ticks = [t for t in _RATIO_TICKS if lo / 1.5 <= t <= hi * 1.5] or [1.0]
    ax.set_xticks(ticks, [f"{t:g}x" for t in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("cost: latency ratio to the single model (within each point, log scale)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.autoscale_view()
    xy = [tuple(ax.transData.transform((e["x"], e["y"]))) for e in entries]
    for i, (e, off) in enumerate(zip(entries, _label_offsets(xy), strict=True), start=1):
        ax.annotate(str(i), (e["x"], e["y"]), textcoords="offset points", xytext=off, fontsize=8)
    handles = [
        Line2D(
            [],
            [],
            ls="",
            marker=KIND_STYLE.get(k, _OTHER_STYLE)[1],
            color=KIND_STYLE.get(k, _OTHER_STYLE)[0],
            label=k,
        )
        for k in kinds
    ]
    handles.append(Line2D([], [], ls="--", color="red", label="Pareto front (ringed)"))
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.69, 0.93), fontsize=8)
    key = "\n".join(f"{i}  {e['label']}" for i, e in enumerate(entries, start=1))
    fig.text(0.70, 0.55, key, va="top", fontsize=8, family="monospace")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _err(
    st: Mapping[str, Any] | None, rng: tuple[float | None, float | None] = (None, None)
) -> list[list[float]] | None:
    """Error bar lengths of an across-seed interval clipped to ``rng``."""
    if st is None or st["low"] is None:
        return None
    low, high = clip(st["low"], rng), clip(st["high"], rng)
    return [[max(0.0, st["mean"] - low)], [max(0.0, high - st["mean"])]]


def pareto_panels(col: Collected) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Per :data:`PARETO` panel, its summary (figure path, front, plotted points, models left
    out for lack of a cost ratio or metric) and ``{"figures/<stem>.png": PNG bytes}``. x is the
    model's cost ratio to the single model of the same point (``model.cost_ratio``), mean across
    seeds; y the metric's mean, error bars the across-seed intervals clipped to the range."""
    summary: dict[str, Any] = {}
    figures: dict[str, bytes] = {}
    for stem, key, ylabel in PARETO:
        entries, missing = [], []
        for label in col.labels():
            xs, ys = col.stats(label, "model.cost_ratio"), col.stats(label, key)
            if xs is None or ys is None:
                missing.append(label)
                continue
            entries.append(
                {
                    "label": label,
                    "x": xs["mean"],
                    "y": ys["mean"],
                    # a log axis: the ratio's interval stops short of 0
                    "xerr": _err(xs, (xs["mean"] / 100, None)),
                    "yerr": _err(ys, metric_range(key)),
                }
            )
        if not entries:
            continue
        metric = key.split(".", 1)[1]
        front = pareto_front(
            ((e["label"], e["x"], e["y"]) for e in entries), GREATER_IS_BETTER[metric]
        )
        path = f"figures/{stem}.png"
        figures[path] = _pareto_figure(entries, front, ylabel)
        summary[key] = {
            "figure": path,
            "front": front,
            "points": [
                {"number": i, **{k: e[k] for k in ("label", "x", "y")}}
                for i, e in enumerate(entries, start=1)
            ],
            "missing": missing,
        }
    return summary, figures
