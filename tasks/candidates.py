"""The models ``evaluate`` compares: the Hydra that ships and the baselines that make it trusted.

``hydra`` (``models/hydra``, at the precision it ships), ``single``, ``naive_pruned`` (the base
pruned to the top-k heads), ``deep_ensemble``, ``mc_dropout`` (when enabled) and, when members were
fine-tuned, ``control``. ``single``, ``deep_ensemble`` and ``mc_dropout`` come from
:func:`tasks.baseline_models.seed_baselines` (the seed's models alone, whatever the variant).
"""

from __future__ import annotations

import logging
from pathlib import Path

from hydra_ops.checkpoints import load_pruned
from hydra_ops.inference import logits as run_logits
from hydra_ops.plans import load_plans
from hydra_ops.runtime import Runtime
from tasks.baseline_models import Candidate, independent_models, seed_baselines
from tasks.common import BASE, COMPILED, HYDRA, PLANS, read_json
from tasks.params import PipelineConfig

log = logging.getLogger("hydra_ens")


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
    shared = {c.name: c for c in seed_baselines(cfg, root, rt)}
    cands.append(shared.pop("single"))
    naive_plan = load_plans(root / PLANS / "naive_plan.json")[0]
    cands.append(independent_models("naive_pruned", [load_pruned(root / BASE, naive_plan)], {}, rt))
    cands += shared.values()  # deep_ensemble, then mc_dropout when enabled
    controls = load_members(cfg, root, kind="control")
    if controls:
        cands.append(independent_models("control", controls, {}, rt))
    return cands, temperature
