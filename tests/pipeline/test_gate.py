"""tasks.gates.checks: the gate rules, against a baseline, prod and the compile tolerance of the
shipped precision."""

from __future__ import annotations

import pytest

from tasks.gates.checks import evaluate_check
from tasks.params import GateCheck


def _ev(hydra_acc=0.90, single_acc=0.92, low=-0.03, high=0.01):
    def entry(acc):
        return {
            "calibrated": {"id_test": {"accuracy": acc, "ece": 0.05}},
            "raw": {"id_test": {"accuracy": acc - 0.1, "ece": 0.2}},
            "latency_ms": 10.0,
        }

    return {
        "models": {"hydra": entry(hydra_acc), "single": entry(single_acc)},
        "bootstrap": {
            "single": {"calibrated": {"id_test": {"accuracy": {"low": low, "high": high}}}}
        },
    }


@pytest.mark.parametrize(
    ("check", "status"),
    [
        ({"metric": "accuracy", "threshold": 0.9}, "passed"),
        ({"metric": "accuracy", "threshold": 0.91}, "failed"),
        ({"metric": "accuracy", "threshold": 0.85, "calibrated": False}, "failed"),  # raw 0.80
        ({"metric": "accuracy", "baseline": "single", "tolerance": 0.03}, "passed"),
        ({"metric": "accuracy", "baseline": "single", "tolerance": 0.01}, "failed"),
        ({"metric": "accuracy", "baseline": "single", "min_absolute_change": -0.03}, "passed"),
        ({"metric": "accuracy", "baseline": "single", "min_absolute_change": 0.0}, "failed"),
        (
            {
                "metric": "accuracy",
                "baseline": "single",
                "tolerance": 0.025,
                "use_bootstrap_bound": True,
            },
            "failed",  # point diff -0.02 passes, the bound -0.03 does not
        ),
        ({"metric": "ece", "baseline": "single", "tolerance": 0.0}, "passed"),  # lower is better
        ({"metric": "latency_ms", "threshold": 5.0}, "failed"),
        ({"metric": "accuracy", "baseline": "control", "tolerance": 0.0}, "failed"),
        ({"metric": "accuracy", "baseline": "prod", "tolerance": 0.0}, "failed"),
        ({"metric": "accuracy", "baseline": "prod", "tolerance": 0.0, "optional": True}, "skipped"),
    ],
)
def test_gate_rules(check, status):
    rec = evaluate_check(GateCheck(**check), _ev(), prod=None)
    assert rec["status"] == status, rec


def test_gate_against_prod_uses_recorded_metrics():
    prod = _ev(hydra_acc=0.95)["models"]["hydra"]
    rec = evaluate_check(
        GateCheck(metric="accuracy", baseline="prod", tolerance=0.01), _ev(), prod=prod
    )
    assert rec["status"] == "failed" and rec["baseline_value"] == 0.95


# ----- compile precision and the gate that follows it ------------------------------------------
def _compiled_ev(precision: str | None, tolerance: float | None, diff: float = 5e-3) -> dict:
    ev = _ev()
    ev["models"]["hydra"] |= {
        "compile_backend": "export",
        "compile_max_abs_diff": diff,
        "compile_argmax_agreement": 1.0,
        "compile_precision": precision,
        "compile_tolerance": tolerance,
    }
    return ev


@pytest.mark.parametrize(
    ("threshold", "precision", "tolerance", "diff", "applied", "status"),
    [
        ("compile_tolerance", "fp32", 1e-4, 5e-5, 1e-4, "passed"),
        ("compile_tolerance", "fp32", 1e-4, 5e-3, 1e-4, "failed"),
        ("compile_tolerance", "bf16", 2e-2, 5e-3, 2e-2, "passed"),
        ("compile_tolerance", "bf16", 2e-2, 3e-2, 2e-2, "failed"),
        (1e-4, "bf16", 2e-2, 5e-3, 1e-4, "failed"),  # a number is applied as written
        (0.05, "fp32", 1e-4, 5e-3, 0.05, "passed"),
    ],
)
def test_compile_gate_follows_the_shipped_precision(
    threshold, precision, tolerance, diff, applied, status
):
    check = GateCheck(metric="compile_max_abs_diff", threshold=threshold)
    rec = evaluate_check(check, _compiled_ev(precision, tolerance, diff), prod=None)
    assert rec["status"] == status and rec["threshold"] == applied, rec
    assert rec["rule"].startswith(f"<= {applied:g}")
    assert ("threshold_from" in rec) == (threshold == "compile_tolerance")
    if threshold == "compile_tolerance":
        assert rec["threshold_from"] == f"compile tolerance for the shipped {precision}"


def test_compile_tolerance_gate_fails_closed_without_a_recorded_tolerance():
    check = GateCheck(metric="compile_max_abs_diff", threshold="compile_tolerance")
    rec = evaluate_check(check, _compiled_ev(None, None), prod=None)
    assert rec["status"] == "failed" and "no compile_tolerance" in rec["note"]
    eager = _compiled_ev(None, None)
    eager["models"]["hydra"] |= {"compile_backend": "eager", "compile_max_abs_diff": None}
    assert evaluate_check(check, eager, prod=None)["status"] == "not applicable"
