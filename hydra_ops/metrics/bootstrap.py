"""Paired bootstrap of metric differences between two models evaluated on the same examples.

Each resample draws N example indices with replacement (one ``torch.Generator`` seeded with
``seed``, all indices drawn at once as an [R, N] tensor) and evaluates both models on the *same*
indices, so the spread reflects the difference between the models rather than the difficulty of
the particular examples drawn. Reported difference: ``metric(a) - metric(b)``.

The interval is the percentile interval: the ``(1 - confidence) / 2`` and
``(1 + confidence) / 2`` quantiles (linear interpolation) of the R resampled differences.

For OOD metrics (:func:`paired_bootstrap_ood`) the ID and OOD example sets are resampled
independently of each other (keeping their sizes), and both models share the same ID and the same
OOD indices.

Metrics listed in :data:`hydra_ops.metrics.RESAMPLED_METRICS` (accuracy, nll, brier, ece) are
evaluated for all resamples at once by their vectorised twins (per-example quantities computed once,
then indexed by the [R, N] resample indices), and so is AUROC
(:data:`hydra_ops.metrics.RESAMPLED_OOD_METRICS`); any other ``metric_fn`` is
called once per resample per model. That loop runs with one intra-op torch thread (the previous
setting is restored afterwards): each call works on a few hundred examples, where thread fan-out
costs more than it saves and stalls badly on a busy machine (~10x slower with 2 threads under
load, measured).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from hydra_ops.metrics import RESAMPLED_METRICS, RESAMPLED_OOD_METRICS

__all__ = ["BootstrapResult", "paired_bootstrap", "paired_bootstrap_ood"]


@dataclass(frozen=True)
class BootstrapResult:
    """Summary of a paired bootstrap of ``metric(a) - metric(b)``.

    Attributes:
        mean_difference: mean of the resampled differences.
        low: lower end of the percentile interval.
        high: upper end of the percentile interval.
        point_difference: the difference on the full (not resampled) data.
        n_resamples: number of resamples R.
    """

    mean_difference: float
    low: float
    high: float
    point_difference: float
    n_resamples: int


def _as_examples(x: Any, name: str) -> Tensor:
    if not isinstance(x, Tensor):
        x = torch.as_tensor(x)
    if x.ndim < 1 or x.shape[0] == 0:
        raise ValueError(
            f"{name} must have a non-empty leading example dimension, got shape {tuple(x.shape)}"
        )
    return x


def _check_settings(n_resamples: int, seed: int, confidence: float) -> None:
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, int) or n_resamples < 2:
        raise ValueError(f"n_resamples must be an integer >= 2, got {n_resamples!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    if not isinstance(confidence, int | float) or not 0.0 < float(confidence) < 1.0:
        raise ValueError(f"confidence must be a number in (0, 1), got {confidence!r}")


@contextmanager
def _single_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _indices(generator: torch.Generator, n_resamples: int, n: int, device: torch.device) -> Tensor:
    """[R, n] indices drawn uniformly with replacement."""
    return torch.randint(0, n, (n_resamples, n), generator=generator).to(device)


def _as_float(value: Any, what: str) -> float:
    out = float(value)
    if not math.isfinite(out):
        raise ValueError(f"metric_fn returned a non-finite value ({out}) on {what}")
    return out


def _finite(diffs: list[float]) -> list[float]:
    for r, value in enumerate(diffs):
        if not math.isfinite(value):
            raise ValueError(f"metric_fn returned a non-finite value ({value}) on resample {r}")
    return diffs


def _resample(difference: Callable[[int], float], n_resamples: int) -> list[float]:
    """``[difference(r) for r in range(R)]`` with one intra-op thread."""
    with _single_thread():
        return [difference(r) for r in range(n_resamples)]


def _summarise(point: float, diffs: list[float], confidence: float) -> BootstrapResult:
    d = torch.tensor(diffs, dtype=torch.float64)
    alpha = (1.0 - float(confidence)) / 2.0
    low, high = torch.quantile(d, torch.tensor([alpha, 1.0 - alpha], dtype=torch.float64))
    return BootstrapResult(
        mean_difference=float(d.mean()),
        low=float(low),
        high=float(high),
        point_difference=point,
        n_resamples=len(diffs),
    )


def paired_bootstrap(
    metric_fn: Callable[[Tensor, Tensor | None], float],
    a_inputs: Tensor,
    b_inputs: Tensor,
    labels_or_none: Tensor | None,
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> BootstrapResult:
    """Paired bootstrap interval of ``metric_fn(a) - metric_fn(b)`` on the same N examples.

    Args:
        metric_fn: ``(inputs [N, ...], labels [N] or None) -> float``, e.g.
            ``hydra_ops.metrics.ece``.
        a_inputs: [N, ...] model A's per-example inputs to ``metric_fn`` (e.g. probs [N, C]).
        b_inputs: [N, ...] model B's, same examples in the same order.
        labels_or_none: [N] labels, or None for label-free metrics (passed through as None).
        n_resamples: R >= 2.
        seed: seed of the index generator; equal seeds give equal results.
        confidence: interval coverage in (0, 1).
    """
    _check_settings(n_resamples, seed, confidence)
    a = _as_examples(a_inputs, "a_inputs")
    b = _as_examples(b_inputs, "b_inputs")
    n = a.shape[0]
    if b.shape[0] != n:
        raise ValueError(
            f"b_inputs must have the same number of examples as a_inputs ({n}), got {b.shape[0]}"
        )
    labels = None
    if labels_or_none is not None:
        labels = _as_examples(labels_or_none, "labels_or_none")
        if labels.ndim != 1 or labels.shape[0] != n:
            raise ValueError(f"labels_or_none must have shape [{n}], got {tuple(labels.shape)}")
    point = _as_float(metric_fn(a, labels), "the full data (model a)") - _as_float(
        metric_fn(b, labels), "the full data (model b)"
    )
    generator = torch.Generator().manual_seed(seed)
    idx = _indices(generator, n_resamples, n, a.device)
    resampled = RESAMPLED_METRICS.get(metric_fn)
    if resampled is not None and labels is not None:
        with _single_thread():
            d = resampled(a, labels, idx) - resampled(b, labels, idx)
        return _summarise(point, _finite(d.tolist()), confidence)

    def difference(r: int) -> float:
        i = idx[r]
        lab = None if labels is None else labels[i.to(labels.device)]
        return _as_float(metric_fn(a[i], lab), f"resample {r} (model a)") - _as_float(
            metric_fn(b[i.to(b.device)], lab), f"resample {r} (model b)"
        )

    return _summarise(point, _resample(difference, n_resamples), confidence)


def paired_bootstrap_ood(
    metric_fn: Callable[[Tensor, Tensor], float],
    a_id_scores: Tensor,
    a_ood_scores: Tensor,
    b_id_scores: Tensor,
    b_ood_scores: Tensor,
    n_resamples: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> BootstrapResult:
    """Paired bootstrap of an OOD metric difference ``metric_fn(a) - metric_fn(b)``.

    ID and OOD sets are resampled independently; models A and B share the same indices.

    Args:
        metric_fn: ``(id_scores [N], ood_scores [K]) -> float``, e.g.
            ``lambda i, o: ood_metrics(i, o)["auroc"]``.
        a_id_scores: [N] model A's scores on the ID examples.
        a_ood_scores: [K] model A's scores on the OOD examples.
        b_id_scores: [N] model B's scores on the same ID examples.
        b_ood_scores: [K] model B's scores on the same OOD examples.
        n_resamples, seed, confidence: as in :func:`paired_bootstrap`.
    """
    _check_settings(n_resamples, seed, confidence)
    a_id = _as_examples(a_id_scores, "a_id_scores")
    a_ood = _as_examples(a_ood_scores, "a_ood_scores")
    b_id = _as_examples(b_id_scores, "b_id_scores")
    b_ood = _as_examples(b_ood_scores, "b_ood_scores")
    if b_id.shape[0] != a_id.shape[0]:
        raise ValueError(
            f"b_id_scores must have {a_id.shape[0]} examples like a_id_scores, got {b_id.shape[0]}"
        )
    if b_ood.shape[0] != a_ood.shape[0]:
        raise ValueError(
            f"b_ood_scores must have {a_ood.shape[0]} examples like a_ood_scores, "
            f"got {b_ood.shape[0]}"
        )
    point = _as_float(metric_fn(a_id, a_ood), "the full data (model a)") - _as_float(
        metric_fn(b_id, b_ood), "the full data (model b)"
    )
    generator = torch.Generator().manual_seed(seed)
    id_idx = _indices(generator, n_resamples, a_id.shape[0], a_id.device)
    ood_idx = _indices(generator, n_resamples, a_ood.shape[0], a_ood.device)
    resampled = RESAMPLED_OOD_METRICS.get(metric_fn)
    if resampled is not None:
        with _single_thread():
            d = resampled(a_id, a_ood, id_idx, ood_idx) - resampled(b_id, b_ood, id_idx, ood_idx)
        return _summarise(point, _finite(d.tolist()), confidence)

    def difference(r: int) -> float:
        i, o = id_idx[r], ood_idx[r]
        return _as_float(metric_fn(a_id[i], a_ood[o]), f"resample {r} (model a)") - _as_float(
            metric_fn(b_id[i.to(b_id.device)], b_ood[o.to(b_ood.device)]),
            f"resample {r} (model b)",
        )

    return _summarise(point, _resample(difference, n_resamples), confidence)
