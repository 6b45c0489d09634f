"""The efficient-ensemble baselines of a seed: LoRA-Ensemble and BatchEnsemble on the fine-tuned
base (:mod:`hydra_ops.baselines`), when ``baselines.lora_ensemble.enabled`` /
``baselines.batch_ensemble.enabled``.

Stage ``finetune_baselines`` trains them beside the Deep Ensemble, as resumable units
``models/baselines/lora_ensemble`` and ``models/baselines/batch_ensemble``
(:mod:`tasks.runtime.resumable`: a unit whose fingerprint and file hashes verify is not retrained);
each holds only what the members add to ``models/base`` (adapters and classifiers, fast weights) and
the base's state-dict hash, checked on load. They train in the precision ``runtime.precision``
resolved for the Deep Ensemble. Like the Deep Ensemble and MC Dropout they are the same for every
Hydra variant of a seed: stage ``baseline_logits`` computes their logits once, ``evaluate`` scores,
times and bootstraps them like every baseline
(:func:`tasks.candidates.baseline_models.efficient_models`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hydra_ops.models.checkpoints import load_model, split_timings
from hydra_ops.models.runtime import Runtime
from tasks.params.baselines import BaselinesStageConfig
from tasks.runtime import data
from tasks.runtime.layout import BASE, BASELINES, DATA
from tasks.runtime.resumable import dir_sha256, ensure_unit, fingerprint

log = logging.getLogger("hydra_ens")

#: The baselines of this module, in report order (unit folder = model name).
EFFICIENT = ("lora_ensemble", "batch_ensemble")


def enabled(cfg: BaselinesStageConfig) -> list[str]:
    """The efficient baselines ``cfg`` turns on, in :data:`EFFICIENT` order."""
    return [name for name in EFFICIENT if getattr(cfg.baselines, name).enabled]


def num_members(cfg: BaselinesStageConfig, name: str) -> int:
    """Members of baseline ``name``: its ``members``, else M (``members.num_members``)."""
    return getattr(cfg.baselines, name).members or cfg.members.num_members


def _seed(cfg: BaselinesStageConfig, name: str) -> int:
    return getattr(cfg.baselines, name).seed + cfg.replicate_offset


def _progress() -> bool:
    return os.environ.get("HYDRA_ENS_PROGRESS", "1") != "0"


def _val_accuracy(
    module: torch.nn.Module, cfg: BaselinesStageConfig, root: Path, rt: Runtime
) -> list:
    """Each member's validation accuracy (``module(batch) -> [B, M, C]``)."""
    from hydra_ops.data import split_labels

    val = data.split(root, "val")
    logits = member_logits(module, data.batches(cfg, val, cfg.evaluate.batch_size), rt)
    labels = split_labels(val)
    return [
        round(float((logits[:, m].argmax(-1) == labels).float().mean()), 6)
        for m in range(logits.shape[1])
    ]


def _train_lora(cfg: BaselinesStageConfig, root: Path, out: Path, rt: Runtime) -> dict[str, Any]:
    from hydra_ops.baselines.lora_ensemble import LoRAEnsemble, save_lora_ensemble
    from hydra_ops.models.training import fine_tune

    c, seed = cfg.baselines.lora_ensemble, _seed(cfg, "lora_ensemble")
    ens = LoRAEnsemble(
        load_model(root / BASE),
        num_members(cfg, "lora_ensemble"),
        c.rank,
        c.alpha,
        c.dropout,
        seed,
        c.batched,
    )
    train = []
    for m in range(ens.num_members):
        report = fine_tune(
            ens.train_member(m),
            data.train_batches(cfg, root, seed + m, pin_memory=rt.pin_memory),
            epochs=c.epochs,
            lr=c.lr,
            weight_decay=cfg.finetune.weight_decay,
            warmup_ratio=cfg.finetune.warmup_ratio,
            seed=seed + m,
            progress=_progress(),
            device=rt.device,
            precision=rt.precision,
        )
        kept, timings = split_timings(report.to_dict())
        log.info("lora_ensemble member %d: epoch seconds %s", m, timings.get("epoch_seconds"))
        train.append(kept)
    ens.eval()
    summary = {"members": ens.num_members, "train": train}
    summary["val_accuracy"] = _val_accuracy(ens, cfg, root, rt)
    save_lora_ensemble(ens.cpu(), out, summary)
    return summary


def _train_batch(cfg: BaselinesStageConfig, root: Path, out: Path, rt: Runtime) -> dict[str, Any]:
    from hydra_ops.baselines.batch_ensemble import BatchEnsemble, save_batch_ensemble
    from hydra_ops.baselines.batching import member_major_batches
    from hydra_ops.models.training import fine_tune

    c, seed = cfg.baselines.batch_ensemble, _seed(cfg, "batch_ensemble")
    ens = BatchEnsemble(
        load_model(root / BASE), num_members(cfg, "batch_ensemble"), c.init_std, seed
    )
    batches = data.train_batches(cfg, root, seed, pin_memory=rt.pin_memory)
    report = fine_tune(
        ens.model,
        member_major_batches(batches, ens.num_members),
        epochs=c.epochs,
        lr=c.lr,
        weight_decay=0.0,  # fast weights are scales around 1 and biases: no decay towards 0
        warmup_ratio=cfg.finetune.warmup_ratio,
        seed=seed,
        progress=_progress(),
        device=rt.device,
        precision=rt.precision,
    )
    kept, timings = split_timings(report.to_dict())
    log.info("batch_ensemble: epoch seconds %s", timings.get("epoch_seconds"))
    ens.eval()
    summary = {"members": ens.num_members, "train": [kept]}
    summary["val_accuracy"] = _val_accuracy(ens, cfg, root, rt)
    save_batch_ensemble(ens.cpu(), out, summary)
    return summary


_TRAIN: dict[str, Callable[[BaselinesStageConfig, Path, Path, Runtime], dict[str, Any]]] = {
    "lora_ensemble": _train_lora,
    "batch_ensemble": _train_batch,
}


def train_units(cfg: BaselinesStageConfig, root: Path, rt: Runtime) -> dict[str, dict[str, Any]]:
    """Train (or verify) the enabled baselines' units under ``models/baselines``; returns
    ``{name: done record}`` for :func:`tasks.runtime.resumable.finalise`."""
    if not enabled(cfg):
        return {}
    shared = {
        "data": dir_sha256(root / DATA),
        "base": dir_sha256(root / BASE),
        "family": cfg.family,
        "batch_size": cfg.finetune.batch_size,
        "weight_decay": cfg.finetune.weight_decay,
        "warmup_ratio": cfg.finetune.warmup_ratio,
        **({} if rt.is_default else {"runtime": rt.tag}),
    }
    units = {}
    for name in enabled(cfg):
        section = getattr(cfg.baselines, name).model_dump(exclude={"batched"})
        fp = fingerprint(
            {
                **shared,
                name: section,
                "members": num_members(cfg, name),
                "seed": _seed(cfg, name),
            }
        )
        units[name] = ensure_unit(
            root / BASELINES / name,
            fp,
            lambda tmp, n=name: _TRAIN[n](cfg, root, tmp, rt),
            name.replace("_", " "),
        )
    return units


def member_logits(module: torch.nn.Module, batches: list[dict], runtime: Runtime) -> torch.Tensor:
    """``[N, M, C]`` float32 CPU logits of an ensemble module (``batch -> [B, M, C]``) over
    ``batches``, on ``runtime``'s device and precision, without grad, in eval mode."""
    from hydra_ops.models.runtime import autocast, move_batch

    module.to(runtime.device).eval()
    out = []
    with torch.no_grad():
        for b in batches:
            with autocast(runtime.device, runtime.precision):
                out.append(module(move_batch(b, runtime.device)).float().cpu())
    return torch.cat(out)


def load(cfg: BaselinesStageConfig, root: Path, name: str) -> torch.nn.Module:
    """Baseline ``name`` as trained under ``models/baselines/<name>``, on a fresh copy of the
    base (the adapters go into the model in place)."""
    from hydra_ops.baselines.batch_ensemble import load_batch_ensemble
    from hydra_ops.baselines.lora_ensemble import load_lora_ensemble

    base = load_model(root / BASE)
    if name == "lora_ensemble":
        return load_lora_ensemble(
            root / BASELINES / name, base, batched=cfg.baselines.lora_ensemble.batched
        )
    return load_batch_ensemble(root / BASELINES / name, base)
