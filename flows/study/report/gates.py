"""Gate verdicts in a study: each point's Hydra, and each baseline judged as the candidate."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from flows.study.report.collect import Collected
from flows.study.report.results import PointResult
from tasks.gates.candidates import applicability
from tasks.gates.checks import evaluate_check
from tasks.gates.twin import resolve_any_of
from tasks.params import GateCheck, default_gates
from tasks.runtime.outputs import with_latency


def _gate_checks(params: Mapping[str, Any]) -> list[GateCheck]:
    """The gate checks of a point's params (the defaults when it has none)."""
    raw = params.get("gates")
    return [GateCheck.model_validate(g) for g in (default_gates() if raw is None else raw)]


def baseline_as_candidate(
    checks: Sequence[GateCheck], evaluation: Mapping[str, Any], candidate: str
) -> list[dict[str, Any]]:
    """The gate checks judged with baseline ``candidate`` in Hydra's place (a shim over
    :func:`tasks.gates.checks.evaluate_check`, which always judges ``models.hydra``).

    Not applicable (status ``n/a``): model-level checks (split ``model``: compile, latency and
    parameter thresholds are facts of the shipped Hydra artifact), ``prod`` comparisons (a study
    point has no prod model) and a comparison of the candidate with itself, unless the check asks
    for a strict improvement (``min_absolute_change > 0``), which no model makes on itself: that
    fails. A check with
    ``use_bootstrap_bound`` compares the point difference instead (a point written before
    evaluate recorded ``candidate_bootstrap`` has only Hydra minus each baseline); for the same
    reason an ``any_of`` group (:mod:`tasks.gates.twin`) asks for a better point difference. A
    candidate that is the group's own baseline: not applicable, as in the run's own gate
    (:func:`tasks.gates.candidates.applicability`).
    """
    ev = {
        **evaluation,
        "models": {**evaluation["models"], "hydra": evaluation["models"][candidate]},
        "bootstrap": {},
    }
    out = []
    for check in checks:
        rec = {"name": check.name, "metric": check.metric, "split": check.split}
        if check.split == "model":
            out.append({**rec, "status": "n/a", "note": "model-level check (Hydra artifact)"})
        elif check.baseline == "prod":
            out.append({**rec, "status": "n/a", "note": "no prod model in a study point"})
        elif check.baseline == candidate and (check.min_absolute_change or 0) > 0:
            r = evaluate_check(check.model_copy(update={"use_bootstrap_bound": False}), ev, None)
            out.append({**r, "note": "a model cannot improve on itself"})
        elif check.baseline == candidate and check.any_of is not None:
            # the group holds a model against this cheaper model: not applicable, as in the
            # run's own gate (tasks.gates.candidates.applicability)
            _, note = applicability(check, candidate) or ("", "")
            out.append({**rec, "status": "n/a", "note": note})
        elif check.baseline == candidate:
            out.append({**rec, "status": "n/a", "note": "the candidate is this check's baseline"})
        elif check.use_bootstrap_bound:
            r = evaluate_check(check.model_copy(update={"use_bootstrap_bound": False}), ev, None)
            note = "point difference: no paired bootstrap of candidate - baseline"
            out.append({**r, "note": note})
        else:
            out.append(evaluate_check(check, ev, None))
    # no paired bootstrap of candidate - baseline: an any_of group reads the point difference
    return resolve_any_of(checks, out, ev, point=True)


def point_gate(p: PointResult, gates: Sequence[GateCheck] | None = None) -> dict[str, Any]:
    """The point's verdict: its ``reports/gate.json``, or ``gates`` judged on its evaluation."""
    if gates is not None:
        ev = with_latency(p.evaluation, p.latency)
        checks = resolve_any_of(gates, [evaluate_check(c, ev, None) for c in gates], ev)
        # an optional check that was compared and failed counts, as in tasks.gates.checks
        failed = [c["name"] for c in checks if c["status"] == "failed"]
        gate = {"verdict": "failed" if failed else "passed", "failed": failed, "checks": checks}
    else:
        gate = p.gate
    failed = sorted(
        gate.get("failed")
        or [c["name"] for c in gate.get("checks", []) if c.get("status") == "failed"]
    )
    verdict = gate.get("verdict") or ("passed" if gate.get("passed") and not failed else "failed")
    return {
        "variant": p.variant,
        "seed": p.seed,
        "verdict": verdict,
        "passed": verdict == "passed",
        "failed": failed,
        "statuses": {c["name"]: c.get("status") for c in gate.get("checks", [])},
    }


def baseline_gates(col: Collected, gates: Sequence[GateCheck] | None = None) -> dict[str, Any]:
    """Per baseline label: per seed the verdict with the gate checks of that point's params (or
    ``gates``)."""
    result: dict[str, Any] = {}
    for b in col.baselines:
        for v in [None] if b in col.shared else col.variants:
            label = b if v is None else f"{b}[{v}]"
            rows = []
            for s in col.seeds:
                pts = [p for p in col.at_seed(s, b) if v is None or p.variant == v]
                judged = [
                    (
                        p,
                        baseline_as_candidate(
                            gates or _gate_checks(p.params),
                            with_latency(p.evaluation, p.latency),
                            b,
                        ),
                    )
                    for p in pts
                ]
                if not judged:
                    continue
                statuses = {json.dumps([(c["name"], c["status"]) for c in j]) for _, j in judged}
                # a shared baseline judged identically by every run at this seed: one row
                groups = judged[:1] if len(statuses) == 1 else judged
                for p, checks in groups:
                    failed = sorted(c["name"] for c in checks if c["status"] == "failed")
                    rows.append(
                        {
                            "seed": s,
                            "in_run_of": p.variant if v is None and len(groups) > 1 else None,
                            "passed": not failed,
                            "failed": failed,
                            "not_applicable": sorted(
                                c["name"]
                                for c in checks
                                if c["status"] == "n/a" and c["split"] != "model"
                            ),
                            "checks": checks,
                        }
                    )
            if rows:
                caught: dict[str, list[int]] = {}
                for r in rows:
                    for name in r["failed"]:
                        caught.setdefault(name, []).append(r["seed"])
                result[label] = {
                    "model": b,
                    "variant": v,
                    "rows": rows,
                    # a seed counts as passed only when every run judged there passed
                    "seeds_passed": sorted(
                        {r["seed"] for r in rows} - {r["seed"] for r in rows if not r["passed"]}
                    ),
                    "caught_by": {k: sorted(set(ss)) for k, ss in sorted(caught.items())},
                }
    return result
