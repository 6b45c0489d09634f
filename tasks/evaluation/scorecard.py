"""What ``evaluate`` computes from one model's member logits, as pure functions of tensors.

Every function takes ``out``: ``{split: member logits [N, M, C]}`` for the evaluation splits
(``val``, ``test``, ``shift``, ``near_ood``, ``far_ood``) and a temperature ``t`` (1.0 = raw).
Probabilities are :func:`hydra_ops.uq.calibration.ensemble_probs` (the mean member softmax,
temperature-scaled); OOD scores are
:func:`hydra_ops.uq.calibrated.calibrated_ood_score`, the one definition shared with calibrate's
thresholds and ``hydra-ens predict`` (higher = more likely OOD; OOD is the positive class).
Metric keys use ``id_test`` for the ``test`` split.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hydra_ops.uq.calibration import ensemble_probs
from tasks.params.core import CoreConfig
from tasks.runtime.layout import HYDRA

#: Metrics of the paired bootstrap on ``id_test`` and ``shift`` (names in ``hydra_ops.metrics``).
BOOTSTRAP_CLASSIFICATION = ("accuracy", "nll", "brier", "ece")
#: Metrics of the paired bootstrap on ``near_ood`` and ``far_ood``.
BOOTSTRAP_OOD = ("auroc",)
CLASSIFICATION_SPLITS = (("test", "id_test"), ("shift", "shift"))
OOD_SPLITS = ("near_ood", "far_ood")
#: The splits evaluate compares the shipped artifact with the eager model on: (split, metric key).
COMPARED_SPLITS = (
    ("test", "id_test"),
    ("shift", "shift"),
    ("near_ood", "near_ood"),
    ("far_ood", "far_ood"),
)
#: The splits ``verdicts`` counts: (evaluation split, metric key).
VERDICT_SPLITS = (("test", "id_test"), ("near_ood", "near_ood"), ("far_ood", "far_ood"))


def ood_scores(cfg: CoreConfig, member_logits: torch.Tensor, t: float) -> torch.Tensor:
    """``[N]`` OOD scores of ``evaluate.ood_score`` kind at temperature ``t``."""
    from hydra_ops.uq.calibrated import calibrated_ood_score

    return calibrated_ood_score(member_logits, t, cfg.evaluate.ood_score)


def split_metrics(
    cfg: CoreConfig, out: dict[str, torch.Tensor], labels: dict, t: float
) -> dict[str, dict[str, float]]:
    """Every classification metric on ``id_test`` and ``shift``, every OOD metric of the
    configured score on ``near_ood`` and ``far_ood`` (ID test as the negatives)."""
    from hydra_ops.metrics import classification_metrics, ood_metrics

    result: dict[str, dict[str, float]] = {}
    for split, key in CLASSIFICATION_SPLITS:
        result[key] = classification_metrics(ensemble_probs(out[split], t), labels[split])
    id_scores = ood_scores(cfg, out["test"], t)
    for split in OOD_SPLITS:
        result[split] = ood_metrics(id_scores, ood_scores(cfg, out[split], t))
    return result


def ood_by_score(
    out: dict[str, torch.Tensor], t: float, members: int
) -> dict[str, dict[str, dict[str, float] | None]]:
    """``{split: {score kind: ood_metrics | None}}`` for near/far-OOD at temperature ``t``, every
    criterion of ``hydra_ops.uq.ood_criteria.OOD_CRITERIA``; ``None`` for one that needs members
    when ``members == 1`` (the score is 0 for every input: there is nothing to detect with, and
    0.5 would look like data)."""
    from hydra_ops.metrics import ood_metrics
    from hydra_ops.uq.calibrated import calibrated_ood_score
    from hydra_ops.uq.ood_criteria import OOD_CRITERIA

    result: dict[str, dict[str, dict[str, float] | None]] = {s: {} for s in OOD_SPLITS}
    for kind, criterion in OOD_CRITERIA.items():
        if members == 1 and criterion.needs_members():
            for split in OOD_SPLITS:
                result[split][kind] = None
            continue
        id_scores = calibrated_ood_score(out["test"], t, kind)
        for split in OOD_SPLITS:
            result[split][kind] = ood_metrics(id_scores, calibrated_ood_score(out[split], t, kind))
    return result


def paired_intervals(
    cfg: CoreConfig,
    out_a: dict[str, torch.Tensor],
    out_b: dict[str, torch.Tensor],
    labels: dict,
    t_a: float,
    t_b: float,
) -> dict[str, dict[str, dict[str, float]]]:
    """The paired bootstrap of model A minus model B (``evaluate.bootstrap_samples`` resamples,
    ``evaluate.bootstrap_seed``): ``{split: {metric: {difference, low, high, mean,
    n_resamples}}}`` for :data:`BOOTSTRAP_CLASSIFICATION` on ``id_test``/``shift`` and
    :data:`BOOTSTRAP_OOD` on ``near_ood``/``far_ood``, each model at its own temperature."""
    from hydra_ops import metrics as hm
    from hydra_ops.metrics.bootstrap import paired_bootstrap, paired_bootstrap_ood

    n, seed = cfg.evaluate.bootstrap_samples, cfg.evaluate.bootstrap_seed
    result: dict[str, dict[str, dict[str, float]]] = {}
    for split, key in CLASSIFICATION_SPLITS:
        pa, pb = ensemble_probs(out_a[split], t_a), ensemble_probs(out_b[split], t_b)
        result[key] = {
            metric: _interval(
                paired_bootstrap(
                    getattr(hm, metric), pa, pb, labels[split], n_resamples=n, seed=seed
                )
            )
            for metric in BOOTSTRAP_CLASSIFICATION
        }
    a_id, b_id = ood_scores(cfg, out_a["test"], t_a), ood_scores(cfg, out_b["test"], t_b)
    for split in OOD_SPLITS:
        a_ood, b_ood = ood_scores(cfg, out_a[split], t_a), ood_scores(cfg, out_b[split], t_b)
        result[split] = {
            metric: _interval(
                paired_bootstrap_ood(
                    getattr(hm, metric), a_id, a_ood, b_id, b_ood, n_resamples=n, seed=seed
                )
            )
            for metric in BOOTSTRAP_OOD
        }
    return result


def _interval(r) -> dict[str, float]:
    return {
        "difference": r.point_difference,
        "low": r.low,
        "high": r.high,
        "mean": r.mean_difference,
        "n_resamples": r.n_resamples,
    }


def hydra_verdicts(
    root: Path, hydra_out: dict[str, torch.Tensor], t: float
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, float]], dict[str, Any]]:
    """Verdict counts and fractions per split (ID test, near-OOD, far-OOD) of the Hydra model,
    with the thresholds stored by calibrate in ``models/hydra``'s metadata (and their score kind,
    so the verdicts are those ``hydra-ens predict`` gives). Returns (counts, fractions,
    thresholds as stored)."""
    from hydra_ops.hydra.serialization import read_hydra_config
    from hydra_ops.uq.calibrated import calibrated_ood_score
    from hydra_ops.uq.ood_thresholds import OodThresholds, verdict_counts

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


def compiled_vs_eager(
    shipped: dict[str, torch.Tensor],
    eager: dict[str, torch.Tensor],
    tolerance: float,
    min_agreement: float,
) -> dict[str, dict[str, Any]]:
    """Per split of :data:`COMPARED_SPLITS`: how far the shipped artifact's member logits are
    from the eager model's (:func:`hydra_ops.compile.compare_logits`: ``max_abs_diff_probs`` of
    the ensemble probabilities without temperature, ``max_abs_diff_logits``, ``argmax_agreement``
    of the ensemble argmax where the eager model is not at a near-tie, ``raw_argmax_agreement``
    and ``near_ties``, ``passed`` within ``tolerance`` and ``min_agreement``) and
    ``num_examples``."""
    from hydra_ops.compile import compare_logits

    keep = (
        "max_abs_diff_probs",
        "max_abs_diff_logits",
        "argmax_agreement",
        "raw_argmax_agreement",
        "near_ties",
        "passed",
    )
    result: dict[str, dict[str, Any]] = {}
    for split, key in COMPARED_SPLITS:
        compared = compare_logits(eager[split], shipped[split], tolerance, min_agreement)
        result[key] = {"num_examples": int(shipped[split].shape[0])}
        result[key].update({k: compared[k] for k in keep})
    return result


def plot_rows(
    cfg: CoreConfig,
    outputs: dict[str, dict[str, torch.Tensor]],
    temps: dict[str, float],
    labels: dict,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The DVC plots' rows of every model at its temperature: reliability bins on ID test, and
    ROC points (FPR, TPR) of near- and far-OOD against ID test."""
    from hydra_ops.metrics import reliability_bins, roc_points

    reliability, roc = [], []
    for name, out in outputs.items():
        probs = ensemble_probs(out["test"], temps[name])
        reliability += [{"model": name, **row} for row in reliability_bins(probs, labels["test"])]
        id_s = ood_scores(cfg, out["test"], temps[name])
        for split in OOD_SPLITS:
            points = roc_points(id_s, ood_scores(cfg, out[split], temps[name]))
            roc += [{"model": name, "split": split, "fpr": f, "tpr": t} for f, t in points]
    return reliability, roc
