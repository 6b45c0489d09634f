"""The models ``evaluate`` compares: the Hydra that ships and the baselines that make it trusted.

``hydra`` (``models/hydra``, at the precision it ships), ``single`` (the fine-tuned base),
``naive_pruned`` (the base pruned to the top-k heads), ``deep_ensemble`` (the base plus
``models/baselines``), ``mc_dropout`` (the base with dropout on, ``baselines.mc_dropout.samples``
passes, when enabled) and, when members were fine-tuned, ``control``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch

from hydra_ops.checkpoints import load_model, load_pruned
from hydra_ops.inference import logits as run_logits
from hydra_ops.plans import load_plans
from hydra_ops.runtime import Runtime
from tasks.common import BASE, BASELINES, COMPILED, HYDRA, PLANS, read_json
from tasks.params import PipelineConfig

log = logging.getLogger("hydra_ens")


class Candidate:
    """A model under evaluation: ``logits(batch) -> [B, K, C]`` (K members; 1 for a single
    model). ``split_logits``, when given, computes a whole split's ``[N, K, C]`` instead (so shared
    models can reuse cached outputs); latency always times ``fn``."""

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

    @torch.no_grad()
    def member_logits(self, data_batches: list[dict]) -> torch.Tensor:
        if self.split_logits is not None:
            return self.split_logits(data_batches)
        return torch.cat([self.fn(b).float() for b in data_batches])

    def latency_ms(self, batch: dict, repeats: int, device: torch.device | None = None) -> float:
        """Median ms of ``fn(batch)`` (synchronised on a CUDA ``device``)."""
        from hydra_ops.compile import median_latency_ms

        return median_latency_ms(lambda: self.fn(batch), repeats, device)[1]


def _singles(
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


def _mc_dropout(cfg: PipelineConfig, base: torch.nn.Module, runtime: Runtime | None) -> Candidate:
    """The base with its dropout on at inference, ``samples`` seeded passes (K = samples). The
    mask seed is ``baselines.mc_dropout.seed`` shifted like every other seed of the replicate, and
    restarts on every call: each split's logits, and the latency batch's, are reproducible."""
    from hydra_ops.mc_dropout import dropout_setting, mc_dropout_logits

    rt = runtime or Runtime()
    mc = cfg.baselines.mc_dropout
    seed = mc.seed + cfg.replicate_offset
    log.info(
        "evaluate mc_dropout: %d samples; %s", mc.samples, dropout_setting(base, mc.rate).describe()
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
        )

    params = sum(p.numel() for p in base.parameters())
    return Candidate("mc_dropout", lambda b: split_logits([b]), params, mc.samples, split_logits)


def build_candidates(
    cfg: PipelineConfig, root: Path, runtime: Runtime | None = None
) -> tuple[list[Candidate], float]:
    """The candidates, every model on ``runtime`` (None: CPU fp32), and Hydra's temperature."""
    from hydra_ops.serialization import load_hydra
    from tasks.merge import load_members

    rt = runtime or Runtime()
    hydra = load_hydra(root / HYDRA)
    temperature = float(hydra.temperature)
    # The gates judge what ships: when compile shipped a bf16/fp16 artifact, the Hydra is the
    # eager model cast to that precision (what the artifact computes; compile checked the two
    # agree); an fp32 (or eager) artifact keeps today's path (bit-identical metrics).
    shipped = read_json(root / COMPILED / "compiled.json", "compile output").get("precision")
    if shipped in (None, "fp32", "float32"):
        hydra_logits = lambda b: run_logits(  # noqa: E731
            hydra, [b], device=rt.device, precision=rt.precision
        )
    else:
        from hydra_ops.compile import DTYPES, cast_batch, precision_name

        shipped = precision_name(shipped)
        at_shipped = hydra.to(DTYPES[shipped])
        hydra_logits = lambda b: run_logits(  # noqa: E731
            at_shipped, [cast_batch(b, shipped)], device=rt.device
        )
        log.info("evaluate hydra: at the shipped precision %s (compiled.json)", shipped)
    cands = [
        Candidate(
            "hydra",
            hydra_logits,
            int(hydra.num_parameters(effective=True)),
            cfg.members.num_members,
        )
    ]
    cache: dict[tuple[int, int], torch.Tensor] = {}
    base = load_model(root / BASE)
    cands.append(_singles("single", [base], cache, rt))
    naive_plan = load_plans(root / PLANS / "naive_plan.json")[0]
    cands.append(_singles("naive_pruned", [load_pruned(root / BASE, naive_plan)], cache, rt))
    ensemble = [base]
    index = read_json(root / BASELINES / "index.json", "finetune_baselines output")
    for unit in index["units"]:
        ensemble.append(load_model(root / BASELINES / unit))
    cands.append(_singles("deep_ensemble", ensemble, cache, rt))
    if cfg.baselines.mc_dropout.enabled:
        cands.append(_mc_dropout(cfg, base, rt))
    controls = load_members(cfg, root, kind="control")
    if controls:
        cands.append(_singles("control", controls, cache, rt))
    return cands, temperature
