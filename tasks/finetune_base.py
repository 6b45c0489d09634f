"""Stage ``finetune_base``: fine-tune the base model (a registered family's: on text the encoder in
``model.path`` or MiniLM-L6, on images a from-scratch timm ViT) on the training split; writes a
safetensors checkpoint to ``models/base``.

With ``finetune.from_checkpoint`` the user's fine-tuned classifier (``model.path``) is the base as
it is: no training; its labels are matched to the data's classes (a mismatch is one line naming
both lists), its head's rows put in the data's class order, and it is written to ``models/base``
like a trained base, with the sha256 of the folder it came from and its validation accuracy.

Training runs on ``runtime.device`` in ``runtime.precision`` (``auto``: fp32 where bf16 is not
native, else the faster of a short probe of both on this model and batch,
:mod:`tasks.runtime.precision`; the choice and its reason go to the log and
``metrics/finetune_base.json``)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from hydra_ops.data import split_labels
from hydra_ops.hashing import sha256_file
from hydra_ops.models.checkpoints import save_model, split_timings
from hydra_ops.models.factory import build_base
from hydra_ops.models.fine_tuned import load_fine_tuned
from hydra_ops.models.inference import logits
from hydra_ops.models.runtime import Runtime, resolve_device
from hydra_ops.models.training import fine_tune
from hydra_ops.perf.precision_probe import PrecisionChoice
from tasks.params.core import CoreConfig
from tasks.runtime import data
from tasks.runtime.layout import BASE, METRICS
from tasks.runtime.outputs import write_json
from tasks.runtime.precision import precision_record, probe_batch, stage_runtime
from tasks.runtime.stage import stage_main

#: The params view this stage validates ``params.yaml`` with (the sections it reads).
SCHEMA = CoreConfig

log = logging.getLogger("hydra_ens")


def new_base(cfg: CoreConfig, root: Path, seed: int) -> torch.nn.Module:
    """A new, untrained base model of ``cfg`` (:func:`hydra_ops.models.factory.build_base`)."""
    manifest = data.manifest(root)
    vit = cfg.model.vit
    shape = manifest.image_shape or [vit.image_size, vit.image_size]
    return build_base(
        cfg.family,
        manifest.classes,
        seed=seed,
        model_path=cfg.model.path,
        in_chans=int(shape[2]) if len(shape) == 3 else 1,
        **vit.model_dump(),
    )


def training_runtime(
    cfg: CoreConfig, root: Path, stage: str = "finetune_base"
) -> tuple[Runtime, PrecisionChoice]:
    """``cfg.runtime`` resolved for training a base (:func:`tasks.runtime.precision.stage_runtime`;
    the probe, when one runs, times a new base of seed ``finetune.seed`` on :func:`probe_batch`)."""
    return stage_runtime(
        cfg,
        root,
        stage,
        "training",
        lambda: new_base(cfg, root, cfg.finetune_seed),
        lambda: probe_batch(cfg, root),
    )


def train_base(
    cfg: CoreConfig, root: Path, seed: int, out_dir: Path, runtime: Runtime | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fine-tune one base model with ``seed`` (init of the new head + data order + dropout) on
    ``runtime`` (None: :func:`training_runtime`); the validation pass runs on it too.

    Returns ``(summary, timings)``: ``summary`` (seed, loss curve, val accuracy, ...) is what the
    same inputs always give and is stored in the checkpoint; ``timings`` (epoch and total wall
    seconds) is for the stage's uncached metrics or the log only.
    """
    rt = runtime or training_runtime(cfg, root)[0]
    model = new_base(cfg, root, seed)
    log.info(
        "fine-tuning %s (seed %d): %d epochs, lr %g",
        cfg.family,
        seed,
        cfg.finetune.epochs,
        cfg.base_lr,
    )
    report = fine_tune(
        model,
        data.train_batches(cfg, root, seed, pin_memory=rt.pin_memory),
        epochs=cfg.finetune.epochs,
        lr=cfg.base_lr,
        weight_decay=cfg.finetune.weight_decay,
        warmup_ratio=cfg.finetune.warmup_ratio,
        seed=seed,
        progress=os.environ.get("HYDRA_ENS_PROGRESS", "1") != "0",
        device=rt.device,
        precision=rt.precision,
    )
    train, timings = split_timings(report.to_dict())
    summary = {"seed": seed, "family": cfg.family, "train": train}
    summary |= _validation_record(cfg, root, model, rt)
    save_model(model.cpu(), out_dir, summary)
    log.info(
        "seed %d: val accuracy %.3f, mean confidence %.3f, trained in %.1fs",
        seed,
        summary["val_accuracy"],
        summary["val_mean_confidence"],
        timings.get("total_seconds", float("nan")),
    )
    return summary, timings


def _validation_record(
    cfg: CoreConfig, root: Path, model: torch.nn.Module, rt: Runtime
) -> dict[str, Any]:
    """The base's validation accuracy and mean confidence, its classes and runtime."""
    val = data.split(root, "val")
    val_batches = data.batches(cfg, val, cfg.evaluate.batch_size, pin_memory=rt.pin_memory)
    probs = logits(model, val_batches, device=rt.device, precision=rt.precision).softmax(-1)
    labels = split_labels(val)
    return {
        "val_accuracy": float((probs.argmax(-1) == labels).float().mean()),
        "val_mean_confidence": float(probs.max(-1).values.mean()),
        "classes": list(data.manifest(root).classes),
        "runtime": precision_record(cfg, rt),
    }


def folder_sha256(folder: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``folder`` (what the base came from)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in files}


def adopt_checkpoint(cfg: CoreConfig, root: Path, out_dir: Path) -> dict[str, Any]:
    """The user's fine-tuned classifier (``model.path``) as the base, unchanged but for its head's
    row order (:func:`hydra_ops.models.fine_tuned.load_fine_tuned`); ValueError, one line, when
    its labels are not the data's classes. Returns the summary stored with the checkpoint."""
    source = Path(cfg.model_dir or "")
    model = load_fine_tuned(source, data.manifest(root).classes)
    rt = Runtime(resolve_device(cfg.runtime.device))
    summary = {
        "family": cfg.family,
        "from_checkpoint": {"path": cfg.model.path, "sha256": folder_sha256(source)},
        **_validation_record(cfg, root, model, rt),
    }
    save_model(model.cpu(), out_dir, summary)
    log.info(
        "base: the fine-tuned classifier %s as it is (no fine-tune): val accuracy %.3f",
        cfg.model.path,
        summary["val_accuracy"],
    )
    return summary


def run(cfg: CoreConfig, root: Path) -> dict[str, Any]:
    if cfg.finetune.from_checkpoint:
        summary = adopt_checkpoint(cfg, root, root / BASE)
        write_json(root / METRICS / "finetune_base.json", summary)
        return summary
    rt, choice = training_runtime(cfg, root)
    summary, timings = train_base(cfg, root, cfg.finetune_seed, root / BASE, rt)
    # metrics/finetune_base.json is not cached (dvc.yaml): the timings may live here
    metrics = {**summary, "train": {**summary["train"], **timings}, "precision": choice.to_dict()}
    write_json(root / METRICS / "finetune_base.json", metrics)
    return metrics


def main() -> None:
    stage_main("finetune_base", run, SCHEMA)


if __name__ == "__main__":
    main()
