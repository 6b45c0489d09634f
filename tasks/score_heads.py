"""Stage ``score_heads``: head importance of the fine-tuned base with the configured scorer.

``taylor`` (default: the text study's choice, docs/study.md) scores heads by first-order Taylor
importance on training data only. ``circuit`` (the paper's best variant) runs the HeadMap greedy
circuit search M times (diverse circuits) on ID validation data against the ``ood_val`` split: an
OOD validation set built from ID validation data (e.g. word-shuffled texts), never an OOD test
set; ``metrics/scores.json`` says which.

The scorer runs on ``runtime.device``, under autocast for ``runtime.precision`` bf16 / fp16
(``auto``: fp32).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from hydra_ops.models.checkpoints import load_model
from hydra_ops.models.runtime import Runtime
from tasks.params.core import CoreConfig
from tasks.runtime.data import batches, manifest, split
from tasks.runtime.layout import BASE, METRICS, SCORES
from tasks.runtime.outputs import publish_dir, write_json
from tasks.runtime.stage import stage_main

#: The params view this stage validates ``params.yaml`` with (the sections it reads).
SCHEMA = CoreConfig

log = logging.getLogger("hydra_ens")


def layer_progress_logger(num_heads: int) -> Any:
    """A circuit-search callback that logs one line per finished (circuit, layer), with an ETA.

    (The tqdm bar does not reach the Prefect log: DVC relays whole lines only.)
    """
    start = time.monotonic()

    def callback(event: dict[str, Any]) -> None:
        if event["head"] != num_heads - 1:
            return
        elapsed = time.monotonic() - start
        eta = elapsed / event["done"] * (event["total"] - event["done"])
        log.info(
            "circuit %d layer %d: %d/%d head evaluations, %.0fs elapsed, about %.0fs left",
            event["circuit"] + 1,
            event["layer"] + 1,
            event["done"],
            event["total"],
            elapsed,
            eta,
        )

    return callback


def run(cfg: CoreConfig, root: Path) -> dict[str, Any]:
    from hydra_ops.adapters import get_adapter
    from hydra_ops.scoring import get_scorer, scorer_arguments

    rt = Runtime.from_spec(cfg.runtime.device, cfg.runtime.precision)
    log.info(rt.describe())
    # the scorers run the model where it is and cache their batches on its device
    model = load_model(root / BASE).to(rt.device)
    sc = cfg.scoring
    run_wide = {
        "seed": cfg.scoring_seed,
        "max_batches": sc.max_batches,
        "progress": os.environ.get("HYDRA_ENS_PROGRESS", "1") != "0",
    }
    # each criterion gets the run-wide settings it takes (taylor: no seed; random: seed only)
    taken = scorer_arguments(sc.method).options
    options: dict[str, Any] = {key: value for key, value in run_wide.items() if key in taken}
    data: dict[str, Any] = {}
    ood_val = None
    if sc.method == "taylor":
        data["train_batches"] = batches(
            cfg, split(root, "train"), sc.batch_size, shuffle=True, seed=cfg.scoring_seed
        )
    elif sc.method == "circuit":
        data["val_batches"] = batches(cfg, split(root, "val"), sc.batch_size)
        data["ood_val_batches"] = batches(
            cfg, split(root, "ood_val"), sc.batch_size, with_labels=False
        )
        options.update(
            num_circuits=cfg.members.num_members,
            heads_per_layer=cfg.heads_per_member,
            objective=sc.objective,
            shared_layers=cfg.shared_layers,
            search_trunk=sc.search_trunk,
            overlap_penalty=cfg.members.overlap_penalty,
            callback=layer_progress_logger(get_adapter(model).num_heads(0)),
        )
        ood_val = manifest(root).ood_val_provenance
    log.info("score_heads: method %s (%s)", sc.method, "ood_val: " + ood_val if ood_val else "")
    with rt.autocast():
        scores = get_scorer(sc.method, **options)(model, **data)
    with publish_dir(root / SCORES) as tmp:
        scores.save(tmp / "scores.safetensors")
    summary = {
        "method": sc.method,
        "objective": sc.objective if sc.method == "circuit" else None,
        "ood_validation_set": ood_val,
        "shape": list(scores.scores.shape),
        "scores": scores.scores.tolist(),
        "circuits": None
        if scores.circuits is None
        else [[list(h) for h in p.kept] for p in scores.circuits],
    }
    write_json(root / METRICS / "scores.json", summary)
    return summary


def main() -> None:
    stage_main("score_heads", run, SCHEMA)


if __name__ == "__main__":
    main()
