"""flows.study.points: what a study worker does, and which points the project already holds
(real git; the end-to-end runs on a Dask cluster are in test_study_flow.py)."""

from __future__ import annotations

import json
from pathlib import Path

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
