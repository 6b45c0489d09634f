"""What a person reads of DVC's own views of the pipeline: ``dvc exp show --only-changed`` after two
study points, and ``dvc dag``. A real git + DVC project with the repository's ``dvc.yaml`` and
``params.yaml``, no stage run: every dependency and output is a small stand-in file (DVC shows
their hashes, which change from point to point for outputs and stay for code, as in a study), the
metrics are written by the pipeline's own writer
(:func:`tasks.reports.key_metrics.write_key_metrics`), ``dvc commit`` writes the lock and ``dvc exp
save`` records two points as experiments: seven DVC processes in all, no model."""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, git

from tasks.reports.key_metrics import KEYS, LATENCY_KEY, write_key_metrics
from tasks.runtime.hardware import sync_choices
from tasks.runtime.layout import METRICS

#: Two points of a study (benchmarks/studies/text-evidence.yaml): variant overrides and the seed.
POINTS: dict[str, dict[str, Any]] = {
    "circuit-s0-seed1": {
        "seed": 1,
        "data.seed": 1,
        "scoring.method": "circuit",
        "merge.shared_layers": 0,
    },
    "taylor-half-seed2": {
        "seed": 2,
        "data.seed": 2,
        "scoring.method": "taylor",
        "merge.shared_layers": None,
    },
}
MODELS = ("hydra", "single", "naive_pruned", "deep_ensemble", "mc_dropout", "control")
#: What ``dvc exp show`` adds to a table (CSV; ``--only-changed`` leaves out those all equal); a
#: terminal shows Experiment and Created only.
BOOKKEEPING = ("Experiment", "rev", "typ", "Created", "parent")
#: The command docs/pipeline.md gives for a study's points: every column with a ``/`` dropped
#: (DVC's dependency hashes), leaving the metrics and the changed params.
DECIDING = ("exp", "show", "--only-changed", "--drop", ".*/")


def _paths(entries: list | None) -> list[str]:
    return [next(iter(e)) if isinstance(e, dict) else e for e in entries or []]


def write_stand_ins(root: Path, point: str, index: int) -> None:
    """Every path ``dvc.yaml`` names: outputs name the point (so their hash moves with it), code
    names itself (one commit's code at every point), the key metrics are the pipeline's files."""
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"].values()
    outs = {p for s in stages for k in ("outs", "metrics", "plots") for p in _paths(s.get(k))}
    paths = outs | {p for s in stages for p in _paths(s.get("deps"))}
    folders = {str(Path(p).parent) for p in paths} | {"metrics/key"}
    for rel in sorted(paths - folders):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'{{"point": "{point}"}}\n' if rel in outs else f"# {rel}\n")
    keys = {
        model: {
            key: round(0.5 + 0.1 * index + 0.01 * m + 0.001 * k, 4)
            for k, key in enumerate([*KEYS, LATENCY_KEY])
        }
        for m, model in enumerate(MODELS)
    }
    write_key_metrics(root / METRICS, keys)


def set_params(root: Path, sets: dict[str, Any]) -> None:
    params = yaml.safe_load((root / "params.yaml").read_text())
    for dotted, value in sets.items():
        *parents, leaf = dotted.split(".")
        node = params
        for key in parents:
            node = node[key]
        node[leaf] = value
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def dvc(root: Path, *args: str, columns: int = 2000) -> str:
    """``dvc ARGS`` in ``root`` (stdout), the terminal ``columns`` wide."""
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": str(columns), "DVC_NO_ANALYTICS": "1"}
    r = subprocess.run(
        [str(Path(sys.executable).parent / "dvc"), *args],
        cwd=root,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def study_project(root: Path, dvc_yaml: str) -> Path:
    """The project after a baseline commit and the two :data:`POINTS` saved as experiments."""
    root.mkdir(parents=True)
    (root / "dvc.yaml").write_text(dvc_yaml)
    shutil.copy2(REPO / "params.yaml", root / "params.yaml")
    sync_choices(root)  # the stages' hardware/choices.yaml, as the flow writes it before a run
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "tests@hydra-ens.invalid")
    git(root, "config", "user.name", "hydra-ens tests")
    dvc(root, "init", "-q")
    write_stand_ins(root, "baseline", 0)
    dvc(root, "commit", "-f", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "baseline")
    for i, (name, sets) in enumerate(POINTS.items(), start=1):
        set_params(root, sets)
        write_stand_ins(root, name, i)
        dvc(root, "exp", "save", "-q", "-n", name)  # commits the lock of every stage first
    return root


def columns(root: Path, *args: str) -> list[str]:
    """The columns of ``dvc ARGS --csv`` (``exp show``), bookkeeping included."""
    return next(csv.reader(io.StringIO(dvc(root, *args, "--csv"))))


def widest_line(text: str) -> int:
    return max(len(line.rstrip()) for line in text.splitlines())


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    return study_project(tmp_path_factory.mktemp("views") / "proj", (REPO / "dvc.yaml").read_text())


def test_exp_show_of_a_study_shows_the_hydras_numbers_and_the_changed_params(project):
    """The command the docs give shows the Hydra's seven key numbers, one short column each
    (headed by the key alone: no other metrics file has those keys, so no model's 42), and the
    four params the points changed; it fits 200 columns. (Without ``--drop``, DVC adds a column
    per output whose hash changed: 18 of them.)"""
    shown = columns(project, *DECIDING)
    data = [c for c in shown if c not in BOOKKEEPING]
    assert data == [*KEYS, LATENCY_KEY, *POINTS["circuit-s0-seed1"]], shown
    table = dvc(project, *DECIDING, "--no-pager")
    assert all(name in table for name in POINTS) and widest_line(table) <= 200, table


def test_docs_show_the_dag_that_dvc_draws(project):
    """docs/pipeline.md draws the DAG with ``dvc dag --md`` (a Mermaid chart, one line per stage
    and per edge): the same as DVC draws from dvc.yaml now."""
    drawn = dvc(project, "dag", "--md").strip()
    docs = (REPO / "docs" / "pipeline.md").read_text()
    found = re.search(r"```mermaid\n.*?\n```", docs, re.S)
    assert found and found.group(0) == drawn.replace("\t", "    ")
    assert widest_line(drawn) <= 60
