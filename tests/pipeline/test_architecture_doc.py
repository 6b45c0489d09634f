"""docs/architecture.md's module tables match the code: every module of ``hydra_ops/``, ``tasks/``
and ``flows/`` has a row (its own, its package's or, for a stage, the stages' row), and every
module a row names exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO

from tasks.runtime.layout import STAGES

DOC = REPO / "docs" / "architecture.md"
#: The doc's module sections: (heading, the folder its table's names are relative to).
TABLES = (
    ("## `hydra_ops/` modules", "hydra_ops"),
    ("## `tasks/` modules", "tasks"),
    ("### `tasks/params/`", "tasks/params"),
    ("## `flows/` modules", "flows"),
)


def _tables() -> dict[str, set[str]]:
    """``{folder: the module names its section's table rows name in their first cell}``."""
    lines = DOC.read_text().splitlines()
    named: dict[str, set[str]] = {}
    for heading, folder in TABLES:
        start = next(i for i, line in enumerate(lines) if line.startswith(heading))
        rows = []
        for line in lines[start + 1 :]:
            if line.startswith("#"):
                break
            if line.startswith("| `"):
                rows.append(line.split("|")[1])
        named[folder] = set(re.findall(r"`([\w./]+)`", " ".join(rows)))
    return named


def _covered(rel: str, names: set[str]) -> bool:
    parents = [p.as_posix() + "/" for p in Path(rel).parents if p.as_posix() != "."]
    if rel in names or any(p in names for p in parents):
        return True
    if rel.endswith("__init__.py"):  # a package is documented by its modules' rows
        return not parents or any(n.startswith(parents[0]) for n in names)
    return False


@pytest.mark.parametrize("folder", ["hydra_ops", "tasks", "flows"])
def test_every_module_has_a_row(folder: str) -> None:
    tables = _tables()
    missing = []
    for path in sorted((REPO / folder).rglob("*.py")):
        rel = path.relative_to(REPO / folder).as_posix()
        sub = [
            f
            for f in tables
            if f.startswith(folder + "/") and rel.startswith(f[len(folder) + 1 :] + "/")
        ]
        names = tables[folder] | {f"{f[len(folder) + 1 :]}/{n}" for f in sub for n in tables[f]}
        if _covered(rel, names) or (folder == "tasks" and path.stem in STAGES):
            continue
        missing.append(rel)
    assert not missing, f"docs/architecture.md has no row for {folder}/: {missing}"


def test_every_module_a_row_names_exists() -> None:
    stale = [
        f"{folder}/{name}"
        for folder, names in _tables().items()
        for name in names
        if (name.endswith(".py") or name.endswith("/"))
        and not (REPO / folder / name.rstrip("/")).exists()
    ]
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"


def test_the_stages_row_lists_the_stages_in_order() -> None:
    row = next(
        line
        for line in DOC.read_text().splitlines()
        if "the 15 stages" in line or "stages, in `dvc.yaml` order" in line
    )
    listed = re.findall(r"\b([a-z_]+)\b", row.split("order:")[-1])
    assert [s for s in listed if s in STAGES] == list(STAGES)
