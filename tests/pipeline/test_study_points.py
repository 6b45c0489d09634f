"""flows.study.points: what a study worker does, and which points the project already holds
(real git; the end-to-end runs on a Dask cluster are in test_study_flow.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import commit_project, git


def test_an_earlier_upstream_gives_only_the_stages_whose_params_agree(tmp_path):
    from flows.study.points import earlier_upstream

    def stored(name: str, lock: dict) -> Path:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"lock": lock, "files": {"metrics/data.json": "{}"}}))
        return path

    params = {"seed": 1, "data": {"name": "x"}, "evaluate": {"batch_size": 64}}
    data = {"params": {"params.yaml": {"data": {"name": "x"}}}}
    base = {"params": {"params.yaml": {"seed": 1}}}
    other_seed = {"params": {"params.yaml": {"seed": 2}}}
    logits = {"params": {"params.yaml": {"seed": 1, "evaluate.batch_size": 32}}}
    old = stored("old", {"prepare_data": data, "finetune_base": other_seed})
    new = stored("new", {"prepare_data": data, "finetune_base": base, "baseline_logits": logits})
    seed = earlier_upstream([new, old, tmp_path / "missing.json"], params)
    assert seed is not None and seed["from"] == "new"
    assert list(seed["lock"]) == ["prepare_data", "finetune_base"]
    assert seed["files"] == {"metrics/data.json": "{}"}
    assert earlier_upstream([old], {**params, "data": {"name": "y"}, "seed": 3}) is None


def test_experiments_pushed_to_another_git_url_are_fetched_into_the_project(tmp_path):
    from flows.study.points import experiment_refs, fetch_experiments

    project = tmp_path / "proj"
    project.mkdir()
    (project / "dvc.yaml").write_text("stages: {}\n")
    commit_project(project, "project")
    commit = git(project, "rev-parse", "HEAD").strip()
    bare = tmp_path / "server.git"
    git(tmp_path, "clone", "-q", "--bare", str(project), str(bare))
    git(bare, "update-ref", f"refs/exps/{commit[:2]}/{commit[2:]}/circuit-seed0", commit)
    assert experiment_refs(project, commit) == {}
    fetch_experiments(project, str(bare))
    assert experiment_refs(project, commit) == {"circuit-seed0": commit}
    fetch_experiments(project, str(project))  # the project itself: nothing to do


def _project_with_points(tmp_path: Path) -> tuple[Path, Path, str]:
    """A bare 'remote', a clone of it with one commit of its own (the study commit), and two
    points recorded at that commit as DVC does (commits whose parent is the study commit)."""
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "dvc.yaml").write_text("stages: {}\n")
    commit_project(seed, "project")
    remote = tmp_path / "remote.git"
    git(tmp_path, "clone", "-q", "--bare", str(seed), str(remote))
    project = tmp_path / "proj"
    git(tmp_path, "clone", "-q", str(remote), str(project))
    git(project, "config", "user.email", "tests@hydra-ens.invalid")
    git(project, "config", "user.name", "hydra-ens tests")
    (project / "params.yaml").write_text("seed: 0\n")
    git(project, "add", "params.yaml")
    git(project, "commit", "-q", "-m", "study set-up")
    commit = git(project, "rev-parse", "HEAD").strip()
    tree = git(project, "rev-parse", "HEAD^{tree}").strip()
    for name in ("circuit-seed0", "taylor-seed0"):
        point = git(project, "commit-tree", tree, "-p", commit, "-m", name).strip()
        git(project, "update-ref", f"refs/exps/{commit[:2]}/{commit[2:]}/{name}", point)
    return remote, project, commit


def test_the_points_bundle_carries_the_study_commit_and_its_points_to_a_fresh_clone(tmp_path):
    from flows.study.carry import write_points_bundle
    from flows.study.points import experiment_refs

    remote, project, commit = _project_with_points(tmp_path)
    dest = tmp_path / "points.bundle"
    dest.write_text("the previous bundle")
    assert write_points_bundle(project, commit, dest) == 2
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    heads = git(project, "bundle", "list-heads", str(dest))
    assert f"{commit} HEAD" in heads and heads.count("refs/exps/") == 2
    # the remote's history is a prerequisite, not carried: a clone of the remote can use it
    verify = subprocess.run(
        ["git", "bundle", "verify", str(dest)], cwd=project, capture_output=True, text=True
    )
    assert verify.returncode == 0 and "requires" in verify.stdout + verify.stderr
    fresh = tmp_path / "fresh"
    git(tmp_path, "clone", "-q", str(remote), str(fresh))
    git(fresh, "fetch", "-q", str(dest), "HEAD:refs/heads/study", "refs/exps/*:refs/exps/*")
    assert git(fresh, "rev-parse", "study").strip() == commit
    assert sorted(experiment_refs(fresh, commit)) == ["circuit-seed0", "taylor-seed0"]


def test_a_point_is_handed_on_while_another_seeds_upstream_still_runs(monkeypatch):
    """The study flow bundles each point as it finishes: it does not wait for every upstream
    first (a third seed's upstream runs beside the first seeds' points for half an hour)."""
    from flows.study import flow as study_flow

    clock = [0]
    monkeypatch.setattr(study_flow.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + 1))

    def finishing_at(tick):  # a Prefect future whose wrapped (Dask) future is done from `tick`
        return SimpleNamespace(wrapped_future=SimpleNamespace(done=lambda: clock[0] >= tick))

    upstreams = {"seed0": finishing_at(1), "seed1": finishing_at(5)}
    points = {"b-seed0": finishing_at(3), "a-seed0": finishing_at(2), "a-seed1": finishing_at(6)}
    seen = [(kind, name, clock[0]) for kind, name, _ in study_flow._as_finished(upstreams, points)]
    assert seen == [
        ("upstream", "seed0", 1),
        ("point", "a-seed0", 2),
        ("point", "b-seed0", 3),
        ("upstream", "seed1", 5),
        ("point", "a-seed1", 6),
    ]
    # futures that cannot say whether they are done come in the order they were submitted
    plain = {"seed0": object()}, {"a-seed0": object()}
    assert [n for _, n, _ in study_flow._as_finished(*plain)] == ["seed0", "a-seed0"]


def test_a_finished_upstream_is_stored_at_once_and_a_failed_one_is_logged_not_stored(tmp_path):
    from flows.study import flow as study_flow

    class Future:
        def __init__(self, outcome):
            self.outcome = outcome

        def result(self):
            if isinstance(self.outcome, Exception):
                raise self.outcome
            return self.outcome

    errors = []
    logger = SimpleNamespace(error=lambda fmt, *args: errors.append(fmt % args))
    done = Future({"seconds": 12.5, "ran": ["finetune_base"], "seeded_from": None})
    entry = study_flow._record_upstream("abc", done, tmp_path, "c" * 40, logger)
    assert entry == {
        "seconds": 12.5,
        "reused_from_earlier": False,
        "ran": ["finetune_base"],
        "seeded_from": None,
        "resumed": False,
    }
    stored = tmp_path / "upstream" / f"{'c' * 12}-abc.json"
    assert json.loads(stored.read_text())["seconds"] == 12.5 and errors == []
    failed = Future(RuntimeError("finetune_base: out of memory\nTraceback ..."))
    entry = study_flow._record_upstream("def", failed, tmp_path, "c" * 40, logger)
    assert entry == {"error": "finetune_base: out of memory"}
    assert errors == ["upstream def failed: finetune_base: out of memory"]
    assert sorted(p.name for p in (tmp_path / "upstream").iterdir()) == [stored.name]


def test_no_points_no_bundle_and_a_bad_destination_is_one_line(tmp_path):
    from flows.study.carry import BundleError, check_bundle_path, write_points_bundle

    _, project, commit = _project_with_points(tmp_path)
    assert write_points_bundle(project, "0" * 40, tmp_path / "none.bundle") == 0
    assert not (tmp_path / "none.bundle").exists()
    with pytest.raises(BundleError, match="does not exist"):
        check_bundle_path(tmp_path / "nowhere" / "points.bundle")
    with pytest.raises(BundleError, match="is a folder"):
        check_bundle_path(tmp_path)
    assert check_bundle_path(Path("rel.bundle")).is_absolute()
    # git failing (a point ref naming a missing object) is one line, and the bundle written
    # before stays whole
    dest = tmp_path / "points.bundle"
    assert write_points_bundle(project, commit, dest) == 2
    before = dest.read_bytes()
    broken = project / ".git" / "refs" / "exps" / commit[:2] / commit[2:] / "broken-seed0"
    broken.write_text("1" * 40 + "\n")
    with pytest.raises(BundleError, match=r"^git bundle") as err:
        write_points_bundle(project, commit, dest)
    assert "\n" not in str(err.value) and dest.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_a_point_whose_model_stages_run_as_modules_gets_a_warm_process(tmp_path, monkeypatch):
    """Two model stages run as ``python -m tasks.<stage>``: the point's ``dvc exp run`` gets the
    warm process's variables; the study's stub commands get none (nothing is started)."""
    import os

    import yaml

    from flows import warm
    from flows.study.points import _warm

    monkeypatch.setattr(warm, "PRELOAD", ("json",))
    stages = {s: {"cmd": f"python -m tasks.{s}"} for s in ("merge", "evaluate")}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    lines: list[str] = []
    with _warm(tmp_path, stages, dict(os.environ), lines.append) as extra:
        assert Path(extra["HYDRA_ENS_STAGE_SERVER"]).exists()
        assert extra["PATH"].split(os.pathsep)[0].endswith("bin")
    assert lines == ["warm stages: 0 forked"]
    stub = {s: {"cmd": f"python stub.py {s}"} for s in ("merge", "evaluate")}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": stub}))
    with _warm(tmp_path, stub, dict(os.environ), lines.append) as extra:
        assert extra == {}
