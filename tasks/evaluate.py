"""Stage ``evaluate``: Hydra and the baselines a user needs to trust it, on ID test, near-OOD,
far-OOD and shift, each raw and after temperature scaling fitted on validation. Every model is a
candidate the gate judges with the same checks; :mod:`tasks.candidate_scoring` adds what that
needs (the paired bootstrap of each candidate against every baseline, its own verdict
thresholds, how it ships).

Models: ``hydra`` (``models/hydra``), ``single`` (the fine-tuned base), ``naive_pruned`` (the base
pruned to the top-k heads, one member, the members' per-layer budget), ``deep_ensemble`` (the base
plus ``models/baselines``), ``mc_dropout`` (the base with dropout on at inference,
``baselines.mc_dropout.samples`` seeded passes as members; when enabled) and, when members were
fine-tuned, ``control`` (M unpruned copies of the base given the same member fine-tune). Metrics:
all of ``hydra_ops.metrics`` (OOD = positive class, score ``evaluate.ood_score``), parameters,
latency, and the paired bootstrap interval of Hydra minus each baseline. Every model the stage
runs itself (``naive_pruned``, ``control``) runs on ``runtime.device`` in the precision
``runtime.precision`` resolves to for inference (:mod:`tasks.precision`; ``auto``: the probe
stage ``baseline_logits`` ran on the base, read back from the hardware record, so every
baseline runs at one precision); the Hydra is scored as it ships and checked against its fp32
eager model. The logits of ``single``, ``deep_ensemble`` and ``mc_dropout`` are read from stage
``baseline_logits`` (the same for every variant of a seed, computed once). Every model is timed
here, side by side (:mod:`tasks.cost`, ``evaluate.cost_rounds`` interleaved rounds on one batch
of ``evaluate.latency_batch``): ``metrics/cost.json``, and each model's median in
``metrics/latency.json`` (for ``mc_dropout`` all its passes; for the Hydra its shipped artifact).
Besides: ``ood_by_score``, the calibrated near-/far-OOD metrics under every OOD score of
``hydra_ops.uq.ood_criteria.OOD_SCORE_KINDS`` (``null`` for the ensemble-only scores of a one-member
model), so the detectors can be compared beyond the one score the gates read.
For Hydra also ``verdicts`` / ``verdict_fractions``: per split (ID test, near-OOD, far-OOD), how
many examples ``hydra-ens predict`` calls ``ok`` / ``uncertain`` / ``likely_ood`` with the
thresholds calibrate stored in ``models/hydra`` (``hydra_ops.uq.ood_thresholds``).

Outputs: ``metrics/evaluate.json`` (everything, versioned by DVC), ``metrics/key/<model>.json`` (the
few numbers per model that decide) and ``metrics/hydra.json`` (the Hydra's, the DVC metrics;
:mod:`tasks.key_metrics`), ``plots/reliability.json``,
``plots/roc.json`` and ``plots/histograms.json`` (DVC plots; :mod:`tasks.score_histograms`),
``reports/evaluate.md`` (the Markdown tables; stage ``run_report`` draws the figures). What is
computed from each model's member logits (metrics, OOD per score, bootstrap, verdicts, plot rows)
is :mod:`tasks.scorecard`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch

from hydra_ops.data import split_labels
from hydra_ops.models.runtime import Runtime, describe_device, move_batch, resolve_device
from tasks import data as prepared
from tasks.baseline_logits import load_baseline_logits
from tasks.baseline_models import EVAL_SPLITS, base_inference_runtime, eval_batches
from tasks.candidate_scoring import candidate_bootstrap, candidate_exports
from tasks.candidates import ShippedHydra, build_candidates
from tasks.cost import COST_FILE, latency_from_cost, measure_candidates
from tasks.custody import check_compiled_source, scored_record
from tasks.evaluate_markdown import latency_setup, render_report
from tasks.key_metrics import key_metrics, write_key_metrics
from tasks.layout import COMPILED, HYDRA, METRICS, PLOTS, REPORTS
from tasks.member_diversity import model_diversity, plan_overlap_summary
from tasks.outputs import LATENCY_FILE, read_json, write_json, write_text
from tasks.params.baselines import BaselinesStageConfig
from tasks.precision import precision_record
from tasks.score_histograms import score_histograms
from tasks.scorecard import (
    COMPARED_SPLITS,
    compiled_vs_eager,
    hydra_verdicts,
    ood_by_score,
    paired_intervals,
    plot_rows,
    split_metrics,
)
from tasks.stage import stage_main

#: The params view this stage validates ``params.yaml`` with (the sections it reads).
SCHEMA = BaselinesStageConfig

log = logging.getLogger("hydra_ens")


def compile_fields(
    compiled: dict[str, Any], compared: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The Hydra's compile facts from ``compiled.json``: the check of the shipped artifact against
    the eager model (``None`` for ``eager``: nothing compiled, nothing checked), its backend and
    precision, and ``compile_tolerance``, the tolerance compile checked it with (its precision's),
    which the gate's ``threshold: compile_tolerance`` applies.

    ``compared``: evaluate's own comparison of the two on every split
    (:func:`tasks.scorecard.compiled_vs_eager`); the gate then judges the worst of compile's
    held-out check and every split: the largest max |dp| and the lowest argmax agreement.
    """
    check = compiled.get("check")
    diff = check and check["max_abs_diff_probs"]
    agreement = check and check["argmax_agreement"]
    if check and compared:
        diff = max([diff, *(c["max_abs_diff_probs"] for c in compared.values())])
        agreement = min([agreement, *(c["argmax_agreement"] for c in compared.values())])
    return {
        "compile_max_abs_diff": diff,
        "compile_argmax_agreement": agreement,
        "compile_backend": compiled["backend"],
        "compile_tolerance": check and check.get("tolerance"),
        "compile_precision": compiled.get("precision"),
    }


def run(cfg: BaselinesStageConfig, root: Path) -> dict[str, Any]:
    from hydra_ops.uq.calibration import ensemble_log_probs, fit_temperature

    data = {s: prepared.split(root, s) for s in EVAL_SPLITS}
    labels = {s: split_labels(data[s]) for s in ("val", "test", "shift")}
    batched = eval_batches(cfg, root, Runtime(resolve_device(cfg.runtime.device)))
    # the probe baseline_logits ran (same model, batches and machine): a cache hit, not a rerun
    rt, choice = base_inference_runtime(cfg, root, "evaluate", batched["val"])
    # on the device already: latency times the model (and its logits' copy back), not the input
    latency_batch = move_batch(
        prepared.batches(cfg, data["test"], cfg.evaluate.latency_batch, with_labels=False)[0],
        rt.device,
    )
    # what is scored, hashed before it is loaded; the artifact must come from this model
    scored = scored_record(cfg, root)
    compiled = read_json(root / COMPILED / "compiled.json", "compile output")
    check_compiled_source(compiled, scored["model"]["sha256"], f"{COMPILED} <- {HYDRA}")
    # the Hydra is scored as configured (auto: fp32 unless compile shipped another precision)
    hydra_rt = Runtime.from_spec(cfg.runtime.device, cfg.runtime.precision)
    candidates, hydra_t = build_candidates(cfg, root, rt, hydra_runtime=hydra_rt)
    stored = load_baseline_logits(root, {s: len(d) for s, d in data.items()})

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
            "calibrated": split_metrics(cfg, outputs[cand.name], labels, temps[cand.name]),
            "raw": split_metrics(cfg, outputs[cand.name], labels, 1.0),
            "ood_by_score": ood_by_score(outputs[cand.name], temps[cand.name], cand.members),
            "diversity": model_diversity(outputs[cand.name], labels),
        }
        if isinstance(cand, ShippedHydra):
            entry.update(_shipped_fields(cfg, cand, batched, outputs["hydra"], compiled))
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
            "calibrated": paired_intervals(
                cfg, outputs["hydra"], outputs[name], labels, temps["hydra"], temps[name]
            ),
        }
        if cfg.evaluate.bootstrap_raw:
            bootstrap[name]["raw"] = paired_intervals(
                cfg, outputs["hydra"], outputs[name], labels, 1.0, 1.0
            )
    log.info(
        "evaluate: paired bootstrap (%d resamples) in %.1fs",
        cfg.evaluate.bootstrap_samples,
        time.perf_counter() - t0,
    )

    manifest = prepared.manifest(root)
    # every other candidate: judged like the Hydra (its bootstrap), and shipped if allowed
    exports, thresholds = candidate_exports(
        root, candidates, outputs, temps, verdict_thresholds, list(manifest.classes)
    )
    for name, found in thresholds.items():
        models[name]["ood_thresholds"] = found
    scored["candidates"] = exports
    result = {
        "variant": cfg.scoring.method,
        "num_members": cfg.members.num_members,
        "ood_score": cfg.evaluate.ood_score,
        "ood_validation_set": manifest.ood_val_provenance,
        "counts": {s: len(d) for s, d in data.items()},
        "runtime": precision_record(cfg, rt),
        "plan_overlap": plan_overlap_summary(cfg, root),
        "models": models,
        "bootstrap": bootstrap,
        "candidate_bootstrap": candidate_bootstrap(cfg, outputs, labels, temps),
        "scored": scored,
    }
    # latency is a fact of this run on this machine: kept beside the evaluation, not in it, so
    # the evaluation a gate verdict is bound to hashes the same for the same models
    write_json(root / METRICS / "evaluate.json", result)
    ev_cfg = cfg.evaluate
    cost = measure_candidates(
        candidates,
        latency_batch,
        ev_cfg.cost_rounds,
        rt.device,
        ev_cfg.latency_batch,
        rt.precision,
    )
    cost["precision_choice"] = choice.to_dict()
    write_json(root / METRICS / COST_FILE, cost)
    latency = latency_from_cost(cost)
    for name, ms in latency.items():
        models[name]["latency_ms"] = ms
    write_json(root / METRICS / LATENCY_FILE, latency)
    # the few numbers per model that decide; the Hydra's are the DVC metrics (tasks.key_metrics)
    write_key_metrics(root / METRICS, key_metrics(models, latency))
    report_extra = {
        "verdict_thresholds": verdict_thresholds,
        "latency_setup": latency_setup(
            cfg, describe_device(rt.device), rt.precision, models, compiled
        ),
    }

    reliability, roc = plot_rows(cfg, outputs, temps, labels)
    write_json(root / PLOTS / "reliability.json", reliability)
    write_json(root / PLOTS / "roc.json", roc)
    write_json(
        root / PLOTS / "histograms.json", score_histograms(cfg.evaluate.ood_score, outputs, temps)
    )
    write_text(root / REPORTS / "evaluate.md", render_report({**result, **report_extra}))
    return result


def _shipped_fields(
    cfg: BaselinesStageConfig,
    hydra: ShippedHydra,
    batched: dict[str, list[dict]],
    shipped: dict[str, torch.Tensor],
    compiled: dict[str, Any],
) -> dict[str, Any]:
    """The Hydra entry's compile fields, with ``scored_by`` and, when a compiled artifact ships,
    ``compiled_vs_eager`` (per split, against the eager model it was compiled from)."""
    fields: dict[str, Any] = {"scored_by": hydra.scored_by}
    compared = None
    if hydra.eager is not None:
        eager = {s: hydra.eager_logits(batched[s]) for s, _ in COMPARED_SPLITS}
        tolerance = cfg.compile.tolerance(compiled.get("precision") or "fp32")
        compared = compiled_vs_eager(shipped, eager, tolerance, cfg.compile.min_agreement)
        fields["compiled_vs_eager"] = compared
        worst = max(compared.values(), key=lambda c: c["max_abs_diff_probs"])
        log.info(
            "evaluate hydra: %s vs eager on every split: max |dp| %.2e, lowest argmax agreement "
            "%.4f",
            hydra.scored_by,
            worst["max_abs_diff_probs"],
            min(c["argmax_agreement"] for c in compared.values()),
        )
    return {**compile_fields(compiled, compared), **fields}


def main() -> None:
    stage_main("evaluate", run, SCHEMA)


if __name__ == "__main__":
    main()
