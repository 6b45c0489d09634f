"""Paired differences (Hydra minus a baseline in the same run) across seeds, and whether any
variant beats the single model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tasks.params import GREATER_IS_BETTER
from tasks.study_report.cells import diff_cell
from tasks.study_report.collect import Collected
from tasks.study_report.stats import seed_stats

#: The headline metrics of the paired differences (split.metric).
HEADLINE = (
    "id_test.accuracy",
    "id_test.nll",
    "id_test.ece",
    "near_ood.auroc",
    "near_ood.fpr_at_95_tpr",
    "far_ood.auroc",
)
#: Baselines Hydra is paired with (those present in evaluate.json).
PAIRED_BASELINES = ("single", "deep_ensemble", "mc_dropout")
#: The UQ metrics on which the report states whether any variant beats the single model.
BEATS_SINGLE = ("id_test.nll", "id_test.ece", "near_ood.auroc", "near_ood.fpr_at_95_tpr")


def paired_differences(col: Collected) -> dict[str, Any]:
    """``{variant: {baseline: {"split.metric": stats}}}`` of Hydra minus the baseline of the same
    run, per :data:`HEADLINE` metric: :func:`~tasks.study_report.stats.seed_stats` of the per-seed
    differences, ``greater_is_better`` and each seed's paired bootstrap interval (with its
    ``direction``) where evaluate.json has one."""
    out: dict[str, Any] = {}
    for v in col.variants:
        for b in PAIRED_BASELINES:
            per_metric: dict[str, Any] = {}
            for key in HEADLINE:
                split, metric = key.split(".", 1)
                diffs: dict[int, float] = {}
                boot: list[dict[str, Any]] = []
                for s in col.seeds:
                    p = col.point(v, s)
                    if p is None or b not in p.evaluation["models"]:
                        continue
                    h = col.flat[(v, s, "hydra")][0]
                    base = col.flat[(v, s, b)][0]
                    if key not in h or key not in base:
                        continue
                    diffs[s] = h[key] - base[key]
                    interval = (
                        p.evaluation.get("bootstrap", {})
                        .get(b, {})
                        .get("calibrated", {})
                        .get(split, {})
                        .get(metric)
                    )
                    if interval is not None:
                        lo, hi = float(interval["low"]), float(interval["high"])
                        boot.append(
                            {
                                "seed": s,
                                "low": lo,
                                "high": hi,
                                "excludes_zero": lo > 0 or hi < 0,
                                "direction": _direction(metric, lo, hi),
                            }
                        )
                if diffs:
                    per_metric[key] = {
                        **seed_stats(diffs),
                        "greater_is_better": GREATER_IS_BETTER.get(metric),
                        "bootstrap": boot,
                    }
            if per_metric:
                out.setdefault(v, {})[b] = per_metric
    return out


def _direction(metric: str, low: float, high: float) -> str:
    """``better`` / ``worse`` when the interval of Hydra - baseline excludes 0, else ``n.s.``."""
    gib = GREATER_IS_BETTER.get(metric, True)
    if low > 0:
        return "better" if gib else "worse"
    if high < 0:
        return "worse" if gib else "better"
    return "n.s."


def _beats(stats: Mapping[str, Any], metric: str) -> bool:
    """The across-seed interval of a difference excludes 0 on the good side of ``metric``."""
    if stats.get("low") is None:
        return False
    return stats["low"] > 0 if GREATER_IS_BETTER.get(metric, True) else stats["high"] < 0


def beats_single(col: Collected, paired: Mapping[str, Any]) -> dict[str, Any]:
    """Per :data:`BEATS_SINGLE` metric, the variants that beat the single model across seeds
    and the sentence the report prints about them."""
    out = {}
    for key in BEATS_SINGLE:
        metric = key.split(".", 1)[1]
        winners = []
        for v in col.variants:
            st = paired.get(v, {}).get("single", {}).get(key)
            if st is not None and _beats(st, metric):
                winners.append(v)
        if winners:
            details = []
            for v in winners:
                st = paired[v]["single"][key]
                details.append(f"`{v}` ({diff_cell(st)}, n={st['n']})")
            sentence = (
                f"Variants that beat the single model on {key} across seeds (Hydra - single, "
                "mean [95%]): " + ", ".join(details) + "."
            )
        else:
            n_max = max(
                (
                    paired.get(v, {}).get("single", {}).get(key, {}).get("n", 0)
                    for v in col.variants
                ),
                default=0,
            )
            why = " (n=1, no interval)" if n_max == 1 else ""
            if "single" not in col.baselines:
                why = " (no single model evaluated)"
            sentence = f"no variant beats the single model on {key} across seeds{why}."
        out[key] = {"variants": winners, "sentence": sentence}
    return out
