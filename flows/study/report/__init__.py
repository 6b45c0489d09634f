"""The study report: every (variant, seed) point of ``hydra-ens study`` summarised across seeds.

A study runs one full pipeline per (variant, seed) point; each point leaves
``metrics/evaluate.json``, ``metrics/latency.json``, ``reports/gate.json`` and its resolved
``params.yaml`` (:func:`load_point` reads them into a :class:`PointResult`).
:func:`write_study_report` turns the points into ``study.md``, ``study.json`` (the numbers behind
the Markdown) and ``figures/*.png`` (Pareto plots), all written atomically. It is a pure function
of its inputs: no Prefect, no DVC, no clock; orders are sorted and figure sizes fixed.

Conventions (docs/study_report.md says what each table means):

- Statistics are across the choosing seeds: the mean and the 95% Student-t interval
  ``mean +- t(0.975, n - 1) * s / sqrt(n)``; one seed has no interval; a zero-width interval is no
  evidence of a difference. Displayed intervals are clipped to the metric's range. When every
  point has the same ``data.seed`` the intervals are marked as conditional on one split.
- Claims printed in words are Holm-corrected over their family (the report says its size).
- Models: ``hydra[<variant>]`` per variant; ``naive_pruned`` (the Hydra's twin) and ``control``
  depend on the variant; ``single``, ``deep_ensemble``, ``mc_dropout`` are pooled once per seed
  (their timings averaged over the runs at that seed) unless they differ between variants.
- Cost is each model's latency ratio to the single model of the same point, timed side by side in
  the point's process (``metrics/cost.json``, :mod:`tasks.evaluation.cost`), with FLOPs and
  parameters.
- Paired differences are Hydra minus a baseline within one point (the same run), per seed, with
  that run's paired bootstrap interval beside them.
- ``confirm_seeds``: points at those seeds never enter the choice; they are reported apart.
"""

from flows.study.report.gates import baseline_as_candidate
from flows.study.report.results import PointResult, load_point
from flows.study.report.stats import mean_interval, pareto_front
from flows.study.report.write import write_study_report

__all__ = [
    "PointResult",
    "baseline_as_candidate",
    "load_point",
    "mean_interval",
    "pareto_front",
    "write_study_report",
]
