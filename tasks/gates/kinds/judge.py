"""Judging one gate check through its kind (:data:`tasks.gates.kinds.GATE_KINDS`)."""

from __future__ import annotations

from typing import Any

from tasks.gates.kinds import GATE_KINDS
from tasks.gates.kinds.base import COMPILE_METRICS, base_record, metric_value
from tasks.params.gates import GateCheck


def kind_name(check: GateCheck) -> str:
    """The kind that judges ``check``: its own ``kind``, else ``threshold`` or ``baseline``."""
    if check.kind is not None:
        return check.kind
    return "threshold" if check.threshold is not None else "baseline"


def evaluate_check(
    check: GateCheck,
    ev: dict[str, Any],
    prod: dict[str, Any] | str | None,
    candidate: str = "hydra",
) -> dict[str, Any]:
    """One check's record for ``candidate`` (a model of ``ev``): its values, what it was compared
    against (``against``), the rule applied, its ``status`` and, once judged, its ``margin`` (how
    far it passed, or failed when negative, in the metric's units, the good direction positive).

    ``prod``: the prod model's metrics, None when no model is in the stage yet, or the one-line
    reason the registry could not be read. Which checks apply to a candidate other than the Hydra
    is decided before this is called (:func:`tasks.gates.candidates.judge_candidate`).
    """
    entry = ev["models"][candidate]
    rec = base_record(check, metric_value(entry, check))
    if check.metric in COMPILE_METRICS and entry.get("compile_backend") == "eager":
        return {
            **rec,
            "status": "not applicable",
            "note": "the shipped artifact is the eager model (compile.backend: eager)",
        }
    if rec["value"] is None:
        return {**rec, "status": "failed", "note": "metric missing from metrics/evaluate.json"}
    return GATE_KINDS.get(kind_name(check), "gates.kind").judge(check, rec, ev, prod, candidate)
