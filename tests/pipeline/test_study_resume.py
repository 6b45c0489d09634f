"""A study job killed midway resumes where it stopped: the next run of that job on the machine
takes over the clone it left (real git, DVC and its remote; the study stub's stages, one of them
slowed to give a window to kill the job in)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import commit_project, git, kill_group

STUB = Path(__file__).parent / "study_stub"
ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(240)

_JOB_SCRIPT = """
import json, sys
from flows.study.points import PointJob, run_point, run_upstream
job = PointJob(**json.loads(sys.argv[2]))
{"upstream": run_upstream, "point": run_point}[sys.argv[1]](job, print)
"""


def _study(root: Path) -> dict:
    """A committed copy of the study stub in ``root``, a DVC remote beside it and the job of one
    upstream of it."""
    from flows.study.points import PointJob
    from tasks.params import resolve_params, write_params

    project = root / "proj"
    project.mkdir(parents=True)
    for name in ("dvc.yaml", "stub.py", "evaluate_template.json"):
        shutil.copy2(STUB / name, project / name)
    write_params(resolve_params("quick"), project / "params.yaml")
    commit_project(project, "stub project")
    job = PointJob(
        study="tiny",
        name="upstream-abc",
        params=yaml.safe_load((project / "params.yaml").read_text()),
        git_url=str(project),
        commit=git(project, "rev-parse", "HEAD").strip(),
        dvc_remote=str(root / "remote"),
    )
    return {"project": project, "scratch": root / "scratch", "job": job}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        study = _study(tmp_path_factory.mktemp("resume"))
        mp.setenv("HYDRA_ENS_STUDY_SCRATCH", str(study["scratch"]))
        yield study


@pytest.fixture(scope="module")
def resumed_upstream(study):
    """The upstream job killed in ``finetune_baselines`` (``finetune_base`` finished), then run
    again: its result, its log lines and the clone the killed run left."""
    from flows.study.points import run_upstream

    job = study["job"]
    killed = _killed_midway(
        job, "upstream", study["scratch"], "finetune_baselines", "finetune_base"
    )
    lines: list[str] = []
    result = run_upstream(job, lines.append)
    return {"result": result, "lines": lines, "killed": killed}


def _killed_midway(job, kind: str, scratch: Path, slow_stage: str, finished: str) -> Path:
    """Run ``kind`` for ``job`` in a child process with ``slow_stage`` slowed; SIGKILL it (and
    its DVC and stage processes) once its clone's ``dvc.lock`` records ``finished``."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "STUB_SLOW_STAGE": slow_stage,
        "STUB_SLOW_SECONDS": "120",
    }
    spec = json.dumps(dataclasses.asdict(job))
    proc = subprocess.Popen(
        [sys.executable, "-c", _JOB_SCRIPT, kind, spec],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            for clone in scratch.glob(f"{job.study}-{job.name}-*"):
                lock = clone / "dvc.lock"
                stages = (yaml.safe_load(lock.read_text()) or {}) if lock.is_file() else {}
                if finished in (stages.get("stages") or {}):
                    return clone
            time.sleep(0.2)
        raise AssertionError(f"{finished} never finished: {proc.communicate()[0][-2000:]}")
    finally:
        kill_group(proc)


def test_a_killed_upstream_resumes_its_clone_and_reruns_only_the_unfinished_stages(
    study, resumed_upstream
):
    from flows.study.points import run_upstream

    job, resumed = study["job"], resumed_upstream["result"]
    assert resumed["resumed"] is True
    assert resumed["ran"] == ["finetune_baselines", "baseline_logits"]
    said = f"resuming the clone a killed run of {job.name} left"
    assert any(said in ln for ln in resumed_upstream["lines"])
    assert list(study["scratch"].iterdir()) == []  # the taken-over clone is removed at the end
    assert not resumed_upstream["killed"].exists()
    # what it recorded is what a run that was never killed records, hash for hash
    whole = run_upstream(dataclasses.replace(job, name="upstream-whole"), lambda _: None)
    assert whole["resumed"] is False
    assert whole["ran"] == ["prepare_data", "finetune_base", *resumed["ran"]]
    assert resumed["lock"] == whole["lock"] and resumed["files"] == whole["files"]


def test_a_killed_point_resumes_its_experiment_and_pushes_it_whole(study, resumed_upstream):
    from flows.study.points import experiment_refs, run_point
    from flows.study.report.results import POINT_FILES

    upstream = resumed_upstream["result"]
    job = dataclasses.replace(study["job"], name="taylor-seed0", upstream=upstream)
    _killed_midway(job, "point", study["scratch"], "evaluate", "score_heads")
    assert experiment_refs(study["project"], job.commit) == {}  # a killed point records nothing
    point = run_point(job, lambda _: None)
    assert point["resumed"] is True and point["reused_upstream"] is True
    assert point["ran"] == ["evaluate", "gate"]
    refs = experiment_refs(study["project"], job.commit)
    assert refs == {"taylor-seed0": point["ref"]}
    for rel in POINT_FILES.values():
        git(study["project"], "cat-file", "-e", f"{point['ref']}:{rel}")


def _left_by_a_killed_job(project: Path, dest: Path, commit: str) -> Path:
    """A clone as :func:`flows.study.points.checkout` sets one up, at ``commit``."""
    git(dest.parent, "clone", "-q", str(project), str(dest))
    git(dest, "checkout", "-q", "-B", "hydra-study", commit)
    (dest / ".dvc").mkdir()
    (dest / ".dvc" / "config.local").write_text("")
    return dest


def test_killed_clones_at_another_commit_or_half_made_are_removed_not_taken_over(
    tmp_path, monkeypatch
):
    from flows.study.points import Clone, checkout

    study = _study(tmp_path)
    job, scratch, project = study["job"], study["scratch"], study["project"]
    monkeypatch.setenv("HYDRA_ENS_STUDY_SCRATCH", str(scratch))
    scratch.mkdir()
    # pids above the kernel's largest (2**22) never name a live process
    earlier = _left_by_a_killed_job(project, scratch / f"tiny-{job.name}-99999997-a", job.commit)
    (project / "new.txt").write_text("a later commit\n")
    git(project, "add", "new.txt")
    git(project, "commit", "-q", "-m", "later")
    later = git(project, "rev-parse", "HEAD").strip()
    half_made = scratch / f"tiny-{job.name}-99999998-b"  # killed before its set-up ended
    git(tmp_path, "clone", "-q", str(project), str(half_made))
    lines: list[str] = []
    with checkout(dataclasses.replace(job, commit=later), lines.append) as clone:
        assert isinstance(clone, Clone) and clone.resumed is False
        assert (clone.path / "new.txt").is_file()
        assert not earlier.exists() and not half_made.exists()
    assert not any("resuming" in ln for ln in lines)


def test_a_clone_a_process_still_works_in_is_left_alone(tmp_path, monkeypatch):
    """Its worker was killed, but a stage (or ``dvc``) it started still runs there."""
    from flows.study.points import checkout

    study = _study(tmp_path)
    job, scratch = study["job"], study["scratch"]
    monkeypatch.setenv("HYDRA_ENS_STUDY_SCRATCH", str(scratch))
    scratch.mkdir()
    busy = _left_by_a_killed_job(
        study["project"], scratch / f"tiny-{job.name}-99999999-c", job.commit
    )
    (busy / "models").mkdir()
    orphan = subprocess.Popen(["sleep", "60"], cwd=busy / "models")
    try:
        with checkout(job, lambda _: None) as clone:
            assert clone.resumed is False and clone.path != busy
            assert busy.is_dir()
    finally:
        orphan.kill()
        orphan.wait()
    with checkout(job, lambda _: None) as clone:  # once it is gone, the clone is taken over
        assert clone.resumed is True
    assert not busy.exists()


def test_a_pid_the_system_gave_to_another_process_does_not_keep_a_clone_alive(
    tmp_path, monkeypatch
):
    """A clone records its maker's start time: after a restart, the pid in its name may name a
    process started since, which is not its maker."""
    import psutil

    from flows.study.points import checkout

    study = _study(tmp_path)
    job, scratch = study["job"], study["scratch"]
    monkeypatch.setenv("HYDRA_ENS_STUDY_SCRATCH", str(scratch))
    scratch.mkdir()
    pid = os.getpid()  # a live process: this one
    ours = _left_by_a_killed_job(study["project"], scratch / f"tiny-{job.name}-{pid}-d", job.commit)
    (ours / ".git" / "hydra-study-owner").write_text(repr(psutil.Process().create_time()))
    reused = _left_by_a_killed_job(
        study["project"], scratch / f"tiny-{job.name}-{pid}-e", job.commit
    )
    (reused / ".git" / "hydra-study-owner").write_text("1000000000.0")  # made in 2001
    with checkout(job, lambda _: None) as clone:
        assert clone.resumed is True  # the clone whose maker is gone
        assert not reused.exists() and ours.is_dir()  # the live maker's clone is left alone
        owner = float((clone.path / ".git" / "hydra-study-owner").read_text())
        assert owner == psutil.Process().create_time()
