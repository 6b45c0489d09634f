"""A model stage's start in a fresh interpreter against forked from a warm process
(:mod:`flows.warm`), side by side.

Each trial runs, in a temp copy of the project's code, what a DVC stage runs
(``python -m tasks.<module>``) for a probe module written there; the probe imports what a model
stage imports before its work (``--imports``: by default the ``calibrate`` stage's module and the
BERT adapter, which pull in torch and transformers' modeling code) and exits. ``fresh`` runs the
real interpreter; ``warm`` runs the ``python`` a run puts on its stages' ``PATH``, answered by
one warm process started before the rounds (its own start-up, paid once per run, is reported
apart). The trials alternate
(fresh, warm, fresh, ...) so a change in the machine's load falls on both.

Per trial: wall time from the command's start to its end, as ``dvc repro`` sees it, and CPU time
(the command's process, and for ``warm`` the forked stage's own). Reported: the medians and the
ratios warm / fresh.

Usage: ``python -m benchmarks.warm_stages [--rounds 5] [--imports a,b] [--out FILE.json]``.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from flows.warm import PRELOAD, warm_stages
from hydra_ops.measurements import machine_kind

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_IMPORTS = "tasks.calibrate,hydra_ops.adapters.bert"
PROBE = """import importlib, time
for name in {imports!r}:
    importlib.import_module(name)
print(time.process_time())
"""


def _project(dest: Path, imports: list[str]) -> Path:
    skip = shutil.ignore_patterns("__pycache__")
    for package in ("hydra_ops", "tasks"):
        shutil.copytree(ROOT / package, dest / package, ignore=skip)
    (dest / "tasks" / "warm_probe.py").write_text(PROBE.format(imports=imports))
    return dest


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def trial(project: Path, env: dict[str, str], forked: bool) -> dict[str, float]:
    """One probe run: its wall and CPU seconds."""
    python = "python" if forked else sys.executable
    cpu0, t0 = _children_cpu(), time.perf_counter()
    done = subprocess.run(
        [python, "-m", "tasks.warm_probe"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if forked:
        cpu += float(done.stdout.split()[-1])  # the forked stage's own, counted by the server
    return {"wall_s": wall, "cpu_s": cpu}


def measure(rounds: int, imports: list[str], preload: tuple[str, ...]) -> dict:
    with tempfile.TemporaryDirectory(prefix="warm-stages-") as tmp:
        project = _project(Path(tmp), imports)
        env = {**os.environ, "PYTHONPATH": str(project), "HYDRA_ENS_PROGRESS": "0"}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        trial(project, env, forked=False)  # bytecode written once, outside the rounds
        t0 = time.perf_counter()
        with warm_stages(env, preload=preload) as extra:
            if not extra:
                raise SystemExit("error: warm stages are unavailable here")
            warm_env = {**env, **extra}
            first = trial(project, warm_env, forked=True)  # waits for the server's imports
            start_s = time.perf_counter() - t0
            runs: dict[str, list[dict[str, float]]] = {"fresh": [], "warm": []}
            for i in range(rounds):
                print(f"[warm_stages] round {i + 1}/{rounds}", file=sys.stderr, flush=True)
                runs["fresh"].append(trial(project, env, forked=False))
                runs["warm"].append(trial(project, warm_env, forked=True))
    medians = {
        kind: {k: statistics.median(r[k] for r in rows) for k in ("wall_s", "cpu_s")}
        for kind, rows in runs.items()
    }
    return {
        "imports": imports,
        "preload": list(preload),
        "rounds": rounds,
        "machine": {k: v for k, v in machine_kind().items() if k in ("cpu", "cpu_flags", "cpus")},
        "server_start_and_first_stage_s": round(start_s, 3),
        "first_warm_stage": first,
        "medians": medians,
        "ratios_warm_to_fresh": {
            k: round(medians["warm"][k] / medians["fresh"][k], 4) for k in ("wall_s", "cpu_s")
        },
        "trials": runs,
    }


def main(
    rounds: Annotated[int, typer.Option(min=1, help="fresh/warm pairs")] = 5,
    imports: Annotated[str, typer.Option(help="modules the probe imports")] = DEFAULT_IMPORTS,
    preload: Annotated[str, typer.Option(help="modules the warm process imports")] = ",".join(
        PRELOAD
    ),
    out: Annotated[Path | None, typer.Option(help="write the record here (JSON)")] = None,
) -> None:
    """A model stage's start, fresh against warm, side by side."""
    if out is not None and not out.parent.is_dir():
        print(f"error: --out: {out.parent} is not a folder", file=sys.stderr)
        raise SystemExit(2)
    names = [m for m in imports.split(",") if m]
    record = measure(rounds, names, tuple(m for m in preload.split(",") if m))
    med, ratio = record["medians"], record["ratios_warm_to_fresh"]
    print(
        f"fresh {med['fresh']['wall_s']:.2f} s wall, {med['fresh']['cpu_s']:.2f} s CPU; "
        f"warm {med['warm']['wall_s']:.2f} s wall, {med['warm']['cpu_s']:.2f} s CPU; "
        f"warm / fresh: wall {ratio['wall_s']:.3f}, CPU {ratio['cpu_s']:.3f}; "
        f"the warm process's start and its first stage: "
        f"{record['server_start_and_first_stage_s']:.2f} s"
    )
    if out is not None:
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        tmp.replace(out)


if __name__ == "__main__":
    typer.run(main)
