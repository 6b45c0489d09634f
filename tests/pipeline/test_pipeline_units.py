"""Fast checks of the pipeline's pieces without running it: gate rules, resumable units, the DAG
declaration, the CLI's refusal paths."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from tasks.common import STAGES
from tasks.gate import evaluate_check
from tasks.params import GateCheck
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
    from tasks.common import PLANS, SCORES
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
