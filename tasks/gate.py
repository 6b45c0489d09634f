"""Stage ``gate``: the checks of ``params.yaml``'s ``gates:`` on every candidate's metrics, each
judged by its kind (:mod:`tasks.gates.checks`, :mod:`tasks.gates.kinds`,
:mod:`tasks.gates.verdict`); the one that ships. Every record says what it was compared
``against`` and its ``margin``; the verdict lists each failed check with its shortfall
(``failures``) and the baselines its checks used (``baselines_used``).

The verdict is bound to what it judged: ``reports/gate.json`` records the DVC md5 of the model that
ships (``models/hydra``), its compiled artifact, the evaluation it read and the params
(:mod:`tasks.release.lineage`); ``promote`` refuses a verdict whose hashes no longer match the
workspace. Writes ``reports/gate.json`` and ``reports/gate.md``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tasks.gates.candidates import failure_lines, render_candidates, summary_note
from tasks.gates.checks import NO_CHECK, NO_CHECK_NOTE
from tasks.gates.kinds import check_kinds
from tasks.gates.verdict import compares_with_prod, decide, load_cost, prod_seen
from tasks.params.schema import PipelineConfig
from tasks.release.custody import check_chain
from tasks.release.lineage import judged_hashes
from tasks.runtime.layout import REPORTS
from tasks.runtime.outputs import load_evaluation, write_json, write_text
from tasks.runtime.stage import stage_main

#: The params view this stage validates ``params.yaml`` with (the sections it reads).
SCHEMA = PipelineConfig

log = logging.getLogger("hydra_ens")


def run(cfg: PipelineConfig, root: Path) -> dict[str, Any]:
    check_kinds(cfg)
    judged = judged_hashes(cfg, root)
    ev = load_evaluation(root)
    check_chain(cfg, root, ev)  # never judge an evaluation of another model, artifact or params
    prod, seen = prod_seen(cfg, root) if compares_with_prod(cfg) else (None, None)
    verdict = {**decide(cfg, ev, prod, load_cost(root)), "judged": judged}
    if seen is not None:
        verdict["prod_compared"] = seen
    checks = verdict["checks"]
    write_json(root / REPORTS / "gate.json", verdict)
    write_text(root / REPORTS / "gate.md", render_gate(verdict))
    for c in checks:
        log.info(
            "gate %-40s %s (value %s, %s)",
            c["name"],
            c["status"].upper(),
            _f(c.get("value")),
            c.get("rule", c.get("note", "")),
        )
    if verdict["failed"] == [NO_CHECK]:
        log.info("gate %s: %s", NO_CHECK, NO_CHECK_NOTE)
    for line in failure_lines(verdict):
        log.info("gate failed: %s", line)
    for name, j in verdict["candidates"].items():
        log.info("gate candidate %-14s %s", name, j["verdict"].upper())
    log.info(
        "gate verdict: %s (ships: %s)%s",
        verdict["verdict"].upper(),
        verdict["ships"] or "none",
        f"; {note}" if (note := summary_note(verdict)) else "",
    )
    return verdict


def _f(v: Any) -> str:
    return "-" if v is None else f"{v:.4f}"


def render_gate(verdict: dict[str, Any]) -> str:
    note = summary_note(verdict)
    lines = [
        f"# Gate: **{verdict['verdict'].upper()}**",
        "",
        f"Checks below: `{verdict.get('candidate', 'hydra')}`; ships: "
        f"**{verdict.get('ships') or 'none'}**" + (f". {note}." if note else "."),
        "",
        "Judged (DVC md5): "
        + ", ".join(f"{r['path']} `{r['md5']}`" for r in verdict["judged"].values()),
        "",
        "Baselines the checks compared with: "
        + (", ".join(f"`{b}`" for b in verdict.get("baselines_used") or []) or "none"),
        "",
        *(f"- failed: {line}" for line in failure_lines(verdict)),
        "",
        "| check | against | status | value | baseline value | difference | rule | margin |",
        "|---|---|---|---|---|---|---|---|",
    ]
    if verdict["failed"] == [NO_CHECK]:
        lines.append(f"| {NO_CHECK} | - | failed | - | - | - | {NO_CHECK_NOTE} | - |")
    for c in verdict["checks"]:
        lines.append(
            f"| {c['name']} | {c.get('against', '-')} | {c['status']} | {_f(c.get('value'))} | "
            f"{_f(c.get('baseline_value'))} | {_f(c.get('difference'))} | "
            f"{c.get('rule', c.get('note', ''))} | {_f(c.get('margin'))} |"
        )
    lines += render_candidates(verdict)
    return "\n".join(lines) + "\n"


def main() -> None:
    stage_main("gate", run, SCHEMA)


if __name__ == "__main__":
    main()
