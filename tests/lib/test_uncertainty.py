"""hydra_ops.uq.uncertainty: entropy and the decomposition of member probabilities, by hand."""

from __future__ import annotations

import math

import pytest
import torch

from hydra_ops.uq.uncertainty import decompose, entropy


def test_entropy_hand_values_and_zero_log_zero() -> None:
    probs = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    expected = torch.tensor([0.0, math.log(2), math.log(3)])
    torch.testing.assert_close(entropy(probs), expected)


def test_decompose_hand_values() -> None:
    # Example 0: two confident members that disagree. Example 1: identical members.
    member_probs = torch.tensor(
        [
            [[0.9, 0.1], [0.1, 0.9], [0.8, 0.2]],
            [[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]],
        ],
        dtype=torch.float64,
    )
    out = decompose(member_probs)
    assert set(out) == {"total_entropy", "expected_entropy", "mutual_information", "disagreement"}

    def h(p: float) -> float:
        return -(p * math.log(p) + (1 - p) * math.log(1 - p))

    mean0 = (0.9 + 0.1 + 0.8) / 3  # 0.6
    total0, expected0 = h(mean0), (h(0.9) + h(0.1) + h(0.8)) / 3
    torch.testing.assert_close(
        out["total_entropy"], torch.tensor([total0, math.log(2)], dtype=torch.float64)
    )
    torch.testing.assert_close(
        out["expected_entropy"], torch.tensor([expected0, math.log(2)], dtype=torch.float64)
    )
    torch.testing.assert_close(
        out["mutual_information"], torch.tensor([total0 - expected0, 0.0], dtype=torch.float64)
    )
    # Ensemble argmax of example 0 is class 0; member 1 picks class 1 -> 1/3. Example 1: all ties
    # resolve to class 0 for members and ensemble -> 0.
    torch.testing.assert_close(out["disagreement"], torch.tensor([1 / 3, 0.0], dtype=torch.float64))


def test_mutual_information_non_negative_on_random_data() -> None:
    g = torch.Generator().manual_seed(0)
    member_probs = torch.softmax(torch.randn(64, 4, 5, generator=g) * 3, dim=-1)
    out = decompose(member_probs)
    assert bool((out["mutual_information"] >= 0).all())
    assert bool((out["disagreement"] <= 3 / 4).all())


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (torch.full((2, 3), 0.5), "member_probs"),  # wrong ndim
        (torch.full((2, 3, 2), 0.7), "sum to 1"),
        (torch.tensor([[[float("nan"), 1.0]]]), "NaN"),
        (torch.ones(2, 3, 2, dtype=torch.long), "floating"),
    ],
)
def test_decompose_rejects_bad_input(bad: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        decompose(bad)
    assert "member_probs" in str(info.value)
