"""Stage ``gate``: the checks of ``params.yaml``'s ``gates:`` on every candidate's metrics.

Each check (``tasks.params.GateCheck``, modelled on MLflow's ``MetricThreshold``) is judged by its
kind (:mod:`tasks.gate_kinds`): a comparison with a baseline the run built (``single``,
``naive_pruned``, ``deep_ensemble``, ...) or the current ``prod`` model, or an absolute threshold
the user opts into, with a direction per metric, on calibrated probabilities unless it says
``calibrated: false``. With a baseline the candidate may be worse by at most ``tolerance`` (or
must be better by at least ``min_absolute_change``); with ``use_bootstrap_bound`` the conservative
end of the paired bootstrap interval of (candidate - baseline) replaces the point difference.
Every record says what it was compared ``against`` and its ``margin`` (how far it passed; the
shortfall when negative); the verdict lists each failed check with its margin (``failures``) and
the baselines its checks used (``baselines_used``).

``threshold: compile_tolerance`` (the default ``compile_max_abs_diff`` check) applies the tolerance
the compile stage checked the shipped artifact with (``compile.tolerance_fp32`` for fp32,
``compile.tolerance_low_precision`` for bf16/fp16, recorded by evaluate as ``compile_tolerance``);
the check's record holds the number applied (``threshold``) and where it came from
(``threshold_from``). A numeric threshold is applied as written.

A verdict passes only when no check failed and at least one check applied: ``gates: []``, or
every check skipped or not applicable, fails as ``no applicable check``. When a check compares
with ``prod``, the verdict records the version it compared with (``prod_compared``); ``promote``
refuses it once another version holds the stage.

Statuses: ``passed``, ``failed``, ``not applicable`` (a compile check when the shipped artifact is
the eager model: nothing was compiled, so nothing was checked; it neither passes nor blocks) and
``skipped`` (a ``prod`` comparison while no model holds the stage, allowed only for a check marked
``optional: true``; without it the check fails with the reason). A baseline the run did not build
is refused when the params are validated, and fails if its evaluation is missing anyway: a check
never passes for want of its baseline. A registry that cannot be read fails a ``prod``
comparison: it never turns into a pass.

The verdict is bound to what it judged: ``reports/gate.json`` records the DVC md5 of the model that
ships (``models/hydra``), its compiled artifact, the evaluation it read and the params
(:mod:`tasks.lineage`); ``promote`` refuses a verdict whose hashes no longer match the workspace.
Writes ``reports/gate.json`` and ``reports/gate.md``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from tasks.candidate_gate import (
    NO_CHECK,
    NO_CHECK_NOTE,
    failure_lines,
    judge_all,
    render_candidates,
    summary_note,
)
from tasks.custody import check_chain
from tasks.gate_kinds.judge import evaluate_check
from tasks.layout import METRICS, REPORTS
from tasks.lineage import judged_hashes
from tasks.outputs import COST_FILE, load_evaluation, read_json, write_json, write_text
from tasks.params.schema import PipelineConfig
from tasks.stage import stage_main

__all__ = ["decide", "evaluate_check", "render_gate", "run"]

#: The params view this stage validates ``params.yaml`` with (the sections it reads).
SCHEMA = PipelineConfig

log = logging.getLogger("hydra_ens")


def prod_seen(cfg: PipelineConfig, root: Path) -> tuple[dict[str, Any] | str | None, dict]:
    """``(prod, seen)``: the metrics of the version in the stage (None when no version holds it,
    the one-line reason when the registry cannot be read; :func:`evaluate_check`'s ``prod``) and
    ``{"version": ...}``, the version they belong to (None for none; absent when unreadable)."""
    from tasks.registry import RegistryError, prod_version

    try:
        record = prod_version(root, cfg.promote.model_name, cfg.promote.stage)
        if record is None:
            return None, {"version": None}
        raw = record["fields"].get("metrics")
        if raw is None:
            raise RegistryError(f"{record['tag']}: its tag message records no metrics")
        return json.loads(raw), {"version": record["version"], "stage_tag": record["stage_tag"]}
    except RegistryError as err:
        return str(err), {"unreadable": str(err)}


def compares_with_prod(cfg: PipelineConfig) -> bool:
    return any(c.baseline == "prod" for c in cfg.gates)


def decide(
    cfg: PipelineConfig,
    ev: dict[str, Any],
    prod: dict[str, Any] | str | None,
    cost: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The verdict of ``cfg.gates`` on evaluation ``ev`` (``prod``: :func:`evaluate_check`'s;
    ``cost``: ``metrics/cost.json``, None when not measured): every candidate of ``ev`` judged,
    the one that ships, and at top level the checks, failed ones and counts of the candidate that
    ships (else of the first allowed; :func:`tasks.candidate_gate.judge_all`). A candidate passes
    only when no check failed and at least one applied (passed): no check at all
    (``gates: []``), or only skipped and not applicable ones, fails as :data:`NO_CHECK`.
    ``promote`` calls this again on the same inputs; it never trusts a stored ``passed``."""
    return judge_all(cfg, ev, prod, cost)


def load_cost(root: Path) -> dict[str, Any] | None:
    """``metrics/cost.json`` (:mod:`tasks.cost`), None when this run measured no cost."""
    path = root / METRICS / COST_FILE
    return read_json(path, "evaluate output") if path.is_file() else None


def run(cfg: PipelineConfig, root: Path) -> dict[str, Any]:
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
