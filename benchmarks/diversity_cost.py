"""What the NCL objective costs a member fine-tune step: MiniLM-L6, the default member shape
(4 of 12 heads in layers 3-5, layers 0-2 and the embeddings frozen), batch 16 of 64 tokens.

Side by side, interleaved, on the same machine: ``repeats`` rounds of ``steps`` steps each with
cross-entropy alone and with ``members.finetune.objective: ncl`` (one extra no-grad forward of the
unpruned base per step); prints the median seconds per step and their ratio.

    python -m benchmarks.diversity_cost [--steps 6] [--repeats 3]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

from hydra_ops.heads.plans import HeadPlan
from hydra_ops.heads.surgery import prune_heads
from hydra_ops.models.diversity_loss import anchored_ncl_term
from hydra_ops.models.factory import build_base
from hydra_ops.models.training import fine_tune


def _batches(steps: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        {
            "input_ids": torch.randint(1000, 20000, (16, 64), generator=g),
            "attention_mask": torch.ones(16, 64, dtype=torch.long),
            "labels": torch.randint(4, (16,), generator=g),
        }
        for _ in range(steps)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.diversity_cost")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    base = build_base("bert", ["a", "b", "c", "d"], seed=0)
    plan = HeadPlan(tuple([tuple(range(12))] * 3 + [(0, 1, 2, 3)] * 3))
    batches = _batches(args.steps)
    times: dict[str, list[float]] = {"ce": [], "ncl": []}
    for _ in range(args.repeats):
        for name in ("ce", "ncl"):
            member = prune_heads(copy.deepcopy(base), plan)
            term = None if name == "ce" else anchored_ncl_term(copy.deepcopy(base), 0.5)
            t0 = time.perf_counter()
            fine_tune(
                member,
                lambda _e: batches,
                epochs=1,
                lr=2.5e-5,
                frozen_layers=3,
                progress=False,
                log_fn=None,
                loss_term=term,
            )
            times[name].append((time.perf_counter() - t0) / args.steps)
    ce, ncl = statistics.median(times["ce"]), statistics.median(times["ncl"])
    print(f"seconds per step: ce {ce:.3f}, ncl {ncl:.3f}; ncl / ce = {ncl / ce:.2f}")
    rounds = {name: [round(t, 3) for t in ts] for name, ts in times.items()}
    print(f"rounds: {rounds}")


if __name__ == "__main__":
    main()
