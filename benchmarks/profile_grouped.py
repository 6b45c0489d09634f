"""Layout copies of the grouped attention, old vs new: ``python -m benchmarks.profile_grouped``.

Side by side in one process, on the same members and inputs (MiniLM-L6 shaped BERT by default):

* ``single``: the unpruned base model (HF ``BertForSequenceClassification``);
* ``hydra_v1[<impl>]``: the merge as it was at ``--baseline-rev`` (streams ``[B, M, T, D]``),
  its ``grouped.py`` and ``merge.py`` read from git history (``git show``, read-only) and run on
  top of the current package's other modules;
* ``hydra[<impl>]``: the current merge (member-major streams ``[M, B, T, D]``).

For fp32 and for bf16 CPU autocast it reports:

* the median wall time of one forward (round robin over the rows, so load drift hits all alike)
  and its median count of minor page faults (``getrusage``): with glibc's malloc, freed tensors
  above its (dynamic, at most 32 MB) mmap threshold go back to the OS and are faulted in again on
  the next call; ``--mallopt`` pins the thresholds (mmap 32 MB, no trimming) to take most of that
  out of the comparison;
* the top ops per forward (``torch.profiler``, CPU, ``record_shapes``, self CPU time), the mean of
  ``--profiled`` forwards after an unrecorded one, with the page faults they took;
* the materialising copies of ONE layer: block 0 (HF: encoder layer 0) rerun on its captured input
  under a ``TorchDispatchMode`` that records every op that only moves data: ``clone`` (what
  ``reshape``/``contiguous`` of a non-viewable tensor call), ``cat``/``stack``, explicit ``copy_``
  ("layout") and ``_to_copy`` (the casts autocast inserts: "cast"), with the bytes each writes.
  Copies made inside a kernel (``addmm``/``baddbmm`` filling the output with the bias, SDPA's mask
  conversion) are not ops at that level and are not counted; the profiler table shows them under
  ``aten::copy_``.

It checks that old and new give the same logits (fp32, max abs difference printed).
"""

from __future__ import annotations

import ctypes
import os
import resource
import statistics
import subprocess
import sys
import time
import types
from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
import typer
from torch import Tensor, nn
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.workloads import MODELS, is_text, make_inputs, make_members, single_fn
from hydra_ops.hydra.merge import merge_members

ROOT = Path(__file__).resolve().parents[1]
#: The last commit with the ``[B, M, T, D]`` stream layout.
BASELINE_REV = "b33da37fde580f0f466d1f530e199cb316f9fb3b"

aten = torch.ops.aten
LAYOUT_OPS = {aten.clone, aten.contiguous, aten.cat, aten.stack, aten.copy_, aten.copy}
CAST_OPS = {aten._to_copy}


def load_baseline(rev: str) -> types.ModuleType:
    """``hydra_ops.hydra.merge`` as of ``rev`` (with that revision's ``grouped``) as a fresh
    module."""
    loaded: dict[str, types.ModuleType] = {}
    for name in ("grouped", "merge"):
        path = f"hydra_ops/{name}.py"
        source = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{rev}:{path}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        source = source.replace("from .grouped import", "from hydra_ops._v1_grouped import")
        module = types.ModuleType(f"hydra_ops._v1_{name}")
        module.__package__ = "hydra_ops"
        module.__file__ = f"{rev[:7]}:{path}"
        sys.modules[module.__name__] = module
        exec(compile(source, module.__file__, "exec"), module.__dict__)
        loaded[name] = module
    return loaded["merge"]


class CopyCounter(TorchDispatchMode):
    """Records ``(kind, op, bytes written)`` of every data-moving op run under it."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[str, str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        packet = func.overloadpacket
        kind = "layout" if packet in LAYOUT_OPS else "cast" if packet in CAST_OPS else None
        if kind is not None:
            result = out if isinstance(out, Tensor) else args[0]
            self.records.append((kind, packet.__name__, result.numel() * result.element_size()))
        return out


def capture_input(layer: nn.Module, fn: Callable[[], Any]) -> tuple[tuple, dict]:
    """The positional and keyword arguments of ``layer``'s first call during ``fn()``."""
    seen: list[tuple[tuple, dict]] = []

    def hook(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not seen:
            seen.append((args, dict(kwargs)))

    handle = layer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            fn()
    finally:
        handle.remove()
    return seen[0]


def layer_copies(
    layer: nn.Module, run: Callable[[], Any], cast: Callable[[], AbstractContextManager]
) -> dict[str, tuple[int, float]]:
    """``kind -> (count, MB)`` of one call of ``layer`` on the input it gets inside ``run()``."""
    args, kwargs = capture_input(layer, lambda: _under(cast, run))
    counter = CopyCounter()
    with torch.no_grad(), cast(), counter:
        layer(*args, **kwargs)
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for kind, op, nbytes in counter.records:
        for key in (kind, f"{kind}:{op}"):
            totals[key][0] += 1
            totals[key][1] += nbytes / 1e6
    return {k: (int(v[0]), v[1]) for k, v in sorted(totals.items())}


def _under(cast: Callable[[], AbstractContextManager], fn: Callable[[], Any]) -> Any:
    with cast():
        return fn()


def top_ops(
    fn: Callable[[], Any], rows: int, calls: int
) -> tuple[list[tuple[str, float, float]], float]:
    """``(op, calls, self CPU ms)`` per forward, averaged over ``calls`` profiled forwards (after
    one unrecorded forward under the profiler), most expensive first; and the minor page faults
    per profiled forward (the profiler's own allocations can push glibc into faulting tensors in
    again, which inflates the memory-bound ops: read the table with that count)."""
    ready: dict[str, Any] = {}
    with profile(
        activities=[ProfilerActivity.CPU],
        record_shapes=True,
        schedule=schedule(wait=0, warmup=1, active=calls, repeat=1),
        on_trace_ready=lambda p: ready.update(events=p.key_averages()),
    ) as prof:
        for step in range(1 + calls):
            if step == 1:
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            fn()
            prof.step()
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls
    ops = [e for e in ready["events"] if not e.key.startswith("ProfilerStep")]
    averages = sorted(ops, key=lambda e: e.self_cpu_time_total, reverse=True)
    table = [(e.key, e.count / calls, e.self_cpu_time_total / 1e3 / calls) for e in averages[:rows]]
    return table, faults


def median_ms(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, tuple[float, float]]:
    """``(median ms, median minor page faults)`` per call, every function once per round."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    faults: dict[str, list[int]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            start = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - start) * 1e3)
            faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return {name: (statistics.median(times[name]), statistics.median(faults[name])) for name in fns}


def pin_malloc_thresholds() -> bool:
    """glibc ``mallopt``: mmap threshold 32 MB (its maximum), trim threshold 1 GB; False if not
    glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 32 << 20)) and bool(
        libc.mallopt(m_trim_threshold, 1 << 30)
    )


def cpu_facts() -> str:
    model, flags = "?", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    shown = [f for f in ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in flags]
    missing = [f for f in ("avx512_bf16", "amx_bf16") if f not in flags]
    return f"{model}, {os.cpu_count()} CPUs; flags: {' '.join(shown) or 'none of avx512/amx'}" + (
        f" (no {', '.join(missing)})" if missing else ""
    )


def main(
    model: str = typer.Option("minilm", help=f"one of {sorted(MODELS)}"),
    batch: int = typer.Option(32),
    seq: int = typer.Option(64),
    members: int = typer.Option(3),
    implementations: str = typer.Option("padded_bmm", help="comma-separated grouped impls"),
    threads: int = typer.Option(2),
    rounds: int = typer.Option(9, help="timed rounds per dtype"),
    rows: int = typer.Option(10, help="ops per top-ops table (0: no profile)"),
    profiled: int = typer.Option(3, help="profiled forwards per row (the table is per forward)"),
    baseline_rev: str = typer.Option(BASELINE_REV, help="git revision of the old layout"),
    dtypes: str = typer.Option("fp32,bf16", help="fp32 and/or bf16 (CPU autocast)"),
    mallopt: bool = typer.Option(False, help="pin glibc's malloc thresholds (see above)"),
) -> None:
    """Print markdown: median ms, copies per layer and top ops, old vs new layout."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(threads)
    pinned = pin_malloc_thresholds() if mallopt else False
    spec = MODELS[model]
    if not is_text(spec.family):
        raise typer.BadParameter(f"model must be a text model's key, got {model!r}")
    load_start = os.getloadavg()
    base = spec.build()
    member_models = make_members(base, spec.num_layers, spec.num_heads, members)
    old_merge = load_baseline(baseline_rev)
    inputs = make_inputs(spec, batch, seq, torch.device("cpu"), torch.float32)
    single = single_fn(base, spec.family)
    # name -> (callable on inputs, its layer 0 module)
    rows_: dict[str, tuple[Callable[..., Tensor], nn.Module]] = {
        "single": (single, base.bert.encoder.layer[0])
    }
    for impl in [s.strip() for s in implementations.split(",") if s.strip()]:
        old = old_merge.merge_members(member_models, attention=impl)
        new = merge_members(member_models, attention=impl)
        with torch.no_grad():
            diff = (old(*inputs) - new(*inputs)).abs().max().item()
        typer.echo(f"<!-- {impl}: max |old - new| logits (fp32) = {diff:.2e} -->")
        rows_[f"hydra_v1[{impl}]"] = (old, old.blocks[0])
        rows_[f"hydra[{impl}]"] = (new, new.blocks[0])

    casts: dict[str, Callable[[], AbstractContextManager]] = {
        "fp32": nullcontext,
        "bf16": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
    }
    chosen = [d.strip() for d in dtypes.split(",") if d.strip()]
    for d in chosen:
        if d not in casts:
            raise typer.BadParameter(f"dtypes must be among {sorted(casts)}, got {d!r}")
    typer.echo(
        f"Machine: {cpu_facts()}; torch {torch.__version__}, {threads} threads; "
        f"{model} b{batch} s{seq}, M = {members}; glibc malloc thresholds "
        + ("pinned (mmap 32 MB, trim 1 GB)" if pinned else "default")
        + "; load average at start "
        + ", ".join(f"{x:.1f}" for x in load_start)
    )
    for d in chosen:
        cast = casts[d]

        def call(fn: Callable[..., Tensor], cast=cast) -> Callable[[], Tensor]:
            def run() -> Tensor:
                with torch.no_grad(), cast():
                    return fn(*inputs)

            return run

        fns = {name: call(fn) for name, (fn, _) in rows_.items()}
        for fn in fns.values():
            fn()  # warm-up
        ms = median_ms(fns, rounds)
        typer.echo(f"\n#### {d}: median ms of one forward ({rounds} rounds)\n")
        typer.echo("| row | median ms | x single | minor page faults |\n|---|---|---|---|")
        for name, (value, faults) in ms.items():
            typer.echo(f"| {name} | {value:.1f} | {value / ms['single'][0]:.2f} | {faults:.0f} |")

        typer.echo(f"\n#### {d}: materialising copies in one layer (count / MB)\n")
        kinds = ["layout", "cast"]
        copies = {name: layer_copies(layer, fns[name], cast) for name, (_, layer) in rows_.items()}
        detail_keys = sorted({k for c in copies.values() for k in c if ":" in k})
        header = ["row", *kinds, *detail_keys]
        typer.echo("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
        for name, c in copies.items():
            cells = [f"{c.get(k, (0, 0.0))[0]} / {c.get(k, (0, 0.0))[1]:.1f}" for k in header[1:]]
            typer.echo(f"| {name} | " + " | ".join(cells) + " |")

        if rows < 1:
            continue
        typer.echo(
            f"\n#### {d}: top ops per forward (self CPU ms; calls), mean of {profiled} forwards\n"
        )
        profiles = {name: top_ops(fn, rows, profiled) for name, fn in fns.items()}
        tables = {name: table for name, (table, _) in profiles.items()}
        typer.echo("| rank | " + " | ".join(tables) + " |\n|" + "---|" * (len(tables) + 1))
        for rank in range(rows):
            cells = []
            for table in tables.values():
                if rank < len(table):
                    op, count, self_ms = table[rank]
                    cells.append(f"`{op}` {self_ms:.1f} ({count:g})")
                else:
                    cells.append("")
            typer.echo(f"| {rank + 1} | " + " | ".join(cells) + " |")
        typer.echo(
            "| minor page faults per profiled forward | "
            + " | ".join(f"{faults:.0f}" for _, faults in profiles.values())
            + " |"
        )
    typer.echo("\nLoad average at end: " + ", ".join(f"{x:.1f}" for x in os.getloadavg()) + "\n")


if __name__ == "__main__":
    typer.run(main)
