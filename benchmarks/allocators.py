"""Memory allocators side by side: glibc malloc as is, glibc tuned, tcmalloc, jemalloc.

An allocator is chosen when a process starts (``LD_PRELOAD``, ``GLIBC_TUNABLES``), so every
(allocator, workload) trial is its own child process; the trials run interleaved round-robin
(round 1: every allocator once, round 2: again, ...) so that a change in the machine's load
falls on all of them alike. Each child builds its workload, warms up, times ``--reps`` calls and
prints the median wall and CPU ms (CPU: all threads, user + system; page faults are system time,
and CPU time is less sensitive than wall time to another process on the machine); the parent
reports per allocator the median over rounds and the ratio to ``system``.

Workloads (``--model``: MiniLM-L6 with the packaged weights, or ``tiny_bert`` for a smoke run;
fp32 eager, ``--threads`` torch threads):

* ``single``: the single model's forward, batch 32 x seq 64 (``torch.no_grad``).
* ``hydra``: the served default's shape: M = 3 members of 1/3 of the heads of each layer after a
  shared trunk of L/2 layers (MiniLM: 4 of 12 heads in layers 3-5), stack merge, same inputs.
* ``train``: one fine-tune step of the single model, batch 16 x seq 64, fused AdamW (what
  ``hydra_ops.models.training.fine_tune`` runs).

Allocators (:mod:`hydra_ops.perf.allocators`): ``system`` (glibc malloc as is), ``glibc_tuned``
(``GLIBC_TUNABLES``: no mmap for large blocks and no trimming, so freed memory is reused instead
of being unmapped and page-faulted in again), ``tcmalloc`` / ``jemalloc`` (``LD_PRELOAD``; left
out when not installed). The parent's own ``LD_PRELOAD`` / ``GLIBC_TUNABLES`` are cleared for
the children, so ``system`` is glibc as is.

Usage: ``python -m benchmarks.allocators [--rounds 3] [--reps 10] [--allocators a,b]
[--workloads single,hydra,train] [--out FILE.json]``.
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

from hydra_ops.perf.allocators import allocator_env

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


def _child(model: str, workload: str, reps: int, threads: int) -> tuple[float, float, float]:
    """Median wall ms and median CPU ms (all threads, user + system) of ``reps`` calls of
    ``workload`` after three warm-up calls, and the process's peak RSS in MiB."""
    import resource

    import torch

    from benchmarks.workloads import MODELS, make_inputs, make_members
    from hydra_ops.hydra.merge import merge_members

    torch.set_num_threads(threads)
    spec = MODELS[model]
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
            trunk = spec.num_layers // 2
            members = make_members(base, spec.num_layers, spec.num_heads, 3, shared_layers=trunk)
            hydra = merge_members(members, mode="stack", shared_layers=trunk).eval()

            def forward() -> object:
                return hydra(ids, mask)

        else:

            def forward() -> object:
                return base(input_ids=ids, attention_mask=mask).logits

        def call() -> None:
            with torch.no_grad():
                forward()

    for _ in range(3):  # tuned glibc grows its heap over the first calls
        call()
    wall, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        call()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    return statistics.median(wall), statistics.median(cpu), peak_mib


def _trial(
    allocator: dict[str, str], model: str, workload: str, reps: int, threads: int
) -> tuple[float, float, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "GLIBC_TUNABLES")}
    env = {**env, "HYDRA_ENS_MALLOC": "system", **allocator}
    cmd = [sys.executable, "-m", "benchmarks.allocators", "--child", workload, "--model", model]
    cmd += ["--reps", str(reps), "--threads", str(threads)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{workload} with {allocator}: {out.stderr.strip().splitlines()[-1]}")
    wall, cpu, peak = out.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu), float(peak)


def main(
    rounds: Annotated[int, typer.Option(min=1, help="interleaved rounds")] = 3,
    reps: Annotated[int, typer.Option(min=1, help="timed calls per trial")] = 10,
    threads: Annotated[int, typer.Option(min=1, help="torch threads")] = 2,
    workloads: Annotated[str, typer.Option(help="comma list of " + ", ".join(WORKLOADS))] = (
        ",".join(WORKLOADS)
    ),
    allocators: Annotated[
        str, typer.Option(help="comma list of " + ", ".join(COMPARED) + " (default: installed)")
    ] = "",
    model: Annotated[str, typer.Option(help="minilm | tiny_bert")] = "minilm",
    out: Annotated[Path | None, typer.Option(help="write the results as JSON here")] = None,
    child: Annotated[str | None, typer.Option(hidden=True)] = None,
) -> None:
    """Time each workload under each installed allocator, interleaved, one process per trial."""
    if model not in ("minilm", "tiny_bert"):
        raise typer.BadParameter(f"--model {model!r}: allowed: minilm, tiny_bert")
    if child:
        print(" ".join(f"{v:.3f}" for v in _child(model, child, reps, threads)))
        return
    chosen = [w.strip() for w in workloads.split(",") if w.strip()]
    if unknown := sorted(set(chosen) - set(WORKLOADS)):
        raise typer.BadParameter(f"unknown workload(s) {unknown}; allowed: {', '.join(WORKLOADS)}")
    envs = installed_allocators()
    if allocators:
        asked = [a.strip() for a in allocators.split(",") if a.strip()]
        if unknown := sorted(set(asked) - set(COMPARED)):
            raise typer.BadParameter(f"unknown allocator(s) {unknown}; allowed: {COMPARED}")
        if missing := sorted(set(asked) - set(envs)):
            raise typer.BadParameter(f"not usable here: {missing} (see the lines above)")
        envs = {name: envs[name] for name in asked}
    if "system" not in envs:
        envs = {"system": {}, **envs}  # the reference of every ratio
    trials: dict[str, dict[str, list[tuple[float, float, float]]]] = {
        w: {a: [] for a in envs} for w in chosen
    }
    for r in range(rounds):
        for workload in chosen:
            for name, env in envs.items():
                wall, cpu, peak = _trial(env, model, workload, reps, threads)
                trials[workload][name].append((wall, cpu, peak))
                print(
                    f"[allocators] round {r + 1}/{rounds} {workload:6s} {name:11s} "
                    f"{wall:8.1f} ms wall {cpu:8.1f} ms CPU {peak:7.0f} MiB peak RSS",
                    flush=True,
                )
    load = os.getloadavg()
    print(f"\nload average at the end: {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f}")
    print(
        "| workload | allocator | wall ms (median of rounds) | wall per round | x system "
        "| CPU ms (median of rounds) | x system | peak RSS MiB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    summary: dict[str, dict[str, dict[str, object]]] = {}
    for workload, by_alloc in trials.items():
        ref_wall = statistics.median(v[0] for v in by_alloc["system"])
        ref_cpu = statistics.median(v[1] for v in by_alloc["system"])
        for name, values in by_alloc.items():
            wall = statistics.median(v[0] for v in values)
            cpu = statistics.median(v[1] for v in values)
            peak = max(v[2] for v in values)
            summary.setdefault(workload, {})[name] = {
                "wall_ms": wall,
                "cpu_ms": cpu,
                "peak_rss_mib": peak,
                "rounds_wall_ms": [v[0] for v in values],
                "rounds_cpu_ms": [v[1] for v in values],
                "wall_ratio_to_system": wall / ref_wall,
                "cpu_ratio_to_system": cpu / ref_cpu,
            }
            per_round = ", ".join(f"{v[0]:.0f}" for v in values)
            print(
                f"| {workload} | {name} | {wall:.1f} | {per_round} | {wall / ref_wall:.2f} "
                f"| {cpu:.1f} | {cpu / ref_cpu:.2f} | {peak:.0f} |"
            )
    if out:
        record = {
            "model": model,
            "allocators": dict(envs),
            "threads": threads,
            "reps": reps,
            "load_average_end": load,
            "results": summary,
        }
        out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    typer.run(main)
