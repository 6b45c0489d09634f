"""hydra_ops.uq.calibrated: every predict column from one calibrated distribution.

Hand-checkable numbers: two classes, member probabilities such as (0.8, 0.2), temperatures 0.5 / 2.
"""

from __future__ import annotations

import math

import pytest
import torch

from hydra_ops.metrics import OOD_CRITERIA, ood_scores
from hydra_ops.uq.calibrated import calibrated_ood_score, calibrated_uncertainty
from hydra_ops.uq.calibration import apply_temperature, ensemble_log_probs
from hydra_ops.uq.uncertainty import decompose


def member_logits_of(*member_probs: tuple[float, ...]) -> torch.Tensor:
    """[1, M, C] logits whose softmaxes are exactly the given member probabilities."""
    return torch.tensor([member_probs], dtype=torch.float64).log()


def h(*p: float) -> float:
    return -sum(x * math.log(x) for x in p if x > 0)


def random_logits(n: int = 200, m: int = 4, c: int = 5, scale: float = 3.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, m, c, generator=g, dtype=torch.float64) * scale


# ---------------------------------------------------------------- calibrated columns
def test_prob_and_entropy_come_from_the_same_calibrated_distribution():
    # identical members (0.8, 0.2), T = 0.5: p_cal = (0.8^2, 0.2^2) / 0.68 = (16/17, 1/17)
    u = calibrated_uncertainty(member_logits_of((0.8, 0.2), (0.8, 0.2)), 0.5)
    assert u.predicted.tolist() == [0]
    assert u.prob.item() == pytest.approx(16 / 17, abs=1e-12)
    assert u.entropy.item() == pytest.approx(h(16 / 17, 1 / 17), abs=1e-12)  # 0.22372 nats
    assert u.entropy.item() == pytest.approx(0.22372, abs=1e-5)
    assert u.mutual_information.item() == pytest.approx(0.0, abs=1e-12)  # members agree exactly
    assert u.disagreement.item() == 0.0
    assert u.ood_score.item() == pytest.approx(-16 / 17, abs=1e-12)  # msp = -prob
    assert u.max_entropy == pytest.approx(math.log(2))


def test_confident_prediction_has_entropy_near_zero_and_bounded_by_ln_c():
    confident = torch.tensor([[[20.0, 0.0, 0.0]] * 3])
    u = calibrated_uncertainty(confident, 0.5)
    assert u.prob.item() > 1 - 1e-12 and u.entropy.item() < 1e-12
    x = random_logits()
    for t in (0.3, 0.5, 1.0, 2.0, 5.0):
        u = calibrated_uncertainty(x, t)
        assert torch.equal(u.prob, u.probs.max(dim=1).values)
        assert bool((u.entropy >= 0).all()) and bool((u.entropy <= math.log(5) + 1e-12).all())
        # consistent with prob: any distribution whose top probability is p has H >= h(p, 1 - p)
        assert bool(
            (u.entropy >= torch.tensor([h(p, 1 - p) for p in u.prob.tolist()]) - 1e-9).all()
        )


def test_opposed_members_split_entropy_into_expected_entropy_and_mutual_information():
    # members (0.8, 0.2) and (0.2, 0.8): pbar = (0.5, 0.5) = p_cal for every T, so q_m = p_m
    x = member_logits_of((0.8, 0.2), (0.2, 0.8))
    for t in (0.5, 1.0, 2.0):
        u = calibrated_uncertainty(x, t)
        assert u.prob.item() == pytest.approx(0.5)
        assert u.entropy.item() == pytest.approx(math.log(2))
        assert u.expected_entropy.item() == pytest.approx(h(0.8, 0.2))  # 0.5004
        assert u.mutual_information.item() == pytest.approx(math.log(2) - h(0.8, 0.2))  # 0.1927
        assert u.disagreement.item() == 0.5


def test_temperature_one_equals_the_classical_decomposition():
    x = random_logits(seed=1)
    u, d = calibrated_uncertainty(x, 1.0), decompose(x.softmax(-1))
    for key, ref in (
        ("entropy", "total_entropy"),
        ("expected_entropy", "expected_entropy"),
        ("mutual_information", "mutual_information"),
        ("disagreement", "disagreement"),
    ):
        torch.testing.assert_close(getattr(u, key), d[ref], atol=1e-9, rtol=0)


def test_mutual_information_is_the_mi_of_the_recalibrated_joint():
    """Independent float64 check: P(m, y) = p_cal(y) p_m(y) / (M pbar(y)); MI = I(Y; member)."""
    x = random_logits(n=50, m=3, c=4, seed=2)
    for t in (0.4, 2.5):
        u = calibrated_uncertainty(x, t)
        p = x.softmax(-1)
        pbar = p.mean(1)
        p_cal = torch.softmax(pbar.log() / t, dim=1)
        joint = p_cal[:, None, :] * p / (3 * pbar[:, None, :])
        assert torch.allclose(joint.sum((1, 2)), torch.ones(50, dtype=torch.float64))
        pm, py = joint.sum(2, keepdim=True), joint.sum(1, keepdim=True)
        mi = (joint * (joint / (pm * py)).log()).sum((1, 2))
        torch.testing.assert_close(u.mutual_information, mi, atol=1e-9, rtol=0)
        assert bool((u.mutual_information >= 0).all())
        assert bool((u.mutual_information <= u.entropy + 1e-12).all())
        assert bool((u.mutual_information <= math.log(3) + 1e-12).all())
        torch.testing.assert_close(u.expected_entropy + u.mutual_information, u.entropy)


def test_mutual_information_is_zero_for_identical_members_at_any_temperature():
    one = random_logits(n=20, m=1, c=4, seed=3)
    x = one.expand(20, 5, 4).clone()
    for t in (0.2, 1.0, 3.0):
        u = calibrated_uncertainty(x, t)
        assert u.mutual_information.abs().max().item() < 1e-10
        assert u.disagreement.max().item() == 0.0


def test_disagreement_counts_member_votes_against_the_prediction():
    # votes 0, 0, 1 -> the ensemble predicts 0; one member of three disagrees
    x = member_logits_of((0.9, 0.1), (0.7, 0.3), (0.4, 0.6))
    for t in (0.5, 2.0):
        u = calibrated_uncertainty(x, t)
        assert u.predicted.item() == 0 and u.disagreement.item() == pytest.approx(1 / 3)


@pytest.mark.parametrize("kind", OOD_CRITERIA.names())
def test_ood_score_is_the_evaluate_stage_score(kind):
    x = random_logits(n=30, m=3, c=4, seed=4).float()
    t = 0.503
    # the formula tasks/evaluate.py used before it called calibrated_ood_score
    expected = ood_scores(
        apply_temperature(ensemble_log_probs(x), t),
        member_probs=x.softmax(-1),
        logits=x / t,
        kind=kind,
    )
    assert torch.equal(calibrated_ood_score(x, t, kind), expected)
    u = calibrated_uncertainty(x, t, kind)
    assert torch.equal(u.ood_score, expected) and u.ood_score_kind == kind
    if kind == "msp":
        assert torch.equal(u.ood_score, -u.prob)


def test_bad_arguments_name_the_argument():
    x = random_logits(n=2, m=2, c=3)
    with pytest.raises(ValueError, match="temperature"):
        calibrated_uncertainty(x, 0.0)
    with pytest.raises(ValueError, match="ood_score_kind"):
        calibrated_uncertainty(x, 1.0, "maxlogit")
    with pytest.raises(ValueError, match="member_logits"):
        calibrated_uncertainty(x[:, 0], 1.0)
    with pytest.raises(ValueError, match="member_logits"):
        calibrated_uncertainty(x.masked_fill(x > 0, float("nan")), 1.0)
