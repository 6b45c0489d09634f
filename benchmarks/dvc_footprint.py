"""Disk footprint of a run's artifacts, DVC's default cache (copies) against linked outputs.

A DVC project with the default pipeline's output graph and sizes (``STAGES``: the megabytes each
model stage of ``hydra-ens run``'s default writes, MiniLM-L6 checkpoints of ~87 MB; ``--scale``
shrinks them all alike) and stages that write random bytes instead of training, run with real
DVC and git, twice per mode:

- ``before``: what a project got until now: DVC's default ``cache.type`` (``reflink,copy``; on a
  disk without reflinks, copies) and ``dvc push`` to the project's ``local`` remote
  (``.dvc-remote/``, the same disk);
- ``after``: :func:`flows.dvcops.ensure_project`'s cache links (:mod:`flows.dvclinks`) and
  :func:`flows.dvcops.push` (the local remote hard-linked to the cache).

Each mode runs the pipeline and pushes (``first``), then changes one param that reruns the
member fine-tunes and everything after them and runs and pushes again (``second``). The
footprint is counted like ``du``: allocated blocks of every file under the project, a file with
several hard links once, split by where its first name lies (workspace, cache, remote).

    python -m benchmarks.dvc_footprint --out benchmarks/results/dvc_footprint.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flows import dvcops

#: (stage, output, megabytes, depends on, param it reads): the default run's model outputs.
STAGES = [
    ("finetune_base", "models/base", 87, [], "seed"),
    ("finetune_baselines", "models/baselines", 174, ["models/base"], "seed"),
    ("baseline_logits", "artifacts/baseline_logits", 2, ["models/baselines"], "seed"),
    ("finetune_members", "models/members", 390, ["models/base"], "member_seed"),
    ("merge", "models/merged", 110, ["models/members"], "member_seed"),
    ("calibrate", "models/hydra", 110, ["models/merged"], "member_seed"),
    ("compile", "models/compiled", 110, ["models/hydra"], "member_seed"),
    ("bundle", "models/bundle", 220, ["models/compiled"], "member_seed"),
]

WRITE = (
    "import os, random, sys, pathlib; out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True); "
    "random.seed(sys.argv[3]); size = int(float(sys.argv[2]) * 2**20); "
    "f = open(out / 'model.bin', 'wb'); "
    "[f.write(random.randbytes(min(2**24, size - i))) for i in range(0, size, 2**24)]; f.close()"
)


def _dvc_yaml(scale: float) -> str:
    lines = ["stages:"]
    for name, out, mb, deps, param in STAGES:
        cmd = f'{sys.executable} -c "{WRITE}" {out} {mb * scale} ${{{param}}}-{name}'
        lines += [f"  {name}:", f"    cmd: {cmd}", f"    params: [{param}]"]
        if deps:
            lines.append(f"    deps: [{', '.join(deps)}]")
        lines.append(f"    outs: [{out}]")
    return "\n".join(lines) + "\n"


def footprint(root: Path) -> dict[str, int]:
    """Allocated bytes under ``root`` by area, each inode counted once (``du``'s rule)."""
    areas = {"workspace": 0, "cache": 0, "remote": 0}
    seen: set[tuple[int, int]] = set()
    cache, remote = root / ".dvc" / "cache", root / dvcops.REMOTE_DIR
    for base, _, files in os.walk(root):
        if "/.git" in base[len(str(root)) :]:
            continue
        for name in files:
            path = Path(base) / name
            st = path.lstat()
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            area = (
                "cache"
                if path.is_relative_to(cache)
                else "remote"
                if path.is_relative_to(remote)
                else "workspace"
            )
            areas[area] += st.st_blocks * 512
    areas["total"] = sum(areas.values())
    return areas


def run_mode(mode: str, scale: float, workdir: Path) -> dict[str, object]:
    root = workdir / mode
    root.mkdir()
    (root / "dvc.yaml").write_text(_dvc_yaml(scale))
    (root / "params.yaml").write_text("seed: 0\nmember_seed: 0\n")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    dvcops.dvc(root, "init", "-q")
    if mode == "after":
        done = dvcops.ensure_project(root)
    else:
        dvcops.dvc(root, "remote", "add", "-d", dvcops.REMOTE_NAME, dvcops.REMOTE_DIR)
        done = ["dvc remote local (DVC's default cache.type)"]
    result: dict[str, object] = {"setup": done}
    for label in ("first", "second"):
        if label == "second":
            (root / "params.yaml").write_text("seed: 0\nmember_seed: 1\n")
        t0 = time.perf_counter()
        dvcops.dvc(root, "repro", "-q")
        pushed = dvcops.push(root) if mode == "after" else dvcops.dvc(root, "push", "-q").stdout
        result[label] = {
            **footprint(root),
            "seconds": round(time.perf_counter() - t0, 1),
            "push": pushed or "pushed",
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="output size factor")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    outputs_mb = sum(stage[2] for stage in STAGES)
    report: dict[str, object] = {
        "scale": args.scale,
        "outputs_mb_per_run": round(outputs_mb * args.scale, 1),
    }
    with tempfile.TemporaryDirectory(prefix="hydra-ens-footprint-") as tmp:
        for mode in ("before", "after"):
            report[mode] = run_mode(mode, args.scale, Path(tmp))
    mb = 2**20
    for label in ("first", "second"):
        b, a = report["before"][label], report["after"][label]  # type: ignore[index]
        report[f"{label}_ratio_after_over_before"] = round(a["total"] / b["total"], 3)
        print(
            f"{label} run: before {b['total'] / mb:.0f} MiB (workspace {b['workspace'] / mb:.0f}, "
            f"cache {b['cache'] / mb:.0f}, remote {b['remote'] / mb:.0f}); after "
            f"{a['total'] / mb:.0f} MiB (workspace {a['workspace'] / mb:.0f}, cache "
            f"{a['cache'] / mb:.0f}, remote {a['remote'] / mb:.0f})"
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
