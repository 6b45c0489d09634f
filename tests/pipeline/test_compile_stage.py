"""tasks.compile: ``compile.precision: auto`` ships the fastest precision that agrees; the gate
applies its tolerance."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from test_gate import _ev
from tiny_models import make_members, tiny_inputs

from hydra_ops import compile as hc
from hydra_ops.compile import auto
from hydra_ops.heads.plans import HeadPlan
from hydra_ops.hydra.merge import merge_members
from hydra_ops.hydra.serialization import save_hydra
from tasks import compile as compile_stage
from tasks.evaluate import compile_fields
from tasks.gates.checks import evaluate_check
from tasks.params import GateCheck, default_gates, resolve_params


def _run_compile_stage(
    tmp_path,
    monkeypatch,
    caplog,
    sets: dict,
    times: list[float],
    eager_ms: dict | None = None,
    whole: int = 6,
) -> tuple:
    """The compile stage (``export``, ``precision: auto``) on a tiny Hydra with fixed timings
    (``auto`` times fp32 then bf16), the eager probe's ``eager_ms`` (None: not measured) and
    ``whole`` batches of 8 as every example of the test split; returns (compiled.json,
    metrics/compile.json, auto lines)."""
    plans = [HeadPlan(((0,),)), HeadPlan(((1, 2),))]
    hydra = merge_members(make_members("bert", plans, fine_tuned=True, num_hidden_layers=1))
    save_hydra(hydra, tmp_path / "models" / "hydra")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(hc.compiler, "fast_bf16_unavailable_reason", lambda device: None)
    check_batches = [tiny_inputs("bert", 4, seed=11), tiny_inputs("bert", 5, seed=12)]
    monkeypatch.setattr(
        compile_stage,
        "check_batches",
        lambda cfg, root: (check_batches[0], {"test": check_batches[1:]}),
    )
    every = [tiny_inputs("bert", 8, seed=20 + i) for i in range(whole)]
    monkeypatch.setattr(compile_stage, "whole_split_batches", lambda cfg, root: {"test/all": every})

    def fixed(call, repeats, device=None):
        with torch.no_grad():
            return call(), [times.pop(0)] * repeats

    monkeypatch.setattr(auto, "latency_rounds_ms", fixed)
    monkeypatch.setattr(compile_stage, "eager_precision_ms", lambda cfg, root, model: eager_ms)
    cfg = resolve_params("quick", sets={"compile.backend": "export", **sets})
    assert cfg.compile.precision == "auto"
    with caplog.at_level(logging.INFO, logger="hydra_ops.compile"):
        compile_stage.run(cfg, tmp_path)
    compiled = json.loads((tmp_path / "models" / "compiled" / "compiled.json").read_text())
    metrics = json.loads((tmp_path / "metrics" / "compile.json").read_text())
    lines = [r.getMessage() for r in caplog.records if "auto precision" in r.getMessage()]
    return compiled, metrics, lines


def test_auto_precision_ships_bf16_and_the_gate_applies_its_tolerance(
    tmp_path, monkeypatch, caplog
):
    compiled, metrics, lines = _run_compile_stage(tmp_path, monkeypatch, caplog, {}, [2.0, 1.0])
    assert compiled["precision"] == "bf16" and compiled["requested_precision"] == "auto"
    assert compiled["check"]["tolerance"] == 2e-2 and compiled["check"]["passed"]
    assert 1e-4 < compiled["check"]["max_abs_diff_probs"] <= 2e-2  # beyond the fp32 tolerance
    trials = compiled["auto_selection"]["trials"]
    assert trials["export/fp32"]["ok"] and trials["export/bf16"]["ok"]
    assert "median_ms" not in trials["export/bf16"]  # timings are run facts
    assert metrics["auto_selection_timings"]["export/bf16"]["median_ms"] == 1.0
    assert metrics["tolerance"] == 2e-2 and metrics["precision"] == "bf16"
    assert lines == [f"compile: auto precision ships bf16: {compiled['precision_reason']}"]
    ev = _ev()
    ev["models"]["hydra"] |= compile_fields(compiled)
    gates = [GateCheck(**g) for g in default_gates() if g["metric"].startswith("compile_")]
    recs = {r["metric"]: r for r in (evaluate_check(g, ev, prod=None) for g in gates)}
    assert recs["compile_max_abs_diff"]["threshold"] == 2e-2
    assert recs["compile_max_abs_diff"]["status"] == "passed"
    assert recs["compile_argmax_agreement"]["status"] == "passed"
    pinned = GateCheck(metric="compile_max_abs_diff", threshold=1e-4)  # a number still wins
    assert evaluate_check(pinned, ev, prod=None)["status"] == "failed"


def test_auto_precision_keeps_fp32_when_bf16_disagrees(tmp_path, monkeypatch, caplog):
    sets = {"compile.tolerance_low_precision": 1e-9}  # no bf16 output is that close
    compiled, metrics, lines = _run_compile_stage(tmp_path, monkeypatch, caplog, sets, [2.0, 1.0])
    assert compiled["precision"] == "fp32" and compiled["check"]["tolerance"] == 1e-4
    bf16 = compiled["auto_selection"]["trials"]["export/bf16"]
    assert not bf16["ok"] and bf16["max_abs_diff_probs"] > 1e-9
    assert compiled["precision_reason"].startswith("bf16 failed its check (max |dp|")
    assert len(lines) == 1 and lines[0].startswith("compile: auto precision keeps fp32: bf16")
    assert metrics["precision_reason"] == compiled["precision_reason"]


def test_auto_builds_a_precision_the_eager_probe_found_twice_as_slow_only_if_needed(
    tmp_path, monkeypatch, caplog
):
    slow_fp32 = {"fp32": 30.0, "bf16": 10.0}  # eager fp32 3x slower: its candidate waits
    compiled, metrics, lines = _run_compile_stage(
        tmp_path, monkeypatch, caplog, {}, [1.0], eager_ms=slow_fp32
    )
    selection = compiled["auto_selection"]
    assert compiled["precision"] == "bf16" and set(selection["trials"]) == {"export/bf16"}
    why = selection["skipped_candidates"]["export/fp32"]
    assert why.startswith("eager fp32 >= 2x slower than eager bf16") and "30" not in why
    assert set(metrics["auto_selection_timings"]) == {"export/bf16"}
    assert lines == [f"compile: auto precision ships bf16: {compiled['precision_reason']}"]
    # bf16 fails its check: the deferred fp32 candidate is built after all, and ships
    sets = {"compile.tolerance_low_precision": 1e-9}
    compiled, _, _ = _run_compile_stage(
        tmp_path, monkeypatch, caplog, sets, [1.0, 2.0], eager_ms=slow_fp32
    )
    assert compiled["precision"] == "fp32"
    assert set(compiled["auto_selection"]["trials"]) == {"export/bf16", "export/fp32"}
    assert "skipped_candidates" not in compiled["auto_selection"]


@pytest.mark.parametrize(
    ("sets", "device", "passed", "expected"),
    [
        ({}, "cpu", True, {"fp32": 30.0, "bf16": 10.0}),
        ({}, "cpu", False, {"fp32": 30.0}),  # bf16 disagreed with fp32: only fp32 is a reference
        ({"compile.precision": "fp32"}, "cpu", True, None),  # pinned: nothing to defer
        ({}, "cuda", True, None),  # a GPU probe says nothing of the CPU candidates
    ],
)
def test_eager_precision_ms_reads_the_inference_probe(
    monkeypatch, tmp_path, sets, device, passed, expected
):
    from hydra_ops.models.runtime import Runtime
    from hydra_ops.perf.precision_probe import PrecisionChoice

    timings = {"fp32_median_ms": 30.0, "bf16_median_ms": 10.0, "speedup": 3.0}
    choice = PrecisionChoice("bf16", "why", "inference", "cached", timings, {"passed": passed})
    calls = []

    def probe(cfg, root, stage, use, model_fn, batches_fn, measure_fn, log_runtime=True):
        calls.append((stage, use, model_fn()))
        return Runtime(torch.device("cpu")), choice

    monkeypatch.setattr(compile_stage, "needs_probe", lambda cfg: True)
    monkeypatch.setattr(compile_stage, "resolve_device", lambda spec: torch.device(device))
    monkeypatch.setattr(compile_stage, "stage_runtime", probe)
    monkeypatch.setattr(compile_stage, "batches", lambda *a, **k: [])
    monkeypatch.setattr(compile_stage, "split", lambda root, name: name)
    cfg = resolve_params("quick", sets={"compile.backend": "export", **sets})
    model = torch.nn.Linear(2, 2)
    assert compile_stage.eager_precision_ms(cfg, tmp_path, model) == expected
    assert calls == ([] if expected is None else [("compile (eager probe)", "inference", model)])


def test_a_low_precision_that_agrees_on_the_sample_but_not_on_every_example_ships_fp32(
    tmp_path, monkeypatch, caplog
):
    """What the gate judges (every example) is what compile checks: a tolerance between bf16's
    worst difference on the sample and on the whole split lets ``auto`` choose bf16 on the
    sample, then ships fp32; the recorded choice does the same on the next run."""
    first, _, _ = _run_compile_stage(tmp_path / "a", monkeypatch, caplog, {}, [2.0, 1.0])
    parts = first["check"]["splits"]
    sample, whole = parts["test"]["max_abs_diff_probs"], parts["test/all"]["max_abs_diff_probs"]
    assert first["precision"] == "bf16" and parts["test/all"]["num_examples"] == 48
    assert sample < whole  # the worst of more examples
    tolerance = (sample + whole) / 2
    sets = {"compile.tolerance_low_precision": tolerance}
    shipped, metrics, _ = _run_compile_stage(tmp_path / "b", monkeypatch, caplog, sets, [2.0, 1.0])
    assert shipped["auto_selection"]["trials"]["export/bf16"]["ok"]  # chosen on the sample
    assert shipped["precision"] == "fp32" and shipped["check"]["passed"]
    assert shipped["check"]["tolerance"] == 1e-4
    assert shipped["precision_reason"].startswith("bf16 failed this model's check (max |dp|")
    assert shipped["precision_reason"].endswith("on test/all)")
    assert metrics["precision"] == "fp32" and metrics["check_splits"]["test/all"] == 48
    again, _, _ = _run_compile_stage(tmp_path / "b", monkeypatch, caplog, sets, [])
    assert again == shipped  # the recorded bf16 is built, fails the same way, and fp32 ships


def test_a_second_run_builds_the_recorded_choice_and_writes_the_same_metadata(
    tmp_path, monkeypatch, caplog
):
    first, _, _ = _run_compile_stage(tmp_path, monkeypatch, caplog, {}, [2.0, 1.0])
    assert first["precision"] == "bf16"
    record = next((tmp_path / "hardware").glob("*.json"))
    trials = [e for e in json.loads(record.read_text())["entries"].values()]
    chosen = [e["value"] for e in trials if e["kind"] == compile_stage.CHOICE_KIND]
    assert [(c["backend"], c["precision"]) for c in chosen] == [("export", "bf16")]
    assert chosen[0]["trials"]["export/bf16"]["rounds_ms"] == [1.0] * 5  # raw timings kept
    # nothing timed the second time (an empty list of timings): the recorded candidate is built
    again, metrics, _ = _run_compile_stage(tmp_path, monkeypatch, caplog, {}, [])
    assert again == first
    assert metrics["choice_source"] == "recorded" and "auto_selection_timings" not in metrics
    choices = (tmp_path / "hardware" / "choices.yaml").read_text()
    assert "backend: export" in choices and "precision: bf16" in choices


def test_two_fresh_projects_whose_timings_differ_by_noise_ship_the_same_artifact(
    tmp_path, monkeypatch, caplog
):
    """bf16 5% faster in one project, 5% slower in the other: both keep the default."""
    a, b = tmp_path / "a", tmp_path / "b"
    first, _, _ = _run_compile_stage(a, monkeypatch, caplog, {}, [1.0, 0.95])
    second, _, _ = _run_compile_stage(b, monkeypatch, caplog, {}, [0.95, 1.0])
    assert first["precision"] == second["precision"] == "fp32"
    assert first == second
    assert (a / "models/compiled/compiled.json").read_bytes() == (
        b / "models/compiled/compiled.json"
    ).read_bytes()
