"""hydra_ops.uq.ood_thresholds: thresholds fitted on ID validation scores, and the verdicts."""

from __future__ import annotations

import json

import pytest
import torch

from hydra_ops.uq.ood_thresholds import (
    OodThresholds,
    empirical_quantile,
    fit_ood_thresholds,
    verdict_counts,
    verdicts,
)


# ---------------------------------------------------------------- thresholds and verdicts
def test_thresholds_are_the_quantiles_id_scores_stay_under():
    scores = torch.arange(1, 101, dtype=torch.float32)  # 1, 2, ..., 100 (shuffled below)
    scores = scores[torch.randperm(100, generator=torch.Generator().manual_seed(0))]
    th = fit_ood_thresholds(scores, score="msp")
    assert (th.uncertain, th.likely_ood) == (90.0, 95.0)
    assert (th.uncertain_quantile, th.likely_ood_quantile, th.n) == (0.9, 0.95, 100)
    assert (th.score, th.fitted_on) == ("msp", "val")
    # on the scores it was fitted on: 90 ok, 5 uncertain, 5 likely OOD
    assert verdict_counts(scores, th) == {"ok": 90, "uncertain": 5, "likely_ood": 5}
    th2 = fit_ood_thresholds(
        scores, score="energy", uncertain_quantile=0.5, likely_ood_quantile=0.8
    )
    assert (th2.uncertain, th2.likely_ood) == (50.0, 80.0)


def test_empirical_quantile_is_the_ceil_qn_th_smallest():
    s = torch.tensor([3.0, 1.0, 2.0, 4.0])
    assert empirical_quantile(s, 0.5) == 2.0  # ceil(2.0) = 2nd smallest
    assert empirical_quantile(s, 0.6) == 3.0  # ceil(2.4) = 3rd
    assert empirical_quantile(s, 0.01) == 1.0
    assert empirical_quantile(s, 0.99) == 4.0
    hundred = torch.arange(1, 101, dtype=torch.float64)
    assert empirical_quantile(hundred, 0.07) == 7.0  # 0.07 * 100 = 7.000000000000001 in floats


def test_verdict_boundaries_give_the_milder_verdict_on_equality():
    th = OodThresholds("msp", -0.9, -0.8, 0.9, 0.95, "val", 10)
    scores = torch.tensor([-0.95, -0.9, -0.89, -0.8, -0.79, 0.0], dtype=torch.float64)
    assert verdicts(scores, th) == [
        "ok",
        "ok",
        "uncertain",
        "uncertain",
        "likely_ood",
        "likely_ood",
    ]
    assert verdict_counts(scores[:2], th) == {"ok": 2, "uncertain": 0, "likely_ood": 0}
    # float32 scores compare with the float64 thresholds they were fitted from without round-off
    s32 = torch.tensor([0.1, 0.2, 0.3, 0.7], dtype=torch.float32)
    th32 = fit_ood_thresholds(s32, score="msp", uncertain_quantile=0.5, likely_ood_quantile=0.75)
    assert verdicts(s32, th32) == ["ok", "ok", "uncertain", "likely_ood"]


def test_threshold_fitting_rejects_bad_input():
    s = torch.rand(10)
    with pytest.raises(ValueError, match="uncertain_quantile must be < likely_ood_quantile"):
        fit_ood_thresholds(s, score="msp", uncertain_quantile=0.95, likely_ood_quantile=0.9)
    with pytest.raises(ValueError, match="likely_ood_quantile"):
        fit_ood_thresholds(s, score="msp", likely_ood_quantile=1.0)
    with pytest.raises(ValueError, match="id_scores"):
        fit_ood_thresholds(torch.tensor([]), score="msp")
    with pytest.raises(ValueError, match="id_scores"):
        fit_ood_thresholds(torch.tensor([0.1, float("nan")]), score="msp")


def test_thresholds_round_trip_through_metadata():
    th = fit_ood_thresholds(torch.linspace(-1, 0, 21), score="msp")
    meta = json.loads(json.dumps(th.to_metadata()))
    assert set(meta) == {
        "score",
        "uncertain",
        "likely_ood",
        "uncertain_quantile",
        "likely_ood_quantile",
        "fitted_on",
        "n",
    }
    assert OodThresholds.from_metadata(meta) == th
    with pytest.raises(ValueError, match="missing likely_ood"):
        OodThresholds.from_metadata({k: v for k, v in meta.items() if k != "likely_ood"})
    with pytest.raises(ValueError, match="must be <= likely_ood"):
        OodThresholds.from_metadata({**meta, "uncertain": 1.0})
