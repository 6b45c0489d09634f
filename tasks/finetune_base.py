"""Stage ``finetune_base``: fine-tune the base model (MiniLM-L6 on text, a from-scratch timm ViT on
images) on the training split; writes a safetensors checkpoint to ``models/base``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tasks import models_io
from tasks.common import BASE, METRICS, stage_main, write_json
from tasks.params import PipelineConfig

log = logging.getLogger("hydra_ens")


def train_base(
    cfg: PipelineConfig, root: Path, seed: int, out_dir: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fine-tune one base model with ``seed`` (init of the new head + data order + dropout).

    Returns ``(summary, timings)``: ``summary`` (seed, loss curve, val accuracy, ...) is what the
    same inputs always give and is stored in the checkpoint; ``timings`` (epoch and total wall
    seconds) is for the stage's uncached metrics or the log only.
    """
    model = models_io.new_base(cfg, root, seed)
    log.info(
        "fine-tuning %s (seed %d): %d epochs, lr %g",
        cfg.family,
        seed,
        cfg.finetune.epochs,
        cfg.base_lr,
    )
    report = models_io.fine_tune(
        cfg, root, model, epochs=cfg.finetune.epochs, lr=cfg.base_lr, seed=seed
    )
    train, timings = models_io.split_timings(report)
    val = models_io.split(root, "val")
    logits = models_io.logits_of(model, models_io.batches(cfg, val, cfg.evaluate.batch_size))
    probs = logits.softmax(-1)
    labels = models_io.labels_of(val)
    summary = {
        "seed": seed,
        "family": cfg.family,
        "train": train,
        "val_accuracy": float((probs.argmax(-1) == labels).float().mean()),
        "val_mean_confidence": float(probs.max(-1).values.mean()),
        "classes": list(models_io.manifest(root).classes),
    }
    models_io.save_base(model, out_dir, summary)
    log.info(
        "seed %d: val accuracy %.3f, mean confidence %.3f, trained in %.1fs",
        seed,
        summary["val_accuracy"],
        summary["val_mean_confidence"],
        timings.get("total_seconds", float("nan")),
    )
    return summary, timings


def run(cfg: PipelineConfig, root: Path) -> dict[str, Any]:
    summary, timings = train_base(cfg, root, cfg.finetune.seed, root / BASE)
    # metrics/finetune_base.json is not cached (dvc.yaml): the timings may live here
    metrics = {**summary, "train": {**summary["train"], **timings}}
    write_json(root / METRICS / "finetune_base.json", metrics)
    return metrics


def main() -> None:
    stage_main("finetune_base", run)


if __name__ == "__main__":
    main()
