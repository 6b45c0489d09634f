"""Every DVC stage lists the code it runs: the import closure of its command, read from the source,
is covered by the stage's deps in dvc.yaml, and no stage depends on the whole library folder."""

from __future__ import annotations

from pathlib import Path

import yaml

from tasks.stage_deps import ROOT, import_closure, missing_deps, stage_modules


def test_every_stage_lists_its_import_closure():
    assert missing_deps() == {}


def test_no_stage_depends_on_the_whole_library():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name, stage in stages.items():
        assert "hydra_ops" not in stage.get("deps", []), name


def test_every_python_stage_is_analysed():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert set(stage_modules()) == set(stages)


def test_closure_follows_lazy_relative_and_package_imports(tmp_path: Path):
    pkg = tmp_path / "hydra_ops"
    (pkg / "sub").mkdir(parents=True)
    (tmp_path / "tasks").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .leaf import x\n")
    (pkg / "sub" / "leaf.py").write_text("x = 1\n")
    (pkg / "lazy.py").write_text("def f():\n    from hydra_ops import sub\n    return sub\n")
    (pkg / "unused.py").write_text("y = 2\n")
    (tmp_path / "tasks" / "__init__.py").write_text("")
    (tmp_path / "tasks" / "stage.py").write_text("import os\nfrom hydra_ops.lazy import f\n")
    found = {p.relative_to(tmp_path).as_posix() for p in import_closure("tasks.stage", tmp_path)}
    assert found == {
        "tasks/__init__.py",
        "tasks/stage.py",
        "hydra_ops/__init__.py",
        "hydra_ops/lazy.py",
        "hydra_ops/sub/__init__.py",
        "hydra_ops/sub/leaf.py",
    }


def test_closure_follows_lazy_exports_and_registry_paths(tmp_path: Path):
    pkg = tmp_path / "hydra_ops"
    for folder in (pkg / "data", pkg / "families", tmp_path / "tasks"):
        folder.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "data" / "__init__.py").write_text(
        '_EXPORTS = {"load": "hydra_ops.data.store", "batches": "hydra_ops.data.batching"}\n'
    )
    for name in ("store", "batching", "spec"):
        (pkg / "data" / f"{name}.py").write_text("x = 1\n")
    (pkg / "families" / "__init__.py").write_text(
        'REGISTRY = {"bert": ".bert:BertAdapter", "note": "not: a path"}\n'
    )
    (pkg / "families" / "bert.py").write_text("class BertAdapter: ...\n")
    (pkg / "families" / "unused.py").write_text("y = 2\n")
    (tmp_path / "tasks" / "__init__.py").write_text("")
    (tmp_path / "tasks" / "stage.py").write_text(
        "from hydra_ops.data import load\nfrom hydra_ops.data.spec import x\n"
        "import hydra_ops.families\n"
    )
    found = {p.relative_to(tmp_path).as_posix() for p in import_closure("tasks.stage", tmp_path)}
    assert found == {
        "tasks/__init__.py",
        "tasks/stage.py",
        "hydra_ops/__init__.py",
        "hydra_ops/data/__init__.py",
        "hydra_ops/data/store.py",  # the lazily exported name it imports, not the others
        "hydra_ops/data/spec.py",
        "hydra_ops/families/__init__.py",
        "hydra_ops/families/bert.py",  # a registry path
    }
