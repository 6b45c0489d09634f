"""Stage ``finetune_members``: the Taylor variant's short fine-tune of each pruned member.

For the Taylor variant (``members.finetune.enabled: auto`` with ``scoring.method: taylor``, or
``true``) each member ``m`` is the base pruned with plan ``m`` and fine-tuned with seed
``finetune.seed + members.finetune.seed_offset + m``; with ``members.finetune.controls`` (the
``study`` profile) ``control_m`` is an *unpruned* copy of the base given the same fine-tune (the
control that separates pruning from extra training). With
``merge.shared_layers = k > 0`` both keep the embeddings and the first ``k`` layers frozen, so the
merge can share them. The circuit
variant skips this stage's work and writes only ``index.json`` (``finetuned: false``); the merge
then prunes copies of the base.

Diversity mechanisms (off by default; docs/diversity.md): ``members.finetune.data`` gives member
``m`` (and ``control_m``) a bootstrap resample or the ``m``-th disjoint shard of the training split
(:mod:`hydra_ops.data.members`), and ``members.finetune.objective: ncl`` adds the
negative-correlation penalty against the fine-tuned base's predictions on each batch
(:mod:`hydra_ops.models.diversity_loss`).

Each unit trains in the precision :func:`unit_runtime` resolves (``runtime.precision``; ``auto``
probes a member and a control once per machine and shape, :mod:`tasks.runtime.precision`), recorded
in its ``done.json`` (``runtime``) and the log.

Each member is a resumable unit (:mod:`tasks.runtime.resumable`): a killed run restarts only
unfinished members. ``python -m tasks.finetune_members --member m`` builds one member (what the
Prefect flow maps over when ``members.finetune.max_parallel`` > 1); without ``--member`` every
member is built (or verified) and the index written.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from hydra_ops.heads.plans import load_plans
from hydra_ops.models.checkpoints import (
    load_model,
    load_pruned,
    save_member,
    split_timings,
    weights_hash,
)
from hydra_ops.models.runtime import Runtime, describe_device, resolve_device
from hydra_ops.models.training import fine_tune, freeze_layers
from tasks.params.core import CoreConfig
from tasks.runtime.data import batches, split, train_batches
from tasks.runtime.layout import BASE, MEMBERS, PLANS
from tasks.runtime.precision import precision_record, probe_batch, stage_runtime
from tasks.runtime.resumable import ensure_unit, finalise, fingerprint
from tasks.runtime.stage import stage_main

#: The params view this stage validates ``params.yaml`` with (the sections it reads).
SCHEMA = CoreConfig

log = logging.getLogger("hydra_ens")


def unit_runtime(cfg: CoreConfig, root: Path, label: str, load: Callable[[], nn.Module]) -> Runtime:
    """The precision unit ``label`` trains in (:func:`tasks.runtime.precision.stage_runtime`): the
    probe, when one runs, times ``load()`` with the trunk frozen as the fine-tune freezes it, on the
    probe batch of :func:`tasks.runtime.precision.probe_batch`. Members share one measurement, and
    controls another (kept in the hardware record)."""

    def probe_model() -> nn.Module:
        model = load()
        if cfg.shared_layers:
            freeze_layers(model, cfg.shared_layers)
        return model

    def batch() -> list[dict]:
        return probe_batch(cfg, root)

    label = f"finetune_members {label}"
    rt, _ = stage_runtime(cfg, root, label, "training", probe_model, batch, log_runtime=False)
    return rt


def log_runtime(cfg: CoreConfig) -> None:
    """The stage's one runtime line (each unit logs the precision it resolved)."""
    if cfg.runtime.precision != "auto":
        spec = Runtime.from_spec(cfg.runtime.device, cfg.runtime.precision, training=True)
        log.info(spec.describe())
        return
    device = describe_device(resolve_device(cfg.runtime.device))
    log.info("runtime: device %s, precision auto (resolved per member and control)", device)


def member_seed(cfg: CoreConfig, m: int) -> int:
    return cfg.finetune_seed + cfg.members.finetune.seed_offset + m


def member_train_batches(cfg: CoreConfig, root: Path, m: int, rt: Runtime):
    """``epoch -> batches`` of member ``m``'s training data:
    :func:`tasks.runtime.data.train_batches` itself for ``members.finetune.data: full``; otherwise
    the member's subset (:func:`hydra_ops.data.members.member_indices`), shuffled per epoch the same
    way."""
    seed, mode = member_seed(cfg, m), cfg.members.finetune.data
    if mode == "full":
        return train_batches(cfg, root, seed, pin_memory=rt.pin_memory)
    from hydra_ops.data.members import member_indices, subset

    train = split(root, "train")
    # shards: one permutation for all members (seed of member 0), so the shards are disjoint
    draw_seed = member_seed(cfg, 0) if mode == "shards" else seed
    indices = member_indices(train.labels, cfg.members.num_members, m, mode, draw_seed)
    mine = subset(train, indices)
    log.info("member %d: %s data, %d of %d examples", m, mode, len(mine), len(train))

    def epoch_batches(epoch: int) -> list[dict]:
        return batches(
            cfg,
            mine,
            cfg.finetune.batch_size,
            shuffle=True,
            seed=seed + epoch,
            pin_memory=rt.pin_memory,
            random_shift=cfg.finetune.random_shift,
        )

    return epoch_batches


def _loss_term(cfg: CoreConfig, root: Path, rt: Runtime):
    """The fine-tune's extra loss term: None (cross-entropy alone) or the NCL penalty against
    the fine-tuned base (``members.finetune.objective: ncl``), run in the fine-tune's precision."""
    ft = cfg.members.finetune
    if ft.objective == "ce":
        return None
    from hydra_ops.models.diversity_loss import anchored_ncl_term

    return anchored_ncl_term(load_model(root / BASE), ft.ncl_strength, rt.precision)


def _unit_fingerprint(
    cfg: CoreConfig, root: Path, kind: str, plan_layers, m: int, runtime: Runtime
) -> str:
    return fingerprint(
        {
            "kind": kind,
            "base": weights_hash(root / BASE),
            "plan": plan_layers,
            "finetune": cfg.members.finetune.model_dump(exclude={"max_parallel", "controls"}),
            "batch": cfg.finetune.batch_size,
            "lr": cfg.member_lr,
            "max_length": cfg.model.max_length,
            "seed": member_seed(cfg, m),
            "frozen_layers": cfg.shared_layers,
            # a member's shard depends on how many shards there are
            **(
                {"shards": cfg.members.num_members} if cfg.members.finetune.data == "shards" else {}
            ),
            # CPU fp32 units keep the fingerprint they had before the runtime setting
            **({} if runtime.is_default else {"runtime": runtime.tag}),
        }
    )


def build_member(
    cfg: CoreConfig, root: Path, m: int, runtime: Runtime | None = None
) -> dict[str, dict[str, Any]]:
    """Build (or verify) ``member_m`` and, when the run builds controls, ``control_m`` on
    ``runtime`` (None: each unit kind's :func:`unit_runtime`); returns their done-records."""
    plans = load_plans(root / PLANS / "plans.json")
    if not 0 <= m < len(plans):
        raise ValueError(f"--member {m}: allowed 0..{len(plans) - 1}")
    plan = plans[m]
    layers = [list(h) for h in plan.kept]
    ft = cfg.members.finetune
    seed = member_seed(cfg, m)
    out: dict[str, dict[str, Any]] = {}
    kinds = [("member", plan)] + ([("control", None)] if ft.controls else [])
    for kind, unit_plan in kinds:
        name = f"{kind}_{m}"

        def load(unit_plan=unit_plan) -> nn.Module:
            if unit_plan is None:
                return load_model(root / BASE)
            return load_pruned(root / BASE, unit_plan)

        rt = runtime or unit_runtime(cfg, root, name, load)

        def build(tmp: Path, load=load, kind=kind, rt=rt) -> dict[str, Any]:
            model = load()
            report = fine_tune(
                model,
                member_train_batches(cfg, root, m, rt),
                epochs=ft.epochs,
                lr=cfg.member_lr,
                weight_decay=cfg.finetune.weight_decay,
                warmup_ratio=cfg.finetune.warmup_ratio,
                seed=seed,
                progress=os.environ.get("HYDRA_ENS_PROGRESS", "1") != "0",
                frozen_layers=cfg.shared_layers or None,
                device=rt.device,
                precision=rt.precision,
                loss_term=_loss_term(cfg, root, rt),
            )
            # the unit's done.json and checkpoint are cached: timings only to the log
            train, timings = split_timings(report.to_dict())
            log.info(
                "%s_%d: trained in %.1fs (epoch seconds %s)",
                kind,
                m,
                timings.get("total_seconds", float("nan")),
                timings.get("epoch_seconds"),
            )
            info = {
                "kind": kind,
                "member": m,
                "seed": seed,
                "train": train,
                "runtime": precision_record(cfg, rt),
            }
            save_member(model.cpu(), tmp, root / BASE, info)
            return info

        fp = _unit_fingerprint(cfg, root, kind, layers if unit_plan is not None else None, m, rt)
        out[name] = ensure_unit(root / MEMBERS / name, fp, build, f"finetune_members {name}")
    return out


def run(cfg: CoreConfig, root: Path, member: int | None = None) -> dict[str, Any]:
    if not cfg.finetune_members:
        log.info(
            "finetune_members: skipped (variant %s does not fine-tune members)", cfg.scoring.method
        )
        finalise(root / MEMBERS, {}, {"finetuned": False, "variant": cfg.scoring.method})
        return {"finetuned": False}
    log_runtime(cfg)
    if member is not None:
        return {"units": list(build_member(cfg, root, member))}
    units: dict[str, dict[str, Any]] = {}
    for m in range(cfg.members.num_members):
        units.update(build_member(cfg, root, m))
    finalise(
        root / MEMBERS,
        units,
        {
            "finetuned": True,
            "variant": cfg.scoring.method,
            "num_members": cfg.members.num_members,
            "controls": cfg.members.finetune.controls,
        },
    )
    return {"finetuned": True, "units": list(units)}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tasks.finetune_members")
    parser.add_argument("--member", type=int, default=None, help="build only this member")
    args = parser.parse_args()
    stage_main("finetune_members", lambda cfg, root: run(cfg, root, args.member), SCHEMA)


if __name__ == "__main__":
    main()
