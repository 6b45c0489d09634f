"""What compile's eager probe saves, side by side: ``compile: auto`` with and without it.

On a finished project (a default run's ``models/hydra`` and its hardware record), each round runs
the compile stage's call of :func:`hydra_ops.compile.compile_model` twice, each in a fresh process
with an empty inductor cache (``TORCHINDUCTOR_CACHE_DIR``) and no measurement history, so both start
as on a new machine: ``every`` builds and times every candidate (``eager_ms=None``, what compile did
before), ``probe`` passes :func:`tasks.compile.eager_precision_ms` (the inference precision probe,
read back from the project's hardware record) and so builds a precision whose eager forward is >= 2x
slower only if nothing faster agrees. The order alternates between rounds. Per run: wall seconds of
the call, the candidates built and deferred, each one's timing, and what shipped. The project
(``compile.backend: auto``) is only read (artifacts go to a temporary folder).

    python -m benchmarks.compile_probe --project /tmp/run/project --rounds 1 \\
        --out benchmarks/results/cpu_amx/compile_probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.rounds import alternating, fail, median_seconds, publish, run_child

MODES = ("every", "probe")


def compile_once(project: Path, mode: str) -> dict[str, Any]:
    """One ``compile: auto`` of ``project``'s calibrated Hydra (in this process)."""
    from hydra_ops.hydra.serialization import load_hydra
    from tasks import compile as stage
    from tasks.params.files import load_as
    from tasks.runtime.layout import HYDRA
    from tasks.runtime.stage import set_threads

    set_threads()
    cfg = load_as(stage.SCHEMA, project / "params.yaml")
    hydra = load_hydra(project / HYDRA)
    example, heldout = stage.check_batches(cfg, project)
    eager_ms = stage.eager_precision_ms(cfg, project, hydra) if mode == "probe" else None
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        artifact = stage.build_artifact(cfg, hydra, example, heldout, Path(out), eager_ms=eager_ms)
        seconds = time.perf_counter() - t0
    selection = artifact.get("auto_selection") or {}
    return {
        "mode": mode,
        "seconds": round(seconds, 2),
        "eager_ms": eager_ms,
        "built": sorted(selection.get("trials", {})),
        "deferred": sorted(selection.get("skipped_candidates", {})),
        "shipped": f"{artifact['backend']}/{artifact['precision']}",
        "trials": {
            k: {f: t.get(f) for f in ("median_ms", "build_and_time_seconds", "ok")}
            for k, t in selection.get("trials", {}).items()
        },
    }


def _child(project: Path, mode: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "benchmarks.compile_probe", "--project", str(project)]
    with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        proc = run_child([*argv, "--child", mode], f"compile_probe {mode}", env=env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--project", type=Path, required=True, help="a finished project")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    project = args.project.resolve()
    if args.rounds < 1:
        fail(f"--rounds must be >= 1, got {args.rounds}")
    if not (project / "models" / "hydra").is_dir() or not (project / "params.yaml").is_file():
        fail(f"{project}: no models/hydra and params.yaml (run the pipeline there first)")
    if args.child:
        print(json.dumps(compile_once(project, args.child)))
        return
    from tasks import compile as stage
    from tasks.params.files import load_as

    backend = load_as(stage.SCHEMA, project / "params.yaml").compile.backend
    if backend != "auto":
        fail(f"{project}: compile.backend is {backend!r}; the probe defers candidates of auto")
    runs = []
    for r, mode in alternating(MODES, args.rounds):
        runs.append(_child(project, mode))
        print(f"[compile_probe] round {r}: {mode} {runs[-1]['seconds']} s", flush=True)
    seconds = median_seconds(runs, MODES)
    result = {
        "project": "<project>",
        "rounds": args.rounds,
        "median_seconds": seconds,
        "every_over_probe": round(seconds["every"] / seconds["probe"], 2),
        "runs": runs,
    }
    publish(result, args.out)


if __name__ == "__main__":
    main()
