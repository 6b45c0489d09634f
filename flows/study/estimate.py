"""What is left of a study, in compute time, from the points and upstreams it measured so far."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any


@dataclass(frozen=True)
class Estimate:
    """The compute a study still needs: ``compute_s`` worker-seconds (each left upstream at the
    mean measured upstream, each left point at the mean measured point), ``wall_s`` with
    ``workers`` running side by side."""

    upstreams_left: int
    points_left: int
    upstream_s: float
    point_s: float
    compute_s: float
    wall_s: float

    def line(self) -> str:
        return (
            f"estimate: {self.points_left} points and {self.upstreams_left} upstreams left, "
            f"about {_hours(self.compute_s)} of compute ({_hours(self.wall_s)} wall) at "
            f"{_hours(self.upstream_s)} per upstream and {_hours(self.point_s)} per point as "
            "measured"
        )


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def estimate_left(
    upstream_seconds: Sequence[float],
    point_seconds: Sequence[float],
    upstreams_left: int,
    points_left: int,
    workers: int,
) -> Estimate | None:
    """The :class:`Estimate` once one point has been measured (None before: an upstream alone
    says nothing about a point). An upstream left with none measured counts as a point."""
    if not point_seconds or workers < 1:
        return None
    point = fmean(point_seconds)
    upstream = fmean(upstream_seconds) if upstream_seconds else point
    compute = upstreams_left * upstream + points_left * point
    return Estimate(upstreams_left, points_left, upstream, point, compute, compute / workers)


def whole_runs(jobs: Iterable[Mapping[str, Any]], stages: Collection[str] = ()) -> list[float]:
    """The ``seconds`` of the finished jobs (upstream or point results) that measured a whole
    job: every one of ``stages`` ran, and it did not resume a killed run's clone. An upstream
    reused from an earlier commit, or seeded by one, or resumed, measured only part of it."""
    return [
        job["seconds"]
        for job in jobs
        if "seconds" in job and not job.get("resumed") and set(stages) <= set(job.get("ran") or ())
    ]
