"""What ``precision: auto`` and batched MC Dropout buy per stage, as ratios measured side by side.

On MiniLM-L6 (the default model, 4 classes, sequence length 64), each pair timed in alternating
rounds (so load from elsewhere on the machine falls on both):

- ``train``: one fine-tune step (forward, fp32 loss, backward, fused AdamW) at the default batch
  (16), fp32 vs bf16 autocast (:func:`hydra_ops.perf.precision_probe.time_training_steps`, the probe
  the training stages run);
- ``infer``: one forward at evaluate's batch (64), fp32 vs bf16, with the bf16-vs-fp32 agreement
  (:func:`hydra_ops.perf.inference_probe.time_inference`);
- ``mc_dropout``: 8 MC Dropout passes of a batch of 64, one forward per pass vs all 8 stacked in
  one forward (:func:`hydra_ops.models.mc_dropout.mc_dropout_logits`, ``passes_per_forward`` 1 vs
  8), in fp32, and the largest difference of their logits (the masks are the same);
- ``train_masks``: one bf16 fine-tune step at batch 16 with each sampler drawing the
  ``nn.Dropout`` masks (``dense`` vs ``gaps``, what ``fine_tune`` picks under ``auto`` for a
  CPU training in bf16), alternating;
- ``mc_masks``: the same 8 stacked passes with each mask sampler
  (:mod:`hydra_ops.models.inverted_dropout`: ``dense``, nn.Dropout's per-element draw, vs
  ``gaps``, only the dropped positions), beside one plain forward of the batch, all at the
  fastest native precision (bf16 where the CPU has it), as ratios to that forward.

    python -m benchmarks.stage_precision --rounds 5 --out benchmarks/results/stage_precision.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from hydra_ops.models.factory import build_base
from hydra_ops.models.inference import logits as eval_logits
from hydra_ops.models.mc_dropout import mc_dropout_logits
from hydra_ops.perf.inference_probe import time_inference
from hydra_ops.perf.precision_probe import Bf16Support, time_training_steps


def _batch(n: int, length: int, labels: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    out = {
        "input_ids": torch.randint(1000, 20000, (n, length), generator=g),
        "attention_mask": torch.ones(n, length, dtype=torch.long),
    }
    if labels:
        out["labels"] = torch.randint(0, 4, (n,), generator=g)
    return out


def mc_dropout_pair(model: torch.nn.Module, batch: dict, rounds: int) -> dict[str, object]:
    """Median seconds of 8 passes looped vs stacked, alternating; max |logit diff|."""
    times: dict[str, list[float]] = {"looped": [], "stacked": []}
    outs = {}
    for i in range(rounds + 1):
        order = ("looped", "stacked") if i % 2 == 0 else ("stacked", "looped")
        for name in order:
            t0 = time.perf_counter()
            outs[name] = mc_dropout_logits(
                model, batch, 8, seed=0, passes_per_forward=1 if name == "looped" else 8
            )
            if i:  # the first round warms up
                times[name].append(time.perf_counter() - t0)
    looped, stacked = (statistics.median(times[k]) for k in ("looped", "stacked"))
    return {
        "looped_s": round(looped, 3),
        "stacked_s": round(stacked, 3),
        "speedup": round(looped / stacked, 3),
        "max_abs_logit_diff": float((outs["looped"] - outs["stacked"]).abs().max()),
    }


def mc_mask_samplers(
    model: torch.nn.Module, batch: dict, rounds: int, precision: str
) -> dict[str, object]:
    """Median seconds of one plain forward and of 8 stacked MC Dropout passes per mask sampler,
    in rotating order; each as a ratio to the plain forward."""
    runs = {
        "forward": lambda: eval_logits(model, [batch], precision=precision),
        **{
            name: (
                lambda name=name: mc_dropout_logits(
                    model, batch, 8, seed=0, precision=precision, implementation=name
                )
            )
            for name in ("dense", "gaps")
        },
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    names = list(runs)
    for i in range(rounds + 1):
        for name in names[i % 3 :] + names[: i % 3]:
            t0 = time.perf_counter()
            runs[name]()
            if i:  # the first round warms up
                times[name].append(time.perf_counter() - t0)
    median = {k: statistics.median(v) for k, v in times.items()}
    return {
        "precision": precision,
        **{f"{k}_s": round(v, 3) for k, v in median.items()},
        "dense_x_forward": round(median["dense"] / median["forward"], 2),
        "gaps_x_forward": round(median["gaps"] / median["forward"], 2),
        "gaps_speedup": round(median["dense"] / median["gaps"], 2),
    }


def train_mask_samplers(model: torch.nn.Module, batch: dict, rounds: int) -> dict[str, object]:
    """Median seconds of one bf16 training step (forward, fp32 loss, backward, fused AdamW) of a
    copy of ``model`` per dropout sampler, alternating; the ratio dense / gaps."""
    import copy

    from hydra_ops.models.inverted_dropout import sampled_dropout
    from hydra_ops.models.runtime import autocast
    from hydra_ops.models.training import model_logits

    probe = copy.deepcopy(model).train()
    optimizer = torch.optim.AdamW(probe.parameters(), lr=1e-7, fused=True)

    def step(sampler: str) -> None:
        with autocast(torch.device("cpu"), "bf16"), sampled_dropout(sampler):
            logits = model_logits(probe, batch)
        loss = torch.nn.functional.cross_entropy(logits.float(), batch["labels"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    times: dict[str, list[float]] = {"dense": [], "gaps": []}
    for i in range(rounds + 2):
        for name in ("dense", "gaps") if i % 2 == 0 else ("gaps", "dense"):
            t0 = time.perf_counter()
            step(name)
            if i >= 2:  # two rounds warm up
                times[name].append(time.perf_counter() - t0)
    median = {k: statistics.median(v) for k, v in times.items()}
    return {
        **{f"{k}_s": round(v, 4) for k, v in median.items()},
        "gaps_speedup": round(median["dense"] / median["gaps"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--parts", default="train,train_masks,infer,mc_dropout,mc_masks")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    model = build_base("bert", ["a", "b", "c", "d"], seed=0)
    support = Bf16Support.of("cpu")
    report: dict[str, object] = {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "bf16": {"native": support.native, "why": support.why},
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "rounds": args.rounds,
    }
    if "train" in parts:
        t = time_training_steps(model, _batch(16, 64, True), "cpu", steps=args.rounds)
        report["train_b16"] = t.to_dict()
        print("train step, batch 16: fp32 / bf16 =", t.to_dict())
    if "infer" in parts:
        t, check = time_inference(
            model,
            [_batch(64, 64, False)],
            "cpu",
            tolerance=2e-2,
            min_agreement=1.0,
            steps=args.rounds,
        )
        report["infer_b64"] = {**t.to_dict(), "check": check}
        print("forward, batch 64: fp32 / bf16 =", t.to_dict(), "agreement", check["passed"])
    if "mc_dropout" in parts:
        report["mc_dropout_b64_s8"] = mc_dropout_pair(model, _batch(64, 64, False), args.rounds)
        print("MC dropout 8 passes, batch 64:", report["mc_dropout_b64_s8"])
    if "train_masks" in parts and support.native:
        report["train_masks_b16"] = train_mask_samplers(model, _batch(16, 64, True), args.rounds)
        print("bf16 train step, batch 16, dropout samplers:", report["train_masks_b16"])
    if "mc_masks" in parts:
        precision = "bf16" if support.native else "fp32"
        report["mc_masks_b64_s8"] = mc_mask_samplers(
            model, _batch(64, 64, False), args.rounds, precision
        )
        print("MC dropout mask samplers, batch 64:", report["mc_masks_b64_s8"])
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
