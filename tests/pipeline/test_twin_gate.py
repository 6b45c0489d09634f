"""tasks.gates.twin and the default gates: the ``any_of`` groups that hold a Hydra against the
cheaper models its own run built (its naive pruned twin, the single model)."""

from __future__ import annotations

import copy

import pytest

from tasks.gates.checks import evaluate_check
from tasks.gates.twin import resolve_any_of
from tasks.params import TWIN_GROUP, GateCheck, default_gates, validate_params


def _entry(nll: float, ece: float, auroc: float, shift_nll: float) -> dict:
    return {
        "parameters": 10,
        "calibrated": {
            "id_test": {"accuracy": 0.9, "nll": nll, "ece": ece},
            "shift": {"accuracy": 0.8, "nll": shift_nll},
            "near_ood": {"auroc": auroc},
            "far_ood": {"auroc": 0.99},
        },
    }


def _evaluation(hydra: dict, twin: dict, single: dict, half: float) -> dict:
    """An evaluation with paired bootstrap intervals of Hydra minus each baseline, +-half."""
    ev = {"models": {"hydra": hydra, "naive_pruned": twin, "single": single}, "bootstrap": {}}
    ev["models"]["deep_ensemble"] = copy.deepcopy(hydra)
    for name in ("naive_pruned", "single", "deep_ensemble"):
        out: dict = {}
        for split, metrics in hydra["calibrated"].items():
            for m, v in metrics.items():
                d = v - ev["models"][name]["calibrated"][split][m]
                w = 0.0 if name == "deep_ensemble" else half
                out.setdefault(split, {})[m] = {"low": d - w, "high": d + w, "difference": d}
        ev["bootstrap"][name] = {"calibrated": out}
    return ev


def _verdict(ev: dict) -> dict[str, dict]:
    gates = [GateCheck(**g) for g in default_gates() if not g["metric"].startswith("compile")]
    checks = resolve_any_of(gates, [evaluate_check(g, ev, None) for g in gates], ev)
    return {c["name"]: c for c in checks}


def test_no_default_gate_passes_a_hydra_its_cheaper_twin_matches():
    """The twin property: the same Hydra passes the default gates when its paired
    bootstrap separates it from its naive pruned twin, and fails them when the twin is the same
    model (a zero-width interval at 0) or when the difference is inside the test-set noise."""
    single = _entry(0.40, 0.05, 0.80, 0.50)
    hydra = _entry(0.30, 0.03, 0.85, 0.40)
    good = _verdict(_evaluation(hydra, _entry(0.36, 0.04, 0.82, 0.45), single, half=0.01))
    assert all(c["status"] == "passed" for c in good.values()), good
    assert good["id_test.nll vs naive_pruned"]["better"] is True

    for twin, half in ((copy.deepcopy(hydra), 0.0), (_entry(0.305, 0.031, 0.849, 0.41), 0.02)):
        bad = _verdict(_evaluation(hydra, twin, single, half))
        group = [c for c in bad.values() if c.get("any_of") == TWIN_GROUP]
        assert len(group) == 4 and all(c["status"] == "failed" for c in group)
        assert all(not c["better"] for c in group)
        assert "better than naive_pruned on none of" in group[0]["note"]
        # the rest of the gates pass: the twin group alone catches it
        assert all(c["status"] == "passed" for c in bad.values() if c.get("any_of") != TWIN_GROUP)


def test_the_default_gates_hold_the_hydra_against_the_single_model_too():
    single = _entry(0.30, 0.03, 0.80, 0.415)
    hydra = _entry(0.30, 0.03, 0.85, 0.40)  # shift NLL 0.015 better: inside +-0.02 noise
    v = _verdict(_evaluation(hydra, _entry(0.40, 0.05, 0.80, 0.50), single, half=0.02))
    assert v["shift.nll vs single"]["status"] == "failed"
    assert "any_of 'beats single'" in v["shift.nll vs single"]["note"]


def test_a_group_member_worse_beyond_tolerance_fails_even_when_another_is_better():
    single = _entry(0.40, 0.05, 0.80, 0.50)
    hydra = _entry(0.30, 0.03, 0.85, 0.40)
    twin = _entry(0.36, 0.04, 0.90, 0.45)  # near-OOD AUROC 0.05 worse than its twin
    v = _verdict(_evaluation(hydra, twin, single, half=0.01))
    assert v["near_ood.auroc vs naive_pruned"]["status"] == "failed"
    assert v["id_test.nll vs naive_pruned"]["status"] == "passed"


def test_any_of_needs_a_baseline_and_is_left_out_of_the_dump():
    with pytest.raises(ValueError, match="'any_of' needs a baseline other than 'prod'"):
        GateCheck(metric="nll", threshold=1.0, any_of="x")
    plain = GateCheck(metric="nll", baseline="single", tolerance=0.1)
    assert "any_of" not in plain.model_dump()
    dumped = validate_params({}).model_dump(mode="json")["gates"]
    assert sum(g.get("any_of") == TWIN_GROUP for g in dumped) == 4
