"""Memory allocators side by side: glibc malloc as is, glibc tuned, tcmalloc, jemalloc.

An allocator is chosen when a process starts (``LD_PRELOAD``, ``GLIBC_TUNABLES``), so every
(allocator, workload) trial is its own child process; the trials run interleaved round-robin
(round 1: every allocator once, round 2: again, ...) so that a change in the machine's load
falls on all of them alike. Each child builds its workload, warms up, times ``--reps`` calls and
prints the median in ms; the parent reports per allocator the median over rounds and the ratio
to ``system``.

Workloads (MiniLM-L6, the packaged weights, fp32 eager, ``--threads`` torch threads):

* ``single``: the single model's forward, batch 32 x seq 64 (``torch.no_grad``).
* ``hydra``: the served default's shape: M = 3 members of 4 of 12 heads in layers 3-5 over a
  shared trunk of 3 layers, stack merge, same inputs.
* ``train``: one fine-tune step of the single model, batch 16 x seq 64, fused AdamW (what
  ``hydra_ops.training.fine_tune`` runs).

Allocators (:mod:`hydra_ops.allocators`): ``system`` (glibc malloc as is), ``glibc_tuned``
(``GLIBC_TUNABLES``: no mmap for large blocks and no trimming, so freed memory is reused instead
of being unmapped and page-faulted in again), ``tcmalloc`` / ``jemalloc`` (``LD_PRELOAD``; left
out when not installed). The parent's own ``LD_PRELOAD`` / ``GLIBC_TUNABLES`` are cleared for
the children, so ``system`` is glibc as is.

Usage: ``python -m benchmarks.allocators [--rounds 3] [--reps 10] [--out FILE.json]``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from hydra_ops.allocators import allocator_env

WORKLOADS = ("single", "hydra", "train")
COMPARED = ("system", "glibc_tuned", "tcmalloc", "jemalloc")


def installed_allocators() -> dict[str, dict[str, str]]:
    """``{allocator: environment additions}`` for each of :data:`COMPARED` usable here."""
    envs = {}
    for name in COMPARED:
        try:
            envs[name] = allocator_env(name, environ={})[0]
        except ValueError as err:
            print(f"[allocators] left out: {err}", file=sys.stderr)
    return envs


def _child(workload: str, reps: int, threads: int) -> float:
    """Median ms of ``reps`` calls of ``workload`` after two warm-up calls."""
    import torch

    from benchmarks.workloads import MODELS, make_inputs, make_members
    from hydra_ops.merge import merge_members

    torch.set_num_threads(threads)
    spec = MODELS["minilm"]
    base = spec.build()
    if workload == "train":
        ids, mask = make_inputs(spec, 16, 64, torch.device("cpu"), torch.float32)
        labels = torch.arange(16) % 4
        base.train()
        opt = torch.optim.AdamW(base.parameters(), lr=1e-5, fused=True)

        def call() -> None:
            loss = base(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    else:
        ids, mask = make_inputs(spec, 32, 64, torch.device("cpu"), torch.float32)
        if workload == "hydra":
            members = make_members(base, spec, 3, shared_layers=3)
            model = merge_members(members, mode="stack", shared_layers=3).eval()

            def forward() -> object:
                return model(ids, mask)

        else:

            def forward() -> object:
                return base(input_ids=ids, attention_mask=mask).logits

        def call() -> None:
            with torch.no_grad():
                forward()

    for _ in range(2):
        call()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _trial(allocator: dict[str, str], workload: str, reps: int, threads: int) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "GLIBC_TUNABLES")}
    env = {**env, "HYDRA_ENS_MALLOC": "system", **allocator}
    cmd = [sys.executable, "-m", "benchmarks.allocators", "--child", workload]
    cmd += ["--reps", str(reps), "--threads", str(threads)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{workload} with {allocator}: {out.stderr.strip().splitlines()[-1]}")
    return float(out.stdout.strip().splitlines()[-1])


def main(
    rounds: Annotated[int, typer.Option(min=1, help="interleaved rounds")] = 3,
    reps: Annotated[int, typer.Option(min=1, help="timed calls per trial")] = 10,
    threads: Annotated[int, typer.Option(min=1, help="torch threads")] = 2,
    workloads: Annotated[str, typer.Option(help="comma list of " + ", ".join(WORKLOADS))] = (
        ",".join(WORKLOADS)
    ),
    out: Annotated[Path | None, typer.Option(help="write the results as JSON here")] = None,
    child: Annotated[str | None, typer.Option(hidden=True)] = None,
) -> None:
    """Time each workload under each installed allocator, interleaved, one process per trial."""
    if child:
        print(f"{_child(child, reps, threads):.3f}")
        return
    chosen = [w.strip() for w in workloads.split(",") if w.strip()]
    if unknown := sorted(set(chosen) - set(WORKLOADS)):
        raise typer.BadParameter(f"unknown workload(s) {unknown}; allowed: {', '.join(WORKLOADS)}")
    envs = installed_allocators()
    trials: dict[str, dict[str, list[float]]] = {w: {a: [] for a in envs} for w in chosen}
    for r in range(rounds):
        for workload in chosen:
            for name, env in envs.items():
                ms = _trial(env, workload, reps, threads)
                trials[workload][name].append(ms)
                print(f"[allocators] round {r + 1}/{rounds} {workload:6s} {name:11s} {ms:8.1f} ms")
    load = os.getloadavg()
    print(f"\nload average at the end: {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f}")
    print("| workload | allocator | median ms over rounds | per round | x system |")
    print("|---|---|---|---|---|")
    summary: dict[str, dict[str, dict[str, object]]] = {}
    for workload, by_alloc in trials.items():
        ref = statistics.median(by_alloc["system"])
        for name, values in by_alloc.items():
            med = statistics.median(values)
            summary.setdefault(workload, {})[name] = {
                "median_ms": med,
                "rounds_ms": values,
                "ratio_to_system": med / ref,
            }
            per_round = ", ".join(f"{v:.0f}" for v in values)
            print(f"| {workload} | {name} | {med:.1f} | {per_round} | {med / ref:.2f} |")
    if out:
        record = {
            "allocators": {name: env for name, env in envs.items()},
            "threads": threads,
            "reps": reps,
            "load_average_end": load,
            "results": summary,
        }
        out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    typer.run(main)
