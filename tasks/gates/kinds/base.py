"""What every gate kind shares: the :class:`GateKind` interface, a check's base record, the value
a check reads from ``metrics/evaluate.json`` and the margin of a judged rule."""

from __future__ import annotations

from typing import Any

from tasks.params.gates import GateCheck
from tasks.params.metrics import MODEL_METRICS

COMPILE_METRICS = ("compile_max_abs_diff", "compile_argmax_agreement")


class GateKind:
    """One kind of gate check. A subclass sets ``name`` and implements :meth:`judge`; it may
    refuse a check's params in :meth:`validate` (run when ``params.yaml`` is validated)."""

    name: str = ""
    #: Whether the kind compares with ``GateCheck.baseline`` (the run must build that model).
    needs_baseline: bool = False

    @classmethod
    def validate(cls, check: GateCheck) -> str | None:
        """The one-line problem with ``check``'s fields for this kind, None when it is fine."""
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
        """``rec`` (:func:`base_record`, its ``value`` known) completed with ``against``,
        ``rule``, ``status`` and ``margin`` (:func:`margin`), or a ``note`` saying why not."""
        raise NotImplementedError


def metric_value(entry: dict[str, Any], check: GateCheck) -> float | None:
    """The value of ``check``'s metric in one model's ``metrics/evaluate.json`` entry."""
    if check.metric in MODEL_METRICS:
        v = entry.get(check.metric)
    else:
        variant = "calibrated" if check.calibrated else "raw"
        v = entry.get(variant, {}).get(check.split, {}).get(check.metric)
    return None if v is None else float(v)


def base_record(check: GateCheck, value: float | None) -> dict[str, Any]:
    return {
        "name": check.name,
        "metric": check.metric,
        "split": check.split,
        "calibrated": check.calibrated,
        "greater_is_better": bool(check.greater_is_better),
        "optional": check.optional,
        "value": value,
        "against": check.baseline or ("threshold" if check.threshold is not None else check.kind),
    }


def margin(compared: float, bound: float, greater_is_better: bool) -> float:
    """How far ``compared`` lies on the passing side of ``bound`` (negative: the shortfall)."""
    return compared - bound if greater_is_better else bound - compared
