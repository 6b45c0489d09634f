"""The quick image pipeline end to end (digits + a tiny timm ViT, Taylor variant with member
fine-tuning), killed in the middle of ``finetune_members`` and started again: the resumed run
recomputes only the unfinished members and leaves a ``dvc.lock`` consistent with its outputs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from conftest import REPO, git, make_project
from test_pipeline_text import ALL_CLASSIFICATION, ALL_OOD, PASSING_GATES, cli, last_run

from flows import dvcops
from tasks.common import STAGES

pytestmark = pytest.mark.slow

PARAMS = {
    "data": {"name": "digits"},
    "scoring": {"method": "taylor"},
    "members": {"finetune": {"max_parallel": 1}},
    "gates": PASSING_GATES,
}


@pytest.fixture(scope="module")
def resumed(prefect_server, tmp_path_factory) -> dict:
    root = make_project(tmp_path_factory.mktemp("image") / "proj", PARAMS)
    members = root / "models" / "members"
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", "-C", str(root)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 400
    while not (members / "member_0" / "done.json").is_file():
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.monotonic() < deadline, "member_0 never finished"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole run: CLI, Prefect tasks, dvc, stage
    proc.wait(timeout=30)
    finished = {
        d.name: (d / "done.json").stat().st_mtime_ns
        for d in members.iterdir()
        if (d / "done.json").is_file()
    }
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    cli("run", "-C", str(root))
    return {"root": root, "finished_before": finished, "lock_at_kill": lock}


def test_kill_left_finetune_members_unlocked(resumed):
    assert "finetune_members" not in resumed["lock_at_kill"]
    assert "member_0" in resumed["finished_before"]
    assert len(resumed["finished_before"]) < 6  # 3 members + 3 controls: not all finished


def test_resume_recomputes_only_unfinished_members(resumed):
    root = resumed["root"]
    summary = last_run(root)
    assert summary["ran"][0] == "finetune_members"  # everything before it was up to date
    assert summary["ran"] == list(STAGES[STAGES.index("finetune_members") :])
    members = root / "models" / "members"
    for name, mtime in resumed["finished_before"].items():
        assert (members / name / "done.json").stat().st_mtime_ns == mtime, name
    index = json.loads((members / "index.json").read_text())
    assert sorted(index["units"]) == sorted(
        [f"member_{m}" for m in range(3)] + [f"control_{m}" for m in range(3)]
    )


def test_lock_is_consistent_with_outputs(resumed):
    root = resumed["root"]
    assert dvcops.stale_stages(root) == set()
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    assert set(lock) == set(STAGES)
    for stage in lock.values():
        for out in stage.get("outs", []):
            assert out["md5"], out


def test_image_report_and_promotion(resumed):
    root = resumed["root"]
    ev = json.loads((root / "metrics" / "evaluate.json").read_text())
    assert set(ev["models"]) == {"hydra", "single", "naive_pruned", "deep_ensemble", "control"}
    assert ev["variant"] == "taylor"
    for entry in ev["models"].values():
        assert set(entry["calibrated"]["id_test"]) >= set(ALL_CLASSIFICATION)
        assert set(entry["raw"]["far_ood"]) >= set(ALL_OOD)
    assert "control" in ev["bootstrap"]
    tags = git(root, "tag", "-l").split()
    assert "hydra@v0.0.1" in tags and "hydra#prod#1" in tags
    hydra_json = json.loads((root / "models" / "hydra" / "hydra.json").read_text())
    assert "timm" in json.dumps(hydra_json)


def test_corrupted_checkpoint_gets_a_clear_error(resumed, tmp_path):
    from tasks import models_io

    root = resumed["root"]
    member = root / "models" / "members" / "member_1"
    copy = tmp_path / "member_1"
    copy.mkdir()
    for f in member.iterdir():
        copy.joinpath(f.name).write_bytes(f.read_bytes())
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ValueError, match="truncated or tampered"):
        models_io.load_member(copy, root / "models" / "base")


def test_bad_params_stop_the_run_before_any_stage(tmp_path):
    root = make_project(tmp_path / "proj", {"data": {"name": "digits"}})
    res = cli("run", "-C", str(root), "--set", "members.num_members=0", code=2)
    assert "members.num_members" in res.output
    assert not (root / "dvc.lock").exists() and not (root / "data" / "prepared").exists()
    res = cli(
        "run", "-C", str(root), "--set", "data.name=folder", "--set", "data.path=/nope", code=2
    )
    assert "data.path" in res.output
