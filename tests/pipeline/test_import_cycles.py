"""No import circle among the project's modules (``hydra_ops``, ``tasks``, ``flows``), counting an
import inside a function as much as one at the top of a module: a lazy import still runs, and a
circle means two modules whose jobs are not separated."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

from tasks.runtime.layout import STAGES

PACKAGES = ("hydra_ops", "tasks", "flows")
#: The packages of ``tasks/``, each importing only those before it (docs/architecture.md).
TASKS_LAYERS = (
    "params",
    "runtime",
    "evaluation",
    "release",
    "candidates",
    "gates",
    "reports",
    "serving",
)


def _modules(root: Path) -> dict[str, Path]:
    """``{dotted name: file}`` of every module of :data:`PACKAGES` under ``root``."""
    found = {}
    for top in PACKAGES:
        for path in sorted((root / top).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the import nodes under ``if TYPE_CHECKING:`` (never run)."""
    skipped = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(test):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skipped


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its body. ``from pkg import sub`` imports
    the submodule ``pkg.sub`` when there is one, else (a name) ``pkg`` itself; a package's
    ``__init__`` running before its submodules is not an edge (every import of a submodule runs
    it, and a package that re-exports its modules is not a circle)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = _type_checking_only(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m in known and m != name}


def cycles(root: Path) -> list[list[str]]:
    """The import circles (strongly connected components of more than one module, or a module
    importing itself) among the project's modules, each sorted."""
    known = _modules(root)
    graph = {name: imports(name, path, known) for name, path in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_circle_among_the_project_modules():
    assert cycles(REPO) == []


def test_tasks_packages_import_down_their_layers_and_no_stage():
    """A package of ``tasks/`` imports only the packages before it in :data:`TASKS_LAYERS`, and
    no stage: the stages sit on top of the packages, and the top level holds only them."""
    known = _modules(REPO)
    stages = {f"tasks.{s}" for s in STAGES}
    top = {n for n in known if n.count(".") == 1 and n.startswith("tasks.")}
    assert top - stages == {f"tasks.{p}" for p in TASKS_LAYERS}
    wrong = []
    for name, path in known.items():
        parts = name.split(".")
        if parts[0] != "tasks" or len(parts) < 3:
            continue
        layer = TASKS_LAYERS.index(parts[1])
        for target in imports(name, path, known):
            to = target.split(".")
            if target in stages or (
                len(to) > 1 and to[1] in TASKS_LAYERS and TASKS_LAYERS.index(to[1]) > layer
            ):
                wrong.append(f"{name} -> {target}")
    assert wrong == []


def test_a_circle_through_a_function_level_import_is_found(tmp_path: Path):
    for top in PACKAGES:
        (tmp_path / top).mkdir()
        (tmp_path / top / "__init__.py").write_text("")
    (tmp_path / "tasks" / "a.py").write_text("from tasks.b import x\n")
    (tmp_path / "tasks" / "b.py").write_text("x = 1\n\ndef f():\n    from tasks import a\n")
    (tmp_path / "flows" / "c.py").write_text("from . import d\n")
    (tmp_path / "flows" / "d.py").write_text("def g():\n    import flows.c\n")
    (tmp_path / "hydra_ops" / "e.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hydra_ops import f\n"
    )
    (tmp_path / "hydra_ops" / "f.py").write_text("from hydra_ops import e\n")
    (tmp_path / "hydra_ops" / "g").mkdir()  # a package re-exporting its module: no circle ...
    (tmp_path / "hydra_ops" / "g" / "__init__.py").write_text("from hydra_ops.g.h import y\n")
    (tmp_path / "hydra_ops" / "g" / "h.py").write_text("from hydra_ops.g import k\ny = 1\n")
    (tmp_path / "hydra_ops" / "g" / "k.py").write_text("")
    assert cycles(tmp_path) == [["flows.c", "flows.d"], ["tasks.a", "tasks.b"]]
    # ... until the module imports a name of the package, which its __init__ imports from it
    (tmp_path / "hydra_ops" / "g" / "k.py").write_text("def z():\n    from hydra_ops.g import y\n")
    assert ["hydra_ops.g", "hydra_ops.g.h", "hydra_ops.g.k"] in cycles(tmp_path)
