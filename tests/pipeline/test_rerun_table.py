"""benchmarks.rerun_table: which stages an edit reruns, asked of real DVC on a fresh clone whose
outputs are placeholders (``--fill``): the edited stage and every stage downstream of it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from conftest import git

from benchmarks.rerun_table import changed_stages, fill_outputs, rerun_of

DVC_YAML = """stages:
  first:
    cmd: python first.py
    deps: [first.py, shared.py]
    outs: [out/first]
  second:
    cmd: python second.py
    deps: [second.py, out/first]
    outs: [out/second.json]
  alone:
    cmd: python alone.py
    deps: [alone.py, shared.py]
    metrics: [{out/alone.json: {cache: false}}]
"""


def test_an_edit_reruns_its_stage_and_what_follows(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "dvc.yaml").write_text(DVC_YAML)
    for name in ("first", "second", "alone", "shared"):
        (tmp_path / f"{name}.py").write_text(f"# {name}\n")
    git(tmp_path, "init", "-q")
    assert sorted(fill_outputs(tmp_path)) == ["out/alone.json", "out/first", "out/second.json"]
    assert (tmp_path / "out" / "first" / "placeholder.txt").read_text() == "first\n"
    assert changed_stages(tmp_path) == set()  # recorded in dvc.lock: nothing is stale
    assert rerun_of(tmp_path, "first.py")["rerun"] == ["first", "second"]
    assert rerun_of(tmp_path, "second.py")["rerun"] == ["second"]
    assert rerun_of(tmp_path, "shared.py")["rerun"] == ["first", "second", "alone"]
    assert rerun_of(tmp_path, "gone.py") == {"edit": "gone.py", "missing": True}
    assert (tmp_path / "first.py").read_text() == "# first\n"  # each edit undone
    assert changed_stages(tmp_path) == set()
