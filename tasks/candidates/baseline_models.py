"""The baselines made of a seed's upstream alone: ``single`` (the fine-tuned base),
``deep_ensemble`` (the base plus ``models/baselines/seed_*``), ``mc_dropout`` (the base with
dropout on at inference, ``baselines.mc_dropout.samples`` passes, when enabled) and, when
enabled, ``lora_ensemble`` and ``batch_ensemble`` (:mod:`tasks.candidates.efficient_baselines`).
They are the same for every Hydra variant of a seed, so stage ``baseline_logits`` computes their
logits once and ``evaluate`` reads them back (it still times them itself, beside the Hydra).

:class:`Candidate` is the one interface ``evaluate`` runs models through.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hydra_ops.models.checkpoints import load_model
from hydra_ops.models.inference import logits as run_logits
from hydra_ops.models.runtime import Runtime
from hydra_ops.perf.precision_probe import PrecisionChoice
from tasks.candidates.export import deep_ensemble_export, mc_dropout_export, single_export
from tasks.params.baselines import BaselinesStageConfig
from tasks.runtime import data as prepared
from tasks.runtime.layout import BASE, BASELINES
from tasks.runtime.outputs import read_json
from tasks.runtime.precision import check_batches, stage_runtime

log = logging.getLogger("hydra_ens")

#: The splits ``evaluate`` runs every model on (``val`` fits the baselines' temperatures).
EVAL_SPLITS = ("val", "test", "shift", "near_ood", "far_ood")


class Candidate:
    """A model under evaluation: ``logits(batch) -> [B, K, C]`` (K members; 1 for a single
    model). ``split_logits``, when given, computes a whole split's ``[N, K, C]`` instead (so shared
    models can reuse cached outputs); the cost comparison (:mod:`tasks.evaluation.cost`) times
    ``fn``."""

    def __init__(
        self,
        name: str,
        fn: Callable[[dict], torch.Tensor],
        parameters: int,
        k: int,
        split_logits: Callable[[list[dict]], torch.Tensor] | None = None,
    ):
        self.name, self.fn, self.parameters, self.members = name, fn, parameters, k
        self.split_logits = split_logits
        #: how it ships (:mod:`tasks.candidates.export`: recipe and source files); None: it cannot
        self.export: dict[str, Any] | None = None

    @torch.no_grad()
    def member_logits(self, data_batches: list[dict]) -> torch.Tensor:
        if self.split_logits is not None:
            return self.split_logits(data_batches)
        return torch.cat([self.fn(b).float() for b in data_batches])


def independent_models(
    name: str,
    models: list[torch.nn.Module],
    cache: dict[tuple[int, int], torch.Tensor],
    runtime: Runtime | None = None,
) -> Candidate:
    """Independent models as one candidate. ``cache`` maps ``(id(model), id(split batches))`` to
    ``[N, C]`` logits, shared between candidates: the base is both ``single`` and Deep Ensemble
    member 0, and runs once per split. The models run on ``runtime`` (None: CPU fp32)."""
    rt = runtime or Runtime()

    def logits(m: torch.nn.Module, batches: list[dict]) -> torch.Tensor:
        return run_logits(m, batches, device=rt.device, precision=rt.precision)

    def fn(b: dict) -> torch.Tensor:
        return torch.stack([logits(m, [b]) for m in models], dim=1)

    def split_logits(batches: list[dict]) -> torch.Tensor:
        per_model = []
        for m in models:
            key = (id(m), id(batches))
            if key not in cache:
                cache[key] = logits(m, batches)
            per_model.append(cache[key])
        return torch.stack(per_model, dim=1)

    params = sum(p.numel() for m in models for p in m.parameters())
    return Candidate(name, fn, params, len(models), split_logits)


def mc_dropout_model(
    cfg: BaselinesStageConfig, base: torch.nn.Module, runtime: Runtime | None
) -> Candidate:
    """The base with its dropout on at inference, ``samples`` seeded passes (K = samples). The
    mask seed is ``baselines.mc_dropout.seed`` shifted like every other seed of the replicate, and
    restarts on every call: each split's logits, and the latency batch's, are reproducible. The
    mask sampler is the device's fastest (``auto``), recorded in the export recipe so the
    shipped candidate draws the same masks anywhere."""
    from hydra_ops.models.inverted_dropout import resolve_implementation
    from hydra_ops.models.mc_dropout import dropout_setting, mc_dropout_logits

    rt = runtime or Runtime()
    mc = cfg.baselines.mc_dropout
    seed = mc.seed + cfg.replicate_offset
    sampler = resolve_implementation("auto", rt.device)
    log.info(
        "evaluate mc_dropout: %d samples; %s; %s masks",
        mc.samples,
        dropout_setting(base, mc.rate).describe(),
        sampler,
    )

    def split_logits(batches: list[dict]) -> torch.Tensor:
        return mc_dropout_logits(
            base,
            batches,
            mc.samples,
            seed=seed,
            rate=mc.rate,
            device=rt.device,
            precision=rt.precision,
            implementation=sampler,
        )

    params = sum(p.numel() for p in base.parameters())
    cand = Candidate("mc_dropout", lambda b: split_logits([b]), params, mc.samples, split_logits)
    cand.export = mc_dropout_export(mc.samples, seed, mc.rate, sampler)
    return cand


def seed_baselines(
    cfg: BaselinesStageConfig, root: Path, runtime: Runtime | None = None
) -> list[Candidate]:
    """``single``, ``deep_ensemble`` (unless the run builds none) and, when enabled,
    ``mc_dropout``, ``lora_ensemble`` and ``batch_ensemble``: the baselines made of the seed's
    base and ``models/baselines`` alone, the same for every Hydra variant of that seed. The base
    runs once per split for both ``single`` and Deep Ensemble member 0."""
    rt = runtime or Runtime()
    cache: dict[tuple[int, int], torch.Tensor] = {}
    base = load_model(root / BASE)
    ensemble = [base]
    index = read_json(root / BASELINES / "index.json", "finetune_baselines output")
    # the Deep Ensemble's seeds; the other units are the efficient baselines'
    seeds = [unit for unit in index["units"] if unit.startswith("seed_")]
    ensemble += [load_model(root / BASELINES / unit) for unit in seeds]
    cands = [independent_models("single", [base], cache, rt)]
    cands[0].export = single_export()
    if cfg.builds_deep_ensemble:
        cands.append(independent_models("deep_ensemble", ensemble, cache, rt))
        cands[1].export = deep_ensemble_export(seeds)
    if cfg.baselines.mc_dropout.enabled:
        cands.append(mc_dropout_model(cfg, base, rt))
    return cands + efficient_models(cfg, root, rt)


def efficient_models(cfg: BaselinesStageConfig, root: Path, runtime: Runtime) -> list[Candidate]:
    """The enabled efficient ensembles (:mod:`tasks.candidates.efficient_baselines`) as candidates,
    K = their members; latency times one forward of the ensemble (one pass over the stacked batch,
    or LoRA-Ensemble member by member when ``baselines.lora_ensemble.batched`` is off)."""
    from tasks.candidates import efficient_baselines as eff

    out = []
    for name in eff.enabled(cfg):
        module = eff.load(cfg, root, name)

        def split_logits(batches: list[dict], module: torch.nn.Module = module) -> torch.Tensor:
            return eff.member_logits(module, batches, runtime)

        fn = lambda b, f=split_logits: f([b])  # noqa: E731
        out.append(Candidate(name, fn, module.num_parameters(), module.num_members, split_logits))
    return out


def base_inference_runtime(
    cfg: BaselinesStageConfig, root: Path, stage: str, val_batches: list[dict]
) -> tuple[Runtime, PrecisionChoice]:
    """``(runtime, choice)`` for the baselines' inference: what ``runtime.precision`` resolves to
    for the seed's base on ``val_batches``' first ``compile.check_examples`` examples
    (:func:`tasks.runtime.precision.stage_runtime`). Stage ``baseline_logits`` measures it;
    ``evaluate`` gets the same answer back from the hardware record, so every baseline runs at one
    precision."""
    from hydra_ops.perf.inference_probe import time_inference

    return stage_runtime(
        cfg,
        root,
        stage,
        "inference",
        lambda: load_model(root / BASE),
        lambda: check_batches(val_batches, cfg.compile.check_examples),
        time_inference,
    )


def eval_batches(
    cfg: BaselinesStageConfig, root: Path, runtime: Runtime | None = None
) -> dict[str, list[dict]]:
    """``{split: batches}`` of every split of :data:`EVAL_SPLITS`, unlabelled, in order, of
    ``evaluate.batch_size`` (pinned for a CUDA ``runtime``)."""
    rt = runtime or Runtime()
    pin = {"with_labels": False, "pin_memory": rt.pin_memory}
    return {
        s: prepared.batches(cfg, prepared.split(root, s), cfg.evaluate.batch_size, **pin)
        for s in EVAL_SPLITS
    }
