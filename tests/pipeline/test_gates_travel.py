"""Which baselines a run builds and what its gates may compare with: the default gates compare
with the run's own baselines, an absolute threshold is the user's opt-in, a check whose baseline
is not built is refused in one line, and a failed check says by how much."""

from __future__ import annotations

import pytest

from tasks.gates.candidates import failure_lines, judge_all
from tasks.gates.kinds.judge import evaluate_check
from tasks.params import ConfigError, GateCheck, default_gates, resolve_params, validate_params

COMPILE = [
    {"metric": "compile_max_abs_diff", "threshold": 1e-4},
    {"metric": "compile_argmax_agreement", "threshold": 1.0},
]


def test_the_default_run_builds_what_its_gates_read():
    cfg = validate_params({})
    assert cfg.built() == ("single", "naive_pruned", "deep_ensemble")
    used = {g.baseline for g in cfg.gates} - {None}
    assert used == {"single", "naive_pruned", "deep_ensemble"}
    assert resolve_params("study").built() == (
        "single",
        "naive_pruned",
        "deep_ensemble",
        "mc_dropout",
        "control",
    )
    # the circuit variant fine-tunes no members: no controls, whatever the switch
    circuit = resolve_params("study", sets={"scoring.method": "circuit"})
    assert "control" not in circuit.built()


def test_no_default_check_is_an_absolute_bound_on_a_quality_metric():
    for built in (("single", "naive_pruned", "deep_ensemble"), ("single", "naive_pruned")):
        for g in default_gates(built):
            check = GateCheck(**g)
            if check.split != "model":
                assert check.baseline in built and check.threshold is None, check.name


def test_an_absolute_threshold_is_an_opt_in_check():
    far = {"metric": "auroc", "split": "far_ood", "threshold": 0.98}
    cfg = resolve_params("default", {"gates": [far, *COMPILE]})
    ev = {"models": {"hydra": {"calibrated": {"far_ood": {"auroc": 0.95}}}}}
    record = evaluate_check(cfg.gates[0], ev, None)
    assert record["against"] == "threshold" and record["status"] == "failed"
    assert record["margin"] == pytest.approx(-0.03)


@pytest.mark.parametrize(
    ("baseline", "hint"),
    [
        ("mc_dropout", "baselines.mc_dropout.enabled is false"),
        ("control", "members.finetune.controls is false, or the variant fine-tunes no members"),
        ("lora_ensemble", "baselines.lora_ensemble.enabled is false"),
    ],
)
def test_a_check_whose_baseline_is_not_built_is_refused_in_one_line(baseline, hint):
    check = {"metric": "nll", "split": "id_test", "baseline": baseline, "optional": True}
    with pytest.raises(ConfigError) as err:
        resolve_params("default", {"gates": [check, *COMPILE]})
    assert str(err.value) == (
        f"params: gates.0: baseline {baseline!r} is not built by this run ({hint}): "
        "build it or drop the check"
    )


def test_a_missing_evaluation_of_a_baseline_fails_never_skips():
    check = GateCheck(metric="accuracy", baseline="deep_ensemble", tolerance=0.5, optional=True)
    ev = {"models": {"hydra": {"calibrated": {"id_test": {"accuracy": 0.9}}}}}
    record = evaluate_check(check, ev, None)
    assert record["status"] == "failed" and "not built" in record["note"]


def _entry(acc: float, near: float) -> dict:
    metrics = {"id_test": {"accuracy": acc}, "near_ood": {"auroc": near}}
    return {"calibrated": metrics, "parameters": 10}


def test_the_verdict_says_which_baseline_each_check_used_and_by_how_much_one_failed():
    gates = [
        {"metric": "accuracy", "split": "id_test", "baseline": "single", "tolerance": 0.01},
        {"metric": "auroc", "split": "near_ood", "baseline": "deep_ensemble", "tolerance": 0.015},
        *COMPILE,
    ]
    cfg = resolve_params("default", {"gates": gates, "promote": {"candidates": ["hydra"]}})
    ev = {
        "models": {
            "hydra": {**_entry(0.90, 0.80), "compile_backend": "eager"},
            "single": _entry(0.90, 0.82),
            "deep_ensemble": _entry(0.91, 0.85),
        }
    }
    verdict = judge_all(cfg, ev, None, None)
    assert verdict["verdict"] == "failed" and verdict["baselines_used"] == [
        "deep_ensemble",
        "single",
    ]
    assert [c["against"] for c in verdict["checks"][:2]] == ["single", "deep_ensemble"]
    (failure,) = verdict["failures"]
    assert failure["check"] == "near_ood.auroc vs deep_ensemble"
    assert failure["by"] == pytest.approx(0.035)  # -0.05 against a tolerance of -0.015
    assert failure_lines(verdict) == [
        "near_ood.auroc vs deep_ensemble against deep_ensemble by 0.0350 (diff >= -0.015)"
    ]


def test_the_merge_and_evaluate_find_no_control_when_none_was_built(tmp_path):
    from tasks.runtime.members import load_members
    from tasks.runtime.outputs import write_json

    cfg = validate_params({})
    write_json(
        tmp_path / "models" / "members" / "index.json", {"finetuned": True, "controls": False}
    )
    assert load_members(cfg, tmp_path, kind="control") == []
