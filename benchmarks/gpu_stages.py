"""Every model stage's library calls on one device: the pipeline's CUDA path, without the pipeline.

``python -m benchmarks.gpu_stages [--device cuda] [--precision bf16] [--shape minilm] [--out FILE]``

The GPU image has ``hydra_ops`` (torch, transformers) but no Prefect, DVC or pydantic, so the
stages themselves cannot run there. This script makes, on ``--device`` at ``--precision``, the
``hydra_ops`` calls each model stage makes with ``runtime: {device, precision}`` (see
``tasks/<stage>.py``), in pipeline order, on a random-init BERT of ``--shape`` and synthetic
token batches, and checks what each call must give:

- ``finetune_base``: :func:`hydra_ops.models.training.fine_tune` (``--train-precision``); finite
  loss.
- ``score_heads``: the ``taylor`` and ``circuit`` (``nll`` objective: the ``ood`` one needs
  torchmetrics) criteria under autocast, as the stage runs them; finite ``[L, H]`` scores.
- ``select_members`` + ``finetune_members``: plans from the Taylor scores, pruned members
  fine-tuned with the shared trunk frozen (``merge.shared_layers``, default L/2).
- ``merge``: :func:`hydra_ops.hydra.merge.merge_members`; the merged model equals its stacked
  members (max |dp| within the precision's tolerance).
- ``calibrate``: :func:`hydra_ops.models.inference.logits`, temperature fit, OOD thresholds.
- ``baseline_logits``: :func:`hydra_ops.models.mc_dropout.mc_dropout_logits` (samples differ).
- ``evaluate``: OOD metrics of the calibrated scores (sklearn; skipped when it does not import).
- ``bundle``/``predict``: :func:`hydra_ops.hydra.serialization.save_hydra` then ``load_hydra`` onto
  the device; the loaded model's logits equal the saved one's exactly.

Each step is one row (ok / error / skipped, seconds); exit status 1 if any step fails. The JSON
report goes to ``--out`` (atomically). CPU smoke test: ``--device cpu --tiny --precision fp32``.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import math
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from benchmarks.gpu_check import SHAPES, build_base, synthetic_batches
from benchmarks.rows import write_report
from hydra_ops.compile.precision import DEFAULT_TOLERANCES
from hydra_ops.models.runtime import autocast, resolve_device

MEMBERS = 3


class Skip(Exception):
    """A step that cannot run here for a reason outside the code under test (a missing optional
    library, a failed earlier step it needs): recorded as ``skipped``, not as a failure."""


class Steps:
    """Runs named steps in order, recording ok / error / skipped and wall seconds for each.

    ``state`` holds what steps hand to later ones; a step whose ``needs`` keys are missing (an
    earlier step failed) is skipped with that reason instead of failing on a KeyError."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.rows: list[dict[str, Any]] = []
        self.state: dict[str, Any] = {}

    def run(
        self, name: str, fn: Callable[[], dict[str, Any] | None], needs: tuple[str, ...] = ()
    ) -> None:
        t0 = time.perf_counter()
        row: dict[str, Any] = {"step": name}
        try:
            if missing := [key for key in needs if key not in self.state]:
                raise Skip(f"needs {', '.join(missing)} from a step that failed")
            row.update(status="ok", **(fn() or {}))
        except Skip as why:
            row.update(status="skipped", why=str(why))
        except Exception as error:
            row.update(status="error", why=f"{type(error).__name__}: {str(error)[:400]}")
            traceback.print_exc()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        row["seconds"] = round(time.perf_counter() - t0, 2)
        print(f"[gpu_stages] {name}: {row['status']} ({row['seconds']} s) {row.get('why', '')}")
        self.rows.append(row)

    @property
    def failed(self) -> list[str]:
        return [r["step"] for r in self.rows if r["status"] == "error"]


def _finite(t: Tensor, what: str) -> None:
    if not torch.isfinite(t).all():
        raise ValueError(f"{what} has non-finite values")


def check_stages(args: argparse.Namespace) -> dict[str, Any]:
    """Run every step; the report (rows, device, shape, precisions)."""
    from hydra_ops.heads.selection import select_members
    from hydra_ops.heads.surgery import prune_heads
    from hydra_ops.hydra.merge import merge_members
    from hydra_ops.hydra.serialization import load_hydra, save_hydra
    from hydra_ops.models.inference import logits
    from hydra_ops.models.mc_dropout import mc_dropout_logits
    from hydra_ops.models.training import fine_tune
    from hydra_ops.scoring import get_scorer
    from hydra_ops.uq.calibrated import calibrated_ood_score
    from hydra_ops.uq.calibration import ensemble_log_probs, fit_temperature, nll_at_temperature
    from hydra_ops.uq.ood_thresholds import fit_ood_thresholds

    device = resolve_device(args.device)
    precision, tolerance = args.precision, DEFAULT_TOLERANCES[args.precision]
    steps = Steps(device)
    base, source, shape = build_base(args.shape)
    shared = shape["layers"] // 2 if args.shared_layers is None else args.shared_layers
    vocab, seq = shape["vocab"], args.seq
    train = synthetic_batches(args.steps, args.batch, seq, vocab, seed=0)
    val = synthetic_batches(2, args.batch, seq, vocab, seed=1)
    ood = synthetic_batches(2, args.batch, seq, vocab, seed=2)
    val_labels = torch.cat([b["labels"] for b in val])
    state = steps.state

    def tune(model: torch.nn.Module, frozen: int | None = None) -> dict[str, Any]:
        report = fine_tune(
            model,
            lambda epoch: train,
            epochs=1,
            device=device,
            precision=args.train_precision,
            frozen_layers=frozen,
            progress=False,
            log_fn=None,
        )
        loss = report.epoch_losses[-1]
        if not math.isfinite(loss):
            raise ValueError(f"fine-tune loss is {loss}")
        return {"loss": round(loss, 4), "steps": report.steps}

    steps.run("finetune_base", lambda: tune(base))

    def score() -> dict[str, Any]:
        out = {}
        with autocast(device, precision):
            taylor = get_scorer("taylor", max_batches=2, progress=False)(base, train_batches=train)
            circuit = get_scorer(
                "circuit",
                num_circuits=MEMBERS,
                heads_per_layer=shape["heads"] // MEMBERS,
                objective="nll",
                max_batches=1,
                progress=False,
                shared_layers=shared,
            )(base, val_batches=val)
        for name, scores in (("taylor", taylor), ("circuit", circuit)):
            _finite(scores.scores, f"{name} scores")
            if tuple(scores.scores.shape) != (shape["layers"], shape["heads"]):
                raise ValueError(f"{name} scores have shape {tuple(scores.scores.shape)}")
            out[f"{name}_scores_device"] = str(scores.scores.device)
        state["scores"] = taylor
        return out

    steps.run("score_heads", score)

    def members() -> dict[str, Any]:
        # as stage select_members: the trunk's layers keep every head, the others H / M
        budget = [shape["heads"]] * shared + [shape["heads"] // MEMBERS] * (
            shape["layers"] - shared
        )
        plans = select_members(state["scores"], MEMBERS, budget)
        state["members"] = [prune_heads(copy.deepcopy(base), p) for p in plans]
        losses = [tune(m, shared or None)["loss"] for m in state["members"]]
        return {"plans": [[list(h) for h in p.kept] for p in plans], "losses": losses}

    steps.run("select_members+finetune_members", members, needs=("scores",))

    def merge() -> dict[str, Any]:
        hydra = merge_members(state["members"], shared_layers=shared).to(device).eval()
        merged = logits(hydra, val, device=device, precision=precision)
        stacked = torch.stack(
            [logits(m, val, device=device, precision=precision) for m in state["members"]], 1
        )
        diff = (merged.softmax(-1) - stacked.softmax(-1)).abs().max().item()
        if diff > tolerance:
            raise ValueError(f"merged != stacked members: max |dp| {diff:.2e} > {tolerance}")
        state["hydra"] = hydra
        return {"max_prob_diff": diff, "tolerance": tolerance}

    steps.run("merge", merge, needs=("members",))

    def calibrate() -> dict[str, Any]:
        member_logits = logits(state["hydra"], val, device=device, precision=precision)
        log_probs = ensemble_log_probs(member_logits)
        t = fit_temperature(log_probs, val_labels)
        state["hydra"].set_temperature(t)
        scores = calibrated_ood_score(member_logits, float(state["hydra"].temperature))
        thresholds = fit_ood_thresholds(scores, score="msp").to_metadata()
        state["id_scores"] = scores
        return {
            "temperature": t,
            "val_nll_raw": nll_at_temperature(log_probs, val_labels),
            "val_nll_calibrated": nll_at_temperature(log_probs, val_labels, t),
            "thresholds": {k: thresholds[k] for k in ("uncertain", "likely_ood")},
        }

    steps.run("calibrate", calibrate, needs=("hydra",))

    def baselines() -> dict[str, Any]:
        samples = mc_dropout_logits(base, val, 4, seed=0, device=device, precision=precision)
        _finite(samples, "MC Dropout logits")
        spread = (samples - samples.mean(1, keepdim=True)).abs().max().item()
        if spread == 0.0:
            raise ValueError("MC Dropout samples are identical: dropout did not run")
        return {"shape": list(samples.shape), "max_sample_spread": spread}

    steps.run("baseline_logits", baselines)

    def evaluate() -> dict[str, Any]:
        if importlib.util.find_spec("sklearn") is None:  # the GPU image may lack it
            raise Skip("scikit-learn is not installed (hydra_ops.metrics.ood needs it)")
        from hydra_ops.metrics.ood import ood_metrics

        t = float(state["hydra"].temperature)
        ood_logits = logits(state["hydra"], ood, device=device, precision=precision)
        return ood_metrics(state["id_scores"], calibrated_ood_score(ood_logits, t))

    steps.run("evaluate", evaluate, needs=("hydra", "id_scores"))

    def round_trip() -> dict[str, Any]:
        before = logits(state["hydra"], val, device=device, precision=precision)
        with tempfile.TemporaryDirectory(prefix="hydra-gpu-stages-") as folder:
            save_hydra(state["hydra"], folder)
            loaded = load_hydra(folder, map_location=device)
        after = logits(loaded, val, device=device, precision=precision)
        diff = (before - after).abs().max().item()
        if diff != 0.0 or float(loaded.temperature) != float(state["hydra"].temperature):
            raise ValueError(f"loaded model differs from the saved one: max |dlogit| {diff:.2e}")
        return {"max_abs_logit_diff": diff}

    steps.run("bundle+predict (save, load onto the device)", round_trip, needs=("hydra",))
    return {
        "format": "hydra-ens-gpu-stages/1",
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "base": source,
        "shape_name": args.shape,
        "shared_layers": shared,
        "precision": precision,
        "train_precision": args.train_precision,
        "rows": steps.rows,
        "failed": steps.failed,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument("--precision", default="bf16", choices=sorted(DEFAULT_TOLERANCES))
    parser.add_argument("--train-precision", default="bf16", choices=sorted(DEFAULT_TOLERANCES))
    parser.add_argument("--shape", choices=sorted(SHAPES), default="minilm")
    parser.add_argument(
        "--tiny", action="store_const", dest="shape", const="tiny", help="same as --shape tiny"
    )
    parser.add_argument("--steps", type=int, default=4, help="fine-tuning steps per model")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument(
        "--shared-layers", type=int, default=None, help="trunk depth (default: L/2, as served)"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu_stages.json"))
    args = parser.parse_args(argv)
    layers = SHAPES[args.shape]["layers"]
    if args.steps < 1 or args.batch < 2 or args.seq < 2:
        parser.error("steps must be >= 1, batch and seq >= 2")
    if args.shared_layers is not None and not 0 <= args.shared_layers < layers:
        parser.error(f"shared-layers must be in 0..{layers - 1}, got {args.shared_layers}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "fp16" in (args.precision, args.train_precision) and not args.device.startswith("cuda"):
        sys.exit("gpu_stages: fp16 runs only on CUDA")
    report = check_stages(args)
    write_report(args.out, json.dumps(report, indent=2, default=str))
    print(f"[gpu_stages] wrote {args.out}; failed: {report['failed'] or 'none'}")
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
