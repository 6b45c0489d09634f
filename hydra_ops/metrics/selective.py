"""Selective prediction: areas under the (generalized) risk-coverage curve, MSP confidence."""

from __future__ import annotations

import torch
from torch import Tensor

from hydra_ops.metrics._checks import prep


def _expected_errors(probs: Tensor, labels: Tensor) -> Tensor:
    """``E[k-1]`` = expected number of errors among the ``k`` most confident examples, ``[N]``.

    Confidence = MSP; tied confidences are ordered at random, so within a tie group the errors are
    spread evenly (``E`` is linear across the group) and the result does not depend on input order.
    """
    conf, pred = probs.max(dim=1)
    errors = (pred != labels).to(probs.dtype)
    order = torch.sort(conf, descending=True, stable=True).indices
    conf_sorted, err_sorted = conf[order], errors[order]
    _, group, counts = torch.unique_consecutive(
        conf_sorted, return_inverse=True, return_counts=True
    )
    group_err = torch.zeros(counts.shape[0], dtype=probs.dtype, device=probs.device)
    group_err.scatter_add_(0, group, err_sorted)
    group_end = counts.cumsum(0)
    group_start = group_end - counts
    err_before = group_err.cumsum(0) - group_err
    k = torch.arange(1, conf.shape[0] + 1, dtype=probs.dtype, device=probs.device)
    return err_before[group] + (k - group_start[group]) * group_err[group] / counts[group]


def aurc(probs: Tensor, labels: Tensor) -> float:
    """Area under the risk-coverage curve with MSP confidence (tie-invariant; module docstring).

    ``AURC = (1/N) sum_{k=1..N} E_k / k``, ``E_k`` the expected errors among the ``k`` most
    confident examples. probs [N, C], labels [N] -> float in [0, 1]; lower is better.
    """
    probs, labels = prep(probs, labels)
    expected_err = _expected_errors(probs, labels)
    k = torch.arange(1, probs.shape[0] + 1, dtype=probs.dtype, device=probs.device)
    return float((expected_err / k).mean())


def augrc(probs: Tensor, labels: Tensor) -> float:
    """Area under the generalized risk-coverage curve (Traub et al., 2024), MSP confidence.

    The generalized risk at coverage ``k/N`` is ``E_k / N``: the fraction of *all* examples that
    are accepted and wrong (``E_k`` = expected errors among the ``k`` most confident, ties ordered
    at random as in :func:`aurc`). The curve starts at ``(0, 0)`` (nothing accepted, no risk) and
    is integrated with the trapezoidal rule over coverages ``0, 1/N, ..., 1``:
    ``AUGRC = (sum_{k=1..N} E_k - E_N / 2) / N^2``. Equivalently
    ``AUGRC = (1 - AUROC_f) * acc * (1 - acc) + (1 - acc)^2 / 2`` with ``AUROC_f`` the AUROC of the
    confidence separating correct (positive) from wrong predictions, ties counting 1/2; a perfect
    ranking gives ``(1 - acc)^2 / 2``.

    probs [N, C], labels [N] -> float in [0, 0.5]; lower is better.
    """
    probs, labels = prep(probs, labels)
    expected_err = _expected_errors(probs, labels)
    n = probs.shape[0]
    return float((expected_err.sum() - expected_err[-1] / 2) / (n * n))
