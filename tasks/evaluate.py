"""Stage ``evaluate``: Hydra and the baselines a user needs to trust it, on ID test, near-OOD,
far-OOD and shift, each raw and after temperature scaling fitted on validation.

Models: ``hydra`` (``models/hydra``), ``single`` (the fine-tuned base), ``naive_pruned`` (the base
pruned to the top-k heads, one member, the members' per-layer budget), ``deep_ensemble`` (the base
plus ``models/baselines``), ``mc_dropout`` (the base with dropout on at inference,
``baselines.mc_dropout.samples`` seeded passes as members; when enabled) and, when members were
fine-tuned, ``control`` (M unpruned copies of the base given the same member fine-tune). Metrics:
all of ``hydra_ops.metrics`` (OOD = positive class, score ``evaluate.ood_score``), parameters,
latency (median ms per batch of ``evaluate.latency_batch``, timed on ``runtime.device``; for
``mc_dropout`` all its passes), and the paired bootstrap interval of Hydra minus each baseline.
Every model runs on ``runtime.device`` in ``runtime.precision`` (``auto``: fp32). The logits of
``single``, ``deep_ensemble`` and ``mc_dropout`` are read from stage ``baseline_logits`` (the same
for every variant of a seed, computed once); their latency is timed here, beside the Hydra's.
Besides: ``ood_by_score``, the calibrated near-/far-OOD metrics under every OOD score of
``hydra_ops.ood_criteria.OOD_SCORE_KINDS`` (``null`` for the ensemble-only scores of a one-member
model), so the detectors can be compared beyond the one score the gates read.
For Hydra also ``verdicts`` / ``verdict_fractions``: per split (ID test, near-OOD, far-OOD), how
many examples ``hydra-ens predict`` calls ``ok`` / ``uncertain`` / ``likely_ood`` with the
thresholds calibrate stored in ``models/hydra`` (``hydra_ops.ood_thresholds``).

Outputs: ``metrics/evaluate.json`` (DVC metrics), ``plots/reliability.json`` and ``plots/roc.json``
(DVC plots), ``reports/evaluate.md`` (the Markdown table).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from hydra_ops.data import split_labels
from hydra_ops.runtime import Runtime, move_batch
from tasks import data as prepared
from tasks.baseline_logits import load_baseline_logits
from tasks.baseline_models import EVAL_SPLITS, eval_batches
from tasks.candidates import build_candidates
from tasks.common import (
    COMPILED,
    HYDRA,
    LATENCY_FILE,
    METRICS,
    PLOTS,
    REPORTS,
    read_json,
    stage_main,
    write_json,
    write_text,
)
from tasks.params import PipelineConfig
from tasks.report import render_report

log = logging.getLogger("hydra_ens")

BOOTSTRAP_CLASSIFICATION = ("accuracy", "nll", "brier", "ece")
BOOTSTRAP_OOD = ("auroc",)
VARIANTS = ("calibrated", "raw")
OOD_SPLITS = ("near_ood", "far_ood")


def _probs(member_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    from hydra_ops.calibration import apply_temperature, ensemble_log_probs

    return apply_temperature(ensemble_log_probs(member_logits), temperature)


def _ood_score(cfg: PipelineConfig, member_logits: torch.Tensor, t: float) -> torch.Tensor:
    from hydra_ops.uncertainty import calibrated_ood_score

    # the one definition shared with calibrate's thresholds and `hydra-ens predict`
    return calibrated_ood_score(member_logits, t, cfg.evaluate.ood_score)


VERDICT_SPLITS = (("test", "id_test"), ("near_ood", "near_ood"), ("far_ood", "far_ood"))


def hydra_verdicts(
    root: Path, hydra_out: dict[str, torch.Tensor], t: float
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, float]], dict[str, Any]]:
    """Verdict counts and fractions per split (ID test, near-OOD, far-OOD) of the Hydra model,
    with the thresholds stored by calibrate in ``models/hydra``'s metadata (and their score kind,
    so the verdicts are those ``hydra-ens predict`` gives). Returns (counts, fractions,
    thresholds as stored)."""
    from hydra_ops.ood_thresholds import OodThresholds, verdict_counts
    from hydra_ops.serialization import read_hydra_config
    from hydra_ops.uncertainty import calibrated_ood_score

    stored = read_hydra_config(root / HYDRA).get("metadata", {}).get("ood_thresholds")
    if stored is None:
        raise ValueError(
            f"{HYDRA}/hydra.json has no metadata.ood_thresholds; re-run the calibrate stage"
        )
    thresholds = OodThresholds.from_metadata(stored)
    counts: dict[str, dict[str, int]] = {}
    fractions: dict[str, dict[str, float]] = {}
    for split, key in VERDICT_SPLITS:
        scores = calibrated_ood_score(hydra_out[split], t, thresholds.score)
        counts[key] = verdict_counts(scores, thresholds)
        fractions[key] = {v: c / len(scores) for v, c in counts[key].items()}
    return counts, fractions, thresholds.to_metadata()


def _metrics(cfg: PipelineConfig, out: dict[str, torch.Tensor], labels: dict, t: float) -> dict:
    from hydra_ops.metrics import classification_metrics, ood_metrics

    result: dict[str, dict[str, float]] = {}
    for split in ("test", "shift"):
        key = "id_test" if split == "test" else split
        result[key] = classification_metrics(_probs(out[split], t), labels[split])
    id_scores = _ood_score(cfg, out["test"], t)
    for split in ("near_ood", "far_ood"):
        result[split] = ood_metrics(id_scores, _ood_score(cfg, out[split], t))
    return result


def _ood_by_score(
    out: dict[str, torch.Tensor], t: float, members: int
) -> dict[str, dict[str, dict[str, float] | None]]:
    """``{split: {score kind: ood_metrics | None}}`` for near/far-OOD at temperature ``t``, every
    kind of ``OOD_SCORE_KINDS``; ``None`` for an ensemble-only kind when ``members == 1`` (the
    score is 0 for every input: there is nothing to detect with, and 0.5 would look like data)."""
    from hydra_ops.metrics import ood_metrics
    from hydra_ops.ood_criteria import ENSEMBLE_ONLY_KINDS, OOD_SCORE_KINDS
    from hydra_ops.uncertainty import calibrated_ood_score

    result: dict[str, dict[str, dict[str, float] | None]] = {s: {} for s in OOD_SPLITS}
    for kind in OOD_SCORE_KINDS:
        if members == 1 and kind in ENSEMBLE_ONLY_KINDS:
            for split in OOD_SPLITS:
                result[split][kind] = None
            continue
        id_scores = calibrated_ood_score(out["test"], t, kind)
        for split in OOD_SPLITS:
            result[split][kind] = ood_metrics(id_scores, calibrated_ood_score(out[split], t, kind))
    return result


def _bootstrap(
    cfg: PipelineConfig,
    hydra_out: dict[str, torch.Tensor],
    base_out: dict[str, torch.Tensor],
    labels: dict,
    t_a: float,
    t_b: float,
) -> dict[str, dict[str, dict[str, float]]]:
    from hydra_ops import metrics as hm
    from hydra_ops.bootstrap import paired_bootstrap, paired_bootstrap_ood

    n, seed = cfg.evaluate.bootstrap_samples, cfg.evaluate.bootstrap_seed
    result: dict[str, dict[str, dict[str, float]]] = {}
    for split in ("test", "shift"):
        key = "id_test" if split == "test" else split
        pa, pb = _probs(hydra_out[split], t_a), _probs(base_out[split], t_b)
        result[key] = {}
        for metric in BOOTSTRAP_CLASSIFICATION:
            fn = getattr(hm, metric)
            r = paired_bootstrap(fn, pa, pb, labels[split], n_resamples=n, seed=seed)
            result[key][metric] = _interval(r)
    a_id, b_id = _ood_score(cfg, hydra_out["test"], t_a), _ood_score(cfg, base_out["test"], t_b)
    for split in ("near_ood", "far_ood"):
        a_ood, b_ood = _ood_score(cfg, hydra_out[split], t_a), _ood_score(cfg, base_out[split], t_b)
        result[split] = {}
        r = paired_bootstrap_ood(hm.auroc, a_id, a_ood, b_id, b_ood, n_resamples=n, seed=seed)
        result[split]["auroc"] = _interval(r)
    return result


def _interval(r) -> dict[str, float]:
    return {
        "difference": r.point_difference,
        "low": r.low,
        "high": r.high,
        "mean": r.mean_difference,
        "n_resamples": r.n_resamples,
    }


def compile_fields(compiled: dict[str, Any]) -> dict[str, Any]:
    """The Hydra's compile facts from ``compiled.json``: the check of the shipped artifact against
    the eager model (``None`` for ``eager``: nothing compiled, nothing checked), its backend and
    precision, and ``compile_tolerance``, the tolerance compile checked it with (its precision's),
    which the gate's ``threshold: compile_tolerance`` applies."""
    check = compiled.get("check")
    return {
        "compile_max_abs_diff": check and check["max_abs_diff_probs"],
        "compile_argmax_agreement": check and check["argmax_agreement"],
        "compile_backend": compiled["backend"],
        "compile_tolerance": check and check.get("tolerance"),
        "compile_precision": compiled.get("precision"),
    }


def run(cfg: PipelineConfig, root: Path) -> dict[str, Any]:
    from hydra_ops.calibration import ensemble_log_probs, fit_temperature
    from hydra_ops.metrics import reliability_bins, roc_points

    rt = Runtime.from_spec(cfg.runtime.device, cfg.runtime.precision)
    log.info(rt.describe())
    data = {s: prepared.split(root, s) for s in EVAL_SPLITS}
    labels = {s: split_labels(data[s]) for s in ("val", "test", "shift")}
    batched = eval_batches(cfg, root, rt)
    # on the device already: latency times the model (and its logits' copy back), not the input
    latency_batch = move_batch(
        prepared.batches(cfg, data["test"], cfg.evaluate.latency_batch, with_labels=False)[0],
        rt.device,
    )
    candidates, hydra_t = build_candidates(cfg, root, rt)
    stored = load_baseline_logits(root, {s: len(d) for s, d in data.items()})
    compiled = read_json(root / COMPILED / "compiled.json", "compile output")

    outputs: dict[str, dict[str, torch.Tensor]] = {}
    verdict_thresholds: dict[str, Any] = {}
    temps: dict[str, float] = {}
    models: dict[str, Any] = {}
    for cand in candidates:
        t0 = time.perf_counter()
        if cand.name in stored:  # the seed's baselines: logits from stage baseline_logits
            if stored[cand.name]["members"] != cand.members:
                raise ValueError(
                    f"baseline_logits has {stored[cand.name]['members']} members for "
                    f"{cand.name}, the model has {cand.members}; re-run stage baseline_logits"
                )
            outputs[cand.name] = stored[cand.name]["outputs"]
        else:
            outputs[cand.name] = {s: cand.member_logits(b) for s, b in batched.items()}
        if cand.name == "hydra":
            temps[cand.name] = hydra_t  # the temperature stored in the promoted artifact
        else:
            temps[cand.name] = fit_temperature(
                ensemble_log_probs(outputs[cand.name]["val"]), labels["val"]
            )
        entry = {
            "members": cand.members,
            "temperature": temps[cand.name],
            "parameters": cand.parameters,
            "latency_ms": cand.latency_ms(latency_batch, cfg.evaluate.latency_repeats, rt.device),
            "calibrated": _metrics(cfg, outputs[cand.name], labels, temps[cand.name]),
            "raw": _metrics(cfg, outputs[cand.name], labels, 1.0),
            "ood_by_score": _ood_by_score(outputs[cand.name], temps[cand.name], cand.members),
        }
        if cand.name == "hydra":
            entry.update(compile_fields(compiled))
            entry["verdicts"], entry["verdict_fractions"], verdict_thresholds = hydra_verdicts(
                root, outputs["hydra"], temps["hydra"]
            )
        models[cand.name] = entry
        log.info(
            "evaluate %s: id acc %.3f, ECE %.3f, near-OOD AUROC %.3f, far-OOD AUROC %.3f (%.1fs)",
            cand.name,
            entry["calibrated"]["id_test"]["accuracy"],
            entry["calibrated"]["id_test"]["ece"],
            entry["calibrated"]["near_ood"]["auroc"],
            entry["calibrated"]["far_ood"]["auroc"],
            time.perf_counter() - t0,
        )

    t0 = time.perf_counter()
    bootstrap: dict[str, Any] = {}
    for name in models:
        if name == "hydra":
            continue
        bootstrap[name] = {
            "calibrated": _bootstrap(
                cfg, outputs["hydra"], outputs[name], labels, temps["hydra"], temps[name]
            ),
        }
        if cfg.evaluate.bootstrap_raw:
            bootstrap[name]["raw"] = _bootstrap(
                cfg, outputs["hydra"], outputs[name], labels, 1.0, 1.0
            )
    log.info(
        "evaluate: paired bootstrap (%d resamples) in %.1fs",
        cfg.evaluate.bootstrap_samples,
        time.perf_counter() - t0,
    )

    manifest = prepared.manifest(root)
    result = {
        "variant": cfg.scoring.method,
        "num_members": cfg.members.num_members,
        "ood_score": cfg.evaluate.ood_score,
        "ood_validation_set": manifest.ood_val_provenance,
        "counts": {s: len(d) for s, d in data.items()},
        "models": models,
        "bootstrap": bootstrap,
    }
    # latency is a fact of this run on this machine: kept beside the evaluation, not in it, so
    # the evaluation a gate verdict is bound to hashes the same for the same models
    write_json(
        root / METRICS / "evaluate.json",
        {**result, "models": {n: _without_latency(e) for n, e in models.items()}},
    )
    write_json(root / METRICS / LATENCY_FILE, {n: e["latency_ms"] for n, e in models.items()})
    report_extra = {"verdict_thresholds": verdict_thresholds}

    reliability, roc = [], []
    for name in models:
        probs = _probs(outputs[name]["test"], temps[name])
        reliability += [{"model": name, **row} for row in reliability_bins(probs, labels["test"])]
        id_s = _ood_score(cfg, outputs[name]["test"], temps[name])
        for split in ("near_ood", "far_ood"):
            points = roc_points(id_s, _ood_score(cfg, outputs[name][split], temps[name]))
            roc += [{"model": name, "split": split, "fpr": f, "tpr": t} for f, t in points]
    write_json(root / PLOTS / "reliability.json", reliability)
    write_json(root / PLOTS / "roc.json", roc)
    write_text(root / REPORTS / "evaluate.md", render_report({**result, **report_extra}))
    return result


def _without_latency(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k != "latency_ms"}


def main() -> None:
    stage_main("evaluate", run)


if __name__ == "__main__":
    main()
