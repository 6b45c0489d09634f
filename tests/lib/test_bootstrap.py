"""Paired bootstrap: point difference inside the interval, narrowing with N, pairing, seeds."""

from __future__ import annotations

import pytest
import torch

from hydra_ops.metrics import (
    accuracy,
    auroc,
    auroc_resampled,
    brier,
    ece,
    ece_resampled,
    nll,
    ood_metrics,
)
from hydra_ops.metrics.bootstrap import BootstrapResult, paired_bootstrap, paired_bootstrap_ood


def _models(n: int, seed: int = 0):
    """Probs of a sharper model A and a flatter model B on the same n examples."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, 4, generator=g) * 2
    labels = torch.multinomial(torch.softmax(logits, 1), 1, generator=g).squeeze(1)
    return torch.softmax(logits * 2, 1), torch.softmax(logits, 1), labels


def test_interval_contains_point_and_narrows_with_more_examples() -> None:
    widths = []
    for n in (200, 2000):
        a, b, y = _models(n)
        r = paired_bootstrap(ece, a, b, y, n_resamples=300, seed=0)
        assert isinstance(r, BootstrapResult)
        assert r.n_resamples == 300
        assert r.low <= r.point_difference <= r.high
        assert r.low <= r.mean_difference <= r.high
        assert r.point_difference == pytest.approx(ece(a, y) - ece(b, y))
        widths.append(r.high - r.low)
    assert widths[1] < widths[0]


def test_identical_models_give_zero_interval() -> None:
    # Pairing: the same indices are used for both models, so a == b differs by exactly 0.
    a, _, y = _models(300)
    r = paired_bootstrap(accuracy, a, a.clone(), y, n_resamples=50)
    assert (r.low, r.high, r.mean_difference, r.point_difference) == (0.0, 0.0, 0.0, 0.0)


def test_seed_determinism_and_label_free_metric() -> None:
    a, b, y = _models(300)
    r1 = paired_bootstrap(ece, a, b, y, n_resamples=100, seed=7)
    assert r1 == paired_bootstrap(ece, a, b, y, n_resamples=100, seed=7)
    assert r1 != paired_bootstrap(ece, a, b, y, n_resamples=100, seed=8)

    def mean_conf(p: torch.Tensor, labels: torch.Tensor | None) -> float:
        assert labels is None
        return float(p.max(1).values.mean())

    r = paired_bootstrap(mean_conf, a, b, None, n_resamples=100)
    assert r.low <= r.point_difference <= r.high and r.point_difference > 0


def test_ood_bootstrap() -> None:
    g = torch.Generator().manual_seed(0)
    a_id, a_ood = torch.randn(400, generator=g), torch.randn(200, generator=g) + 2.0
    b_id, b_ood = torch.randn(400, generator=g), torch.randn(200, generator=g) + 0.5

    def auroc(i: torch.Tensor, o: torch.Tensor) -> float:
        return ood_metrics(i, o)["auroc"]

    r = paired_bootstrap_ood(auroc, a_id, a_ood, b_id, b_ood, n_resamples=200, seed=0)
    assert r.low <= r.point_difference <= r.high
    assert r.low > 0  # A separates far better than B
    same = paired_bootstrap_ood(auroc, a_id, a_ood, a_id, a_ood, n_resamples=20)
    assert (same.low, same.high) == (0.0, 0.0)


def test_bad_input_raises() -> None:
    a, b, y = _models(50)
    with pytest.raises(ValueError, match="b_inputs"):
        paired_bootstrap(ece, a, b[:40], y)
    with pytest.raises(ValueError, match="labels_or_none"):
        paired_bootstrap(ece, a, b, y[:10])
    with pytest.raises(ValueError, match="n_resamples"):
        paired_bootstrap(ece, a, b, y, n_resamples=1)
    with pytest.raises(ValueError, match="confidence"):
        paired_bootstrap(ece, a, b, y, confidence=1.5)
    with pytest.raises(ValueError, match="seed"):
        paired_bootstrap(ece, a, b, y, seed=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="b_ood_scores"):
        paired_bootstrap_ood(
            lambda i, o: 0.0, y[:5].float(), y[:5].float(), y[:5].float(), y[:3].float()
        )
    with pytest.raises(ValueError, match="non-finite"):
        paired_bootstrap(lambda p, lab: float("nan"), a, b, y, n_resamples=5)


@pytest.mark.parametrize("metric", [accuracy, nll, brier, ece])
def test_vectorised_path_matches_per_resample_loop(metric) -> None:
    a, b, y = _models(300, seed=4)
    fast = paired_bootstrap(metric, a, b, y, n_resamples=200, seed=3)

    def wrapped(p: torch.Tensor, labels: torch.Tensor | None) -> float:
        return metric(p, labels)  # not in RESAMPLED_METRICS -> per-resample loop

    slow = paired_bootstrap(wrapped, a, b, y, n_resamples=200, seed=3)
    assert fast.point_difference == slow.point_difference
    for field in ("low", "high", "mean_difference"):
        assert getattr(fast, field) == pytest.approx(getattr(slow, field), abs=1e-6)


def test_ece_resampled_matches_torchmetrics_ece_per_resample() -> None:
    a, _, y = _models(200, seed=5)
    a[0] = torch.tensor([1.0, 0.0, 0.0, 0.0])  # confidence exactly 1.0: its own bin
    idx = torch.randint(0, 200, (5, 200), generator=torch.Generator().manual_seed(0))
    fast = ece_resampled(a, y, idx)
    for r in range(5):
        assert float(fast[r]) == pytest.approx(ece(a[idx[r]], y[idx[r]]), abs=1e-6)


def test_auroc_resampled_equals_sklearn_per_resample_with_ties() -> None:
    g = torch.Generator().manual_seed(7)
    # rounded scores: many tied ID/OOD pairs, which count 1/2
    id_scores = (torch.randn(150, generator=g) * 2).round() / 2
    ood_scores = (torch.randn(90, generator=g) * 2 + 1).round() / 2
    id_idx = torch.randint(0, 150, (40, 150), generator=g)
    ood_idx = torch.randint(0, 90, (40, 90), generator=g)
    fast = auroc_resampled(id_scores, ood_scores, id_idx, ood_idx)
    assert fast.shape == (40,)
    for r in range(40):
        expected = ood_metrics(id_scores[id_idx[r]], ood_scores[ood_idx[r]])["auroc"]
        assert float(fast[r]) == pytest.approx(expected, abs=1e-12)


def test_auroc_resampled_refuses_bad_indices() -> None:
    scores = torch.arange(5.0)
    with pytest.raises(ValueError, match="idx must index"):
        auroc_resampled(scores, scores, torch.full((2, 5), 5), torch.zeros(2, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="same number of resamples"):
        auroc_resampled(
            scores, scores, torch.zeros(2, 5, dtype=torch.long), torch.zeros(3, 5, dtype=torch.long)
        )


def test_ood_bootstrap_vectorised_path_matches_per_resample_loop() -> None:
    g = torch.Generator().manual_seed(2)
    a_id, a_ood = torch.randn(300, generator=g), torch.randn(120, generator=g) + 1.0
    b_id, b_ood = torch.randn(300, generator=g), torch.randn(120, generator=g) + 0.7
    fast = paired_bootstrap_ood(auroc, a_id, a_ood, b_id, b_ood, n_resamples=300, seed=5)
    slow = paired_bootstrap_ood(
        lambda i, o: auroc(i, o), a_id, a_ood, b_id, b_ood, n_resamples=300, seed=5
    )
    assert fast.point_difference == slow.point_difference
    for field in ("low", "high", "mean_difference"):
        assert getattr(fast, field) == pytest.approx(getattr(slow, field), abs=1e-12)
