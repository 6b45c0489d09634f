"""Every DVC stage lists the code it runs: the import closure of its command, read from the source,
is covered by the stage's deps in dvc.yaml, and no stage depends on the whole library folder."""

from __future__ import annotations

from pathlib import Path

import yaml

from tasks.runtime.stage_deps import ROOT, import_closure, missing_deps, stage_modules


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


def _stage_schema(stage: str) -> type:
    """The params view a stage validates params.yaml with (its module's ``SCHEMA``), read from
    the source (importing every stage would import torch)."""
    import ast

    import tasks.params as params

    tree = ast.parse((ROOT / "tasks" / f"{stage}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["SCHEMA"]:
            return getattr(params, node.value.id)
    raise AssertionError(f"tasks/{stage}.py has no SCHEMA")


def test_each_stage_validates_the_sections_it_reads():
    """A stage's params view types every section its dvc.yaml ``params`` name (the whole file:
    every section); the sections it does not read are kept as written."""
    from typing import Any

    from tasks.params.schema import PipelineConfig

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for stage in stage_modules():
        schema = _stage_schema(stage)
        read = set()
        for entry in stages[stage].get("params") or []:
            if isinstance(entry, dict):  # {"params.yaml": [...]}; other files are not params
                read |= set(PipelineConfig.model_fields) if "params.yaml" in entry else set()
            else:
                read.add(entry)
        sections = {key.split(".")[0] for key in read}
        unread = [s for s in sections if schema.model_fields[s].annotation is Any]
        assert unread == [], (stage, schema.__name__, unread)


def test_no_stage_imports_the_override_engine_nor_the_registries_check():
    """``--set``, profiles, source defaults and the name check are the CLI's: editing them
    reruns no stage."""
    cli_only = {
        "tasks/params/overrides.py",
        "tasks/params/profiles.py",
        "tasks/params/names.py",
        "tasks/runtime/preflight.py",
        "tasks/params/source_defaults.py",
    }
    for stage, module in stage_modules().items():
        files = {p.relative_to(ROOT).as_posix() for p in import_closure(module)}
        assert not files & cli_only, (stage, files & cli_only)


def test_the_fine_tunes_do_not_depend_on_the_gates_nor_promote_schema():
    for stage in ("finetune_base", "finetune_baselines", "score_heads", "finetune_members"):
        files = {p.relative_to(ROOT).as_posix() for p in import_closure(f"tasks.{stage}")}
        assert not files & {"tasks/params/gates.py", "tasks/params/promote.py"}, stage
        assert ("tasks/params/baselines.py" in files) == (stage == "finetune_baselines"), stage
