"""Temperature scaling: recovery of a known temperature, ensemble log-probs, validation."""

from __future__ import annotations

import math

import pytest
import torch

from hydra_ops.metrics import nll
from hydra_ops.uq.calibration import (
    apply_temperature,
    ensemble_log_probs,
    ensemble_probs,
    fit_temperature,
)


def _synthetic(true_t: float, n: int = 4000, c: int = 5, seed: int = 0):
    """Labels drawn from softmax(z); returns (z * true_t, labels), so the best T is true_t."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, c, generator=g, dtype=torch.float64) * 2.0
    labels = torch.multinomial(torch.softmax(z, dim=1), 1, generator=g).squeeze(1)
    return z * true_t, labels


@pytest.mark.parametrize("true_t", [0.5, 1.0, 2.5])
def test_fit_temperature_recovers_known_temperature(true_t: float) -> None:
    logits, labels = _synthetic(true_t)
    t = fit_temperature(logits, labels)
    assert t == pytest.approx(true_t, rel=0.1)


def test_fit_temperature_is_a_minimum_and_deterministic() -> None:
    logits, labels = _synthetic(2.0, n=1000, seed=1)
    t = fit_temperature(logits, labels)
    assert fit_temperature(logits, labels) == t
    best = nll(apply_temperature(logits, t), labels)
    for other in (t * 0.9, t * 1.1):
        assert best <= nll(apply_temperature(logits, other), labels)


def test_fit_temperature_respects_bounds() -> None:
    logits, labels = _synthetic(3.0, n=500)
    assert fit_temperature(logits, labels, bounds=(0.5, 1.5)) == pytest.approx(1.5)
    # Perfectly separable, correct data wants T -> 0: the lower bound is returned.
    z = torch.tensor([[3.0, -3.0], [-3.0, 3.0]])
    assert fit_temperature(z, torch.tensor([0, 1]), bounds=(0.1, 10.0)) == pytest.approx(0.1)


def test_ensemble_log_probs_is_log_mean_softmax() -> None:
    g = torch.Generator().manual_seed(0)
    member_logits = torch.randn(6, 3, 4, generator=g, dtype=torch.float64) * 5
    expected = torch.softmax(member_logits, dim=2).mean(dim=1).log()
    torch.testing.assert_close(ensemble_log_probs(member_logits), expected)
    # Stable for huge logits (a naive softmax in float32 would overflow / underflow to log 0).
    big = torch.tensor([[[1000.0, 0.0], [0.0, 1000.0]]])
    torch.testing.assert_close(
        ensemble_log_probs(big), torch.full((1, 2), math.log(0.5)), atol=1e-5, rtol=0
    )


def test_ensemble_probs_is_the_tempered_mean_softmax() -> None:
    g = torch.Generator().manual_seed(1)
    member_logits = torch.randn(5, 3, 4, generator=g, dtype=torch.float64) * 3
    mean = torch.softmax(member_logits, dim=2).mean(dim=1)
    torch.testing.assert_close(ensemble_probs(member_logits), mean)
    # T = 2: softmax(log(mean) / 2) = sqrt(mean) renormalised
    root = mean.sqrt()
    torch.testing.assert_close(ensemble_probs(member_logits, 2.0), root / root.sum(1, keepdim=True))


def test_temperature_on_ensemble_log_probs_recovers_temperature() -> None:
    logits, labels = _synthetic(2.0, n=3000, seed=2)
    members = torch.stack([logits, logits], dim=1)  # identical members: log mean = log_softmax
    t = fit_temperature(ensemble_log_probs(members), labels)
    assert t == pytest.approx(2.0, rel=0.1)


def test_apply_temperature_hand_value() -> None:
    z = torch.tensor([[math.log(4.0), 0.0]])
    # softmax(z / 2) = [2, 1] / 3
    torch.testing.assert_close(apply_temperature(z, 2.0), torch.tensor([[2 / 3, 1 / 3]]))


def test_bad_input_raises() -> None:
    z, y = torch.zeros(3, 2), torch.tensor([0, 1, 0])
    with pytest.raises(ValueError, match="logits_or_log_probs"):
        fit_temperature(torch.zeros(3), y)
    with pytest.raises(ValueError, match="logits_or_log_probs"):
        fit_temperature(torch.tensor([[float("nan"), 0.0]]), torch.tensor([0]))
    with pytest.raises(ValueError, match="labels"):
        fit_temperature(z, torch.tensor([0, 2, 0]))
    with pytest.raises(ValueError, match="bounds"):
        fit_temperature(z, y, bounds=(0.0, 1.0))
    with pytest.raises(ValueError, match="max_iter"):
        fit_temperature(z, y, max_iter=0)
    with pytest.raises(ValueError, match="temperature"):
        apply_temperature(z, -1.0)
    with pytest.raises(ValueError, match="member_logits"):
        ensemble_log_probs(torch.zeros(3, 2))
