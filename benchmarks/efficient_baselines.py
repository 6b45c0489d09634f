"""What the efficient-ensemble baselines cost, side by side in one process, as ratios.

Two shapes: MiniLM-L6 (text, batch 32 of 64 tokens) and the image sources' from-scratch timm
ViT (28 px, 7 px patches, width 96, depth 4; batch 32). Per shape:

* **inference** (``--rounds`` interleaved rounds, :func:`hydra_ops.perf.cost.interleaved_ms`, no
  grad): the single model, LoRA-Ensemble batched (one pass over the M stacked copies,
  ``peft``'s mixed-adapter batch) and looped (one pass per member, the adapter switched between
  them), BatchEnsemble (one pass over the stacked copies). Reported: each one's median ms ratio to
  the single model with its 95% bootstrap interval over rounds, and **LoRA batched / looped**,
  the number behind ``baselines.lora_ensemble.batched``; FLOPs ratios beside them.
* **training** (``--steps`` steps per round, interleaved): seconds per step of the base
  fine-tune (every weight trains), of one LoRA-Ensemble member (adapters and classifier train,
  the base frozen) and of the BatchEnsemble (fast weights train on the M stacked copies), as
  ratios to the base's step; with the pipeline's epochs (base 3, LoRA-Ensemble M members x 1,
  BatchEnsemble 1) this gives each baseline's training cost in units of the base fine-tune.

Timings taken on a loaded machine say nothing in absolute terms; the ratios, measured side by
side, are what docs/benchmarks.md reports.

    python -m benchmarks.efficient_baselines [--rounds 10] [--steps 3] [--members 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from hydra_ops.baselines.batch_ensemble import BatchEnsemble
from hydra_ops.baselines.batching import member_major_batches
from hydra_ops.baselines.lora_ensemble import LoRAEnsemble
from hydra_ops.models.factory import build_base
from hydra_ops.models.training import fine_tune, model_logits
from hydra_ops.perf.cost import count_flops, interleaved_ms, ratio_interval

CLASSES = ["a", "b", "c", "d"]


def shapes() -> dict[str, tuple[torch.nn.Module, dict[str, torch.Tensor]]]:
    """``{name: (base, batch of 32 with labels)}`` for the text and the image shape."""
    g = torch.Generator().manual_seed(0)
    text = build_base("bert", CLASSES, seed=0)
    text_batch = {
        "input_ids": torch.randint(1000, 20000, (32, 64), generator=g),
        "attention_mask": torch.ones(32, 64, dtype=torch.long),
        "labels": torch.randint(len(CLASSES), (32,), generator=g),
    }
    vit = build_base(
        "timm_vit",
        CLASSES,
        seed=0,
        image_size=28,
        patch_size=7,
        in_chans=1,
        embed_dim=96,
        depth=4,
        num_heads=6,
        mlp_ratio=2.0,
    )
    image_batch = {
        "pixel_values": torch.randn(32, 1, 28, 28, generator=g),
        "labels": torch.randint(len(CLASSES), (32,), generator=g),
    }
    return {"minilm": (text.eval(), text_batch), "vit": (vit.eval(), image_batch)}


def _ratios(times: dict[str, list[float]], reference: str) -> dict[str, dict[str, float]]:
    out = {}
    for name, ts in times.items():
        r = ratio_interval(ts, times[reference])
        out[name] = {"median_ms": statistics.median(ts), **r}
    return out


def inference(base: torch.nn.Module, batch: dict, members: int, rounds: int) -> dict[str, Any]:
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    lora = LoRAEnsemble(copy.deepcopy(base), members, rank=8, alpha=16.0).eval()
    with torch.no_grad():  # members that differ (B starts at 0)
        for p in lora.adapter_state().values():
            p.add_(0.01 * torch.randn_like(p))
    be = BatchEnsemble(copy.deepcopy(base), members, init_std=0.1).eval()
    calls = {
        "single": lambda: model_logits(base, inputs),
        "lora_batched": lambda: lora.batched_logits(inputs),
        "lora_looped": lambda: lora.looped_logits(inputs),
        "batch_ensemble": lambda: be(inputs),
    }
    with torch.no_grad():
        gap = (lora.batched_logits(inputs) - lora.looped_logits(inputs)).abs().max().item()
    times = interleaved_ms(calls, rounds)
    flops = {name: count_flops(call) for name, call in calls.items()}
    return {
        "vs_single": _ratios(times, "single"),
        "lora_batched_over_looped": ratio_interval(times["lora_batched"], times["lora_looped"]),
        "flops_ratio": {n: f / flops["single"] for n, f in flops.items()},
        "lora_batched_vs_looped_max_abs_diff": gap,
    }


def training(base: torch.nn.Module, batch: dict, members: int, steps: int, rounds: int) -> dict:
    def step_seconds(kind: str) -> float:
        model = copy.deepcopy(base)
        batches_fn = lambda _e: [batch] * steps  # noqa: E731
        if kind == "lora_member":
            model = LoRAEnsemble(model, members, rank=8, alpha=16.0).train_member(0)
        elif kind == "batch_ensemble":
            be = BatchEnsemble(model, members, init_std=0.1)
            model, batches_fn = be.model, member_major_batches(batches_fn, members)
        t0 = time.perf_counter()
        fine_tune(model, batches_fn, epochs=1, lr=1e-4, progress=False, log_fn=None)
        return (time.perf_counter() - t0) / steps

    kinds = ("base", "lora_member", "batch_ensemble")
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(rounds):
        for kind in kinds[r % 3 :] + kinds[: r % 3]:  # rotate the order per round
            times[kind].append(step_seconds(kind))
    per_step = _ratios(times, "base")
    # the pipeline's epochs: base 3; LoRA-Ensemble M members x 1; BatchEnsemble 1 (all 1 x data)
    return {
        "per_step_vs_base": per_step,
        "training_vs_base_finetune": {
            "lora_ensemble": members * per_step["lora_member"]["ratio"] / 3,
            "batch_ensemble": per_step["batch_ensemble"]["ratio"] / 3,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.efficient_baselines")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--train-rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--shapes", default="minilm,vit")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    result: dict[str, Any] = {"members": args.members, "threads": torch.get_num_threads()}
    for name, (base, batch) in shapes().items():
        if name not in args.shapes.split(","):
            continue
        result[name] = {
            "inference": inference(base, batch, args.members, args.rounds),
            "training": training(base, batch, args.members, args.steps, args.train_rounds),
        }
        inf, tr = result[name]["inference"], result[name]["training"]
        bo = inf["lora_batched_over_looped"]
        print(
            f"{name}: LoRA batched / looped {bo['ratio']:.2f} [{bo['low']:.2f}, {bo['high']:.2f}]"
            f" (max |diff| {inf['lora_batched_vs_looped_max_abs_diff']:.1e}); vs single: "
            + ", ".join(
                f"{n} {r['ratio']:.2f} [{r['low']:.2f}, {r['high']:.2f}]"
                for n, r in inf["vs_single"].items()
                if n != "single"
            )
        )
        print(
            f"{name}: training step vs base: "
            + ", ".join(
                f"{n} {r['ratio']:.2f}" for n, r in tr["per_step_vs_base"].items() if n != "base"
            )
            + "; whole training vs the base fine-tune: "
            + ", ".join(f"{n} {v:.2f}" for n, v in tr["training_vs_base_finetune"].items())
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
