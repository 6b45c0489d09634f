"""Every candidate a run builds, judged with the same gate checks, and which one ships.

A candidate is any model ``metrics/evaluate.json`` holds (``hydra``, ``single``, ``naive_pruned``,
``deep_ensemble``, ``mc_dropout``, ``control``, and whatever kinds a later release adds): each is
judged by the gate list in params, as the Hydra is (:func:`tasks.gates.checks.evaluate_check`, the
any_of groups of :mod:`tasks.gates.twin` with the paired bootstrap of (candidate - baseline) that
evaluate records in ``candidate_bootstrap``). Where a check cannot mean for another candidate what
it means for the Hydra, :func:`applicability` decides, and the record says why:

- a compile agreement check (``compile_*``) is ``not applicable``: a candidate other than the Hydra
  ships as its eager model, nothing was compiled;
- a check whose baseline is the candidate itself is ``not applicable`` (a model compared with
  itself proves nothing; for an ``any_of`` group: the group's cheaper model is this candidate),
  except a strict improvement (``min_absolute_change`` > 0), which fails: no model improves on
  itself.

Every other check (thresholds, parameters and latency, other baselines, ``prod``) applies as
written. Of the candidates ``promote.candidates`` allows that pass and can ship, the cheapest ships
(:func:`cheapest`, from ``metrics/cost.json``: latency ratios whose intervals overlap are ties,
broken by FLOPs, then parameters).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tasks.gates.checks import COMPILE_METRICS, NO_CHECK, evaluate_check
from tasks.gates.twin import resolve_any_of
from tasks.params import GateCheck, PipelineConfig

NOT_APPLICABLE = "not applicable"
#: The candidate whose checks the verdict's top-level fields hold when none is allowed and passes.
DEFAULT = "hydra"


def applicability(check: GateCheck, candidate: str) -> tuple[str, str] | None:
    """None when ``check`` applies to ``candidate`` as written, else ``(status, note)``:
    ``not applicable`` or, for a strict improvement on the candidate itself, ``failed``."""
    if candidate == "hydra":
        return None
    if check.metric in COMPILE_METRICS:
        return NOT_APPLICABLE, f"{candidate} ships as its eager model: nothing was compiled"
    if check.baseline != candidate:
        return None
    if (check.min_absolute_change or 0) > 0:
        return "failed", f"a strict improvement on {candidate} itself: no model makes one"
    if check.any_of is not None:
        return NOT_APPLICABLE, (
            f"any_of {check.any_of!r} holds a model against the cheaper {candidate}, which is "
            "this candidate"
        )
    return NOT_APPLICABLE, f"{candidate} is this check's baseline: a model against itself"


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The verdict of one candidate's check records: it passes only when no check failed and at
    least one applied (passed); only skipped and not applicable ones fail as ``NO_CHECK``."""
    counts = {
        s: sum(c["status"] == s for c in records)
        for s in ("passed", "failed", NOT_APPLICABLE, "skipped")
    }
    failed = [c["name"] for c in records if c["status"] == "failed"]
    if counts["passed"] + counts["failed"] == 0:
        failed = [NO_CHECK]
    return {
        "passed": not failed,
        "verdict": "passed" if not failed else "failed",
        "failed": failed,
        "num_checks": len(records),
        "counts": counts,
        "checks": records,
    }


def judge_candidate(
    checks: Sequence[GateCheck],
    ev: dict[str, Any],
    prod: dict[str, Any] | str | None,
    candidate: str,
) -> dict[str, Any]:
    """``candidate``'s verdict under ``checks`` (:func:`summarize`), every record annotated by
    :func:`applicability`."""
    records = []
    for check in checks:
        rule = applicability(check, candidate)
        if rule is None:
            records.append(evaluate_check(check, ev, prod, candidate))
            continue
        status, note = rule
        if status == "failed":  # compared on the point difference: there is no self-bootstrap
            plain = check.model_copy(update={"use_bootstrap_bound": False})
            rec = evaluate_check(plain, ev, prod, candidate)
            records.append({**rec, "status": "failed", "note": note})
            continue
        records.append(
            {
                "name": check.name,
                "metric": check.metric,
                "split": check.split,
                "baseline": check.baseline,
                "optional": check.optional,
                "status": status,
                "note": note,
            }
        )
    return summarize(resolve_any_of(checks, records, ev, candidate=candidate))


def _cost(name: str, ev: Mapping[str, Any], cost: Mapping[str, Any] | None) -> dict[str, Any]:
    """``name``'s cost: ``metrics/cost.json``'s entry (latency ratio to the single model with its
    interval, FLOPs, parameters) or, where it was not measured, the parameters alone."""
    entry = ((cost or {}).get("models") or {}).get(name)
    if entry is not None:
        return dict(entry)
    return {"parameters": ev["models"][name].get("parameters")}


def _overlap(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two latency ratio intervals overlap (a tie), or either is unknown."""
    if a.get("ratio_low") is None or b.get("ratio_low") is None:
        return True
    return not (a["ratio_high"] < b["ratio_low"] or b["ratio_high"] < a["ratio_low"])


def _tiebreak(c: Mapping[str, Any]) -> tuple[float, float]:
    inf = float("inf")
    flops, params = c.get("flops"), c.get("parameters")
    return (inf if flops is None else float(flops), inf if params is None else float(params))


def cheaper(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether cost ``a`` is cheaper than ``b``: its latency ratio interval lies wholly below
    ``b``'s, or (the intervals overlap: a tie) fewer FLOPs, then fewer parameters."""
    if not _overlap(a, b):
        return a["ratio_high"] < b["ratio_low"]
    return _tiebreak(a) < _tiebreak(b)


def cheapest(costs: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The cheapest of ``costs`` (name -> cost): among those whose latency ratio interval
    overlaps the lowest ratio's (ties), the fewest FLOPs, then parameters, then name."""
    if not costs:
        return None
    ratios = {n: c["ratio"] for n, c in costs.items() if c.get("ratio") is not None}
    leader = costs[min(ratios, key=lambda n: (ratios[n], n))] if ratios else None
    tied = [n for n, c in costs.items() if leader is None or _overlap(c, leader)]
    return min(tied, key=lambda n: (*_tiebreak(costs[n]), n))


def judge_all(
    cfg: PipelineConfig,
    ev: dict[str, Any],
    prod: dict[str, Any] | str | None,
    cost: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The verdict: every candidate of ``ev`` judged (``candidates``), the one that ``ships``
    (the cheapest passing candidate ``promote.candidates`` allows that can ship; None when none
    does), the passing candidates cheaper than the Hydra (``cheaper_passing``), and at top level
    the checks of ``candidate``: the one that ships, else the first allowed (the Hydra by
    default; what ``--force`` would ship)."""
    allowed = list(cfg.promote.candidates)
    exports = (ev.get("scored") or {}).get("candidates") or {}
    judged: dict[str, Any] = {}
    for name in ev["models"]:
        verdict = judge_candidate(cfg.gates, ev, prod, name)
        shippable = name == "hydra" or name in exports
        judged[name] = {
            **verdict,
            "cost": _cost(name, ev, cost),
            "allowed": name in allowed,
            "shippable": shippable,
            **({} if shippable else {"note": "evaluate.json records no export: cannot ship"}),
        }
    eligible = {
        n: j["cost"] for n, j in judged.items() if j["allowed"] and j["shippable"] and j["passed"]
    }
    ships = cheapest(eligible)
    hydra = judged.get("hydra")
    cheaper_passing = sorted(
        n
        for n, j in judged.items()
        if hydra is not None and n != "hydra" and j["passed"] and cheaper(j["cost"], hydra["cost"])
    )
    top = ships or next((n for n in allowed if n in judged), DEFAULT)
    if top not in judged:
        raise ValueError(f"metrics/evaluate.json has no {top!r} model; rerun evaluate")
    head = {k: judged[top][k] for k in ("passed", "verdict", "failed", "num_checks", "counts")}
    if ships is None:
        head.update(passed=False, verdict="failed")
        if not head["failed"]:  # the top candidate passed but may not ship
            head["failed"] = [f"{top}: {judged[top].get('note') or 'not allowed to ship'}"]
    checks = judged[top]["checks"]
    return {
        **head,
        "checks": checks,
        "baselines_used": sorted(
            {c["against"] for c in checks if c.get("against")} - {"threshold"}
        ),
        "failures": failures(checks),
        "candidate": top,
        "ships": ships,
        "allowed": allowed,
        "cheaper_passing": cheaper_passing,
        "cost_reference": (cost or {}).get("reference"),
        "candidates": judged,
    }


def failures(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each failed check of ``records``: its name, what it was compared against, and by how much
    it failed (``by``: the shortfall in the metric's units; None when it could not be judged,
    ``note`` then says why)."""
    out = []
    for c in records:
        if c["status"] != "failed":
            continue
        margin = c.get("margin")
        out.append(
            {
                "check": c["name"],
                "against": c.get("against"),
                "by": None if margin is None or margin >= 0 else -margin,
                "note": c.get("note") or c.get("rule"),
            }
        )
    return out


def failure_lines(verdict: Mapping[str, Any]) -> list[str]:
    """One line per failed check of the verdict's top candidate: which check, against what, and
    by how much (or why it could not be judged)."""
    lines = []
    for f in verdict.get("failures") or []:
        against = f" against {f['against']}" if f.get("against") else ""
        by = f" by {f['by']:.4f}" if f.get("by") is not None else ""
        lines.append(f"{f['check']}{against}{by} ({f['note']})")
    return lines


def _ratio(c: Mapping[str, Any]) -> str:
    if c.get("ratio") is None:
        return "not measured"
    return f"{c['ratio']:.2f}x [{c['ratio_low']:.2f}, {c['ratio_high']:.2f}]"


def candidate_rows(verdict: Mapping[str, Any]) -> list[str]:
    """A Markdown table: each candidate's verdict, cost ratios to the reference (the single
    model), parameters, whether ``promote.candidates`` allows it, its failed checks."""
    ref = verdict.get("cost_reference") or "single"
    rows = [
        f"| candidate | verdict | latency x {ref} [95%] | FLOPs x {ref} | parameters | allowed "
        "| failed checks |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, j in (verdict.get("candidates") or {}).items():
        c = j["cost"]
        flops = "-" if c.get("flops_ratio") is None else f"{c['flops_ratio']:.2f}x"
        params = "-" if c.get("parameters") is None else f"{int(c['parameters']):,}"
        allowed = ("yes" if j["allowed"] else "no") + ("" if j["shippable"] else " (no export)")
        shipped = " (ships)" if name == verdict.get("ships") else ""
        rows.append(
            f"| {name}{shipped} | {j['verdict']} | {_ratio(c)} | {flops} | {params} | {allowed} "
            f"| {', '.join(j['failed']) or '-'} |"
        )
    return rows


def summary_note(verdict: Mapping[str, Any]) -> str:
    """What the run's summary line adds about the other candidates ('' when nothing to say):
    which candidate ships when it is not the Hydra, and which cheaper candidates pass the same
    checks as a passing (or failing) Hydra."""
    judged = verdict.get("candidates") or {}
    ref = verdict.get("cost_reference") or "single"
    ships = verdict.get("ships")
    parts = []
    if ships is not None and ships != "hydra":
        parts.append(
            f"ships {ships} ({_ratio(judged[ships]['cost'])} {ref}), the cheapest passing of "
            "promote.candidates"
        )
    cheaper = [n for n in verdict.get("cheaper_passing") or [] if n != ships]
    if cheaper and "hydra" in judged:
        hydra = judged["hydra"]
        state = "passes" if hydra["passed"] else "fails"
        listed = ", ".join(f"{n} ({_ratio(judged[n]['cost'])})" for n in cheaper)
        hint = "" if any(judged[n]["allowed"] for n in cheaper) else " (promote.candidates)"
        parts.append(
            f"hydra {state} ({_ratio(hydra['cost'])} {ref}) and a cheaper candidate passes the "
            f"same checks: {listed}{hint}"
        )
    return "; ".join(parts)


def gate_summary(verdict: Mapping[str, Any]) -> dict[str, Any]:
    """What the run's summary keeps of a verdict (``reports/gate.json``): ``verdict``,
    ``failed``, one line per failed check with its shortfall (``failures``,
    :func:`failure_lines`), the candidate that ``ships`` and the line's ``note``
    (:func:`summary_note`)."""
    return {
        "verdict": verdict["verdict"],
        "failed": verdict["failed"],
        "failures": failure_lines(verdict),
        "ships": verdict.get("ships"),
        "note": summary_note(verdict),
    }


def render_candidates(verdict: Mapping[str, Any]) -> list[str]:
    """The gate report's candidates section (Markdown lines): each candidate's verdict, cost
    ratio, whether it may and can ship, and its checks that are not plain passes."""
    judged = verdict.get("candidates") or {}
    if not judged:
        return []
    lines = [
        "",
        f"## Candidates (allowed to ship: {', '.join(verdict.get('allowed') or [])}; ships: "
        f"**{verdict.get('ships') or 'none'}**)",
        "",
        *candidate_rows(verdict),
    ]
    lines += [
        "",
        "Every candidate is judged by the same checks; a check that does not apply to a "
        "candidate says why:",
        "",
        "| candidate | check | status | value | baseline value | rule or note |",
        "|---|---|---|---|---|---|",
    ]
    for name, j in judged.items():
        for c in j["checks"]:
            if c["status"] == "passed" or name == "hydra":  # the Hydra's: the table above
                continue
            value = "-" if c.get("value") is None else f"{c['value']:.4f}"
            base = "-" if c.get("baseline_value") is None else f"{c['baseline_value']:.4f}"
            why = c.get("note") or c.get("rule", "")
            lines.append(f"| {name} | {c['name']} | {c['status']} | {value} | {base} | {why} |")
    return lines
