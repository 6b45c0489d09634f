"""Gate kind ``baseline``: the candidate against a model the run built (``single``,
``naive_pruned``, ``deep_ensemble``, ...) or the current ``prod`` model. The candidate may be
worse by at most ``tolerance`` or must be better by at least ``min_absolute_change`` (MLflow's
``MetricThreshold`` meaning); ``use_bootstrap_bound`` compares the conservative end of the paired
bootstrap interval of (candidate - baseline) instead of the point difference.

A baseline the run did not build is refused when ``params.yaml`` is validated, and fails here
(never skipped) if its evaluation is missing anyway; only a ``prod`` comparison marked
``optional: true`` may be skipped, while no model holds the stage yet."""

from __future__ import annotations

from typing import Any

from tasks.gates.kinds.base import GateKind, margin, metric_value
from tasks.gates.twin import paired_interval
from tasks.params.gates import GateCheck


def _not_yet(rec: dict[str, Any], check: GateCheck, why: str) -> dict[str, Any]:
    if check.optional:
        return {**rec, "status": "skipped", "note": f"{why} (optional check)"}
    return {**rec, "status": "failed", "note": f"{why}; mark the check optional: true to allow it"}


class BaselineGate(GateKind):
    name = "baseline"
    needs_baseline = True

    @classmethod
    def validate(cls, check: GateCheck) -> str | None:
        if check.baseline is None or check.threshold is not None:
            return "kind 'baseline' needs a 'baseline' and no 'threshold'"
        return None

    @classmethod
    def judge(
        cls,
        check: GateCheck,
        rec: dict[str, Any],
        ev: dict[str, Any],
        prod: dict[str, Any] | str | None,
        candidate: str,
    ) -> dict[str, Any]:
        gib = rec["greater_is_better"]
        rec = {**rec, "baseline": check.baseline, "against": check.baseline}
        if check.baseline == "prod":
            if isinstance(prod, str):
                return {**rec, "status": "failed", "note": f"registry unreadable: {prod}"}
            if prod is None:
                return _not_yet(rec, check, "no model in prod yet")
            base_value = metric_value(prod, check)
            if base_value is None:
                return _not_yet(rec, check, f"the prod model has no {check.metric!r} recorded")
        else:
            entry = ev["models"].get(check.baseline)
            if entry is None:
                return {
                    **rec,
                    "status": "failed",
                    "note": f"baseline {check.baseline!r} was not built in this run",
                }
            base_value = metric_value(entry, check)
            if base_value is None:
                return {
                    **rec,
                    "status": "failed",
                    "note": f"{check.baseline} has no {check.metric}",
                }
        diff = rec["value"] - base_value
        rec.update(baseline_value=base_value, difference=diff)
        compared = diff
        if check.use_bootstrap_bound:
            interval = paired_interval(check, ev, candidate)
            if interval is None:
                why = f"no bootstrap interval for {check.split}.{check.metric}"
                return {**rec, "status": "failed", "note": why}
            compared = interval["low"] if gib else interval["high"]
            rec.update(bootstrap_interval=[interval["low"], interval["high"]])
            rec["compared"] = "bootstrap bound"
        if check.min_absolute_change is not None:
            need = check.min_absolute_change if gib else -check.min_absolute_change
        else:
            tol = check.tolerance or 0.0
            need = -tol if gib else tol
        ok = compared >= need if gib else compared <= need
        return {
            **rec,
            "rule": f"diff {'>=' if gib else '<='} {need:+g}",
            "compared_value": compared,
            "margin": margin(compared, need, gib),
            "status": "passed" if ok else "failed",
        }
