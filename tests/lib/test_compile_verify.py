"""hydra_ops.compile.verify.compare_logits: what counts as the compiled artifact disagreeing."""

from __future__ import annotations

import math

import torch

from hydra_ops.compile import compare_logits


def _logits(probs: list[list[float]]) -> torch.Tensor:
    """``[N, 1, C]`` member logits whose softmax is ``probs`` (one member)."""
    return torch.tensor(probs).log().unsqueeze(1)


def test_a_flip_at_a_near_tie_within_tolerance_is_not_a_disagreement() -> None:
    eager = _logits([[0.505, 0.495], [0.9, 0.1]])
    compiled = _logits([[0.495, 0.505], [0.9, 0.1]])  # |dp| = 0.01 <= 0.02, argmax flips
    out = compare_logits(eager, compiled, tolerance=0.02, min_agreement=1.0)
    assert out["raw_argmax_agreement"] == 0.5
    assert out["near_ties"] == 1 and out["argmax_agreement"] == 1.0
    assert out["passed"]


def test_a_flip_where_the_eager_model_decides_fails() -> None:
    eager = _logits([[0.6, 0.4], [0.9, 0.1]])  # margin 0.2 > tolerance
    compiled = _logits([[0.45, 0.55], [0.9, 0.1]])  # |dp| = 0.15 <= tolerance, argmax flips
    out = compare_logits(eager, compiled, tolerance=0.15, min_agreement=1.0)
    assert out["near_ties"] == 0 and out["max_abs_diff_probs"] <= 0.15 + 1e-6
    assert out["argmax_agreement"] == 0.5 and not out["passed"]


def test_only_near_ties_agree_by_definition_and_nan_still_fails() -> None:
    eager = _logits([[0.5, 0.5]])
    out = compare_logits(eager, _logits([[0.5, 0.5]]), tolerance=1e-4, min_agreement=1.0)
    assert out["near_ties"] == 1 and out["argmax_agreement"] == 1.0 and out["passed"]
    nan = torch.full_like(eager, math.nan)
    assert not compare_logits(eager, nan, tolerance=1e-4, min_agreement=1.0)["passed"]
