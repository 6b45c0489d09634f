"""tasks.runtime.stage: a stage process logs the library lines, and removes what a killed run of it
left (and nothing else) before it runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import leftover_files
import pytest
from leftover_files import LEFTOVERS, REAL
from leftover_files import touch as _touch

from tasks.runtime.stage import remove_stage_leftovers, stage_main


@pytest.fixture()
def project_files(tmp_path) -> Path:
    """A folder with the project's dvc.yaml and a valid quick params.yaml (no git, no DVC)."""
    return leftover_files.project_files(tmp_path)


def test_stage_logs_show_the_library_lines():
    """A stage's stderr carries ``hydra_ops`` INFO lines (e.g. why ``compile: auto`` kept fp32 on
    a CPU without fast bf16), not only the stage's own."""
    code = (
        "import logging; from tasks.runtime.stage import log, setup_logging; setup_logging(); "
        "logging.getLogger('hydra_ops.compile').info('compile: auto precision keeps fp32: why'); "
        "log.info('stage line')"
    )
    root = Path(__file__).resolve().parents[2]
    err = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    ).stderr
    assert "hydra_ops.compile: compile: auto precision keeps fp32: why" in err
    assert "hydra_ens: stage line" in err and err.count("keeps fp32") == 1


def test_stage_leftovers_are_removed_and_real_outputs_kept(project_files):
    root = project_files
    for rel in (*LEFTOVERS, *REAL):
        _touch(root, rel)
    other_stage = _touch(root, "models/.merged.old-0a1b2c3d/")
    removed = remove_stage_leftovers("finetune_base", root)
    assert sorted(removed) == sorted(root / rel for rel in LEFTOVERS[:3])
    for rel in LEFTOVERS[:3]:
        assert not (root / rel).exists(), rel
    for rel in REAL[:5]:
        assert (root / rel).read_text() == "x", rel
    assert other_stage.is_dir()  # another stage's output: that stage cleans it
    assert (root / LEFTOVERS[3]).is_dir()  # inside a unit stage's output: finalise removes it
    assert remove_stage_leftovers("finetune_base", root) == []


def test_stage_main_cleans_before_the_stage_runs(project_files, monkeypatch):
    root = project_files
    leftover = _touch(root, "models/.members.old-0a1b2c3d/")
    seen = []
    monkeypatch.chdir(root)
    monkeypatch.setattr("tasks.runtime.stage.set_threads", lambda: None)
    stage_main("finetune_members", lambda cfg, r: seen.append(leftover.exists()))
    assert seen == [False]
