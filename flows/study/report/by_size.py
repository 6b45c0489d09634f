"""One variant of several studies side by side by model size: per task, a table of the Hydra
minus the single model, the Deep Ensemble and its naive pruned twin on the confirmation seeds, and
one figure of the Hydra's edge over its twin against the model's parameter count.

Every number is the study's own (``study.json``'s ``confirmation`` section: the mean and 95%
t interval over its confirmation seeds, ``paired``; the cost ratios, ``costs``) and every word
the one its Holm-corrected test gives (``claims``). Nothing is tested across studies: a word
belongs to its study's family.

Entries of one task must be comparable, else :class:`ValueError`: every cell of every entry over
the same number of confirmation seeds with results (at least 2, or there is no interval; the t
interval of 2 seeds and of 3 differ in kind, not only in width), and the same data-split regime
(every entry's split drawn per seed, or every entry's pinned). Studies of different tasks may
differ in both: they are different tables.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flows.study.report.cells import arrow, clip, diff_cell, md_table, metric_range

#: The baselines of each table (Hydra minus each), in order, with their names in the table.
BASELINES = {
    "single": "single model",
    "deep_ensemble": "Deep Ensemble",
    "naive_pruned": "naive pruned twin",
}
#: The metrics of each table and figure panel (``split.metric``) with their names.
METRICS = {
    "near_ood.auroc": "near-OOD AUROC",
    "shift.nll": "shift NLL",
    "id_test.nll": "ID NLL",
}
#: The columns of each table, as its claims anchor names them: ``model`` and ``baseline`` are
#: labels, ``parameters`` the single model's count, ``cost`` the baseline's ratio to the single
#: model, ``hydra_cost`` the Hydra's.
COLUMNS = ("model", "parameters", "baseline", *METRICS, "cost", "hydra_cost")
#: Decimals of a difference cell.
DECIMALS = 3
FIGSIZE = (12.0, 4.2)
DPI = 100
#: Legend entries per row at most; more wrap into rows of near-equal length.
LEGEND_COLUMNS = 3
#: The figure's height (as a fraction) each legend row after the first takes from the panels.
LEGEND_ROW_HEIGHT = 0.06
#: One colour and marker per task (colour-blind-safe Okabe-Ito colours), in the order given.
TASK_STYLES = (
    ("#0072B2", "o"),
    ("#D55E00", "s"),
    ("#009E73", "^"),
    ("#CC79A7", "D"),
    ("#E69F00", "v"),
    ("#56B4E9", "P"),
)


@dataclass(frozen=True)
class Entry:
    """One study's variant as one model size: ``model`` its label (``MiniLM-L6``), ``parameters``
    the single model's parameter count (``given`` when it came from the user, not the study),
    ``study`` the study's name (its folder under docs/studies/), ``confirmation`` the study.json's
    ``confirmation`` section."""

    model: str
    parameters: float
    study: str
    variant: str
    confirmation: Mapping[str, Any]
    given: bool = False


def single_parameters(report: Mapping[str, Any], variant: str) -> float | None:
    """The single model's parameter count in a study.json: its ``models`` section, else the
    variant's confirmation costs; None when neither has it."""
    single = (report.get("models") or {}).get("single") or {}
    count = (single.get("metrics") or {}).get("model.parameters") or {}
    if count.get("mean") is not None:
        return float(count["mean"])
    costs = ((report.get("confirmation") or {}).get("costs") or {}).get(variant) or {}
    value = (costs.get("single") or {}).get("parameters")
    return None if value is None else float(value)


def model_label(baseline: str, variant: str) -> str:
    """The study report's label of a model: the Hydra and its twin depend on the variant."""
    return f"{baseline}[{variant}]" if baseline in ("hydra", "naive_pruned") else baseline


def entry(
    model: str,
    report: Mapping[str, Any],
    study: str,
    variant: str,
    parameters: float | None = None,
) -> Entry:
    """Check one study.json (``report``) for what the tables need of ``variant`` and return its
    :class:`Entry`. ``parameters``: the count to use where the study.json has none; where it has
    one, it must agree within 1%."""
    for what, name in (("model", model), ("study", study), ("variant", variant)):
        if not name or "|" in name or (what != "model" and any(c in name for c in " ,:")):
            raise ValueError(f"bad {what} name {name!r} (no '|'; study and variant: no ' ,:')")
    conf = report.get("confirmation")
    if not conf:
        raise ValueError(f"study {study!r} has no confirmation section (no confirm_seeds)")
    if variant not in conf.get("paired", {}) or variant not in conf.get("claims", {}):
        have = ", ".join(sorted(conf.get("paired", {}))) or "none"
        raise ValueError(f"variant {variant!r} is not in study {study!r}'s confirmation ({have})")
    for b in BASELINES:
        for key in METRICS:
            if _stats(conf, variant, b, key) is None or _test(conf, variant, b, key) is None:
                raise ValueError(f"study {study!r} {variant}: no confirmation claim {b}|{key}")
        if model_label(b, variant) not in conf.get("costs", {}).get(variant, {}):
            raise ValueError(f"study {study!r} {variant}: no confirmation cost of {b}")
    if model_label("hydra", variant) not in conf["costs"][variant]:
        raise ValueError(f"study {study!r} {variant}: no confirmation cost of the Hydra")
    found = single_parameters(report, variant)
    if found is None and parameters is None:
        raise ValueError(f"study {study!r} gives no parameter count: pass one for {model}")
    if found is not None and parameters is not None and abs(parameters - found) > 0.01 * found:
        raise ValueError(
            f"{model}: {parameters:,.0f} parameters given, study {study!r} has {found:,.0f}"
        )
    count = found if found is not None else parameters
    if not (count is not None and math.isfinite(count) and count > 0):
        raise ValueError(f"{model}: the parameter count must be positive, got {count!r}")
    return Entry(model, count, study, variant, conf, given=found is None)


def _stats(conf: Mapping[str, Any], variant: str, baseline: str, key: str) -> Any:
    return conf["paired"][variant].get(baseline, {}).get(key)


def _test(conf: Mapping[str, Any], variant: str, baseline: str, key: str) -> Any:
    family = conf["claims"][variant].get("twin" if baseline == "naive_pruned" else "baselines")
    return (family or {}).get("tests", {}).get(f"{baseline}|{key}")


def seed_count(e: Entry) -> int:
    """The number of confirmation seeds behind every cell of ``e``; :class:`ValueError` when the
    cells differ or have fewer than 2 (no interval)."""
    ns = {_stats(e.confirmation, e.variant, b, k)["n"] for b in BASELINES for k in METRICS}
    if len(ns) != 1:
        raise ValueError(f"{e.model} ({e.study}): cells over different seed counts {sorted(ns)}")
    n = ns.pop()
    if n < 2:
        raise ValueError(f"{e.model} ({e.study}): {n} confirmation seed with results, no interval")
    return n


def check_task(task: str, entries: Sequence[Entry]) -> None:
    """:class:`ValueError` unless ``entries`` can share one table (module docstring)."""
    if not entries:
        raise ValueError(f"task {task!r} has no entries")
    models = [e.model for e in entries]
    if len(set(models)) != len(models):
        raise ValueError(f"task {task!r} names a model twice: {', '.join(models)}")
    counts = {e.model: seed_count(e) for e in entries}
    if len(set(counts.values())) > 1:
        each = ", ".join(f"{m} {n}" for m, n in counts.items())
        raise ValueError(
            f"task {task!r}: confirmation seed counts differ ({each}); intervals over different "
            "seed counts are not comparable side by side"
        )
    if len({bool(e.confirmation.get("mark")) for e in entries}) > 1:
        raise ValueError(
            f"task {task!r}: some studies pin the data split and some draw it per seed; their "
            "intervals cover different noise"
        )


def by_parameters(entries: Sequence[Entry]) -> list[Entry]:
    return sorted(entries, key=lambda e: (e.parameters, e.model))


def parameters_cell(e: Entry) -> str:
    """``22.7M`` (``22.7M given`` when the count is the user's, not the study's)."""
    return f"{e.parameters / 1e6:.1f}M" + (" given" if e.given else "")


def cost_cell(cost: Mapping[str, Any]) -> str:
    """``1.64x [1.55, 1.72]``: the ratio to the single model over the confirmation seeds; no
    interval where it has zero width (the single model itself) or none."""
    lo, hi = cost.get("ratio_low"), cost.get("ratio_high")
    interval = "" if lo is None or lo == hi else f" [{max(lo, 0.0):.2f}, {hi:.2f}]"
    return f"{cost['ratio']:.2f}x{interval}"


def task_table(task: str, entries: Sequence[Entry]) -> str:
    """The claims anchor and the Markdown table of one task: per model (by size) and baseline,
    Hydra minus that baseline on each of :data:`METRICS` as ``mean [low, high] word``, the
    baseline's cost and the Hydra's."""
    check_task(task, entries)
    ordered = by_parameters(entries)
    studies = ",".join(f"{e.study}:{e.variant}" for e in ordered)
    anchor = (
        f"<!-- claims studies={studies} rows={','.join(BASELINES)} cols={','.join(COLUMNS)} -->"
    )
    rows = []
    for e in ordered:
        costs = e.confirmation["costs"][e.variant]
        hydra_cost = cost_cell(costs[model_label("hydra", e.variant)])
        for b, name in BASELINES.items():
            cells = []
            for key in METRICS:
                st = _stats(e.confirmation, e.variant, b, key)
                word = _test(e.confirmation, e.variant, b, key)["word"]
                cells.append(f"{diff_cell(st, key, decimals=DECIMALS)} {word}")
            cost = cost_cell(costs[model_label(b, e.variant)])
            rows.append([e.model, parameters_cell(e), name, *cells, cost, hydra_cost])
    header = [
        "model",
        "parameters",
        "Hydra minus",
        *[f"{name}{arrow(k.split('.', 1)[1])}" for k, name in METRICS.items()],
        "its cost",
        "Hydra cost",
    ]
    return anchor + "\n" + md_table(header, rows)


def by_size_markdown(tasks: Mapping[str, Sequence[Entry]], figure: str | None = None) -> str:
    """The by-size document: one section per task (its table, :func:`task_table`), then the
    figure at ``figure`` (a path relative to the document) when given."""
    lines = [
        "# The Hydra by model size",
        "",
        "Per task, the same variant of each study at each model size: the Hydra minus the "
        "single model, the Deep Ensemble and its naive pruned twin, mean [95% t interval] over "
        "the study's confirmation seeds, worded by that study's Holm-corrected test (*better* / "
        "*worse* only where the correction rejects no difference). Cost: latency as a ratio to "
        "the single model of the same point, over the same seeds. Parameters: the single "
        "model's.",
    ]
    for task, entries in tasks.items():
        n = seed_count(entries[0]) if entries else 0
        variants = ", ".join(f"{e.model} `{e.variant}` ({e.study})" for e in by_parameters(entries))
        lines += ["", f"## {task}", "", f"{variants}; {n} confirmation seeds each.", ""]
        lines.append(task_table(task, entries))
        if any(e.confirmation.get("mark") for e in entries):
            lines += [
                "",
                "Every study pins one data split: the intervals cover training noise only.",
            ]
    if figure is not None:
        lines += ["", f"![the Hydra minus its naive pruned twin by model size]({figure})"]
    return "\n".join(lines) + "\n"


def _ticks(sizes: Mapping[str, Sequence[float]]) -> list[tuple[float, str]]:
    """The x ticks: per model its count (geometric mean over tasks), named ``model`` over
    ``22.7M``; models within 10% of each other share one tick."""
    at = sorted((math.exp(sum(map(math.log, ps)) / len(ps)), m) for m, ps in sizes.items())
    groups: list[list[tuple[float, str]]] = []
    for p, m in at:
        if groups and p <= groups[-1][0][0] * 1.1:
            groups[-1].append((p, m))
        else:
            groups.append([(p, m)])
    return [(g[0][0], " / ".join(m for _, m in g) + f"\n{g[0][0] / 1e6:.3g}M") for g in groups]


def legend_grid(entries: int) -> tuple[int, int]:
    """(rows, columns) of a legend of ``entries``: one row up to :data:`LEGEND_COLUMNS`, else
    the fewest rows that fit, filled evenly (4 entries: 2 x 2, not 3 + 1)."""
    if entries < 1:
        raise ValueError(f"a legend needs an entry, got {entries}")
    rows = math.ceil(entries / LEGEND_COLUMNS)
    return rows, math.ceil(entries / rows)


def by_size_figure(tasks: Mapping[str, Sequence[Entry]]) -> bytes:
    """PNG bytes: one panel per :data:`METRICS` metric, the Hydra minus its naive pruned twin
    (mean, 95% interval over the confirmation seeds) against the single model's parameter count
    (log axis, ticks named by model), one series per task (nudged sideways so they do not hide
    each other). Fixed size, no timestamp: the same tasks give the same bytes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullFormatter

    for task, entries in tasks.items():
        check_task(task, entries)
    if not tasks:
        raise ValueError("no task to plot")
    if len(tasks) > len(TASK_STYLES):
        raise ValueError(f"at most {len(TASK_STYLES)} tasks in one figure, got {len(tasks)}")
    sizes: dict[str, list[float]] = {}
    for entries in tasks.values():
        for e in entries:
            sizes.setdefault(e.model, []).append(e.parameters)
    ticks = _ticks(sizes)
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(METRICS))
    k = len(tasks)
    for ax, (key, name) in zip(axes, METRICS.items(), strict=True):
        rng = metric_range(key, difference=True)
        for i, entries in enumerate(tasks.values()):
            colour, marker = TASK_STYLES[i]
            nudge = 1.06 ** (i - (k - 1) / 2)
            xs, ys, lows, highs = [], [], [], []
            for e in by_parameters(entries):
                st = _stats(e.confirmation, e.variant, "naive_pruned", key)
                xs.append(e.parameters * nudge)
                ys.append(st["mean"])
                lows.append(max(0.0, st["mean"] - clip(st["low"], rng)))
                highs.append(max(0.0, clip(st["high"], rng) - st["mean"]))
            ax.errorbar(xs, ys, yerr=[lows, highs], fmt=marker + "-", color=colour, ms=6, capsize=3)
        ax.axhline(0.0, color="black", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xticks([p for p, _ in ticks], [label for _, label in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlim(ticks[0][0] / 1.6, ticks[-1][0] * 1.6)
        ax.set_title(f"{name}{arrow(key.split('.', 1)[1])}", fontsize=10)
        ax.set_xlabel("single model's parameters (log scale)")
        ax.set_ylabel("Hydra minus its naive pruned twin")
        ax.grid(True, alpha=0.3)
    handles = [
        Line2D([], [], color=TASK_STYLES[i][0], marker=TASK_STYLES[i][1], label=task)
        for i, task in enumerate(tasks)
    ]
    rows, columns = legend_grid(len(handles))
    fig.legend(handles=handles, loc="upper center", ncol=columns, fontsize=9)
    top = 0.84 - LEGEND_ROW_HEIGHT * (rows - 1)
    fig.subplots_adjust(left=0.06, right=0.99, bottom=0.2, top=top, wspace=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()
