"""What the CLI prints: its tables and summaries as rich renderables, from the plain dicts the
commands get back (the flow's summary, ``predict``'s rows, the registry's versions, a study's
summary). Values from files and users are shown as plain text (``escape``/``Text``): a path or a
news text may hold brackets that console markup would drop."""

from __future__ import annotations

import json
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text


def print_run_summary(console: Console, summary: dict[str, Any], log_path: str) -> None:
    """``run``'s end: the stages (ran / up to date, seconds), the numbers that decide per model
    (:func:`deciding_table`; every other number is in the report), the report, the gate's
    verdict, what the promotion did, and where the run's full log is."""
    table = Table(title="stages", show_lines=False)
    table.add_column("stage")
    table.add_column("result")
    table.add_column("seconds", justify="right")
    for r in summary["stages"]:
        table.add_row(r["stage"], "ran" if r["ran"] else "up to date", f"{r['seconds']:.1f}")
    console.print(table)
    if summary.get("models"):
        console.print()
        console.print(deciding_table(summary["models"]))
    if "report" in summary:
        console.print(
            f"[bold]report:[/] {escape(summary['report'])} (every metric, figures and tables)"
        )
    gate = summary.get("gate")
    if gate:
        color = "green" if gate["verdict"] == "passed" else "red"
        console.print(
            f"\n[bold]gate:[/] [{color}]{gate['verdict'].upper()}[/]"
            + (f" (failed: {', '.join(gate['failed'])})" if gate["failed"] else "")
            + (f"; {escape(gate['note'])}" if gate.get("note") else ""),
            soft_wrap=True,
        )
        for line in gate.get("failures") or []:
            console.print(f"  [red]failed:[/] {escape(line)}", soft_wrap=True)
        promo = summary.get("promotion") or {}
        if promo.get("promoted"):
            console.print(
                f"[bold]promoted:[/] {promo['model']}@{promo['version']} -> {promo['stage']}"
            )
        elif promo:
            console.print(f"[bold]not promoted:[/] {promo.get('why')}")
    console.print(f"[dim]total {summary['seconds']:.1f}s[/]")
    console.print(f"[dim]full log: {escape(log_path)}[/]", soft_wrap=True)


#: The run's closing table, per model: (heading, evaluate.json split, metric), calibrated.
DECIDING = (
    ("ID acc", "id_test", "accuracy"),
    ("ID NLL", "id_test", "nll"),
    ("near AUROC", "near_ood", "auroc"),
    ("far AUROC", "far_ood", "auroc"),
    ("shift NLL", "shift", "nll"),
)


def deciding_rows(
    evaluation: dict[str, Any], verdict: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """One row per model of ``metrics/evaluate.json`` (its order): the calibrated
    :data:`DECIDING` numbers, ``cost`` (the verdict's latency ratio to the single model with its
    interval, else evaluate's latency over the single model's, else None) and ``gate`` (the
    verdict's word for that candidate, ``ships`` for the one that ships; None when not judged)."""
    judged = (verdict or {}).get("candidates") or {}
    ships = (verdict or {}).get("ships")
    models = evaluation["models"]
    single_ms = (models.get("single") or {}).get("latency_ms")
    rows = []
    for name, entry in models.items():
        cost = (judged.get(name) or {}).get("cost") or {}
        if cost.get("ratio") is not None:
            ratio = {k: cost.get(k) for k in ("ratio", "ratio_low", "ratio_high")}
        elif single_ms and entry.get("latency_ms") is not None:
            ratio = {"ratio": entry["latency_ms"] / single_ms}
        else:
            ratio = None
        gate = (judged.get(name) or {}).get("verdict")
        rows.append(
            {
                "model": name,
                **{head: entry["calibrated"][split][m] for head, split, m in DECIDING},
                "cost": ratio,
                "gate": "ships" if name == ships else gate,
            }
        )
    return rows


def deciding_table(rows: list[dict[str, Any]]) -> Table:
    """:func:`deciding_rows` as a table that fits an 80-column terminal."""
    table = Table(
        title="the numbers that decide (calibrated; the rest: the report)",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )
    table.add_column("model", no_wrap=True)
    for head, _, _ in DECIDING:
        table.add_column(head.replace(" ", "\n"), justify="right", no_wrap=True)
    table.add_column("x single\n[95%]", justify="right", no_wrap=True)
    table.add_column("gate", no_wrap=True)
    for r in rows:
        cost = r["cost"]
        shown = "-" if cost is None else f"{cost['ratio']:.2f}"
        if cost is not None and cost.get("ratio_low") is not None:
            shown += f" [{cost['ratio_low']:.2f}, {cost['ratio_high']:.2f}]"
        table.add_row(
            escape(r["model"]),
            *[f"{r[head]:.4f}" if "AUROC" in head else f"{r[head]:.3f}" for head, _, _ in DECIDING],
            shown,
            r["gate"] or "-",
        )
    return table


def print_stages(console: Console, stages: tuple[str, ...], stale: set[str]) -> None:
    """``status``: each stage, stale or up to date."""
    for name in stages:
        mark = "[yellow]stale[/]" if name in stale else "[green]up to date[/]"
        console.print(f"  {name:<20} {mark}")


def print_prod(console: Console, model: str, stage: str, prod: dict[str, Any] | None) -> None:
    """``status``: the version of ``model`` in ``stage`` (its commit, verdict, reason), or none."""
    if prod is None:
        console.print(f"{model} {stage}: [dim]none[/]")
        return
    f = prod["fields"]
    console.print(
        f"{model} {stage}: [bold]{prod['version']}[/] "
        f"(commit {prod['commit'][:8]}, gate {f.get('gate', '?')}"
        + (f", reason: {escape(f['reason'])}" if "reason" in f else "")
        + ")",
        soft_wrap=True,
    )


def prediction_table(
    rows: list[dict[str, Any]], title: str, labels: dict[str, str] | None = None
) -> Table:
    """``predict``'s table: one row per input (its first 60 characters), the class, the
    uncertainty numbers and the verdict, in 80 columns: only the input wraps, at spaces (a word
    too long for its column is cut with an ellipsis); class, numbers and headers never wrap.
    ``ood_score`` gets a column unless it is the max-probability score (``msp`` = -prob, the
    legend says so). Inputs, class names and the title are shown as they are (plain text: a
    news text's ``[removed]`` is not console markup). ``labels``: verdict labels (default
    :data:`hydra_ops.uq.ood_thresholds.VERDICT_LABELS`)."""
    if labels is None:
        from hydra_ops.uq.ood_thresholds import VERDICT_LABELS as labels
    with_score = any(r.get("ood_score_kind") != "msp" for r in rows)
    table = Table(title=Text(title), box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("input", overflow="ellipsis", min_width=12, ratio=1)
    cols = ["class", "prob", "entropy", "MI", "disagree"]
    cols += ["ood_score"] if with_score else []
    for col in [*cols, "verdict"]:
        table.add_column(
            col, no_wrap=True, justify="left" if col in ("class", "verdict") else "right"
        )

    def num(v: float | None, fmt: str = ".3f") -> str:
        return "n/a" if v is None else format(v, fmt)  # a column this model cannot give

    for r in rows:
        cells = [
            Text(r["input"][:60]),
            Text(str(r["class"])),
            num(r["prob"]),
            num(r["entropy"]),
            num(r["mutual_information"]),
            num(r["disagreement"]),
        ]
        cells += [num(r["ood_score"], ".4f")] if with_score else []
        table.add_row(*cells, labels.get(r["verdict"], "n/a"))
    return table


def service_title(answer: dict[str, Any]) -> str:
    """``predict``'s title for an answer of the running service (model, version, stage, what
    answered, where, the preprocessing)."""
    return (
        f"{answer['model']} {answer['model_version']} ({answer['stage']}), answered by "
        f"{answer['answered_by']} at {answer['url']}; preprocessing: "
        f"{answer['rows'][0]['preprocessing']}"
    )


def promotion_line(result: dict[str, Any], reason: str | None, rollback: bool) -> str:
    """``promote``'s one line (plain text) for the record :func:`tasks.promote.promote` or
    :func:`tasks.promote.rollback` returned."""
    if result["promoted"]:
        how = (
            f" (rollback from {result['rollback_from']}: {reason})"
            if rollback
            else (f" (forced: {reason})" if result.get("forced") else "")
        )
        return f"promoted {result['model']}@{result['version']} -> {result['stage']}{how}"
    if result.get("why") == "already in stage":
        return (
            f"not promoted: {result['model']}@{result['version']} is already in stage "
            f"{result['stage']}"
        )
    failed = result.get("failed_checks") if result.get("why") == "gate failed" else None
    return f"not promoted: {result['why']}" + (f" (failed: {', '.join(failed)})" if failed else "")


def registry_table(
    name: str,
    stage: str,
    rows: list[dict[str, Any]],
    history: list[dict[str, Any]],
    current: dict[str, Any] | None,
) -> Table:
    """``registry``: one row per registered version, newest first: whether it holds ``stage``
    (and which assignments it had), its gate verdict, key metrics, when, and the reason of a
    forced one."""
    by_commit: dict[str, list[str]] = {}
    for a in history:
        by_commit.setdefault(a["commit"], []).append(f"#{a['n']}")
    table = Table(title=f"{name} versions ({stage}: {current['version'] if current else 'none'})")
    columns = ("version", stage, "gate", "id acc", "id NLL", "id ECE", "near-OOD AUROC")
    for col in (*columns, "registered", "reason"):
        table.add_column(col, overflow="fold")
    for v in reversed(rows):
        f = v["fields"]
        try:
            m = json.loads(f.get("metrics", "{}")).get("calibrated", {})
        except json.JSONDecodeError:
            m = {}

        def cell(split: str, metric: str, m: dict = m) -> str:
            value = m.get(split, {}).get(metric)
            return "-" if value is None else f"{value:.4f}"

        held = by_commit.get(v["commit"], [])
        mark = (
            "[bold green]current[/] " if current and current["version"] == v["version"] else ""
        ) + (f"[dim]assigned {' '.join(held)}[/]" if held else "")
        table.add_row(
            v["version"],
            mark or "-",
            f.get("gate", "?"),
            cell("id_test", "accuracy"),
            cell("id_test", "nll"),
            cell("id_test", "ece"),
            cell("near_ood", "auroc"),
            v["created"][:19].replace("T", " "),
            escape(f.get("reason", "")),
        )
    return table


def print_registry(
    console: Console,
    name: str,
    stage: str,
    rows: list[dict[str, Any]],
    history: list[dict[str, Any]],
    current: dict[str, Any] | None,
) -> None:
    """``registry``: the versions (:func:`registry_table`), then the assignments a person made by
    hand (rollbacks, forced promotions) with their reasons."""
    console.print(registry_table(name, stage, rows, history, current))
    for a in history:
        if "rollback" in a["message"] or "forced" in a["message"]:
            console.print(f"[dim]{escape(a['tag'])}: {escape(a['message'])}[/]", soft_wrap=True)


def study_table(summary: dict[str, Any], report_only: bool = False) -> Table:
    """A study's points: up to date, ran (seconds), failed (why) or missing (``--report-only``,
    which runs none, or not selected by ``--only``)."""
    table = Table(title=f"study {summary['study']} at {summary['commit'][:8]}")
    for col in ("point", "result", "seconds"):
        table.add_column(col)
    for name in summary["up_to_date"]:
        table.add_row(name, "up to date", "-")
    for name, info in summary["points"].items():
        table.add_row(name, "ran", f"{info['seconds']:.0f}")
    for name, why in summary["failed"].items():
        table.add_row(name, f"[red]failed[/]: {escape(why)}", "-")
    why = "not run: --report-only" if report_only else "not selected by --only"
    for name in summary["missing"]:
        table.add_row(name, f"[yellow]missing[/] ({why})", "-")
    return table


def study_line(summary: dict[str, Any], report_only: bool) -> str:
    """The line under a study's table: what is done and missing, or what the reuse saved."""
    if report_only:
        return (
            f"report only: {len(summary['up_to_date'])} points done, "
            f"{len(summary['missing'])} missing (run without --report-only to compute them)"
        )
    reuse = summary["reuse"]
    line = (
        f"{reuse['points']} points shared {reuse['upstreams']} upstream(s); reuse saved "
        f"{reuse['saved_seconds'] / 60:.1f} min of compute; "
        f"wall {summary['seconds'] / 60:.1f} min"
    )
    if summary.get("missing"):
        line += f"; {len(summary['missing'])} points not selected by --only are missing"
    return line


def print_study(console: Console, summary: dict[str, Any], report_only: bool) -> None:
    """A study's end: its points (:func:`study_table`), the line under them, the report."""
    console.print(study_table(summary, report_only))
    console.print(study_line(summary, report_only))
    if summary.get("report"):
        console.print(f"report: {summary['report']}", markup=False, soft_wrap=True)
