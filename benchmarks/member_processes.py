"""What training the members in the stage's own process saves, side by side with a process each.

On a finished project whose variant fine-tunes members (the default, Taylor), each round builds
``models/members`` from nothing twice, the way the flow does it:

- ``per_member``: ``python -m tasks.finetune_members --member m`` for every member, one after
  another (the flow's mapped member tasks with ``members.finetune.max_parallel: 1``, before this
  benchmark's release), then ``python -m tasks.finetune_members``, which verifies the units by
  hash and writes the index (what the stage's ``dvc repro`` ran next);
- ``in_stage``: ``python -m tasks.finetune_members`` alone (the flow now, with ``max_parallel``
  1).

Every process gets the flow's environment (:func:`flows.dvcops.subprocess_env`: offline, the
stage processes' allocator). The order alternates between rounds. Per run: wall seconds, each
process's seconds, and the md5 of every file written, so the two ways are checked to build the
same members. The project's ``models/members`` is set aside first and put back at the end (also
after a failure); nothing else of it is written but its hardware record (``hardware/``).

    python -m benchmarks.member_processes --project /tmp/run/project --rounds 2 \\
        --out benchmarks/results/cpu_amx/member_processes.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.rounds import alternating, fail, median_seconds, publish, run_child

MODES = ("per_member", "in_stage")
MEMBERS = Path("models/members")


def _stage(project: Path, *args: str) -> float:
    """Seconds of one ``python -m tasks.finetune_members ARGS`` in ``project``."""
    from flows.dvcops import subprocess_env

    t0 = time.perf_counter()
    argv = [sys.executable, "-m", "tasks.finetune_members", *args]
    run_child(argv, " ".join(argv[2:]), cwd=project, env=subprocess_env())
    return round(time.perf_counter() - t0, 2)


def file_md5s(folder: Path) -> dict[str, str]:
    """``{relative path: md5}`` of the files below ``folder``."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return {
        p.relative_to(folder).as_posix(): hashlib.md5(p.read_bytes()).hexdigest() for p in files
    }


def build_once(project: Path, mode: str, members: int) -> dict[str, Any]:
    """``models/members`` built from nothing by ``mode``; removed again afterwards."""
    shutil.rmtree(project / MEMBERS, ignore_errors=True)
    t0 = time.perf_counter()
    if mode == "per_member":
        processes = [_stage(project, "--member", str(m)) for m in range(members)]
        processes.append(_stage(project))
    else:
        processes = [_stage(project)]
    seconds = round(time.perf_counter() - t0, 2)
    md5s = file_md5s(project / MEMBERS)
    shutil.rmtree(project / MEMBERS)
    return {"mode": mode, "seconds": seconds, "processes": processes, "md5s": md5s}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--project", type=Path, required=True, help="a finished project")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    project = args.project.resolve()
    if args.rounds < 1:
        fail(f"--rounds must be >= 1, got {args.rounds}")
    if not (project / MEMBERS / "index.json").is_file() or not (project / "params.yaml").is_file():
        fail(f"{project}: no models/members/index.json and params.yaml (run the pipeline first)")
    from tasks.params.schema import load_params

    cfg = load_params(project / "params.yaml")
    if not cfg.finetune_members:
        fail(f"{project}: its variant fine-tunes no members (scoring.method {cfg.scoring.method})")
    kept = project / "models" / ".members.benchmark-original"
    if kept.exists():
        fail(f"{kept} exists: an earlier run of this benchmark was stopped; put it back first")
    (project / MEMBERS).rename(kept)
    runs = []
    try:
        for r, mode in alternating(MODES, args.rounds):
            runs.append(build_once(project, mode, cfg.members.num_members))
            print(f"[member_processes] round {r}: {mode} {runs[-1]['seconds']} s", flush=True)
    finally:
        shutil.rmtree(project / MEMBERS, ignore_errors=True)
        kept.rename(project / MEMBERS)
    seconds = median_seconds(runs, MODES)
    result = {
        "project": "<project>",
        "members": cfg.members.num_members,
        "rounds": args.rounds,
        "median_seconds": seconds,
        "per_member_over_in_stage": round(seconds["per_member"] / seconds["in_stage"], 3),
        "same_files": len({json.dumps(x["md5s"], sort_keys=True) for x in runs}) == 1,
        "runs": [{k: v for k, v in x.items() if k != "md5s"} for x in runs],
    }
    publish(result, args.out)


if __name__ == "__main__":
    main()
