"""hydra_ops.uq.diversity: the pairwise member diversity measures on hand-made logits."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hydra_ops.uq.diversity import (
    correctness_correlation,
    disagreement_matrix,
    pair_mean,
    pairwise_summary,
    probability_correlation,
)


def logits_of(member_probs: list[list[list[float]]]) -> torch.Tensor:
    """[N, M, C] logits whose softmaxes are exactly ``member_probs``."""
    return torch.tensor(member_probs, dtype=torch.float64).log()


# four inputs, three members, three classes; votes per input (member 0, 1, 2):
# (0, 0, 1), (1, 1, 1), (2, 0, 2), (0, 1, 2)
PROBS = [
    [[0.7, 0.2, 0.1], [0.6, 0.3, 0.1], [0.2, 0.5, 0.3]],
    [[0.1, 0.8, 0.1], [0.3, 0.4, 0.3], [0.2, 0.7, 0.1]],
    [[0.1, 0.2, 0.7], [0.5, 0.4, 0.1], [0.3, 0.1, 0.6]],
    [[0.5, 0.3, 0.2], [0.2, 0.6, 0.2], [0.1, 0.1, 0.8]],
]


# ----- the measures ------------------------------------------------------------------------------
def test_disagreement_counts_inputs_whose_top_classes_differ():
    d = disagreement_matrix(logits_of(PROBS))
    # pairs (0,1): differ on inputs 2, 3 -> 2/4; (0,2): inputs 0, 3 -> 2/4; (1,2): 0, 2, 3 -> 3/4
    expected = torch.tensor([[0, 0.5, 0.5], [0.5, 0, 0.75], [0.5, 0.75, 0]], dtype=torch.float64)
    assert torch.equal(d, expected)
    assert pair_mean(d) == pytest.approx((0.5 + 0.5 + 0.75) / 3, abs=1e-15)
    same = logits_of([[p[0], p[0]] for p in PROBS])
    assert torch.equal(disagreement_matrix(same), torch.zeros(2, 2, dtype=torch.float64))


def test_probability_correlation_is_pearson_of_the_probability_tables():
    probs = np.array(PROBS)  # [N, M, C]
    rho = probability_correlation(logits_of(PROBS))
    for i in range(3):
        for j in range(3):
            want = np.corrcoef(probs[:, i].ravel(), probs[:, j].ravel())[0, 1]
            assert rho[i, j].item() == pytest.approx(want, abs=1e-12), (i, j)
    # a member that predicts uniform everywhere has no variance: undefined, and so is the mean
    uniform = logits_of([[p[0], [1 / 3] * 3] for p in PROBS])
    rho_u = probability_correlation(uniform)
    assert math.isnan(rho_u[0, 1].item()) and pair_mean(rho_u) is None


def test_correctness_correlation_is_kuncheva_whitakers_rho():
    labels = torch.tensor([0, 1, 2, 2])
    # right/wrong per member: m0 (1, 1, 1, 0), m1 (1, 1, 0, 0), m2 (0, 1, 1, 1)
    rho = correctness_correlation(logits_of(PROBS), labels)

    def kw(a, b):
        n11 = sum(x and y for x, y in zip(a, b, strict=True))
        n00 = sum((not x) and (not y) for x, y in zip(a, b, strict=True))
        n10 = sum(x and not y for x, y in zip(a, b, strict=True))
        n01 = sum((not x) and y for x, y in zip(a, b, strict=True))
        return (n11 * n00 - n01 * n10) / math.sqrt(
            (n11 + n10) * (n01 + n00) * (n11 + n01) * (n10 + n00)
        )

    right = [(1, 1, 1, 0), (1, 1, 0, 0), (0, 1, 1, 1)]
    for i, j in ((0, 1), (0, 2), (1, 2)):
        assert rho[i, j].item() == pytest.approx(kw(right[i], right[j]), abs=1e-12)
    assert rho[0, 1].item() == pytest.approx(1 / math.sqrt(3), abs=1e-12)  # hand: N11=2,N00=1,N10=1
    assert rho[1, 2].item() == pytest.approx(-1 / math.sqrt(3), abs=1e-12)
    # a member right on every input: undefined (None in the summary), not a number
    perfect = correctness_correlation(
        logits_of([[p[1], p[1]] for p in PROBS]), torch.tensor([0, 1, 0, 1])
    )
    assert math.isnan(perfect[0, 1].item())


def test_summary_is_json_ready_and_single_members_have_no_pairs():
    s = pairwise_summary(logits_of(PROBS), torch.tensor([0, 1, 2, 2]))
    assert s["members"] == 3 and s["n"] == 4
    assert s["disagreement"] == pytest.approx(1.75 / 3)
    # pairs (0, 1), (0, 2), (1, 2): 1/sqrt(3), -1/3, -1/sqrt(3)
    pairs = (1 / math.sqrt(3), kw_02(), -1 / math.sqrt(3))
    assert s["correctness_correlation"] == pytest.approx(sum(pairs) / 3, abs=1e-12)
    assert set(s["matrices"]) == {
        "disagreement",
        "probability_correlation",
        "correctness_correlation",
    }
    no_labels = pairwise_summary(logits_of(PROBS))
    assert "correctness_correlation" not in no_labels
    one = pairwise_summary(logits_of([[p[0]] for p in PROBS]))
    assert one["disagreement"] is None and one["matrices"]["disagreement"] == [[0.0]]
    with pytest.raises(ValueError, match=r"\[N, M, C\]"):
        pairwise_summary(torch.zeros(4, 3))
    with pytest.raises(ValueError, match=r"labels must lie in 0\.\.2"):
        correctness_correlation(logits_of(PROBS), torch.tensor([0, 1, 2, 3]))


def kw_02() -> float:
    # m0 (1, 1, 1, 0) vs m2 (0, 1, 1, 1): N11=2, N00=0, N10=1, N01=1 -> -1 / 3
    return (2 * 0 - 1 * 1) / math.sqrt(3 * 1 * 3 * 1)
