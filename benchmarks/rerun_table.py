"""Which stages an edit reruns, measured with DVC itself on a finished project.

For each edited file: append a comment line to it in the project, ask ``dvc status --json`` which
stages changed, add every stage downstream of them (``dvc.yaml``: a stage whose deps include an
output of a rerun stage reruns too), restore the file byte for byte. The project is left as it was
(the edit is undone in a ``finally``). Run in a project after ``hydra-ens run`` (before and after a
restructure, to compare)::

    python -m benchmarks.rerun_table --project . --edit hydra_ops/uq/ood_criteria/base.py \\
        --edit tasks/params/schema.py --out rerun.json

A path that is not in the project is reported as ``missing`` (a module that moved).

Which stages an edit reruns depends on ``dvc.yaml``'s deps and outs alone, not on what the
outputs hold: ``--fill`` measures a fresh clone of any commit without running it, after giving it
a placeholder for every output it lacks and recording them in ``dvc.lock`` (``dvc commit -f``)::

    git clone -q . /tmp/at && git -C /tmp/at checkout -q COMMIT
    python -m benchmarks.rerun_table --project /tmp/at --fill --edit tasks/gate.py
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import typer
import yaml

from hydra_ops.atomic import atomic_write_bytes

app = typer.Typer(add_completion=False)
PROJECT_OPTION = typer.Option(Path("."), help="a project after `hydra-ens run`")
EDIT_OPTION = typer.Option(..., help="a file to edit, relative to the project")
OUT_OPTION = typer.Option(None, help="write the rows as JSON here")
FILL_OPTION = typer.Option(False, help="first give a fresh clone placeholder outputs (module doc)")


def downstream(dvc_yaml: dict[str, Any], changed: set[str]) -> list[str]:
    """``changed`` and every stage that depends, directly or not, on an output of one of them,
    in ``dvc.yaml``'s order."""
    stages = dvc_yaml["stages"]

    def outs(name: str) -> list[str]:
        return [next(iter(o)) if isinstance(o, dict) else o for o in stages[name].get("outs", [])]

    def deps(name: str) -> list[str]:
        return list(stages[name].get("deps", []))

    rerun, grew = set(changed), True
    while grew:
        grew = False
        produced = [p for s in rerun for p in outs(s)]
        for name in stages:
            if name in rerun:
                continue
            hit = (
                d == p or d.startswith(p.rstrip("/") + "/") for d in deps(name) for p in produced
            )
            if any(hit):
                rerun.add(name)
                grew = True
    return [s for s in stages if s in rerun]


def fill_outputs(project: Path) -> list[str]:
    """Give ``project`` every output ``dvc.yaml`` declares and it lacks (a file, or a folder
    holding one, saying which stage it stands for), then record them all in ``dvc.lock``
    (``dvc init`` first when the project has no ``.dvc``). Returns the outputs it made."""
    made = []
    for name, stage in yaml.safe_load((project / "dvc.yaml").read_text())["stages"].items():
        for entry in [*stage.get("outs", []), *stage.get("metrics", []), *stage.get("plots", [])]:
            out = next(iter(entry)) if isinstance(entry, dict) else entry
            path = project / out
            if path.exists():
                continue
            file = path / "placeholder.txt" if not Path(out).suffix else path
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text("{}\n" if file.suffix == ".json" else f"{name}\n")
            made.append(out)
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    if not (project / ".dvc").is_dir():
        subprocess.run(["dvc", "init", "-q"], cwd=project, check=True, env=env)
    subprocess.run(["dvc", "commit", "-f", "-q"], cwd=project, check=True, env=env)
    return made


def changed_stages(project: Path) -> set[str]:
    """The stages ``dvc status`` reports as changed."""
    out = subprocess.run(
        ["dvc", "status", "--json"],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "DVC_NO_ANALYTICS": "1"},
    )
    return {name.split(":")[-1] for name in json.loads(out.stdout or "{}")}


def rerun_of(project: Path, edit: str) -> dict[str, Any]:
    """What editing ``edit`` (relative to ``project``) reruns: ``{"edit", "changed", "rerun"}``."""
    path = project / edit
    if not path.is_file():
        return {"edit": edit, "missing": True}
    dvc_yaml = yaml.safe_load((project / "dvc.yaml").read_text())
    before = path.read_bytes()
    try:
        atomic_write_bytes(path, before + b"\n# rerun_table probe\n")
        changed = changed_stages(project)
    finally:
        atomic_write_bytes(path, before)
    return {"edit": edit, "changed": sorted(changed), "rerun": downstream(dvc_yaml, changed)}


@app.command()
def main(
    project: Path = PROJECT_OPTION,
    edit: list[str] = EDIT_OPTION,
    out: Path | None = OUT_OPTION,
    fill: bool = FILL_OPTION,
) -> None:
    if fill:
        typer.echo(f"placeholders for {len(fill_outputs(project))} outputs, recorded in dvc.lock")
    if changed_stages(project):
        raise typer.BadParameter("the project has stale stages already; run it first")
    rows = [rerun_of(project, e) for e in edit]
    for row in rows:
        rerun = "missing" if row.get("missing") else ", ".join(row["rerun"]) or "none"
        typer.echo(f"{row['edit']}: {rerun}")
    if out is not None:
        atomic_write_bytes(out, (json.dumps(rows, indent=1) + "\n").encode())


if __name__ == "__main__":
    app()
