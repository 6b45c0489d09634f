"""One gate check judged on a candidate's metrics: the rules of ``params.yaml``'s ``gates:``.

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

Statuses: ``passed``, ``failed``, ``not applicable`` (a compile check when the shipped artifact is
the eager model: nothing was compiled, so nothing was checked; it neither passes nor blocks) and
``skipped`` (a comparison that cannot be made, allowed only for a check marked ``optional: true``;
without it the check fails with the reason). A registry that cannot be read fails a ``prod``
comparison: it never turns into a pass.
"""

from __future__ import annotations

from typing import Any

from tasks.gates.twin import paired_interval
from tasks.params.gates import COMPILE_TOLERANCE, GateCheck
from tasks.params.metrics import MODEL_METRICS

COMPILE_METRICS = ("compile_max_abs_diff", "compile_argmax_agreement")
#: The failed "check" of a verdict in which no check applied.
NO_CHECK = "no applicable check"
NO_CHECK_NOTE = (
    "no check passed or failed (gates: [] or every check skipped / not applicable); a verdict "
    "needs at least one check that applies"
)


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
