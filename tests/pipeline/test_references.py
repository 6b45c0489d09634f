"""Every repository path and module the docs, docstrings and comments name exists.

What counts as a reference (precise patterns, so prose never matches):

- a path under a top-level folder of the repository (``hydra_ops/``, ``tasks/``, ``flows/``,
  ``tests/``, ``benchmarks/``, ``docs/``, ``examples/``) or a top-level file (``README.md``,
  ``CONTRIBUTING.md``, ``dvc.yaml``, ``params.yaml``, ``pyproject.toml``), not inside a longer
  path or URL: it must exist; one with ``*`` must match a file (a glob); one cut short by a
  placeholder (``tasks/<stage>.py``, ``{name}``), or written by a command (after ``--out``,
  ``--bundle`` or ``>``), only needs the folder it goes in to exist;
- a dotted module name rooted at a package of the repository (``tasks.params.resolve_params``),
  not a file name (``benchmarks.md``): its longest module prefix must exist, and the first name
  after it must be defined in that module (a def, class, assignment, import, a lazy export of
  its ``_EXPORTS``, or a module attribute such as ``__file__``);
- a Markdown link of a doc (``[text](study.md#results)``, not a URL): the file, relative to the
  doc, must exist, and the anchor must be a heading of it (GitHub's slugs).

Where: README.md, CONTRIBUTING.md and docs/*.md (all their text); the docstrings (every string
statement) and ``#`` comments of every Python file, and the ``#`` comments of the shell scripts and
YAML files of the repository. Nothing is allow-listed.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from functools import cache
from pathlib import Path

import pytest
from conftest import REPO

ROOTS = ("hydra_ops", "tasks", "flows", "tests", "benchmarks", "docs", "examples")
TOP_FILES = ("README.md", "CONTRIBUTING.md", "dvc.yaml", "params.yaml", "pyproject.toml")
PACKAGES = ("hydra_ops", "tasks", "flows", "benchmarks", "tests")
CODE_FOLDERS = ("hydra_ops", "tasks", "flows", "tests", "benchmarks", "examples")

PATH = re.compile(
    r"(?<![\w./\-~])((?:"
    + "|".join(ROOTS)
    + r")/[\w./*\-]*|"
    + "|".join(re.escape(f) for f in TOP_FILES)
    + r")(?![\w\-])"
)
MODULE = re.compile(r"(?<![\w./\-])((?:" + "|".join(PACKAGES) + r")(?:\.[A-Za-z_]\w*)+)")
#: Suffixes that make a dotted name a file name, not a module.
FILE_SUFFIXES = ("md", "py", "yaml", "yml", "json", "txt", "log", "toml", "sh", "bundle", "png")
#: What a path written by a command follows.
OUTPUT = re.compile(r"(?:--(?:out(?:put)?|bundle)[ =]|>\s*)$")


def doc_files() -> list[Path]:
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]


def code_files() -> list[Path]:
    files: list[Path] = []
    for folder in CODE_FOLDERS:
        for suffix in ("*.py", "*.sh", "*.yaml", "*.yml"):
            files += sorted((REPO / folder).rglob(suffix))
    return [*files, REPO / "dvc.yaml", REPO / "params.yaml", REPO / "Makefile"]


def _python_text(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every line of every string statement (docstrings) and ``#`` comment."""
    out = [
        (node.lineno + k, line)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for k, line in enumerate(node.value.value.splitlines())
    ]
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    out += [(t.start[0], t.string) for t in tokens if t.type == tokenize.COMMENT]
    return out


def texts(path: Path) -> list[tuple[int, str]]:
    source = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        return list(enumerate(source.splitlines(), 1))
    if path.suffix == ".py":
        return _python_text(source)
    return [(i, ln) for i, ln in enumerate(source.splitlines(), 1) if "#" in ln]


LINK = re.compile(r"\]\(([^)\s]+)\)")


@cache
def _anchors(doc: Path) -> frozenset[str]:
    """GitHub's slugs of a Markdown file's headings (``-1``, ``-2``... for repeats)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return frozenset(found)


def stale_links(doc: Path) -> list[str]:
    found = []
    for line, text in texts(doc):
        for m in LINK.finditer(text):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):  # a URL, mailto:...
                continue
            path, _, anchor = target.partition("#")
            linked = (doc.parent / path).resolve() if path else doc
            if not linked.exists() or (
                anchor and linked.suffix == ".md" and anchor not in _anchors(linked)
            ):
                found.append(f"{doc.relative_to(REPO)}:{line}: {target}")
    return found


def _comment(line: str) -> str:
    return line[line.index("#") :] if "#" in line else ""


def _path_exists(ref: str, text: str, end: int, start: int = 0) -> bool:
    if text[end : end + 1] in ("<", "{") or OUTPUT.search(text[:start]):
        return (REPO / ref.rsplit("/", 1)[0]).is_dir()  # the folder it goes in
    if "*" in ref:
        return any(REPO.glob(ref))
    return (REPO / ref.rstrip(".")).exists()


@cache
def _defined(module_file: Path) -> frozenset[str]:
    """Names a module defines at its top level, imports, or exports lazily (``_EXPORTS``)."""
    tree = ast.parse(module_file.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            if isinstance(node.value, ast.Dict) and any(
                isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in targets
            ):
                names.update(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    return frozenset(names)


def _module_exists(ref: str) -> bool:
    parts = ref.split(".")
    if parts[-1] in FILE_SUFFIXES:
        return True  # a file name, not a module: not a reference this pattern checks
    for i in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:i])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else None
        if module is None and (base / "__init__.py").is_file():
            module = base / "__init__.py"
        if module is None and i == 1 and base.is_dir():
            return len(parts) == 1 or (base / parts[1]).exists()  # a namespace folder
        if module is not None:
            rest = parts[i:]
            dunder = bool(rest) and rest[0].startswith("__") and rest[0].endswith("__")
            return not rest or dunder or rest[0] in _defined(module)
    return False


def stale_references(path: Path) -> list[str]:
    found = []
    for line, text in texts(path):
        if path.suffix not in (".md", ".py"):
            text = _comment(text)
        for m in PATH.finditer(text):
            if not _path_exists(m.group(1), text, m.end(1), m.start(1)):
                found.append(f"{path.relative_to(REPO)}:{line}: {m.group(1)}")
        for m in MODULE.finditer(text):
            if not _module_exists(m.group(1)):
                found.append(f"{path.relative_to(REPO)}:{line}: {m.group(1)}")
    return found


def test_the_patterns_find_what_they_should_and_no_prose():
    text = (
        "see tasks/params/names.py, `hydra_ops.data.catalog.DATA_SOURCES`, docs/study.md. and "
        "https://x.org/tasks/a.py, tasks and flows, tasks/<stage>.py, benchmarks/results/*.json"
    )
    assert [m.group(1) for m in PATH.finditer(text)] == [
        "tasks/params/names.py",
        "docs/study.md.",
        "tasks/",
        "benchmarks/results/*.json",
    ]
    assert [m.group(1) for m in MODULE.finditer(text)] == ["hydra_ops.data.catalog.DATA_SOURCES"]
    assert _module_exists("hydra_ops.data.catalog.DATA_SOURCES")
    assert _module_exists("tasks.params.resolve_params")  # a lazy export of tasks/params
    assert not _module_exists("tasks.common")
    assert not _module_exists("hydra_ops.uq.ood_criteria.OOD_SCORE_KINDS")
    assert _path_exists("docs/study.md.", "", 0) and not _path_exists("tasks/params.py", "", 0)
    assert _path_exists("tasks/", "tasks/<stage>.py", 6)
    out = "--out benchmarks/results/new.json"
    assert _path_exists("benchmarks/results/new.json", out, len(out), 6)
    assert not _path_exists(
        "benchmarks/nowhere/new.json", "--out benchmarks/nowhere/new.json", 0, 6
    )
    assert _module_exists("hydra_ops.__file__") and _module_exists("benchmarks.md")


def test_links_resolve_to_a_file_and_one_of_its_headings(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "a.md").write_text(
        "# Results (seeds 3-5)\n\n## `predict` and X\n\n## Results (seeds 3-5)\n"
    )
    (tmp_path / "b.md").write_text(
        "[ok](a.md#results-seeds-3-5) [again](a.md#results-seeds-3-5-1)\n"
        "[code](a.md#predict-and-x) [gone](a.md#results) [none](c.md)\n"
        "[web](https://example.org/x.md) [self](#nothing)\n"
    )
    assert stale_links(tmp_path / "b.md") == [
        "b.md:2: a.md#results",
        "b.md:2: c.md",
        "b.md:3: #nothing",
    ]


@pytest.mark.parametrize("kind", ["code", "docs"])
def test_every_named_path_and_module_exists(kind: str) -> None:
    files = code_files() if kind == "code" else doc_files()
    stale = [ref for path in files for ref in stale_references(path)]
    if kind == "docs":
        stale += [ref for path in files for ref in stale_links(path)]
    assert not stale, f"{len(stale)} references name nothing in the repository:\n" + "\n".join(
        stale
    )
