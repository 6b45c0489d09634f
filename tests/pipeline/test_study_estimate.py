"""flows.study.estimate: what is left of a study, from what it measured."""

from __future__ import annotations

import pytest

from flows.study.estimate import estimate_left


def test_nothing_is_estimated_before_a_point_was_measured():
    assert estimate_left([3600.0], [], upstreams_left=2, points_left=4, workers=2) is None


def test_left_work_is_counted_at_the_measured_means_and_split_over_the_workers():
    est = estimate_left([3000.0, 5000.0], [1800.0], upstreams_left=2, points_left=5, workers=2)
    assert est is not None
    assert est.compute_s == pytest.approx(2 * 4000 + 5 * 1800)
    assert est.wall_s == pytest.approx(est.compute_s / 2)
    assert est.line() == (
        "estimate: 5 points and 2 upstreams left, about 4.7 h of compute (2.4 h wall) at "
        "1.1 h per upstream and 30 min per point as measured"
    )
    # no upstream measured yet: each left upstream counts as a point
    alone = estimate_left([], [600.0], upstreams_left=1, points_left=1, workers=1)
    assert alone is not None and alone.compute_s == pytest.approx(1200.0)


def test_only_jobs_that_did_all_their_work_are_measurements():
    from flows.study.estimate import whole_runs

    stages = ("prepare_data", "finetune_base")
    upstreams = [
        {"seconds": 3000.0, "ran": list(stages), "resumed": False},
        {"seconds": 6.3, "ran": [], "resumed": False},  # reused from an earlier commit
        {"seconds": 900.0, "ran": ["finetune_base"], "resumed": False},  # seeded by one
        {"seconds": 1200.0, "ran": list(stages), "resumed": True},  # a killed run's clone
        {"error": "finetune_base: out of memory"},
    ]
    assert whole_runs(upstreams, stages) == [3000.0]
    points = [{"seconds": 1400.0, "ran": ["gate"]}, {"seconds": 300.0, "resumed": True}]
    assert whole_runs(points) == [1400.0]
