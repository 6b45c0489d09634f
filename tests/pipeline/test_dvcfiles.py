"""tasks.runtime.dvcfiles: a stage's outputs and the cached ones, read from dvc.yaml."""

from __future__ import annotations

from pathlib import Path

import leftover_files
import pytest

from tasks.runtime.dvcfiles import cached_outputs, stage_outputs


@pytest.fixture()
def project_files(tmp_path) -> Path:
    """A folder with the project's dvc.yaml and a valid quick params.yaml (no git, no DVC)."""
    return leftover_files.project_files(tmp_path)


def test_stage_outputs_come_from_dvc_yaml(project_files):
    outs = stage_outputs("evaluate", project_files)
    rel = {p.relative_to(project_files).as_posix() for p in outs}
    assert {"reports/evaluate.md", "metrics/evaluate.json", "plots/roc.json"} <= rel
    with pytest.raises(ValueError, match=r"'nope' is not in .*dvc.yaml; declared: prepare_data"):
        stage_outputs("nope", project_files)
    assert stage_outputs("finetune_base", project_files / "elsewhere") == []


def test_cached_outputs_leave_out_cache_false(project_files):
    cached = cached_outputs(project_files)
    assert cached["models/base"] == "finetune_base"
    assert cached["models/members"] == "finetune_members"  # {persist: true}, still cached
    assert "metrics/finetune_base.json" not in cached  # {cache: false}: may hold timings
    assert "reports/evaluate.md" not in cached


def test_the_dvc_files_read_as_yaml_reads_them_and_a_broken_lock_is_one_line(project_files):
    import yaml

    from tasks.runtime.dvcfiles import read_dvc_yaml, read_lock

    text = (project_files / "dvc.yaml").read_text()
    assert read_dvc_yaml(project_files) == yaml.safe_load(text)["stages"]
    assert read_lock(project_files) == {}
    (project_files / "dvc.lock").write_text("stages:\n  merge: [1, 2\n")
    with pytest.raises(ValueError, match=r"^dvc\.lock is unreadable: [^\n]+$"):
        read_lock(project_files)
