"""What ``evaluate`` adds so that every candidate, not only the Hydra, can be judged and shipped.

For each candidate other than the Hydra (:mod:`tasks.gates.candidates` judges them all):

- ``candidate_bootstrap[name][baseline]``: the paired bootstrap of (candidate - baseline) against
  every other model a gate check may name as its baseline (``tasks.params.CANDIDATES`` less the
  Hydra), calibrated (and raw with ``evaluate.bootstrap_raw``), the intervals the ``any_of``
  groups and ``use_bootstrap_bound`` read; computed for every baseline, not only those the gates
  name now, so that a gate edit never makes the evaluation stale;
- ``ood_thresholds``: its own ``predict`` verdict thresholds (:func:`fit_thresholds`);
- ``scored.candidates[name]``: how it ships and the hashes of its files
  (:mod:`tasks.candidates.export`), for candidates that carry an ``export``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from tasks.candidates.baseline_models import Candidate
from tasks.candidates.export import export_record
from tasks.evaluation.scorecard import paired_intervals
from tasks.params.baselines import BaselinesStageConfig
from tasks.params.gates import CANDIDATES

log = logging.getLogger("hydra_ens")


def candidate_bootstrap(
    cfg: BaselinesStageConfig,
    outputs: dict[str, dict[str, torch.Tensor]],
    labels: dict,
    temps: dict[str, float],
) -> dict[str, dict[str, Any]]:
    """``{candidate: {baseline: {"calibrated": ..., "raw"?: ...}}}`` for every candidate but the
    Hydra against every other model a gate may compare with (module docstring)."""
    t0 = time.perf_counter()
    baselines = [b for b in CANDIDATES if b != "hydra" and b in outputs]
    result: dict[str, dict[str, Any]] = {}
    for name in outputs:
        if name == "hydra":
            continue
        result[name] = {}
        for base in baselines:
            if base == name:
                continue
            pair = (outputs[name], outputs[base], labels)
            entry = {"calibrated": paired_intervals(cfg, *pair, temps[name], temps[base])}
            if cfg.evaluate.bootstrap_raw:
                entry["raw"] = paired_intervals(cfg, *pair, 1.0, 1.0)
            result[name][base] = entry
    log.info(
        "evaluate: paired bootstrap of every candidate against every baseline in %.1fs",
        time.perf_counter() - t0,
    )
    return result


def candidate_exports(
    root: Path,
    candidates: list[Candidate],
    outputs: dict[str, dict[str, torch.Tensor]],
    temps: dict[str, float],
    hydra_thresholds: dict[str, Any],
    class_names: list[str],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(scored_candidates, thresholds)``: per candidate but the Hydra, its export record (when
    it has an export) and its own verdict thresholds fitted like the Hydra's
    (``hydra_thresholds``: the Hydra's stored thresholds)."""
    scored: dict[str, Any] = {}
    thresholds: dict[str, Any] = {}
    for cand in candidates:
        if cand.name == "hydra":
            continue
        thresholds[cand.name] = fit_thresholds(
            outputs[cand.name]["val"], temps[cand.name], cand.members, hydra_thresholds
        )
        if cand.export is not None:
            scored[cand.name] = export_record(root, cand.export, class_names)
    return scored, thresholds


def fit_thresholds(
    val_logits: torch.Tensor, temperature: float, members: int, like: Mapping[str, Any]
) -> dict[str, Any] | None:
    """A candidate's ``predict`` verdict thresholds, fitted on its own ID validation logits
    ``[N, K, C]`` at its temperature with the score kind and quantiles calibrate used for the
    Hydra (``like``: the Hydra's stored thresholds); None when that score is ensemble-only and
    the candidate is one model (every score 0: nothing to threshold)."""
    from hydra_ops.uq.calibrated import calibrated_ood_score
    from hydra_ops.uq.ood_criteria.base import ood_criterion
    from hydra_ops.uq.ood_thresholds import fit_ood_thresholds

    if members == 1 and ood_criterion(like["score"]).needs_members():
        return None
    scores = calibrated_ood_score(val_logits, temperature, like["score"])
    return fit_ood_thresholds(
        scores,
        score=like["score"],
        uncertain_quantile=like["uncertain_quantile"],
        likely_ood_quantile=like["likely_ood_quantile"],
    ).to_metadata()
