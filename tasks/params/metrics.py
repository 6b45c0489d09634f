"""The metrics a gate names and which way each is better (gates, the evaluate report, the study)."""

from __future__ import annotations

#: Metrics a gate may name. Classification metrics apply to ``id_test`` and ``shift``; OOD metrics
#: (OOD = positive class) to ``near_ood`` and ``far_ood``; the rest are model-level
#: (split ``model``).
CLASSIFICATION_METRICS = ("accuracy", "nll", "brier", "ece", "adaptive_ece", "aurc", "augrc")
OOD_METRICS = ("auroc", "aupr_in", "aupr_out", "fpr_at_95_tpr")
MODEL_METRICS = ("parameters", "latency_ms", "compile_max_abs_diff", "compile_argmax_agreement")
#: The checks of the shipped artifact against the eager model: no gate list may drop them.
COMPILE_CHECKS = ("compile_argmax_agreement", "compile_max_abs_diff")
METRICS = CLASSIFICATION_METRICS + OOD_METRICS + MODEL_METRICS
GREATER_IS_BETTER = {
    "accuracy": True,
    "nll": False,
    "brier": False,
    "ece": False,
    "adaptive_ece": False,
    "aurc": False,
    "augrc": False,
    "auroc": True,
    "aupr_in": True,
    "aupr_out": True,
    "fpr_at_95_tpr": False,
    "parameters": False,
    "latency_ms": False,
    "compile_max_abs_diff": False,
    "compile_argmax_agreement": True,
}
