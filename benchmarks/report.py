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


def evaluate_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's CPU targets, per case where they apply; ``met`` is None if not measurable."""
    out: list[dict[str, Any]] = []
    models = results.get("models", {})

    def add(case: str, target: str, value: float | None, limit: str, met: bool | None) -> None:
        out.append({"case": case, "target": target, "value": value, "limit": limit, "met": met})

    for case, rows in _cases(results).items():
        model = rows[0]["model"]
        default = models.get(model, {}).get("default_implementation")
        hydra = _get(rows, f"hydra[{default}]")
        de = _get(rows, "deep_ensemble_seq")
        base = _get(rows, "base")
        if hydra and hydra["latency_ratio"] and hydra["flops_ratio"]:
            rel = hydra["latency_ratio"] / hydra["flops_ratio"]
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
        if avg and avg["params_ratio"]:
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
            add(
                case,
                f"{half['row']} / single",
                half["latency_ratio"],
                "≤ 1.8",
                half["latency_ratio"] <= 1.8,
            )
    return out


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
    for case, rows in _cases(results).items():
        lines.append(f"### {case}")
        lines.append("")
        lines.append("| " + " | ".join(h for _, h in TABLE_COLUMNS) + " |")
        lines.append("|" + "---|" * len(TABLE_COLUMNS))
        for row in rows:
            cells = []
            for key, _ in TABLE_COLUMNS:
                if key == "spread":
                    cells.append(
                        f"{_fmt(row['latency_ms_p25'], 1)}–{_fmt(row['latency_ms_p75'], 1)}"
                    )
                elif key == "row" and row.get("error"):
                    cells.append(f"{row['row']} (error: {row['error'][:80]})")
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
