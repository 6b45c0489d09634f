"""The run report's figures, drawn with matplotlib's Agg backend (no display, no network) from what
``evaluate`` wrote: one function per figure, each returning a :class:`~matplotlib.figure.Figure`.

* :func:`reliability_figure`: the reliability diagram on ID test, one curve per model.
* :func:`roc_figure`: ROC curves of near- and far-OOD against ID test, one curve per model.
* :func:`histogram_figure`: per model, the histogram of one score on ID test, near-OOD and far-OOD.
* :func:`cost_quality_figure`: latency relative to the single model (log axis) against near-OOD
  AUROC and shift NLL, one point per model.

Every model has the same colour and marker in every figure (:func:`model_style`), and every
legend names the model with its number (ECE, AUROC), so a figure reads without the tables.
"""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import matplotlib

matplotlib.use("Agg")

from matplotlib import pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

#: Known models in the order they are drawn (others follow in their own order).
MODEL_ORDER = (
    "hydra",
    "single",
    "naive_pruned",
    "deep_ensemble",
    "mc_dropout",
    "control",
    "lora_ensemble",
    "batch_ensemble",
)
_COLORS = ("#d62728", "#1f77b4", "#7f7f7f", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2")
_MARKERS = ("o", "s", "v", "D", "^", "P", "X", "*")
#: Splits of the histograms and their colours (ID, near-OOD, far-OOD).
SPLIT_STYLE = {
    "id_test": ("ID test", "#1f77b4"),
    "near_ood": ("near-OOD", "#ff7f0e"),
    "far_ood": ("far-OOD", "#2ca02c"),
}
DPI = 110


def ordered(names: Iterable[str]) -> list[str]:
    """``names`` without repeats, the models of :data:`MODEL_ORDER` first in that order."""
    unique = list(dict.fromkeys(names))
    known = [m for m in MODEL_ORDER if m in unique]
    return known + [m for m in unique if m not in known]


def model_style(name: str) -> dict[str, Any]:
    """Colour, marker and line width of a model: fixed per known model, so the same model looks
    the same in every figure; Hydra drawn thickest."""
    known = name in MODEL_ORDER
    i = MODEL_ORDER.index(name) if known else len(MODEL_ORDER) + sum(name.encode()) % 2
    return {
        "color": _COLORS[i % len(_COLORS)],
        "marker": _MARKERS[i % len(_MARKERS)],
        "linewidth": 2.4 if name == "hydra" else 1.4,
        "zorder": 3 if name == "hydra" else 2,
    }


def _by(rows: list[dict[str, Any]], *keys: str) -> dict[tuple, list[dict[str, Any]]]:
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[tuple(row[k] for k in keys)].append(row)
    return groups


def reliability_figure(rows: list[dict[str, Any]], ece: dict[str, float] | None = None) -> Figure:
    """Mean confidence against accuracy per confidence bin on ID test (``plots/reliability.json``
    rows ``{model, confidence, accuracy, count}``), one curve per model; the diagonal is perfect
    calibration. ``ece``: each model's ECE, shown in its legend entry."""
    fig, ax = plt.subplots(figsize=(6.4, 5.2), layout="constrained")
    ax.plot([0, 1], [0, 1], ls="--", color="black", lw=1, label="perfectly calibrated")
    groups = _by(rows, "model")
    for name in ordered(r["model"] for r in rows):
        pts = sorted(groups[(name,)], key=lambda r: r["confidence"])
        style = model_style(name)
        label = name if not ece or name not in ece else f"{name} (ECE {ece[name]:.3f})"
        ax.plot(
            [p["confidence"] for p in pts],
            [p["accuracy"] for p in pts],
            label=label,
            markersize=5,
            **style,
        )
    low = min([r["confidence"] for r in rows] + [r["accuracy"] for r in rows] + [0.5])
    ax.set_xlim(max(0.0, low - 0.05), 1.0)
    ax.set_ylim(max(0.0, low - 0.05), 1.02)
    ax.set_xlabel("mean confidence in bin (max calibrated probability)")
    ax.set_ylabel("accuracy in bin")
    ax.set_title("Reliability on ID test (calibrated)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    return fig


def roc_figure(
    rows: list[dict[str, Any]], auroc: dict[str, dict[str, float]] | None = None
) -> Figure:
    """ROC curves (``plots/roc.json`` rows ``{model, split, fpr, tpr}``): near-OOD and far-OOD
    against ID test side by side, one curve per model. ``auroc[split][model]`` goes in the
    legend."""
    splits = [s for s in ("near_ood", "far_ood") if any(r["split"] == s for r in rows)]
    fig, axes = plt.subplots(
        1, len(splits), figsize=(5.2 * len(splits), 5.0), layout="constrained", squeeze=False
    )
    groups = _by(rows, "model", "split")
    for ax, split in zip(axes[0], splits, strict=True):
        ax.plot([0, 1], [0, 1], ls=":", color="black", lw=1, label="chance")
        for name in ordered(r["model"] for r in rows):
            pts = groups.get((name, split))
            if not pts:
                continue
            value = (auroc or {}).get(split, {}).get(name)
            label = name if value is None else f"{name} (AUROC {value:.3f})"
            ax.plot(
                [p["fpr"] for p in pts],
                [p["tpr"] for p in pts],
                label=label,
                **{**model_style(name), "marker": None},
            )
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.01)
        ax.set_xlabel("false positive rate (ID test flagged as OOD)")
        ax.set_ylabel("true positive rate (OOD flagged)")
        ax.set_title(f"{SPLIT_STYLE[split][0]} vs ID test")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
    return fig


def histogram_figure(rows: list[dict[str, Any]], score: str, title: str) -> Figure:
    """Small multiples, one panel per model that has ``score``: the fraction of each split's
    examples per bin (``plots/histograms.json`` rows of :mod:`tasks.reports.score_histograms`), ID
    test, near-OOD and far-OOD as step outlines over shared bins."""
    mine = [r for r in rows if r["score"] == score]
    names = ordered(r["model"] for r in mine)
    if not names:
        raise ValueError(f"no histogram rows for score {score!r}")
    cols = min(3, len(names))
    nrows = -(-len(names) // cols)
    fig, axes = plt.subplots(
        nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), layout="constrained", squeeze=False
    )
    groups = _by(mine, "model", "split")
    for ax, name in zip(axes.flat, names, strict=False):
        kind = next(r["kind"] for r in mine if r["model"] == name)
        for j, (split, (label, color)) in enumerate(SPLIT_STYLE.items()):
            bins = sorted(groups.get((name, split), []), key=lambda r: r["lo"])
            if not bins:
                continue
            fractions = [b["fraction"] for b in bins]
            if kind == "disagreement":  # a few discrete values: the splits' bars side by side
                width = (bins[0]["hi"] - bins[0]["lo"]) / (len(SPLIT_STYLE) + 1)
                centers = [b["center"] + (j - 1) * width for b in bins]
                ax.bar(centers, fractions, width=width, label=label, color=color)
                ax.set_xticks([b["center"] for b in bins])
                ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.2g}"))
            else:
                edges = [b["lo"] for b in bins] + [bins[-1]["hi"]]
                ax.stairs(fractions, edges, label=label, color=color, lw=1.8)
        ax.set_title(name, color=model_style(name)["color"], fontweight="bold")
        ax.set_xlabel(f"{kind} (higher = more OOD)")
        ax.set_ylabel("fraction of split")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(title)
    return fig


def _ratio_label(x: float, _pos: int) -> str:
    return f"{x:g}x"


def cost_quality_figure(points: dict[str, dict[str, float]], reference: str = "single") -> Figure:
    """Cost against quality: each model's latency relative to ``reference`` (log x axis) against
    near-OOD AUROC (higher is better) and shift NLL (lower is better), one marker per model,
    named in a shared legend. ``points[model]`` = ``{latency_ratio, near_ood_auroc, shift_nll}``."""
    panels = (
        ("near_ood_auroc", "near-OOD AUROC (higher is better)"),
        ("shift_nll", "shift NLL (lower is better)"),
    )
    fig, axes = plt.subplots(1, 2, figsize=(10.4, 4.6), layout="constrained")
    names = ordered(points)
    ratios = [points[n]["latency_ratio"] for n in names]
    low, high = min([*ratios, 1.0]), max([*ratios, 1.0])
    for ax, (key, label) in zip(axes, panels, strict=True):
        ax.axvline(1.0, color="black", lw=0.8, ls=":")
        for name in names:
            style = model_style(name)
            ax.scatter(
                points[name]["latency_ratio"],
                points[name][key],
                s=110 if name == "hydra" else 70,
                color=style["color"],
                marker=style["marker"],
                edgecolors="black",
                linewidths=0.6,
                zorder=style["zorder"],
                label=f"{name} ({points[name]['latency_ratio']:.2f}x)",
            )
        ax.set_xscale("log")
        ax.set_xlim(low / 1.4, high * 1.4)
        ax.xaxis.set_major_locator(LogLocator(base=2))
        ax.xaxis.set_major_formatter(FuncFormatter(_ratio_label))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"latency relative to {reference} (log scale; lower is cheaper)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, which="both")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize=9, title="model (cost)")
    fig.suptitle("Cost vs quality (calibrated; latency as timed by evaluate)")
    return fig


def png_bytes(fig: Figure) -> bytes:
    """``fig`` as PNG (no timestamp in its metadata: the same figure gives the same bytes), and
    closes it."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()
