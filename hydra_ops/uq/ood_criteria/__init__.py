"""OOD criteria: per-example scores that say how out-of-distribution an input looks.

One criterion per module, a subclass of :class:`~hydra_ops.uq.ood_criteria.base.OodCriterion`
that declares what it needs (``members``, ``logits``; the ensemble probabilities always come) and
its direction; :data:`OOD_CRITERIA` registers each once, by name. The params schema
(``evaluate.ood_score``), the evaluate stage's ``ood_by_score``, ``hydra-ens predict`` and the
study report all read this registry. :func:`ood_scores` computes one by name, oriented so that
higher = more OOD; :mod:`hydra_ops.metrics` judges the scores (AUROC, FPR@95...).

This module imports no torch: the built-in criteria are registered as lazy paths, so the params
schema can list the names without loading a criterion.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hydra_ops.registry import Registry

if TYPE_CHECKING:
    from hydra_ops.uq.ood_criteria.base import OodCriterion

#: ``name -> OodCriterion subclass``, in report order.
OOD_CRITERIA: Registry[type[OodCriterion]] = Registry("OOD score", package=__name__)
OOD_CRITERIA.register_lazy("msp", ".msp:MaxSoftmaxProbability")
OOD_CRITERIA.register_lazy("entropy", ".entropy:PredictiveEntropy")
OOD_CRITERIA.register_lazy("energy", ".energy:Energy")
OOD_CRITERIA.register_lazy("mutual_information", ".mutual_information:MutualInformation")
OOD_CRITERIA.register_lazy("disagreement", ".disagreement:Disagreement")

_EXPORTS = {
    "OodCriterion": ".base",
    "OodInputs": ".base",
    "ood_criterion": ".base",
    "ood_scores": ".base",
}

__all__ = ["OOD_CRITERIA", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
