"""One gate check judged on a candidate's metrics: the rules of ``params.yaml``'s ``gates:``.

Each check (``tasks.params.GateCheck``, modelled on MLflow's ``MetricThreshold``) is judged by its
kind (:mod:`tasks.gates.kinds`): a comparison with a baseline the run built (``single``,
``naive_pruned``, ``deep_ensemble``, ...) or the current ``prod`` model, or an absolute threshold
the user opts into. :func:`evaluate_check` (:func:`tasks.gates.kinds.judge.evaluate_check`) gives
one check's record: its value, what it was compared ``against``, the rule, its status and its
``margin`` (how far it passed; the shortfall when negative).

Statuses: ``passed``, ``failed``, ``not applicable`` (a compile check when the shipped artifact is
the eager model: nothing was compiled, so nothing was checked; it neither passes nor blocks) and
``skipped`` (a ``prod`` comparison while no model holds the stage, allowed only for a check marked
``optional: true``; without it the check fails with the reason). A baseline the run did not build
fails (never skipped), and a registry that cannot be read fails a ``prod`` comparison: neither
turns into a pass.
"""

from __future__ import annotations

from tasks.gates.kinds.base import COMPILE_METRICS
from tasks.gates.kinds.judge import evaluate_check

__all__ = ["COMPILE_METRICS", "NO_CHECK", "NO_CHECK_NOTE", "evaluate_check"]

#: The failed "check" of a verdict in which no check applied.
NO_CHECK = "no applicable check"
NO_CHECK_NOTE = (
    "no check passed or failed (gates: [] or every check skipped / not applicable); a verdict "
    "needs at least one check that applies"
)
