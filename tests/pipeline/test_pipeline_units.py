"""Fast checks of the pipeline's pieces without running it: gate rules, resumable units, the DAG
declaration, the CLI's refusal paths."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from tiny_models import make_members, tiny_inputs
from typer.testing import CliRunner

from flows import dvcops
from flows.cli import app
from hydra_ops import compile as hc
from hydra_ops.compile import auto
from hydra_ops.merge import merge_members
from hydra_ops.plans import HeadPlan
from hydra_ops.serialization import save_hydra
from tasks import compile as compile_stage
from tasks.evaluate import compile_fields
from tasks.gate import evaluate_check
from tasks.layout import STAGES
from tasks.params import ConfigError, GateCheck, default_gates, resolve_params, write_params
from tasks.preflight import check_compile_here, check_device_here
from tasks.resumable import ensure_unit, finalise, unit_is_done

REPO = Path(__file__).resolve().parents[2]


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


def test_resumable_unit_skips_verified_and_rebuilds_tampered(tmp_path):
    calls = []

    def build(d: Path):
        calls.append(1)
        (d / "w.bin").write_bytes(b"weights")
        return {"n": len(calls)}

    unit = tmp_path / "out" / "member_0"
    ensure_unit(unit, "fp1", build, "m0")
    ensure_unit(unit, "fp1", build, "m0")
    assert len(calls) == 1 and unit_is_done(unit, "fp1")
    assert not unit_is_done(unit, "fp2")  # other inputs: recompute
    (unit / "w.bin").write_bytes(b"weightz")  # tampered: recompute
    assert not unit_is_done(unit, "fp1")
    ensure_unit(unit, "fp1", build, "m0")
    assert len(calls) == 2 and (unit / "w.bin").read_bytes() == b"weights"
    (tmp_path / "out" / "member_9").mkdir()
    finalise(tmp_path / "out", {"member_0": {"sha256": "x"}}, {})
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["index.json", "member_0"]


def test_a_failing_build_leaves_no_unit(tmp_path):
    def build(d: Path):
        (d / "partial").write_text("x")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        ensure_unit(tmp_path / "u", "fp", build, "u")
    assert not (tmp_path / "u").exists()


def test_dvc_yaml_declares_the_stages_in_order_and_as_python_modules():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert list(stages) == list(STAGES)
    for name, stage in stages.items():
        assert stage["cmd"] == f"python -m tasks.{name}"
        assert f"tasks/{name}.py" in stage["deps"]
        assert (REPO / "tasks" / f"{name}.py").is_file()
    for name in ("finetune_members", "finetune_baselines"):
        assert stages[name]["outs"][0][next(iter(stages[name]["outs"][0]))]["persist"] is True


def test_cli_refuses_force_without_reason_and_bad_cron(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["promote", "-C", str(tmp_path), "--force"])
    assert res.exit_code == 2 and "--reason" in res.output
    res = runner.invoke(
        app,
        ["serve", "-C", str(tmp_path), "--cron", "every day"],
        env={"PREFECT_API_URL": "http://127.0.0.1:1/api"},
    )
    assert res.exit_code == 2 and "cron" in res.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal needs a machine without CUDA")
def test_run_refuses_a_cuda_device_this_machine_lacks_before_anything(tmp_path):
    """``runtime.device: cuda`` without CUDA: one line naming the key, exit 2, before params.yaml is
    rewritten or any stage (or Prefect) starts; ``auto`` and ``cpu`` are never refused."""
    params = tmp_path / "params.yaml"
    write_params(resolve_params("quick", {}), params)
    before = params.read_bytes()
    runner = CliRunner()
    for args in (
        ["--set", "runtime.device=cuda"],
        ["--profile", "quick", "--set", "runtime.device=cuda:1"],
    ):
        res = runner.invoke(app, ["run", "-C", str(tmp_path), *args])
        said = " ".join(res.output.split())
        assert res.exit_code == 2, res.output
        assert "error: params: runtime.device: 'cuda" in said and "no CUDA device here" in said
        assert params.read_bytes() == before
    write_params(resolve_params("quick", {"runtime": {"device": "cuda"}}), params)
    res = runner.invoke(app, ["run", "-C", str(tmp_path)])  # a hand edit is checked too
    assert res.exit_code == 2 and "runtime.device" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]
    for device in ("auto", "cpu"):
        check_device_here(resolve_params("quick", {"runtime": {"device": device}}))


def _said(res) -> str:
    """The CLI's output, each run of whitespace one space (a wrapped line reads whole)."""
    return " ".join(res.output.split())


def test_run_refuses_a_set_value_that_is_not_yaml_in_one_line(tmp_path):
    """``--set 'data.classes=[a'``: one line naming the item and YAML's complaint, exit 2, no
    traceback, params.yaml untouched (the bracket is shown, not taken for console markup)."""
    params = tmp_path / "params.yaml"
    write_params(resolve_params("quick", {}), params)
    before = params.read_bytes()
    runner = CliRunner()
    for args in (["--set", "data.classes=[a"], ["--profile", "quick", "--set", "seed={x"]):
        res = runner.invoke(app, ["run", "-C", str(tmp_path), *args])
        assert res.exit_code == 2, res.output
        assert len(res.output.strip().splitlines()) == 1, res.output
        assert "Traceback" not in res.output and isinstance(res.exception, SystemExit)
        assert params.read_bytes() == before
    assert _said(res).startswith("error: --set 'seed={x': value is not valid YAML (while parsing")
    res = runner.invoke(app, ["run", "-C", str(tmp_path), "--set", "data.classes=[a"])
    assert _said(res) == (
        "error: --set 'data.classes=[a': value is not valid YAML (while parsing a flow sequence: "
        "expected ',' or ']', but got '<stream end>')"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal needs a machine without CUDA")
def test_run_refuses_a_compile_precision_the_compile_stage_would_refuse_here(tmp_path):
    """``compile.precision: fp16`` (needs CUDA) with a compiling backend on a CPU-only machine:
    one line naming ``compile.precision``, exit 2, before params.yaml is rewritten (not a
    CompileError after every model is trained). ``eager`` and ``auto`` precision are never
    refused; onnxruntime has no bf16 on the CPU, the other backends do."""
    params = tmp_path / "params.yaml"
    write_params(resolve_params("quick", {}), params)
    before = params.read_bytes()
    runner = CliRunner()
    for backend in ("auto", "inductor"):
        args = ["--set", f"compile.backend={backend}", "--set", "compile.precision=fp16"]
        res = runner.invoke(app, ["run", "-C", str(tmp_path), *args])
        assert res.exit_code == 2, res.output
        assert len(res.output.strip().splitlines()) == 1, res.output
        assert _said(res).startswith("error: params: compile.precision: precision 'fp16' cannot")
        assert f"compile.backend {backend!r}" in _said(res)
        assert params.read_bytes() == before
    hand_edit = {"compile": {"backend": "auto", "precision": "fp16"}}
    write_params(resolve_params("quick", hand_edit), params)
    res = runner.invoke(app, ["run", "-C", str(tmp_path)])  # a hand edit is checked too
    assert res.exit_code == 2 and "compile.precision" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]

    def refused(backend: str, precision: str) -> bool:
        cfg = resolve_params("quick", {"compile": {"backend": backend, "precision": precision}})
        try:
            check_compile_here(cfg)
        except ConfigError as err:
            assert "compile.precision" in str(err)
            return True
        return False

    assert refused("onnxruntime", "bf16") and refused("export", "fp16")
    assert refused("tensorrt", "fp16")
    for backend, precision in (
        ("eager", "fp16"),
        ("auto", "auto"),
        ("auto", "fp32"),
        ("auto", "bf16"),
        ("inductor", "bf16"),
        ("onnxruntime", "fp32"),
    ):
        assert not refused(backend, precision), (backend, precision)


def test_run_outside_a_project_writes_nothing(tmp_path):
    """No dvc.yaml here: exit 2 with one line, and no params.yaml left behind."""
    res = CliRunner().invoke(app, ["run", "-C", str(tmp_path), "--profile", "quick"])
    assert res.exit_code == 2, res.output
    assert (
        _said(res) == f"error: {tmp_path}: no dvc.yaml here; run hydra-ens from the project folder"
    )
    assert list(tmp_path.iterdir()) == []


def test_the_prediction_table_shows_inputs_and_classes_as_written():
    """Inputs and class names are the user's text, not console markup: a news text's
    ``[removed]`` vanished from ``predict``'s table and ``[/x]`` ended it with a MarkupError."""
    from rich.console import Console

    from flows.render import prediction_table

    numbers = {"prob": 0.9, "entropy": 0.3, "mutual_information": 0.1, "disagreement": 0.0}
    rows = [
        {"input": "[removed] by the editor", "class": "[misc]", **numbers},
        {"input": "prices [/x] rose", "class": "business", **numbers},
    ]
    rows = [{**r, "ood_score": 0.5, "verdict": "ok"} for r in rows]
    console = Console(width=120, record=True)
    console.print(prediction_table(rows, "hydra v0.0.1 [prod]"))
    text = console.export_text()
    for shown in ("[removed] by the editor", "[misc]", "prices [/x] rose", "hydra v0.0.1 [prod]"):
        assert shown in text, text


@pytest.mark.parametrize("folder", ["proj [v2]", "a[/b]"])
def test_an_error_shows_a_path_with_brackets_as_it_is(tmp_path, folder):
    """The error line is plain text, not console markup: ``[v2]`` was dropped from the path
    shown, and ``[/b]`` ended the command with a MarkupError traceback."""
    root = tmp_path / folder
    root.mkdir(parents=True)
    res = CliRunner().invoke(app, ["run", "-C", str(root), "--profile", "quick"])
    assert res.exit_code == 2, res.output
    assert _said(res) == f"error: {root}: no dvc.yaml here; run hydra-ens from the project folder"


def test_run_refuses_an_unknown_or_missing_allocator_before_anything(tmp_path, monkeypatch):
    """``HYDRA_ENS_MALLOC`` is checked before params.yaml is rewritten; the stage processes'
    environment carries the allocator asked for."""
    from hydra_ops import allocators

    params = tmp_path / "params.yaml"
    write_params(resolve_params("quick", {}), params)
    before = params.read_bytes()
    monkeypatch.setattr(allocators, "find_library", lambda name, dirs=(): None)
    runner = CliRunner()
    for value, said in (("bogus", "unknown allocator 'bogus'"), ("jemalloc", "libjemalloc2")):
        args = ["run", "-C", str(tmp_path), "--profile", "default"]
        res = runner.invoke(app, args, env={"HYDRA_ENS_MALLOC": value})
        assert res.exit_code == 2, res.output
        assert said in " ".join(res.output.split())
        assert params.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]
    monkeypatch.setenv("HYDRA_ENS_MALLOC", "system")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert "LD_PRELOAD" not in dvcops.subprocess_env()
    if allocators._has_glibc():
        monkeypatch.setenv("HYDRA_ENS_MALLOC", "auto")
        monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
        assert dvcops.subprocess_env()["GLIBC_TUNABLES"] == allocators.GLIBC_TUNED


@pytest.mark.parametrize("method", ["taylor", "circuit"])
def test_shared_layers_plans_keep_the_trunk_whole_and_merge_exactly(tmp_path, method):
    """select_members with merge.shared_layers = 2: layers 0-1 of every plan (and of the naive
    plan) keep all heads, the later layers are the strategy's (circuits from a search that skipped
    the trunk, or overlap-penalised top-k); such members merge with a 2-layer trunk, exactly."""
    import torch
    from tiny_models import NUM_HEADS, NUM_LAYERS, tiny_inputs, tiny_model

    from hydra_ops.merge import merge_members
    from hydra_ops.plans import load_plans
    from hydra_ops.scoring import random_scores, score_heads
    from hydra_ops.surgery import prune_heads
    from tasks import select_members
    from tasks.layout import PLANS, SCORES
    from tasks.params import resolve_params

    base = tiny_model("bert")
    sets = {"scoring.method": method, "members.heads_per_layer": 2, "merge.shared_layers": 2}
    cfg = resolve_params("quick", sets=sets)
    if method == "circuit":
        val = [{**tiny_inputs("bert", 6, seed=1), "labels": torch.tensor([0, 1, 2, 0, 1, 2])}]
        scores = score_heads(
            base,
            "circuit",
            val_batches=val,
            objective="nll",
            num_circuits=cfg.members.num_members,
            heads_per_layer=2,
            shared_layers=2,
            progress=False,
        )
    else:
        scores = random_scores(base, seed=3)
    (tmp_path / SCORES).mkdir(parents=True)
    scores.save(tmp_path / SCORES / "scores.safetensors")
    summary = select_members.run(cfg, tmp_path)
    plans = load_plans(tmp_path / PLANS / "plans.json")
    assert summary["shared_layers"] == 2 and len(plans) == cfg.members.num_members
    if method == "circuit":
        assert plans == list(scores.circuits)
    naive = load_plans(tmp_path / PLANS / "naive_plan.json")
    for plan in [*plans, *naive]:
        assert plan.num_layers == NUM_LAYERS
        assert plan.heads(0) == plan.heads(1) == tuple(range(NUM_HEADS))
        assert len(plan.heads(2)) == 2
    pruned = summary["jaccard_per_layer"][2:]
    assert summary["jaccard_mean_pruned_layers"] == pytest.approx(sum(pruned) / len(pruned))
    members = []
    for plan in plans:
        member = tiny_model("bert")
        prune_heads(member, plan)
        members.append(member)
    hydra = merge_members(members, shared_layers=2).eval()
    batch = tiny_inputs("bert", 5)
    with torch.no_grad():
        merged = hydra(batch["input_ids"], batch["attention_mask"])
        separate = torch.stack([m(**batch).logits for m in members], dim=1)
    torch.testing.assert_close(merged, separate, rtol=0, atol=1e-5)


def test_promotion_tags_get_an_identity_on_a_machine_without_one(tmp_path, monkeypatch):
    import os
    import subprocess

    from tasks.registry import FALLBACK_IDENTITY, ensure_git_identity

    for role in ("AUTHOR", "COMMITTER"):  # registered with monkeypatch, so restored afterwards
        for field in ("NAME", "EMAIL"):
            monkeypatch.setenv(f"GIT_{role}_{field}", "x")
            monkeypatch.delenv(f"GIT_{role}_{field}")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    tag = ["git", "tag", "-a", "t", "-m", "m", "4b825dc642cb6eb9a060e54bf8d69288fbee4904"]
    assert subprocess.run(tag, cwd=repo, capture_output=True).returncode != 0  # no identity
    note = ensure_git_identity(repo)
    assert note is not None and FALLBACK_IDENTITY[1] in note
    subprocess.run(tag, cwd=repo, check=True, capture_output=True)
    assert ensure_git_identity(repo) is None  # now there is one


def test_stage_log_relays_dvc_output_without_its_git_advice(tmp_path, monkeypatch):
    from flows import dvcops

    fake = tmp_path / "dvc"
    fake.write_text(
        "#!/bin/sh\n"
        "echo \"Running stage 'merge':\"\n"
        "echo '> python -m tasks.merge'\n"
        "echo 'To track the changes with git, run:'\n"
        "echo '        git add dvc.lock'\n"
        "echo 'To enable auto staging, run:'\n"
        "echo '        dvc config core.autostage true'\n"
        "echo 'Use `dvc push` to send your updates to remote storage.'\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(dvcops, "bin_path", lambda name: str(fake))
    logged: list[str] = []
    result = dvcops.repro_stage(tmp_path, "merge", log=logged.append)
    assert result.ran
    assert logged == ["[merge] Running stage 'merge':", "[merge] > python -m tasks.merge"]
    assert len(result.lines) == 7  # kept for error messages


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


def _run_compile_stage(tmp_path, monkeypatch, caplog, sets: dict, times: list[float]) -> tuple:
    """The compile stage (``export``, ``precision: auto``) on a tiny Hydra with fixed timings
    (``auto`` times fp32 then bf16); returns (compiled.json, metrics/compile.json, auto lines)."""
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

    def fixed(call, repeats, device=None):
        with torch.no_grad():
            return call(), times.pop(0)

    monkeypatch.setattr(auto, "median_latency_ms", fixed)
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


def test_stage_logs_show_the_library_lines():
    """A stage's stderr carries ``hydra_ops`` INFO lines (e.g. why ``compile: auto`` kept fp32 on
    a CPU without fast bf16), not only the stage's own."""
    code = (
        "import logging; from tasks.stage import log, setup_logging; setup_logging(); "
        "logging.getLogger('hydra_ops.compile').info('compile: auto precision keeps fp32: why'); "
        "log.info('stage line')"
    )
    root = Path(__file__).resolve().parents[2]
    err = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    ).stderr
    assert "hydra_ops.compile: compile: auto precision keeps fp32: why" in err
    assert "hydra_ens: stage line" in err and err.count("keeps fp32") == 1
