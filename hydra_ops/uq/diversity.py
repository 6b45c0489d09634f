"""How differently the members of an ensemble predict: pairwise measures over member logits.

Every measure compares two members ``i != j`` on the same ``N`` inputs, from member logits
``[N, M, C]`` (``p_m = softmax(l_m)``; ties in an argmax go to the lowest class index):

- **disagreement** (Fort, Hu & Lakshminarayanan 2019, "Deep Ensembles: A Loss Landscape
  Perspective", their "fraction of test points on which the predicted labels differ";
  Skalak 1996 / Kuncheva & Whitaker 2003's *disagreement measure* when applied to labels)::

      d_ij = (1/N) #{n : argmax p_i(x_n) != argmax p_j(x_n)}        in [0, 1], 0 = same votes

  It needs no labels, so it is defined on OOD inputs too.
- **probability correlation**: the Pearson correlation of the two members' probability tables
  ``p_i, p_j`` ([N, C], read as N*C paired values)::

      rho_ij = <p_i - 1/C, p_j - 1/C> / (||p_i - 1/C|| ||p_j - 1/C||)   in [-1, 1]

  (every probability table has mean exactly ``1/C``, so centring at ``1/C`` is centring at the
  mean). 1 = the same predictions up to scale around uniform; it sees confidence, not only votes.
  Needs no labels. Undefined (NaN) when a member predicts the uniform distribution everywhere.
- **correctness correlation** (Kuncheva & Whitaker 2003, "Measures of Diversity in Classifier
  Ensembles", the correlation coefficient rho of the oracle outputs): the Pearson correlation of
  the two members' 0/1 correctness vectors ``[argmax p_m(x_n) == y_n]``::

      rho_ij = (N11 N00 - N01 N10) / sqrt((N11+N10)(N01+N00)(N11+N01)(N10+N00))

  with ``Nab`` the number of inputs where member i is right (a=1) or wrong (0) and member j is
  right (b=1) or wrong (0). 1 = the same inputs wrong; 0 = errors independent; negative = errors
  on different inputs (what an ensemble wants). Needs labels (ID splits only). Undefined (NaN)
  when a member is right on every input or wrong on every input.

Matrices are ``[M, M]`` float64, symmetric, with the diagonal at the measure's value for a member
against itself (0 disagreement, correlation 1 where defined). :func:`pairwise_summary` gives the
JSON-ready means over the ``M (M - 1) / 2`` pairs (``None`` where undefined or ``M = 1``).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "correctness_correlation",
    "disagreement_matrix",
    "pair_mean",
    "pairwise_summary",
    "probability_correlation",
]


def _check_logits(member_logits: Tensor) -> Tensor:
    if not isinstance(member_logits, Tensor) or not member_logits.is_floating_point():
        raise ValueError("member_logits must be a floating tensor of shape [N, M, C]")
    if member_logits.ndim != 3 or min(member_logits.shape) < 1 or member_logits.shape[2] < 2:
        raise ValueError(
            "member_logits must have shape [N, M, C] with N, M >= 1 and C >= 2, got "
            f"{tuple(member_logits.shape)}"
        )
    if not bool(torch.isfinite(member_logits).all()):
        raise ValueError("member_logits contains NaN or infinite values")
    return member_logits.detach().to("cpu", torch.float64)


def disagreement_matrix(member_logits: Tensor) -> Tensor:
    """Pairwise label disagreement of the members (module docstring).

    Shape: member_logits [N, M, C] -> [M, M] float64, symmetric, zero diagonal, entries in [0, 1].
    """
    votes = _check_logits(member_logits).argmax(dim=-1)  # [N, M]
    differ = votes[:, :, None] != votes[:, None, :]  # [N, M, M]
    return differ.to(torch.float64).mean(dim=0)


def _pearson(x: Tensor) -> Tensor:
    """Pearson correlation of the columns of ``x`` [K, M] (already centred): [M, M], NaN for a
    column of zero variance."""
    gram = x.T @ x  # [M, M]
    norms = gram.diagonal().sqrt()
    denom = norms[:, None] * norms[None, :]
    corr = torch.where(denom > 0, gram / denom.clamp_min(1e-300), torch.nan)
    return corr.clamp(-1.0, 1.0)


def probability_correlation(member_logits: Tensor) -> Tensor:
    """Pairwise Pearson correlation of the members' probability tables (module docstring).

    Shape: member_logits [N, M, C] -> [M, M] float64, symmetric, entries in [-1, 1] or NaN.
    """
    logits = _check_logits(member_logits)
    n, m, c = logits.shape
    centred = logits.softmax(dim=-1) - 1.0 / c  # [N, M, C]
    return _pearson(centred.permute(0, 2, 1).reshape(n * c, m))


def correctness_correlation(member_logits: Tensor, labels: Tensor) -> Tensor:
    """Kuncheva & Whitaker's pairwise correlation of the members' correctness (module docstring).

    Shape: member_logits [N, M, C], labels [N] long in 0..C-1 -> [M, M] float64, symmetric,
    entries in [-1, 1] or NaN.
    """
    logits = _check_logits(member_logits)
    labels = torch.as_tensor(labels)
    if labels.shape != (logits.shape[0],) or labels.is_floating_point():
        raise ValueError(
            f"labels must be an integer tensor of shape [{logits.shape[0]}], got "
            f"{labels.dtype} {tuple(labels.shape)}"
        )
    if bool(((labels < 0) | (labels >= logits.shape[2])).any()):
        raise ValueError(f"labels must lie in 0..{logits.shape[2] - 1}")
    correct = (logits.argmax(dim=-1) == labels[:, None]).to(torch.float64)  # [N, M]
    # Pearson of 0/1 vectors is the phi coefficient, Kuncheva & Whitaker's rho
    return _pearson(correct - correct.mean(dim=0, keepdim=True))


def pair_mean(matrix: Tensor) -> float | None:
    """Mean of the off-diagonal pairs ``i < j`` of an [M, M] matrix; ``None`` when ``M = 1`` or
    any pair is NaN (an undefined pair makes the mean undefined)."""
    m = matrix.shape[0]
    if matrix.shape != (m, m):
        raise ValueError(f"matrix must be square [M, M], got {tuple(matrix.shape)}")
    pairs = [float(matrix[i, j]) for i, j in itertools.combinations(range(m), 2)]
    if not pairs or any(math.isnan(v) for v in pairs):
        return None
    return sum(pairs) / len(pairs)


def _rows(matrix: Tensor) -> list[list[float | None]]:
    return [[None if math.isnan(v) else v for v in row] for row in matrix.tolist()]


def pairwise_summary(member_logits: Tensor, labels: Tensor | None = None) -> dict[str, Any]:
    """Every pairwise measure of one split, JSON-ready (``None`` for NaN).

    Shape: member_logits [N, M, C], labels [N] or None.

    Returns:
        ``{"members": M, "n": N, "disagreement": mean, "probability_correlation": mean,
        "correctness_correlation": mean (only with labels), "matrices": {name: [M][M]}}``; the
        means are over the pairs ``i < j`` (:func:`pair_mean`).
    """
    logits = _check_logits(member_logits)
    matrices = {
        "disagreement": disagreement_matrix(logits),
        "probability_correlation": probability_correlation(logits),
    }
    if labels is not None:
        matrices["correctness_correlation"] = correctness_correlation(logits, labels)
    return {
        "members": int(logits.shape[1]),
        "n": int(logits.shape[0]),
        **{name: pair_mean(mat) for name, mat in matrices.items()},
        "matrices": {name: _rows(mat) for name, mat in matrices.items()},
    }
