"""Verdict thresholds on an OOD score, fitted on in-distribution validation scores.

Scores follow :func:`hydra_ops.uq.ood_criteria.ood_scores`: higher = more OOD.

Fit (:func:`fit_ood_thresholds`): each threshold is the empirical ``q``-quantile of the ``N`` ID
validation scores, inverted-CDF definition: the ``ceil(q * N)``-th smallest score. So at least a
fraction ``q`` of the ID validation scores are ``<=`` it and at most ``1 - q`` lie above it.
Defaults: ``uncertain`` at ``q = 0.90``, ``likely_ood`` at ``q = 0.95``.

Verdict (:func:`verdicts`), per example::

    score >  likely_ood                -> "likely_ood"
    uncertain < score <= likely_ood    -> "uncertain"
    score <= uncertain                 -> "ok"

A score equal to a threshold gets the milder verdict (it is among the ID scores that "stay under").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "VERDICTS",
    "VERDICT_LABELS",
    "OodThresholds",
    "empirical_quantile",
    "fit_ood_thresholds",
    "verdict_counts",
    "verdicts",
]

VERDICTS: tuple[str, ...] = ("ok", "uncertain", "likely_ood")
"""Verdict values, mildest first (the keys used in JSON output)."""

VERDICT_LABELS: dict[str, str] = {"ok": "ok", "uncertain": "uncertain", "likely_ood": "likely OOD"}
"""Human-readable label of each verdict (tables)."""


def _validate_scores(scores: Any, name: str) -> Tensor:
    if not isinstance(scores, Tensor):
        scores = torch.as_tensor(scores)
    if not scores.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {scores.dtype}")
    if scores.ndim != 1 or scores.numel() == 0:
        raise ValueError(f"{name} must have shape [N] with N >= 1, got {tuple(scores.shape)}")
    if not bool(torch.isfinite(scores).all()):
        raise ValueError(f"{name} contains NaN or infinite values")
    return scores


def _validate_quantiles(uncertain_quantile: Any, likely_ood_quantile: Any) -> tuple[float, float]:
    for name, q in (
        ("uncertain_quantile", uncertain_quantile),
        ("likely_ood_quantile", likely_ood_quantile),
    ):
        if isinstance(q, bool) or not isinstance(q, int | float) or not 0 < q < 1:
            raise ValueError(f"{name} must be a number in (0, 1), got {q!r}")
    if not uncertain_quantile < likely_ood_quantile:
        raise ValueError(
            f"uncertain_quantile must be < likely_ood_quantile, got {uncertain_quantile!r} >= "
            f"{likely_ood_quantile!r}"
        )
    return float(uncertain_quantile), float(likely_ood_quantile)


def empirical_quantile(scores: Tensor, q: float) -> float:
    """The ``ceil(q * N)``-th smallest of ``scores`` [N] (inverted-CDF quantile), ``0 < q < 1``.

    ``q * N`` is rounded to 9 decimals first, so ``0.95 * 100`` is 95 and not 95.0000000001.
    """
    scores = _validate_scores(scores, "scores")
    if isinstance(q, bool) or not isinstance(q, int | float) or not 0 < q < 1:
        raise ValueError(f"q must be a number in (0, 1), got {q!r}")
    k = max(1, math.ceil(round(q * scores.numel(), 9)))
    return float(torch.sort(scores.double()).values[k - 1])


@dataclass(frozen=True)
class OodThresholds:
    """Thresholds of one OOD score kind, as stored in ``hydra.json`` ``metadata["ood_thresholds"]``.

    Invariant: ``uncertain <= likely_ood`` and ``0 < uncertain_quantile < likely_ood_quantile < 1``.
    """

    score: str
    uncertain: float
    likely_ood: float
    uncertain_quantile: float
    likely_ood_quantile: float
    fitted_on: str
    n: int

    def to_metadata(self) -> dict[str, Any]:
        """JSON-serialisable dict with exactly the dataclass fields."""
        return asdict(self)

    @classmethod
    def from_metadata(cls, meta: Any) -> OodThresholds:
        """Inverse of :meth:`to_metadata`; ValueError naming the missing or bad field."""
        if not isinstance(meta, Mapping):
            raise ValueError(f"ood_thresholds must be a mapping, got {type(meta).__name__}")
        fields = ("score", "uncertain", "likely_ood", "uncertain_quantile", "likely_ood_quantile")
        missing = [k for k in (*fields, "fitted_on", "n") if k not in meta]
        if missing:
            raise ValueError(f"ood_thresholds: missing {', '.join(missing)}")
        for key in ("uncertain", "likely_ood"):
            if not isinstance(meta[key], int | float) or not math.isfinite(meta[key]):
                raise ValueError(f"ood_thresholds.{key} must be a finite number, got {meta[key]!r}")
        q1, q2 = _validate_quantiles(meta["uncertain_quantile"], meta["likely_ood_quantile"])
        if meta["uncertain"] > meta["likely_ood"]:
            raise ValueError(
                f"ood_thresholds.uncertain ({meta['uncertain']}) must be <= likely_ood "
                f"({meta['likely_ood']})"
            )
        return cls(
            score=str(meta["score"]),
            uncertain=float(meta["uncertain"]),
            likely_ood=float(meta["likely_ood"]),
            uncertain_quantile=q1,
            likely_ood_quantile=q2,
            fitted_on=str(meta["fitted_on"]),
            n=int(meta["n"]),
        )


def fit_ood_thresholds(
    id_scores: Tensor,
    *,
    score: str,
    uncertain_quantile: float = 0.90,
    likely_ood_quantile: float = 0.95,
    fitted_on: str = "val",
) -> OodThresholds:
    """Fit the two thresholds on ID (validation) scores.

    Args:
        id_scores: [N] OOD scores of in-distribution examples (higher = more OOD).
        score: the score kind the scores are (``msp``, ``entropy``, ...), recorded.
        uncertain_quantile: ``q1``; ``uncertain`` = :func:`empirical_quantile` ``(id_scores, q1)``.
        likely_ood_quantile: ``q2 > q1``; ``likely_ood`` = the ``q2`` quantile.
        fitted_on: name of the split the scores come from, recorded.

    Returns:
        :class:`OodThresholds` with ``n = N``.
    """
    id_scores = _validate_scores(id_scores, "id_scores")
    q1, q2 = _validate_quantiles(uncertain_quantile, likely_ood_quantile)
    return OodThresholds(
        score=score,
        uncertain=empirical_quantile(id_scores, q1),
        likely_ood=empirical_quantile(id_scores, q2),
        uncertain_quantile=q1,
        likely_ood_quantile=q2,
        fitted_on=fitted_on,
        n=int(id_scores.numel()),
    )


def verdicts(scores: Tensor, thresholds: OodThresholds) -> list[str]:
    """Per-example verdict (one of :data:`VERDICTS`) of ``scores`` [N]; see the module docstring."""
    scores = _validate_scores(scores, "scores").double()
    level = (scores > thresholds.uncertain).long() + (scores > thresholds.likely_ood).long()
    return [VERDICTS[i] for i in level.tolist()]


def verdict_counts(scores: Tensor, thresholds: OodThresholds) -> dict[str, int]:
    """``{verdict: count}`` over ``scores`` [N], every verdict present (0 when none)."""
    found = verdicts(scores, thresholds)
    return {v: found.count(v) for v in VERDICTS}
