"""Gate kind ``threshold``: the candidate's value against an absolute bound the user opts into
(``threshold: 0.98``), or for ``compile_max_abs_diff`` the tolerance compile applied to the
artifact that ships (``threshold: compile_tolerance``)."""

from __future__ import annotations

from typing import Any

from tasks.gates.kinds.base import GateKind, margin
from tasks.params.gates import COMPILE_TOLERANCE, GateCheck


def _bound(check: GateCheck, entry: dict[str, Any]) -> tuple[float | None, str | None]:
    """``(bound applied, where it came from)``: a number as written (source None), or the
    compile tolerance evaluate recorded (bound None and the reason when it is missing)."""
    if check.threshold == COMPILE_TOLERANCE:
        tolerance = entry.get("compile_tolerance")
        if tolerance is None:
            return None, "no compile_tolerance in metrics/evaluate.json (re-run compile, evaluate)"
        precision = entry.get("compile_precision") or "unknown precision"
        return float(tolerance), f"compile tolerance for the shipped {precision}"
    return float(check.threshold), None  # type: ignore[arg-type]  # GateCheck: else a number


class ThresholdGate(GateKind):
    name = "threshold"

    @classmethod
    def validate(cls, check: GateCheck) -> str | None:
        if check.threshold is None or check.baseline is not None:
            return "kind 'threshold' needs a 'threshold' and no 'baseline'"
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
        bound, source = _bound(check, ev["models"][candidate])
        rec = {**rec, "against": "threshold"}
        if bound is None:
            return {**rec, "status": "failed", "note": source}
        value = rec["value"]
        ok = value >= bound if gib else value <= bound
        return {
            **rec,
            "threshold": bound,  # the number applied, also for compile_tolerance
            **({"threshold_from": source} if source else {}),
            "rule": f"{'>=' if gib else '<='} {bound:g}" + (f" ({source})" if source else ""),
            "margin": margin(value, bound, gib),
            "status": "passed" if ok else "failed",
        }
