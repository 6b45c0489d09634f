"""Stage ``gate``: the checks of ``params.yaml``'s ``gates:`` on the Hydra model's metrics.

Each check (``tasks.params.GateCheck``, modelled on MLflow's ``MetricThreshold``) is either an
absolute threshold or a comparison with a baseline (``single``, ``naive_pruned``,
``deep_ensemble``, ``control``) or the current ``prod`` model, with a direction per metric, on
calibrated probabilities unless it says ``calibrated: false``. With a baseline the candidate may be
worse by at most ``tolerance`` (or must be better by at least ``min_absolute_change``); with
``use_bootstrap_bound`` the conservative end of the paired bootstrap interval of
(Hydra - baseline) replaces the point difference.

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
``skipped`` (a comparison that cannot be made, allowed only for a check marked ``optional: true``;
without it the check fails with the reason). A registry that cannot be read fails a ``prod``
comparison: it never turns into a pass.

The verdict is bound to what it judged: ``reports/gate.json`` records the DVC md5 of the model that
ships (``models/hydra``), its compiled artifact, the evaluation it read and the params
(:mod:`tasks.release.lineage`); ``promote`` refuses a verdict whose hashes no longer match the
workspace. Writes ``reports/gate.json`` and ``reports/gate.md``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from tasks.gates.twin import paired_interval
from tasks.params.gates import COMPILE_TOLERANCE, GateCheck
from tasks.params.metrics import MODEL_METRICS
from tasks.params.schema import PipelineConfig
from tasks.release.custody import check_chain
from tasks.release.lineage import judged_hashes
from tasks.runtime.layout import METRICS, REPORTS
from tasks.runtime.outputs import COST_FILE, load_evaluation, read_json, write_json, write_text
from tasks.runtime.stage import stage_main

#: The params view this stage validates ``params.yaml`` with (the sections it reads).
SCHEMA = PipelineConfig

COMPILE_METRICS = ("compile_max_abs_diff", "compile_argmax_agreement")
#: The failed "check" of a verdict in which no check applied.
NO_CHECK = "no applicable check"
NO_CHECK_NOTE = (
    "no check passed or failed (gates: [] or every check skipped / not applicable); a verdict "
    "needs at least one check that applies"
)

log = logging.getLogger("hydra_ens")


def _value(entry: dict[str, Any], check: GateCheck) -> float | None:
    if check.metric in MODEL_METRICS:
        v = entry.get(check.metric)
    else:
        variant = "calibrated" if check.calibrated else "raw"
        v = entry.get(variant, {}).get(check.split, {}).get(check.metric)
    return None if v is None else float(v)


def _threshold(check: GateCheck, hydra: dict[str, Any]) -> tuple[float | None, str | None]:
    """``(bound applied, where it came from)`` of a threshold check: a number as written (source
    ``None``), or for ``threshold: compile_tolerance`` the tolerance compile applied to the shipped
    artifact (evaluate's ``compile_tolerance``; bound ``None`` and the reason when it is missing).
    """
    if check.threshold == COMPILE_TOLERANCE:
        tolerance = hydra.get("compile_tolerance")
        if tolerance is None:
            return None, "no compile_tolerance in metrics/evaluate.json (re-run compile, evaluate)"
        precision = hydra.get("compile_precision") or "unknown precision"
        return float(tolerance), f"compile tolerance for the shipped {precision}"
    return float(check.threshold), None  # type: ignore[arg-type]  # GateCheck: else a number


def _cannot_compare(rec: dict[str, Any], check: GateCheck, why: str) -> dict[str, Any]:
    if check.optional:
        return {**rec, "status": "skipped", "note": f"{why} (optional check)"}
    return {**rec, "status": "failed", "note": f"{why}; mark the check optional: true to allow it"}


def evaluate_check(
    check: GateCheck,
    ev: dict[str, Any],
    prod: dict[str, Any] | str | None,
    candidate: str = "hydra",
) -> dict[str, Any]:
    """One check's record for ``candidate`` (a model of ``ev``): values, the rule applied, and its
    status. Which checks apply to a candidate other than the Hydra is decided before this is
    called (:func:`tasks.gates.candidates.judge_candidate`).

    ``prod``: the prod model's metrics, None when no model is in the stage yet, or the one-line
    reason the registry could not be read.
    """
    gib = bool(check.greater_is_better)
    hydra = ev["models"][candidate]
    value = _value(hydra, check)
    rec: dict[str, Any] = {
        "name": check.name,
        "metric": check.metric,
        "split": check.split,
        "calibrated": check.calibrated,
        "greater_is_better": gib,
        "optional": check.optional,
        "value": value,
    }
    if check.metric in COMPILE_METRICS and hydra.get("compile_backend") == "eager":
        return {
            **rec,
            "status": "not applicable",
            "note": "the shipped artifact is the eager model (compile.backend: eager)",
        }
    if value is None:
        return {**rec, "status": "failed", "note": "metric missing from metrics/evaluate.json"}
    if check.threshold is not None:
        threshold, source = _threshold(check, hydra)
        if threshold is None:
            return {**rec, "status": "failed", "note": source}
        ok = value >= threshold if gib else value <= threshold
        rule = f"{'>=' if gib else '<='} {threshold:g}" + (f" ({source})" if source else "")
        return {
            **rec,
            "threshold": threshold,  # the number applied, also for compile_tolerance
            **({"threshold_from": source} if source else {}),
            "rule": rule,
            "status": "passed" if ok else "failed",
        }
    rec["baseline"] = check.baseline
    if check.baseline == "prod":
        if isinstance(prod, str):
            return {**rec, "status": "failed", "note": f"registry unreadable: {prod}"}
        if prod is None:
            return _cannot_compare(rec, check, "no model in prod yet")
        base_value = _value(prod, check)
        if base_value is None:
            return _cannot_compare(rec, check, f"the prod model has no {check.metric!r} recorded")
    else:
        entry = ev["models"].get(check.baseline)
        if entry is None:
            return _cannot_compare(
                rec, check, f"baseline {check.baseline!r} not evaluated in this variant"
            )
        base_value = _value(entry, check)
        if base_value is None:
            return {**rec, "status": "failed", "note": f"{check.baseline} has no {check.metric}"}
    rec["baseline_value"] = base_value
    diff = value - base_value
    rec["difference"] = diff
    compared = diff
    if check.use_bootstrap_bound:
        interval = paired_interval(check, ev, candidate)
        if interval is None:
            return {
                **rec,
                "status": "failed",
                "note": f"no bootstrap interval for {check.split}.{check.metric}",
            }
        compared = interval["low"] if gib else interval["high"]
        rec["bootstrap_interval"] = [interval["low"], interval["high"]]
        rec["compared"] = "bootstrap bound"
    if check.min_absolute_change is not None:
        need = check.min_absolute_change
        ok = compared >= need if gib else compared <= -need
        rule = f"diff {'>=' if gib else '<='} {need if gib else -need:+g}"
    else:
        tol = check.tolerance or 0.0
        ok = compared >= -tol if gib else compared <= tol
        rule = f"diff {'>=' if gib else '<='} {-tol if gib else tol:+g}"
    return {**rec, "rule": rule, "compared_value": compared, "status": "passed" if ok else "failed"}


def prod_seen(cfg: PipelineConfig, root: Path) -> tuple[dict[str, Any] | str | None, dict]:
    """``(prod, seen)``: the metrics of the version in the stage (None when no version holds it,
    the one-line reason when the registry cannot be read; :func:`evaluate_check`'s ``prod``) and
    ``{"version": ...}``, the version they belong to (None for none; absent when unreadable)."""
    from tasks.release.model_registry import RegistryError, prod_version

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
    ships (else of the first allowed; :func:`tasks.gates.candidates.judge_all`). A candidate passes
    only when no check failed and at least one applied (passed): no check at all
    (``gates: []``), or only skipped and not applicable ones, fails as :data:`NO_CHECK`.
    ``promote`` calls this again on the same inputs; it never trusts a stored ``passed``."""
    from tasks.gates.candidates import judge_all

    return judge_all(cfg, ev, prod, cost)


def load_cost(root: Path) -> dict[str, Any] | None:
    """``metrics/cost.json`` (:mod:`tasks.evaluation.cost`), None when this run measured no cost."""
    path = root / METRICS / COST_FILE
    return read_json(path, "evaluate output") if path.is_file() else None


def run(cfg: PipelineConfig, root: Path) -> dict[str, Any]:
    from tasks.gates.candidates import summary_note

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
    from tasks.gates.candidates import render_candidates, summary_note

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
        "| check | status | value | baseline value | difference | rule |",
        "|---|---|---|---|---|---|",
    ]
    if verdict["failed"] == [NO_CHECK]:
        lines.append(f"| {NO_CHECK} | failed | - | - | - | {NO_CHECK_NOTE} |")
    for c in verdict["checks"]:
        lines.append(
            f"| {c['name']} | {c['status']} | {_f(c.get('value'))} | "
            f"{_f(c.get('baseline_value'))} | {_f(c.get('difference'))} | "
            f"{c.get('rule', c.get('note', ''))} |"
        )
    lines += render_candidates(verdict)
    return "\n".join(lines) + "\n"


def main() -> None:
    stage_main("gate", run, SCHEMA)


if __name__ == "__main__":
    main()
