"""Which ops dominate: ``python -m benchmarks.profile_ops --model minilm --batch 32 --seq 64``.

Profiles (``torch.profiler``, CPU) the single base, the Hydra in a chosen grouped implementation
and the sequential Deep Ensemble on the same inputs; prints the top ops by self CPU time.
"""

from __future__ import annotations

import os

import torch
import typer
from torch.profiler import ProfilerActivity, profile

from benchmarks.workloads import MODELS, is_text, make_inputs, make_members, single_fn
from hydra_ops.hydra.merge import merge_members


def main(
    model: str = typer.Option("minilm", help=f"one of {sorted(MODELS)}"),
    batch: int = typer.Option(32),
    seq: int = typer.Option(64, help="text only"),
    implementation: str = typer.Option("padded_bmm"),
    members: int = typer.Option(3),
    threads: int = typer.Option(2),
    rows: int = typer.Option(12, help="ops to show per model"),
) -> None:
    """Print the top ops of base vs Hydra (self CPU time, 2 profiled calls after 1 warm-up)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(threads)
    spec = MODELS[model]
    base = spec.build()
    hydra = merge_members(
        make_members(base, spec.num_layers, spec.num_heads, members), attention=implementation
    )
    inputs = make_inputs(
        spec, batch, seq if is_text(spec.family) else None, torch.device("cpu"), torch.float32
    )
    runs = {"base": single_fn(base, spec.family), f"hydra[{implementation}]": hydra}
    with torch.no_grad():
        for name, fn in runs.items():
            fn(*inputs)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(2):
                    fn(*inputs)
            typer.echo(f"== {name} (2 calls)")
            typer.echo(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


if __name__ == "__main__":
    typer.run(main)
