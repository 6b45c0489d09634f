"""flows.study.report.stats: the across-seed interval, the Pareto front, Holm's step-down,
each against its definition."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from flows.study.report.stats import holm, mean_interval, pareto_front


def test_mean_interval_is_the_student_t_interval():
    vals = [0.90, 0.93, 0.95]
    got = mean_interval(vals)
    mean = sum(vals) / 3
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / 2)
    half = 4.302652729911275 * sd / math.sqrt(3)  # t(0.975, 2)
    assert got["n"] == 3
    assert got["mean"] == pytest.approx(mean)
    assert (got["low"], got["high"]) == pytest.approx((mean - half, mean + half))
    lo, hi = stats.t.interval(0.95, 2, loc=mean, scale=stats.sem(vals))
    assert (got["low"], got["high"]) == pytest.approx((lo, hi))
    assert mean_interval([0.5]) == {"n": 1, "mean": 0.5, "low": None, "high": None}


def test_pareto_front():
    pts = [("a", 1.0, 0.80), ("b", 2.0, 0.90), ("c", 3.0, 0.85), ("d", 2.0, 0.90)]
    assert pareto_front(pts, True) == ["a", "b", "d"]
    assert pareto_front(pts, False) == ["a"]


def test_holm_matches_its_definition():
    """Holm's step-down by hand: sorted p (d .005, a .01, c .03, b .04, e .2), m = 5, adjusted
    max-accumulated (m - i) p: .025, .04, .09, max(.09, .08), .2; rejected at .05: d and a."""

    got = holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005, "e": 0.2}, 0.05)
    adjusted = {"d": 0.025, "a": 0.04, "c": 0.09, "b": 0.09, "e": 0.2}
    assert {k: v["p_holm"] for k, v in got.items()} == pytest.approx(adjusted)
    assert sorted(k for k, v in got.items() if v["rejected"]) == ["a", "d"]
    assert holm({"a": 0.01, "x": None})["x"] == {"p": None, "p_holm": None, "rejected": False}
