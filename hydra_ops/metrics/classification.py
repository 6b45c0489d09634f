"""Classification metrics: accuracy, NLL, Brier (and their resampled twins for the bootstrap),
plus :func:`classification_metrics`, every classification metric at once."""

from __future__ import annotations

import torch
from torch import Tensor

from hydra_ops.metrics._checks import DEFAULT_N_BINS, check_idx, check_n_bins, prep
from hydra_ops.metrics.calibration import adaptive_ece, ece
from hydra_ops.metrics.selective import augrc, aurc

NLL_EPS: float = 1e-12


def accuracy(probs: Tensor, labels: Tensor) -> float:
    """Top-1 accuracy (the first of tied maxima is the prediction). probs [N, C], labels [N] ->
    float in [0, 1]."""
    probs, labels = prep(probs, labels)
    return float((probs.argmax(dim=1) == labels).to(torch.float64).mean())


def nll(probs: Tensor, labels: Tensor) -> float:
    """Mean negative log-likelihood in nats; ``p[label]`` clamped at :data:`NLL_EPS`.

    probs [N, C], labels [N] -> float >= 0.
    """
    probs, labels = prep(probs, labels)
    p_true = probs.gather(1, labels[:, None]).squeeze(1)
    return float(-p_true.clamp_min(NLL_EPS).log().mean())


def brier(probs: Tensor, labels: Tensor) -> float:
    """Brier score: sum over classes of squared error, mean over examples.

    probs [N, C], labels [N] -> float in [0, 2].
    """
    probs, labels = prep(probs, labels)
    onehot = torch.nn.functional.one_hot(labels, probs.shape[1]).to(probs.dtype)
    return float(((probs - onehot) ** 2).sum(dim=1).mean())


def accuracy_resampled(probs: Tensor, labels: Tensor, idx: Tensor) -> Tensor:
    """:func:`accuracy` of R resamples: probs [N, C], labels [N], idx [R, N'] -> [R]."""
    probs, labels = prep(probs, labels)
    idx = check_idx(idx, probs.shape[0]).to(probs.device)
    return (probs.argmax(dim=1) == labels).to(torch.float64)[idx].mean(dim=1)


def nll_resampled(probs: Tensor, labels: Tensor, idx: Tensor) -> Tensor:
    """:func:`nll` of R resamples: probs [N, C], labels [N], idx [R, N'] -> [R]."""
    probs, labels = prep(probs, labels)
    idx = check_idx(idx, probs.shape[0]).to(probs.device)
    loss = -probs.gather(1, labels[:, None]).squeeze(1).clamp_min(NLL_EPS).log()
    return loss[idx].mean(dim=1)


def brier_resampled(probs: Tensor, labels: Tensor, idx: Tensor) -> Tensor:
    """:func:`brier` of R resamples: probs [N, C], labels [N], idx [R, N'] -> [R]."""
    probs, labels = prep(probs, labels)
    idx = check_idx(idx, probs.shape[0]).to(probs.device)
    onehot = torch.nn.functional.one_hot(labels, probs.shape[1]).to(probs.dtype)
    return ((probs - onehot) ** 2).sum(dim=1)[idx].mean(dim=1)


def classification_metrics(
    probs: Tensor, labels: Tensor, *, n_bins: int = DEFAULT_N_BINS
) -> dict[str, float]:
    """All classification metrics at once.

    Args:
        probs: [N, C] predicted probabilities.
        labels: [N] integer class ids.
        n_bins: bins for ``ece`` and ``adaptive_ece``.

    Returns:
        ``{"accuracy", "nll", "brier", "ece", "adaptive_ece", "aurc", "augrc"}`` -> float.
    """
    check_n_bins(n_bins)
    probs, labels = prep(probs, labels)
    return {
        "accuracy": accuracy(probs, labels),
        "nll": nll(probs, labels),
        "brier": brier(probs, labels),
        "ece": ece(probs, labels, n_bins),
        "adaptive_ece": adaptive_ece(probs, labels, n_bins),
        "aurc": aurc(probs, labels),
        "augrc": augrc(probs, labels),
    }
