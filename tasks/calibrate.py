"""Stage ``calibrate``: temperature scaling of the Hydra model, fitted on the validation split.

The temperature scales the log of the mean member probabilities; it is stored in the model
(``HydraEnsemble.set_temperature``, saved with ``save_hydra`` to ``models/hydra``, the artifact that
is promoted), so ``predict_proba`` and ``hydra-ens predict`` apply it.

Right after the temperature, the verdict thresholds of ``hydra-ens predict`` are fitted on the same
validation member logits: the OOD score ``evaluate.ood_score`` (computed as the evaluate stage
does, with the stored temperature) at the quantiles ``calibrate.uncertain_quantile`` and
``calibrate.likely_ood_quantile`` (``hydra_ops.uq.ood_thresholds``), saved in the model's metadata
as ``metadata["ood_thresholds"]``.

The validation logits are computed on ``runtime.device`` in ``runtime.precision`` (``auto``: the
inference probe of :mod:`tasks.runtime.precision`, on the Hydra and the first
``compile.check_examples`` validation examples; recorded in ``metrics/calibrate.json``). The model's
metadata records ``precisions``: what the base fine-tune, each member unit and this stage resolved
to.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra_ops.data import split_labels
from hydra_ops.models.checkpoints import read_checkpoint_metadata, weights_hash
from hydra_ops.models.inference import logits
from hydra_ops.models.runtime import Runtime, resolve_device
from hydra_ops.perf.inference_probe import time_inference
from tasks.params.core import CoreConfig
from tasks.runtime.data import batches, split
from tasks.runtime.layout import BASE, HYDRA, MEMBERS, MERGED, METRICS
from tasks.runtime.outputs import publish_dir, read_json, write_json
from tasks.runtime.precision import check_batches, precision_record, stage_runtime
from tasks.runtime.resumable import DONE
from tasks.runtime.stage import stage_main

#: The params view this stage validates ``params.yaml`` with (the sections it reads).
SCHEMA = CoreConfig

log = logging.getLogger("hydra_ens")


def stage_precisions(cfg: CoreConfig, root: Path, rt: Runtime) -> dict[str, Any]:
    """What each model stage behind this Hydra resolved ``runtime.precision`` to (the version's
    record: ``auto`` may resolve differently on another machine): the base's fine-tune, each
    member unit's, and this stage's. A stage that recorded nothing (an output made before the
    record existed) is left out."""
    # models/base and models/members are upstream of models/merged (this stage's dependency)
    out: dict[str, Any] = {}
    base = read_checkpoint_metadata(root / BASE).get("metadata", {}).get("runtime")
    if base:
        out["finetune_base"] = base["precision"]
    members = {}
    for done in sorted((root / MEMBERS).glob(f"*/{DONE}")):
        record = read_json(done).get("info", {}).get("runtime")
        if record:
            members[done.parent.name] = record["precision"]
    if members:
        out["finetune_members"] = members
    out["calibrate"] = precision_record(cfg, rt)["precision"]
    out["requested"] = cfg.runtime.precision
    return out


def run(cfg: CoreConfig, root: Path) -> dict[str, Any]:
    from hydra_ops.hydra.serialization import load_hydra, read_hydra_config, save_hydra
    from hydra_ops.uq.calibrated import calibrated_ood_score
    from hydra_ops.uq.calibration import ensemble_log_probs, fit_temperature, nll_at_temperature
    from hydra_ops.uq.ood_thresholds import fit_ood_thresholds

    hydra = load_hydra(root / MERGED)
    val = split(root, "val")
    pin = Runtime(resolve_device(cfg.runtime.device)).pin_memory
    val_batches = batches(cfg, val, cfg.evaluate.batch_size, pin_memory=pin)
    rt, choice = stage_runtime(
        cfg,
        root,
        "calibrate",
        "inference",
        lambda: hydra,
        lambda: check_batches(val_batches, cfg.compile.check_examples),
        time_inference,
    )
    member_logits = logits(hydra, val_batches, device=rt.device, precision=rt.precision)
    hydra.cpu()
    labels = split_labels(val)
    log_probs = ensemble_log_probs(member_logits)
    t = fit_temperature(log_probs, labels)
    hydra.set_temperature(t)
    summary = {
        "temperature": t,
        "val_nll_raw": nll_at_temperature(log_probs, labels),
        "val_nll_calibrated": nll_at_temperature(log_probs, labels, t),
        "fitted_on": "val",
    }
    # the stored (float32) temperature: the scores evaluate and predict compute from the artifact
    stored_t = float(hydra.temperature)
    thresholds = fit_ood_thresholds(
        calibrated_ood_score(member_logits, stored_t, cfg.evaluate.ood_score),
        score=cfg.evaluate.ood_score,
        uncertain_quantile=cfg.calibrate.uncertain_quantile,
        likely_ood_quantile=cfg.calibrate.likely_ood_quantile,
        fitted_on="val",
    ).to_metadata()
    meta = dict(read_hydra_config(root / MERGED).get("metadata", {}))
    meta["calibration"] = summary
    meta["ood_thresholds"] = thresholds
    meta["precisions"] = stage_precisions(cfg, root, rt)
    with publish_dir(root / HYDRA) as tmp:
        save_hydra(hydra, tmp, base_weights_hash=weights_hash(root / BASE), metadata=meta)
    result = {**summary, "ood_thresholds": thresholds, "precision": choice.decision()}
    write_json(root / METRICS / "calibrate.json", result)
    log.info(
        "calibrate: T = %.3f, val NLL %.4f -> %.4f; %s thresholds: uncertain > %.4g, "
        "likely OOD > %.4g",
        t,
        summary["val_nll_raw"],
        summary["val_nll_calibrated"],
        thresholds["score"],
        thresholds["uncertain"],
        thresholds["likely_ood"],
    )
    return result


def main() -> None:
    stage_main("calibrate", run, SCHEMA)


if __name__ == "__main__":
    main()
