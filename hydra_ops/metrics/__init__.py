"""Classification, calibration, selective-prediction and OOD-detection metrics.

Conventions (also in ``docs/metrics.md``):

- Inputs: ``probs`` [N, C] are probabilities (rows sum to 1 within
  :data:`hydra_ops.uq.uncertainty.PROB_ATOL`), ``labels`` [N] integer class ids in ``[0, C)``.
  Bad shapes, dtypes, NaN/inf, rows not summing to 1 or labels out of range raise ValueError naming
  the argument. Results are Python floats.
- Prediction = ``argmax`` of ``probs``; ties go to the lowest class index. Confidence = top
  probability (maximum softmax probability, MSP).
- Log base: natural log (NLL and entropies in nats). NLL clamps ``p[label]`` at :data:`NLL_EPS`
  so a zero probability costs ``-log(1e-12) ~= 27.6`` instead of ``inf``.
- Brier: ``mean_n sum_c (p[n, c] - onehot(label_n)[c])^2`` (sum over classes, mean over examples;
  range ``[0, 2]``).
- ECE: top-label, L1, 15 equal-width bins over ``[0, 1]``, binned by :func:`calibration_bins`
  exactly as torchmetrics' ``multiclass_calibration_error`` bins (float32 confidences). Bins are
  left-closed, ``[k/15, (k+1)/15)``; a confidence of exactly 1.0 falls in a bin of its own, the
  last one (index 15). ``ECE = sum_b (n_b / N) |acc_b - conf_b|``. The reliability diagram
  (:func:`reliability_bins`) uses the same bins.
- Adaptive ECE: same formula over 15 equal-mass bins: after a stable ascending sort of the
  confidences, the example at sorted position ``i`` goes to bin ``floor(i * B / N)`` (bin sizes
  differ by at most one; tied confidences may straddle a bin edge, split in input order; with
  ``N < B`` only ``N`` bins are non-empty).
- AURC: area under the risk-coverage curve with MSP confidence,
  ``AURC = (1/N) sum_{k=1..N} risk(k)`` where ``risk(k)`` is the error rate of the ``k`` most
  confident examples. Tied confidences are handled by taking the expectation over a random order
  within each tie group (errors spread evenly across the group), so the result does not depend on
  input order.
- AUGRC (Traub et al., 2024): area under the generalized risk-coverage curve, generalized risk =
  (accepted and wrong) / N, trapezoidal from coverage 0 (risk 0) to 1; ties as for AURC.
- OOD detection: OOD is the POSITIVE class and scores are "higher = more OOD". AUROC and AUPR-Out
  use OOD as positive; AUPR-In uses ID as positive with the score negated; FPR@95%TPR is the
  smallest fraction of ID examples flagged among thresholds ``t`` (flag when ``score >= t``, ``t``
  ranging over the observed scores) that flag at least 95% of the OOD examples. Tied scores are
  never split: AUROC counts a tied ID/OOD pair as 1/2 (as sklearn's ``roc_auc_score``), average
  precision is the step-wise sum over distinct thresholds (as sklearn's
  ``average_precision_score``, which compute them, in float64). :func:`auroc` computes the same
  AUROC by the rank-sum identity (equal up to float rounding, much cheaper: the paired bootstrap
  calls it per resample) and :func:`auroc_resampled` for many resamples at once;
  :func:`roc_points` thins the ROC curve for plots.
- OOD scores (:func:`ood_scores`): the criteria of :data:`OOD_CRITERIA`
  (:mod:`hydra_ops.uq.ood_criteria`, one per module: ``msp``, ``entropy``, ``energy``,
  ``mutual_information``, ``disagreement``).

ECE follows torchmetrics' binning to the bit (tested against it); sklearn computes the OOD
curves. One family per module: :mod:`.classification`, :mod:`.calibration`, :mod:`.selective`
(risk-coverage), :mod:`.ood`; all re-exported here.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from hydra_ops.metrics._checks import DEFAULT_N_BINS, validate_labels
from hydra_ops.metrics.calibration import (
    adaptive_ece,
    calibration_bins,
    ece,
    ece_resampled,
    reliability_bins,
)
from hydra_ops.metrics.classification import (
    NLL_EPS,
    accuracy,
    accuracy_resampled,
    brier,
    brier_resampled,
    classification_metrics,
    nll,
    nll_resampled,
)
from hydra_ops.metrics.ood import auroc, auroc_resampled, ood_metrics, roc_points
from hydra_ops.metrics.selective import augrc, aurc
from hydra_ops.uq.ood_criteria import OOD_CRITERIA
from hydra_ops.uq.ood_criteria.base import ood_scores

__all__ = [
    "DEFAULT_N_BINS",
    "NLL_EPS",
    "OOD_CRITERIA",
    "RESAMPLED_METRICS",
    "RESAMPLED_OOD_METRICS",
    "accuracy",
    "accuracy_resampled",
    "adaptive_ece",
    "augrc",
    "aurc",
    "auroc",
    "auroc_resampled",
    "brier",
    "brier_resampled",
    "calibration_bins",
    "classification_metrics",
    "ece",
    "ece_resampled",
    "nll",
    "nll_resampled",
    "ood_metrics",
    "ood_scores",
    "reliability_bins",
    "roc_points",
    "validate_labels",
]

RESAMPLED_METRICS: dict[Callable[..., float], Callable[..., Tensor]] = {
    accuracy: accuracy_resampled,
    nll: nll_resampled,
    brier: brier_resampled,
    ece: ece_resampled,
}
"""Vectorised twins ``(probs [N, C], labels [N], idx [R, N]) -> [R]``; the bootstrap uses them."""

RESAMPLED_OOD_METRICS: dict[Callable[..., float], Callable[..., Tensor]] = {auroc: auroc_resampled}
"""Vectorised twins ``(id [N], ood [K], id_idx [R, N], ood_idx [R, K]) -> [R]`` of OOD metrics;
:func:`hydra_ops.metrics.bootstrap.paired_bootstrap_ood` uses them."""
