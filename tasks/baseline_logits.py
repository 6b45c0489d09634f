"""Stage ``baseline_logits``: the logits of the seed's baselines on every evaluation split, once.

``single``, ``deep_ensemble`` and ``mc_dropout``
(:func:`tasks.candidates.baseline_models.seed_baselines`) depend on the seed's base and Deep
Ensemble alone, so every Hydra variant of a seed would recompute the same 1 + (K - 1) + samples
passes over the evaluation splits in ``evaluate`` (most of that stage's time with MC Dropout on).
This stage runs them once and ``evaluate`` reads them back; a study computes it in each seed's
shared upstream.

Every baseline runs in the precision ``runtime.precision`` resolves to for the base at inference
(:mod:`tasks.runtime.precision`: ``auto`` keeps fp32 where bf16 is not native, else takes bf16 when
it is faster by the margin and agrees with fp32 within compile's low-precision tolerance on the
first ``compile.check_examples`` validation examples); ``index.json`` records it, and
``metrics/baseline_logits.json`` (not cached) the probe's reason and timings.

Output ``artifacts/baseline_logits/``: ``logits.safetensors`` (fp32 ``[N, K, C]`` per
``<model>/<split>``) and ``index.json`` (per model its members and parameters; per split its N).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from hydra_ops.models.runtime import Runtime, resolve_device
from tasks.candidates.baseline_models import (
    EVAL_SPLITS,
    base_inference_runtime,
    eval_batches,
    seed_baselines,
)
from tasks.params.baselines import BaselinesStageConfig
from tasks.runtime.layout import METRICS
from tasks.runtime.outputs import publish_dir, read_json, write_json
from tasks.runtime.precision import precision_record
from tasks.runtime.stage import stage_main

#: The params view this stage validates ``params.yaml`` with (the sections it reads).
SCHEMA = BaselinesStageConfig

log = logging.getLogger("hydra_ens")

BASELINE_LOGITS = Path("artifacts/baseline_logits")


def run(cfg: BaselinesStageConfig, root: Path) -> dict[str, Any]:
    from safetensors.torch import save_file

    device = Runtime(resolve_device(cfg.runtime.device))
    batched = eval_batches(cfg, root, device)
    rt, choice = base_inference_runtime(cfg, root, "baseline_logits", batched["val"])
    tensors: dict[str, torch.Tensor] = {}
    models: dict[str, dict[str, int]] = {}
    for cand in seed_baselines(cfg, root, rt):
        t0 = time.perf_counter()
        for split, batches in batched.items():
            tensors[f"{cand.name}/{split}"] = cand.member_logits(batches).float().contiguous()
        models[cand.name] = {"members": cand.members, "parameters": cand.parameters}
        log.info(
            "baseline_logits %s: %d splits in %.1fs",
            cand.name,
            len(batched),
            time.perf_counter() - t0,
        )
    index = {
        "runtime": precision_record(cfg, rt),
        "models": models,
        "splits": {s: int(tensors[f"single/{s}"].shape[0]) for s in EVAL_SPLITS},
    }
    with publish_dir(root / BASELINE_LOGITS) as tmp:
        save_file({k: v.cpu() for k, v in tensors.items()}, str(tmp / "logits.safetensors"))
        write_json(tmp / "index.json", index)
    # not cached (dvc.yaml): the probe's reason and timings
    write_json(root / METRICS / "baseline_logits.json", {"precision": choice.to_dict()})
    return index


def load_baseline_logits(root: Path, split_sizes: dict[str, int]) -> dict[str, Any]:
    """``{model: {"members", "parameters", "outputs": {split: [N, K, C]}}}`` as stage
    ``baseline_logits`` stored them, checked against ``split_sizes`` (the splits evaluate runs)."""
    from safetensors.torch import load_file

    folder = root / BASELINE_LOGITS
    index = read_json(folder / "index.json", "baseline_logits output")
    if index.get("splits") != split_sizes:
        raise ValueError(
            f"{BASELINE_LOGITS}: computed for splits {index.get('splits')}, the data has "
            f"{split_sizes}; re-run stage baseline_logits"
        )
    tensors = load_file(str(folder / "logits.safetensors"))
    out = {}
    for name, info in index["models"].items():
        outputs = {s: tensors[f"{name}/{s}"] for s in split_sizes}
        if any(t.ndim != 3 or t.shape[1] != info["members"] for t in outputs.values()):
            raise ValueError(
                f"{BASELINE_LOGITS}: {name}'s logits are not [N, {info['members']}, C]"
            )
        out[name] = {**info, "outputs": outputs}
    return out


def main() -> None:
    stage_main("baseline_logits", run, SCHEMA)


if __name__ == "__main__":
    main()
