"""Stage ``finetune_baselines``: the Deep Ensemble baseline's extra members, and the efficient
ensembles trained on the fine-tuned base when enabled (LoRA-Ensemble, BatchEnsemble:
:mod:`tasks.candidates.efficient_baselines`, units ``models/baselines/lora_ensemble`` and
``batch_ensemble``).

The Deep Ensemble has K = ``baselines.deep_ensemble_size`` (default M) bases fine-tuned with
different seeds; member 0 is ``models/base`` itself, members 1..K-1 land in
``models/baselines/seed_<s>`` (resumable units, see :mod:`tasks.runtime.resumable`). They train in
the precision ``runtime.precision`` resolves to for the base
(:func:`tasks.finetune_base.training_runtime`: the same probe, kept in the hardware record, so
every member of the ensemble trains alike). Without a Deep Ensemble (``baselines.deep_ensemble``
false, or ``auto`` with ``finetune.from_checkpoint``) nothing is trained for it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra_ops.models.runtime import Runtime
from tasks.candidates.efficient_baselines import train_units
from tasks.finetune_base import train_base, training_runtime
from tasks.params.baselines import BaselinesStageConfig
from tasks.runtime.layout import BASELINES, DATA
from tasks.runtime.resumable import dir_sha256, ensure_unit, finalise, fingerprint
from tasks.runtime.stage import stage_main

#: The params view this stage validates ``params.yaml`` with (the sections it reads).
SCHEMA = BaselinesStageConfig

log = logging.getLogger("hydra_ens")


def baseline_seeds(cfg: BaselinesStageConfig) -> list[int]:
    """The seeds of the Deep Ensemble's members 1..K-1; none when the run builds no Deep Ensemble
    (``baselines.deep_ensemble``: there is no backbone to retrain from a user's checkpoint)."""
    if not cfg.builds_deep_ensemble:
        return []
    return [cfg.finetune_seed + k for k in range(1, cfg.deep_ensemble_size)]


def _train_seed(
    cfg: BaselinesStageConfig, root: Path, seed: int, out_dir: Path, runtime: Runtime
) -> dict[str, Any]:
    """Build one Deep Ensemble unit; its timings go to the log (this stage has no metrics file),
    the returned summary into the unit's cached ``done.json``."""
    summary, timings = train_base(cfg, root, seed, out_dir, runtime)
    log.info("deep ensemble seed %d: epoch seconds %s", seed, timings.get("epoch_seconds"))
    return summary


def run(cfg: BaselinesStageConfig, root: Path) -> dict[str, Any]:
    out = root / BASELINES
    # the same model and probe batch as finetune_base: its measurement is reused
    # (tasks.runtime.precision)
    seeds = baseline_seeds(cfg)
    needs_training = seeds or cfg.baselines.lora_ensemble.enabled
    needs_training = needs_training or cfg.baselines.batch_ensemble.enabled
    if not needs_training:
        finalise(out, {}, {"deep_ensemble_size": 0, "base_is_member_0": False})
        return {"units": []}
    rt, _ = training_runtime(cfg, root, "finetune_baselines")
    data_hash = dir_sha256(root / DATA)
    units = {}
    for seed in seeds:
        fp = fingerprint(
            {
                "data": data_hash,
                "family": cfg.family,
                "model": cfg.model.model_dump(),
                "finetune": cfg.finetune.model_dump(),
                "lr": cfg.base_lr,
                "seed": seed,
                # CPU fp32 units keep the fingerprint they had before the runtime setting
                **({} if rt.is_default else {"runtime": rt.tag}),
            }
        )
        name = f"seed_{seed}"
        units[name] = ensure_unit(
            out / name,
            fp,
            lambda tmp, s=seed: _train_seed(cfg, root, s, tmp, rt),
            f"deep ensemble {name}",
        )
    units.update(train_units(cfg, root, rt))
    size = cfg.deep_ensemble_size if cfg.builds_deep_ensemble else 0
    finalise(out, units, {"deep_ensemble_size": size, "base_is_member_0": size > 0})
    return {"units": list(units)}


def main() -> None:
    stage_main("finetune_baselines", run, SCHEMA)


if __name__ == "__main__":
    main()
