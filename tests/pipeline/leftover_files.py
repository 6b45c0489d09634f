"""What a killed run leaves next to a project's outputs, the real files beside them, and a project
folder to leave them in (shared by the tests of tasks.runtime.stage, tasks.runtime.dvcfiles,
tasks.runtime.outputs and the ignore files)."""

from __future__ import annotations

from pathlib import Path

from conftest import REPO

#: What a kill between the steps of an atomic write leaves, and must be ignored/removed
#: (a trailing ``/``: a folder).
LEFTOVERS = (
    "models/.base.old-0a1b2c3d/",  # replace_dir: old folder renamed aside
    "models/.base.tmp-k2j_4g5h/",  # publish_dir / save_model temp folder
    "metrics/.finetune_base.json.ab12cd34.tmp",  # write_text / write_json temp file
    "models/members/.member_1.tmp-abcd1234/",  # a unit's publish_dir temp folder
)
#: Real outputs and sources next to them, which must be neither ignored nor removed.
REAL = (
    "models/base/model.safetensors",
    "models/base/checkpoint.json",
    "models/basement/checkpoint.json",
    "models/members/member_1/done.json",
    "metrics/finetune_base.json",
    "tasks/runtime/stage.py",
    ".dvcignore",
)


def touch(root: Path, rel: str) -> Path:
    """A file holding ``x``, or (``rel`` ends with ``/``) a folder holding a partial file."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if rel.endswith("/"):
        path.mkdir()
        (path / "model.safetensors").write_text("partial")
    else:
        path.write_text("x")
    return path


def paths(rels) -> list[str]:
    return [rel.rstrip("/") for rel in rels]


def project_files(root: Path) -> Path:
    """``root`` with the project's dvc.yaml and a valid quick params.yaml (no git, no DVC)."""
    from tasks.params import resolve_params, write_params

    (root / "dvc.yaml").write_text((REPO / "dvc.yaml").read_text())
    write_params(resolve_params("quick", {}), root / "params.yaml")
    return root
