"""Markdown table and target checks for benchmark results (see docs/benchmarks.md)."""

from __future__ import annotations

from typing import Any

TABLE_COLUMNS = (
    ("row", "row"),
    ("latency_ms_median", "median ms"),
    ("spread", "p25–p75 ms"),
    ("latency_ratio", "latency ×base"),
    ("throughput_per_s", "items/s"),
    ("peak_mem_mb", "peak MiB"),
    ("memory_ratio", "mem ×base"),
    ("params_ratio", "params ×base"),
    ("flops_ratio", "FLOPs ×base"),
)
#: ``--precisions`` runs: ratios are against the reference row; two more columns.
PRECISION_TABLE_COLUMNS = (
    ("row", "row"),
    ("precision", "precision"),
    ("latency_ms_median", "median ms"),
    ("spread", "p25–p75 ms"),
    ("latency_ratio", "latency ×ref"),
    ("throughput_per_s", "items/s"),
    ("peak_mem_mb", "peak MiB"),
    ("params_ratio", "params ×ref"),
    ("flops_ratio", "FLOPs ×ref"),
    ("same_precision_ratio", "latency ×single same precision"),
    ("same_precision_over_flops", "÷ FLOP ratio"),
)


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _cases(results: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    cases: dict[str, list[dict[str, Any]]] = {}
    for row in results["rows"]:
        cases.setdefault(row["case"], []).append(row)
    return cases


def _get(rows: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["row"] == name), None)


def _by_precision(rows: list[dict[str, Any]]) -> dict[str | None, list[dict[str, Any]]]:
    groups: dict[str | None, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row.get("precision"), []).append(row)
    return groups


def _same_precision(row: dict[str, Any]) -> float | None:
    """Latency against ``base`` at the row's precision (legacy rows: the plain latency ratio)."""
    value = row.get("same_precision_ratio")
    return value if value is not None else row.get("latency_ratio")


def evaluate_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets of docs/benchmarks.md, per case (and precision) where they apply; ``met`` is
    None if not measurable. With ``--precisions`` every latency target is judged within one
    precision, plus (a) served default Hydra at each low precision vs the reference (single
    model, fp32 eager) <= 1.0 and (b) Hydra / single at equal precision within 1.15x of the FLOP
    ratio."""
    out: list[dict[str, Any]] = []
    models = results.get("models", {})
    precision_mode = bool(results.get("config", {}).get("precisions"))

    def add(case: str, target: str, value: float | None, limit: str, met: bool | None) -> None:
        out.append({"case": case, "target": target, "value": value, "limit": limit, "met": met})

    for case_name, case_rows in _cases(results).items():
        model = case_rows[0]["model"]
        default = models.get(model, {}).get("default_implementation")
        for index, (precision, rows) in enumerate(_by_precision(case_rows).items()):
            case = f"{case_name} {precision}" if precision_mode else case_name
            first = index == 0 or not precision_mode
            _targets_of(case, rows, model, default, add, params_too=first)
            hydra = _get(rows, f"hydra[{default}]")
            if not precision_mode or not hydra:
                continue
            over = hydra.get("same_precision_over_flops")
            add(
                case,
                f"hydra[{default}] / single at equal precision ÷ FLOP ratio",
                over,
                "≤ 1.15",
                None if over is None else over <= 1.15,
            )
            if precision != "fp32" and hydra.get("latency_ratio") is not None:
                ratio = hydra["latency_ratio"]
                add(
                    case,
                    f"served hydra[{default}] {precision} eager / single fp32 eager (reference)",
                    ratio,
                    "≤ 1.0",
                    ratio <= 1.0,
                )
    return out


def _targets_of(
    case: str,
    rows: list[dict[str, Any]],
    model: str,
    default: str | None,
    add: Any,
    params_too: bool,
) -> None:
    """The release's targets on the rows of one case at one precision."""
    hydra = _get(rows, f"hydra[{default}]")
    de = _get(rows, "deep_ensemble_seq")
    base = _get(rows, "base")
    if hydra and _same_precision(hydra) and hydra["flops_ratio"]:
        rel = _same_precision(hydra) / hydra["flops_ratio"]
        add(
            case,
            f"hydra[{default}] latency ratio / FLOP ratio",
            rel,
            "0.9–1.1",
            0.9 <= rel <= 1.1,
        )
    if hydra and de and hydra["latency_ms_median"] and de["latency_ms_median"]:
        rel = hydra["latency_ms_median"] / de["latency_ms_median"]
        add(case, "hydra / sequential Deep Ensemble latency", rel, "≤ 0.8", rel <= 0.8)
    if model == "minilm" and rows[0]["batch"] == 32 and hydra and hydra["latency_ms_median"]:
        compiled = [r for r in rows if r["kind"] == "hydra_compiled" and r["latency_ms_median"]]
        if compiled:
            best = min(compiled, key=lambda r: r["latency_ms_median"])
            speed = hydra["latency_ms_median"] / best["latency_ms_median"]
            add(
                case,
                f"best compiled ({best['backend']}) speed-up over eager hydra",
                speed,
                "≥ 1.25",
                speed >= 1.25,
            )
    avg = _get(rows, "hydra_average")
    if params_too and avg and avg["params_ratio"]:
        add(
            case,
            "hydra_average params / single",
            avg["params_ratio"],
            "≤ 1.1",
            avg["params_ratio"] <= 1.1,
        )
    shared = [r for r in rows if r["kind"] == "hydra_shared" and r["latency_ms_median"]]
    if shared and de and base and de["latency_ms_median"]:
        half = max(shared, key=lambda r: r["shared_layers"])
        rel_de = half["latency_ms_median"] / de["latency_ms_median"]
        add(case, f"{half['row']} / sequential Deep Ensemble", rel_de, "≤ 0.6", rel_de <= 0.6)
        rel_single = _same_precision(half)
        add(case, f"{half['row']} / single", rel_single, "≤ 1.8", rel_single <= 1.8)


def markdown(results: dict[str, Any]) -> str:
    machine, config = results["machine"], results["config"]
    lines = [
        f"Machine: {machine.get('cpu_model') or machine['processor']}, {machine['cpu_count']} "
        f"cores, torch {machine['torch']}, {config['threads']} threads, device "
        f"{machine.get('gpu', machine['device'])}, dtype {config['dtype']}, M = "
        f"{config['members']}. Load average at start / end: "
        f"{_fmt_load(machine.get('load_average_start'))} / "
        f"{_fmt_load(machine.get('load_average_end'))}.",
        "",
    ]
    for model, info in results.get("models", {}).items():
        lines.append(
            f"- `{model}`: default grouped implementation here: "
            f"`{info['default_implementation']}`"
            + (f"; compile errors: {info['compile_errors']}" if info["compile_errors"] else "")
        )
    lines.append("")
    precision_mode = bool(config.get("precisions"))
    columns = PRECISION_TABLE_COLUMNS if precision_mode else TABLE_COLUMNS
    reference = results.get("reference", {})
    if precision_mode:
        lines.append(
            f"Precisions {', '.join(config['precisions'])} measured side by side (eager: "
            "autocast on fp32 weights; compiled: `compile_model(..., precision=p)`). Reference "
            f"row (every ×ref ratio): **{reference.get('label', 'single model, fp32 eager')}**."
        )
        for precision, note in config.get("precision_notes", {}).items():
            lines.append(f"- {precision}: {note}")
        lines.append("")
    for case, rows in _cases(results).items():
        lines.append(f"### {case}")
        lines.append("")
        lines.append("| " + " | ".join(h for _, h in columns) + " |")
        lines.append("|" + "---|" * len(columns))
        for row in rows:
            cells = []
            is_reference = (
                precision_mode
                and row["row"] == reference.get("row")
                and row.get("precision") == reference.get("precision")
            )
            for key, _ in columns:
                if key == "spread":
                    cells.append(
                        f"{_fmt(row['latency_ms_p25'], 1)}–{_fmt(row['latency_ms_p75'], 1)}"
                    )
                elif key == "row" and row.get("error"):
                    cells.append(f"{row['row']} (error: {row['error'][:80]})")
                elif key == "row" and is_reference:
                    cells.append(f"**{row['row']}: {reference['label']} (reference)**")
                else:
                    cells.append(
                        _fmt(
                            row.get(key),
                            1
                            if key in ("latency_ms_median", "peak_mem_mb", "throughput_per_s")
                            else 2,
                        )
                    )
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if results.get("targets"):
        lines += [
            "### Targets",
            "",
            "| case | target | value | limit | met |",
            "|---|---|---|---|---|",
        ]
        for t in results["targets"]:
            met = {True: "yes", False: "**no**", None: "—"}[t["met"]]
            lines.append(
                f"| {t['case']} | {t['target']} | {_fmt(t['value'])} | {t['limit']} | {met} |"
            )
        lines.append("")
    return "\n".join(lines)


def _fmt_load(load: Any) -> str:
    return "—" if not load else ", ".join(f"{x:.1f}" for x in load)
