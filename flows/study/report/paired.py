"""Paired differences (Hydra minus a baseline in the same run) across seeds, whether any
variant beats the single model, and the word each comparison earns under Holm's correction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flows.study.report.cells import diff_cell
from flows.study.report.collect import Collected
from flows.study.report.stats import holm, seed_stats, t_test_p
from tasks.params import GREATER_IS_BETTER

#: The headline metrics of the paired differences (split.metric).
HEADLINE = (
    "id_test.accuracy",
    "id_test.nll",
    "id_test.ece",
    "shift.nll",
    "near_ood.auroc",
    "near_ood.fpr_at_95_tpr",
    "far_ood.auroc",
)
#: Baselines Hydra is paired with (those present in evaluate.json): the single model, the
#: Hydra's naive pruned twin and its control (same variant), then the costlier baselines.
PAIRED_BASELINES = (
    "single",
    "naive_pruned",
    "control",
    "deep_ensemble",
    "mc_dropout",
    "lora_ensemble",
    "batch_ensemble",
)
#: The UQ metrics on which the report states whether any variant beats the single model.
BEATS_SINGLE = (
    "id_test.nll",
    "id_test.ece",
    "shift.nll",
    "near_ood.auroc",
    "near_ood.fpr_at_95_tpr",
)
#: The uncertainty metrics the default gates watch against the naive pruned twin
#: (``tasks.params.TWIN_GROUP``): a variant is named only when its Hydra beats its twin on one.
TWIN_METRICS = ("id_test.nll", "id_test.ece", "near_ood.auroc", "shift.nll")
#: The family-wise error rate of the claims the report prints in words (Holm's step-down).
ALPHA = 0.05
#: The words a comparison may be printed with: ``better`` / ``worse`` only where Holm's
#: step-down rejects "no difference", ``no detectable difference`` otherwise.
BETTER, WORSE, NO_DIFFERENCE = "better", "worse", "no detectable difference"
#: The baselines of the confirmation's claims family (with :data:`BEATS_SINGLE`), those present.
CLAIM_BASELINES = ("single", "deep_ensemble", "mc_dropout", "lora_ensemble", "batch_ensemble")


def paired_differences(col: Collected) -> dict[str, Any]:
    """``{variant: {baseline: {"split.metric": stats}}}`` of Hydra minus the baseline of the same
    run, per :data:`HEADLINE` metric: :func:`~flows.study.report.stats.seed_stats` of the per-seed
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
    """One run's uncorrected reading of the interval of Hydra - baseline: ``> 0`` / ``< 0`` when
    it excludes 0, else ``n.s.``; never a claim, so never ``better`` or ``worse``."""
    if low > 0:
        return "> 0"
    if high < 0:
        return "< 0"
    return "n.s."


def claim_word(rejected: bool, mean: float, metric: str) -> str:
    """:data:`BETTER` / :data:`WORSE` for the Hydra when Holm rejected "no difference" (the side
    from the mean difference and the metric's direction), else :data:`NO_DIFFERENCE`."""
    if not rejected or mean == 0:
        return NO_DIFFERENCE
    return BETTER if (mean > 0) == GREATER_IS_BETTER.get(metric, True) else WORSE


def _beats(stats: Mapping[str, Any], metric: str) -> bool:
    """The across-seed interval of a difference excludes 0 on the good side of ``metric``; a
    zero-width interval (the same difference at every seed) is no evidence of a difference."""
    if stats.get("low") is None or stats["low"] == stats["high"]:
        return False
    return stats["low"] > 0 if GREATER_IS_BETTER.get(metric, True) else stats["high"] < 0


def holm_claims(
    col: Collected, paired: Mapping[str, Any], baseline: str, keys: Sequence[str]
) -> dict[str, Any]:
    """The family of "Hydra of variant v beats ``baseline`` on metric k across seeds" claims,
    one per (variant, k) with a paired difference: the t-test p-value of the per-seed
    differences (:func:`~flows.study.report.stats.t_test_p`), Holm's step-down at
    :data:`ALPHA`, and the claims kept: rejected by Holm *and* on the good side.
    ``{"m", "tests": {"v|k": {...}}, "kept": {v: [k, ...]}}``."""
    pvals: dict[str, float | None] = {}
    side: dict[str, bool] = {}
    for v in col.variants:
        for key in keys:
            st = paired.get(v, {}).get(baseline, {}).get(key)
            if st is None:
                continue
            diffs = [r["value"] for r in st["per_seed"]]
            pvals[f"{v}|{key}"] = t_test_p(diffs)
            side[f"{v}|{key}"] = _beats(st, key.split(".", 1)[1])
    tests = holm(pvals, ALPHA)
    kept: dict[str, list[str]] = {}
    for name, t in sorted(tests.items()):
        v, key = name.split("|")
        t["good_side"] = side[name]
        t["kept"] = bool(t["rejected"] and side[name])
        mean = paired[v][baseline][key]["mean"]
        t["word"] = claim_word(t["rejected"], mean, key.split(".", 1)[1])
        if t["kept"]:
            kept.setdefault(v, []).append(key)
    return {"m": len(pvals), "alpha": ALPHA, "tests": tests, "kept": kept}


def beats_single(col: Collected, paired: Mapping[str, Any]) -> dict[str, Any]:
    """Per :data:`BEATS_SINGLE` metric, the variants that beat the single model across seeds
    after Holm's correction over every (variant, metric) comparison, and the sentence the report
    prints about them (with the size of the family)."""
    family = holm_claims(col, paired, "single", BEATS_SINGLE)
    m = family["m"]
    holm_note = f"Holm-corrected over {m} comparison{'s' if m != 1 else ''} at {ALPHA:g}"
    mark = col.mark
    out: dict[str, Any] = {"_family": family}
    for key in BEATS_SINGLE:
        winners = [v for v in col.variants if key in family["kept"].get(v, [])]
        if winners:
            details = []
            for v in winners:
                st = paired[v]["single"][key]
                t = family["tests"][f"{v}|{key}"]
                details.append(
                    f"`{v}` ({diff_cell(st, key, mark)}, n={st['n']}, p_Holm={t['p_holm']:.3f})"
                )
            sentence = (
                f"Variants that beat the single model on {key} across seeds (Hydra - single, "
                f"mean [95%], {holm_note}): " + ", ".join(details) + "."
            )
        else:
            n_max = max(
                (
                    paired.get(v, {}).get("single", {}).get(key, {}).get("n", 0)
                    for v in col.variants
                ),
                default=0,
            )
            why = " (n=1, no interval)" if n_max == 1 else f" ({holm_note})"
            if "single" not in col.baselines:
                why = " (no single model evaluated)"
            sentence = f"no variant beats the single model on {key} across seeds{why}."
        out[key] = {"variants": winners, "sentence": sentence}
    return out


def beats_twin(col: Collected, paired: Mapping[str, Any]) -> dict[str, Any]:
    """Per variant, the :data:`TWIN_METRICS` on which its Hydra beats its own naive pruned twin
    across seeds (Holm over every (variant, metric) comparison), and the sentence."""
    family = holm_claims(col, paired, "naive_pruned", TWIN_METRICS)
    m = family["m"]
    out: dict[str, Any] = {"m": m, "alpha": ALPHA, "tests": family["tests"], "variants": {}}
    for v in col.variants:
        won = family["kept"].get(v, [])
        if "naive_pruned" not in paired.get(v, {}):
            sentence = f"`{v}`: no naive pruned twin evaluated, nothing to compare."
        elif won:
            cells = [diff_cell(paired[v]["naive_pruned"][k], k, col.mark) for k in won]
            sentence = f"`hydra[{v}]` beats its naive pruned twin on " + ", ".join(
                f"{k} ({c})" for k, c in zip(won, cells, strict=True)
            )
            sentence += f" across seeds (Holm over {m} comparisons)."
        else:
            sentence = (
                f"`hydra[{v}]` does not beat its naive pruned twin on any of "
                f"{', '.join(TWIN_METRICS)} across seeds (Holm over {m} comparisons)."
            )
        out["variants"][v] = {"metrics": won, "beats": bool(won), "sentence": sentence}
    return out


def worded_claims(by_baseline: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """One variant's confirmation claims, worded by the corrected test: Hydra against each of
    :data:`CLAIM_BASELINES` present on each :data:`BEATS_SINGLE` metric, one Holm family (the
    t-test of the per-seed differences, two-sided), and against its naive pruned twin on each
    :data:`TWIN_METRICS` metric, a family of its own. ``by_baseline``: the variant's entry of
    :func:`paired_differences`. ``{"baselines": family, "twin": family}``, each family
    ``{"m", "alpha", "tests": {"baseline|metric": {"p", "p_holm", "rejected", "mean", "low",
    "high", "n", "word"}}}``."""
    return {
        "baselines": _worded_family(by_baseline, CLAIM_BASELINES, BEATS_SINGLE),
        "twin": _worded_family(by_baseline, ("naive_pruned",), TWIN_METRICS),
    }


def _worded_family(
    by_baseline: Mapping[str, Mapping[str, Any]], baselines: Sequence[str], keys: Sequence[str]
) -> dict[str, Any]:
    stats = {
        f"{b}|{k}": by_baseline[b][k]
        for b in baselines
        for k in keys
        if k in by_baseline.get(b, {})
    }
    tests = holm({n: t_test_p([r["value"] for r in st["per_seed"]]) for n, st in stats.items()})
    for name, t in tests.items():
        st = stats[name]
        t.update(mean=st["mean"], low=st["low"], high=st["high"], n=st["n"])
        t["word"] = claim_word(t["rejected"], st["mean"], name.split(".", 1)[1])
    return {"m": len(tests), "alpha": ALPHA, "tests": dict(sorted(tests.items()))}


def claim_sentence(variant: str, name: str, test: Mapping[str, Any], m: int, mark: str) -> str:
    """``hydra[v]`` against ``baseline`` on ``metric``: the word, the mean difference with its
    interval, and the Holm-corrected p-value with the family's size."""
    baseline, key = name.split("|")
    p = "n/a" if test["p_holm"] is None else f"{test['p_holm']:.3f}"
    return (
        f"`hydra[{variant}]` against `{baseline}` on {key}: **{test['word']}** "
        f"({diff_cell(test, key, mark)}, p_Holm {p} over {m})"
    )
