"""The models ``evaluate`` compares: the Hydra that ships and the baselines that make it trusted.

``hydra``: the compiled artifact that ships (``models/compiled``, whatever backend and precision
compile kept), beside the eager calibrated model it was compiled from (``models/hydra``, fp32) so
evaluate can report how far apart they are; with ``compile.backend: eager`` the eager model is
what ships and is scored as it is. ``single``, ``naive_pruned`` (the base
pruned to the top-k heads), ``deep_ensemble``, ``mc_dropout`` (when enabled) and, when members were
fine-tuned, ``control``. ``single``, ``deep_ensemble`` and ``mc_dropout`` come from
:func:`tasks.candidates.baseline_models.seed_baselines` (the seed's models alone, whatever the
variant). Each baseline carries its ``export`` (:mod:`tasks.candidates.export`): how it ships when
``promote.candidates`` lets it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from hydra_ops.heads.plans import load_plans
from hydra_ops.models.checkpoints import load_pruned
from hydra_ops.models.inference import logits as run_logits
from hydra_ops.models.runtime import Runtime
from tasks.candidates.baseline_models import Candidate, independent_models, seed_baselines
from tasks.candidates.export import control_export, naive_pruned_export
from tasks.params.baselines import BaselinesStageConfig
from tasks.runtime.layout import BASE, COMPILED, HYDRA, PLANS
from tasks.runtime.outputs import read_json

log = logging.getLogger("hydra_ens")


def shipped_logits(
    hydra: nn.Module, shipped: str | None, runtime: Runtime
) -> Callable[[dict], torch.Tensor]:
    """``batch -> [B, M, C]`` fp32 member logits of ``hydra`` as an artifact at precision
    ``shipped`` computes them: the gates judge what ships. A bf16/fp16 artifact is the eager
    model with weights and inputs cast to that precision (compile checked the two agree; the
    cast is in place: pass a copy to keep ``hydra``); fp32 (or None: no compile record) runs
    ``hydra`` as it is, under ``runtime``'s precision."""
    from hydra_ops.compile import DTYPES, cast_batch, precision_name

    if shipped in (None, "fp32", "float32"):
        return lambda b: run_logits(hydra, [b], device=runtime.device, precision=runtime.precision)
    shipped = precision_name(shipped)
    log.info("evaluate hydra: at the shipped precision %s (compiled.json)", shipped)
    at_shipped = hydra.to(DTYPES[shipped])
    return lambda b: run_logits(at_shipped, [cast_batch(b, shipped)], device=runtime.device)


class ShippedHydra(Candidate):
    """The Hydra candidate: ``fn`` runs what ships; ``eager`` (None when the eager model is what
    ships) runs the fp32 eager model it was compiled from, the reference of evaluate's check;
    ``timed_eager`` the same eager model at the stage's precision, the Hydra's row of the cost
    comparison (every model eager, like with like); ``scored_by`` says which ran."""

    def __init__(
        self,
        fn: Callable[[dict], torch.Tensor],
        parameters: int,
        k: int,
        scored_by: str,
        eager: Callable[[dict], torch.Tensor] | None,
        timed_eager: Callable[[dict], torch.Tensor] | None = None,
    ):
        super().__init__("hydra", fn, parameters, k)
        self.scored_by, self.eager = scored_by, eager
        self.timed_eager = timed_eager or eager

    @torch.no_grad()
    def eager_logits(self, data_batches: list[dict]) -> torch.Tensor | None:
        """``[N, M, C]`` of the eager model on ``data_batches`` (None when it is what ships)."""
        if self.eager is None:
            return None
        return torch.cat([self.eager(b).float() for b in data_batches])


def shipped_hydra(
    cfg: BaselinesStageConfig,
    root: Path,
    hydra: nn.Module,
    runtime: Runtime,
    timed_precision: str | None = None,
) -> ShippedHydra:
    """The Hydra candidate of ``root`` (module docstring). The compiled artifact is loaded with
    its hash verified and runs on the device it was compiled for; the eager model on
    ``runtime`` (what ships when compile kept the eager model, and the fp32 reference otherwise),
    timed for the cost comparison at ``timed_precision`` (None: ``runtime``'s), the baselines'."""
    from hydra_ops.compile import load_compiled

    compiled = read_json(root / COMPILED / "compiled.json", "compile output")
    params, k = int(hydra.num_parameters(effective=True)), cfg.members.num_members
    if compiled["backend"] == "eager":
        fn = shipped_logits(hydra, compiled.get("precision"), runtime)
        return ShippedHydra(fn, params, k, "eager (compile.backend: eager)", None)
    artifact = load_compiled(root / COMPILED)
    scored_by = f"compiled {artifact.backend} ({artifact['precision']} on {artifact.device})"
    log.info("evaluate hydra: scoring the shipped artifact, %s", scored_by)

    def eager(b: dict) -> torch.Tensor:
        return run_logits(hydra, [b], device=runtime.device, precision="fp32")

    def timed_eager(b: dict) -> torch.Tensor:
        precision = timed_precision or runtime.precision
        return run_logits(hydra, [b], device=runtime.device, precision=precision)

    return ShippedHydra(lambda b: artifact(b).float(), params, k, scored_by, eager, timed_eager)


def build_candidates(
    cfg: BaselinesStageConfig,
    root: Path,
    runtime: Runtime | None = None,
    hydra_runtime: Runtime | None = None,
) -> tuple[list[Candidate], float]:
    """The candidates, every baseline on ``runtime`` (None: CPU fp32), and Hydra's temperature
    (the first candidate is the :class:`ShippedHydra`). ``hydra_runtime`` (None: ``runtime``)
    runs the Hydra's eager model: the gates judge what ships, so a measured inference precision
    of the baselines never changes the precision an eager Hydra is scored at; its cost row is
    timed at ``runtime``'s precision, like the baselines'."""
    from hydra_ops.hydra.serialization import load_hydra
    from tasks.runtime.members import load_members

    rt = runtime or Runtime()
    hydra = load_hydra(root / HYDRA)
    temperature = float(hydra.temperature)
    cands: list[Candidate] = [shipped_hydra(cfg, root, hydra, hydra_runtime or rt, rt.precision)]
    shared = {c.name: c for c in seed_baselines(cfg, root, rt)}
    cands.append(shared.pop("single"))
    naive_plan = load_plans(root / PLANS / "naive_plan.json")[0]
    naive = independent_models("naive_pruned", [load_pruned(root / BASE, naive_plan)], {}, rt)
    naive.export = naive_pruned_export()
    cands.append(naive)
    cands += shared.values()  # deep_ensemble, then mc_dropout when enabled
    controls = load_members(cfg, root, kind="control")
    if controls:
        control = independent_models("control", controls, {}, rt)
        control.export = control_export(len(controls))
        cands.append(control)
    return cands, temperature
