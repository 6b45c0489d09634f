"""The study report: every (variant, seed) point of ``hydra-ens study`` summarised across seeds.

A study runs one full pipeline per (variant, seed) point; each point leaves
``metrics/evaluate.json``, ``metrics/latency.json``, ``reports/gate.json`` and its resolved
``params.yaml`` (:func:`load_point` reads them into a :class:`PointResult`).
:func:`write_study_report` turns the points into ``study.md``, ``study.json`` (the numbers behind
the Markdown) and ``figures/*.png`` (Pareto plots), all written atomically. It is a pure function
of its inputs: no Prefect, no DVC, no clock; orders are sorted and figure sizes fixed.

Conventions (docs/study_report.md says what each table means):

- Statistics are across seeds: the mean and the 95% Student-t interval
  ``mean +- t(0.975, n - 1) * s / sqrt(n)`` (``s`` the sample standard deviation); one seed has
  no interval. Metrics are the calibrated ones (temperature scaling fitted on validation).
- Models: ``hydra[<variant>]`` per variant; ``naive_pruned`` and ``control`` depend on the variant
  (``naive_pruned[<variant>]``...); every other baseline (``single``, ``deep_ensemble``,
  ``mc_dropout``) is recomputed by every point but is the same model at a given seed, so it is
  pooled once per seed (its latency, measured by every run, averaged over the runs at that seed).
  A "shared" baseline whose metrics differ between variants at one seed (a variant overrides
  something it depends on, e.g. ``members.num_members`` sizes the Deep Ensemble) is kept per
  variant instead, and the report says so.
- Paired differences are Hydra minus a baseline within one point (the same run), per seed.
"""

from tasks.study_report.gates import baseline_as_candidate
from tasks.study_report.points import PointResult, load_point
from tasks.study_report.report import write_study_report
from tasks.study_report.stats import mean_interval, pareto_front

__all__ = [
    "PointResult",
    "baseline_as_candidate",
    "load_point",
    "mean_interval",
    "pareto_front",
    "write_study_report",
]
