"""Which source files each DVC stage runs: the import closure of its ``python -m tasks.<stage>``.

A DVC stage reruns when a dependency's hash changes, so ``dvc.yaml`` lists, per stage, the code
the stage actually imports (no stage depends on the whole ``hydra_ops`` folder: an edit to the
metrics code reruns evaluate and what follows, not the fine-tunes). The closure is read from the
source with :mod:`ast`: every ``import``/``from ... import`` of a project module, at module level
or inside a function (a lazy import still runs), plus the ``__init__.py`` of every package on the
way. Imports by name count too: ``from pkg import name`` where ``pkg/__init__.py`` exports ``name``
lazily (its ``_EXPORTS = {name: module}`` table) imports that module, and a ``".module:Attr"``
string (a lazy :class:`~hydra_ops.registry.Registry` entry) imports ``module``, relative to the
string's package. ``tests/pipeline/test_stage_deps.py`` fails when ``dvc.yaml`` misses a file of
a closure; ``python -m tasks.runtime.stage_deps`` prints each stage's closure; ``--write`` puts it
in ``dvc.yaml``.
"""

from __future__ import annotations

import ast
import re
import sys
from functools import cache
from pathlib import Path

from tasks.runtime.dvcfiles import read_dvc_yaml

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("hydra_ops", "tasks")


def _module_file(name: str, root: Path) -> Path | None:
    """The file of a project module (``a.b`` -> ``a/b.py`` or ``a/b/__init__.py``)."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = root.joinpath(*name.split("."))
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    return None


def _package_inits(name: str, root: Path) -> set[Path]:
    parts = name.split(".")
    inits = set()
    for i in range(1, len(parts)):
        init = root.joinpath(*parts[:i], "__init__.py")
        if init.is_file():
            inits.add(init)
    return inits


def _lazy_exports(path: Path | None) -> dict[str, str]:
    """The ``_EXPORTS = {name: module}`` table of a package's ``__init__.py`` (empty if none)."""
    if path is None or path.name != "__init__.py":
        return {}
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets)
            and isinstance(node.value, ast.Dict)
        ):
            return {
                k.value: v.value
                for k, v in zip(node.value.keys, node.value.values, strict=True)
                if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)
            }
    return {}


def _resolve(package: str, level: int, module: str | None) -> str:
    """The absolute name of ``from <level dots><module> import ...`` inside ``package``."""
    if not level:
        return module or ""
    anchor = package.split(".")
    anchor = anchor[: len(anchor) - (level - 1)]
    return ".".join([*anchor, module] if module else anchor)


def _imported_modules(path: Path, module: str, root: Path) -> set[str]:
    """Project module names ``path`` (module ``module``) imports anywhere in its body."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(package, node.level, node.module)
            names.add(base)
            # ``from pkg import sub`` imports the submodule ``pkg.sub`` when there is one
            names.update(f"{base}.{alias.name}" for alias in node.names)
            exports = _lazy_exports(_module_file(base, root))
            names.update(exports[a.name] for a in node.names if a.name in exports)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and (match := _REGISTRY_PATH.fullmatch(node.value))
        ):
            names.add(_resolve(package, len(match["dots"]), match["module"]))
    return {n for n in names if n.split(".")[0] in PACKAGES}


#: ``".bert:BertAdapter"``: a class a registry imports by name, relative to its package.
_REGISTRY_PATH = re.compile(r"(?P<dots>\.+)(?P<module>\w+(?:\.\w+)*):\w+")


@cache
def import_closure(module: str, root: Path = ROOT) -> frozenset[Path]:
    """Every project source file that running ``module`` imports (itself included)."""
    seen: set[Path] = set()
    todo = [module]
    names_done: set[str] = set()
    while todo:
        name = todo.pop()
        if name in names_done:
            continue
        names_done.add(name)
        path = _module_file(name, root)
        if path is None:
            continue
        seen |= {path} | _package_inits(name, root)
        todo.extend(_imported_modules(path, name, root) - names_done)
        todo.extend(
            str(init.parent.relative_to(root)).replace("/", ".")
            for init in _package_inits(name, root)
        )
    return frozenset(seen)


def stage_modules(root: Path = ROOT) -> dict[str, str]:
    """``{stage: module}`` for every stage whose command is ``python -m <module>``."""
    modules = {}
    for name, stage in read_dvc_yaml(root).items():
        words = str(stage["cmd"]).split()
        if words[:2] == ["python", "-m"]:
            modules[name] = words[2]
    return modules


def missing_deps(root: Path = ROOT) -> dict[str, list[str]]:
    """``{stage: files of its closure that no code dep of dvc.yaml covers}``."""
    stages = read_dvc_yaml(root)
    missing = {}
    for name, module in stage_modules(root).items():
        deps = [Path(d) for d in stages[name].get("deps", [])]
        files = sorted(p.relative_to(root) for p in import_closure(module, root))
        uncovered = [str(f) for f in files if not any(f == d or d in f.parents for d in deps)]
        if uncovered:
            missing[name] = uncovered
    return missing


def code_deps(module: str, root: Path = ROOT) -> list[str]:
    """The closure of ``module`` as ``dvc.yaml`` deps: a package folder when the closure holds
    every source file of it, else the files."""
    files = {p.relative_to(root) for p in import_closure(module, root)}
    folders = sorted(
        {f.parent for f in files if f.parent != Path(".") and f.parent.name != "tasks"},
        key=lambda p: len(p.parts),
    )
    kept: list[Path] = []
    for folder in folders:
        if folder == Path("hydra_ops") or any(k in folder.parents for k in kept):
            continue
        if {p.relative_to(root) for p in (root / folder).rglob("*.py")} <= files:
            kept.append(folder)
    rest = [f for f in files if not any(k in f.parents for k in kept)]
    return [str(p) for p in sorted([*kept, *rest])]


def write_deps(root: Path = ROOT) -> list[str]:
    """Rewrite each stage's ``deps:`` in ``dvc.yaml``: its code closure, then its data deps (kept
    as they are). Returns the stages whose deps changed."""
    import textwrap

    path = root / "dvc.yaml"
    text = path.read_text()
    stages = read_dvc_yaml(root)
    changed = []
    for name, module in stage_modules(root).items():
        old = stages[name].get("deps", [])
        data = [d for d in old if not d.startswith(PACKAGES)]
        new = [*code_deps(module, root), *data]
        if new == old:
            continue
        block = re.search(rf"\n  {name}:\n.*?(?=\n  \w+:\n|\nartifacts:|\Z)", text, re.S)
        assert block is not None, name
        deps = re.search(r"    deps: \[.*?\]", block.group(0), re.S)
        assert deps is not None, name
        line = textwrap.fill(
            ", ".join(new),
            width=98,
            initial_indent="    deps: [",
            subsequent_indent=" " * 11,
            break_on_hyphens=False,
            break_long_words=False,
        )
        text = text.replace(block.group(0), block.group(0).replace(deps.group(0), line + "]"))
        changed.append(name)
    if changed:
        path.write_text(text)
    return changed


def main() -> None:
    if "--write" in sys.argv[1:]:
        changed = write_deps()
        print(f"dvc.yaml: deps rewritten for {', '.join(changed) or 'no stage'}")
        return
    for stage, module in stage_modules().items():
        print(f"{stage}:\n  deps: [{', '.join(code_deps(module))}]")


if __name__ == "__main__":
    main()
