"""hydra_ops.metrics: hand-computed values, sklearn and torch-uncertainty checks, validation."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score

from hydra_ops import metrics as hm


def _two_class(top: list[float]) -> torch.Tensor:
    """[N, 2] probs whose class-0 probability is ``top``."""
    p0 = torch.tensor(top, dtype=torch.float64)
    return torch.stack([p0, 1 - p0], dim=1)


# ---------------------------------------------------------------- classification metrics


def test_accuracy_nll_brier_hand_values() -> None:
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4]])
    labels = torch.tensor([0, 2, 2])
    assert hm.accuracy(probs, labels) == pytest.approx(2 / 3)
    assert hm.nll(probs, labels) == pytest.approx(
        -(math.log(0.7) + math.log(0.1) + math.log(0.4)) / 3
    )
    brier = (
        (0.3**2 + 0.2**2 + 0.1**2) + (0.1**2 + 0.8**2 + 0.9**2) + (0.3**2 + 0.3**2 + 0.6**2)
    ) / 3
    assert hm.brier(probs, labels) == pytest.approx(brier)


def test_nll_clamps_zero_probability() -> None:
    probs = torch.tensor([[1.0, 0.0]])
    assert hm.nll(probs, torch.tensor([1])) == pytest.approx(-math.log(hm.NLL_EPS))


def test_ece_hand_value() -> None:
    # Confidences 0.9 (right), 0.9 (wrong), 0.55 (right). With 15 bins, 0.9 is in bin 13 and 0.55
    # in bin 8: ECE = 2/3 * |0.5 - 0.9| + 1/3 * |1 - 0.55|.
    probs = _two_class([0.9, 0.9, 0.55])
    labels = torch.tensor([0, 1, 0])
    assert hm.ece(probs, labels) == pytest.approx(2 / 3 * 0.4 + 1 / 3 * 0.45, abs=1e-6)
    # With one bin everything is pooled: |2/3 - (0.9 + 0.9 + 0.55) / 3|.
    assert hm.ece(probs, labels, n_bins=1) == pytest.approx(abs(2 / 3 - 2.35 / 3), abs=1e-6)


def test_confidence_one_lands_in_the_last_bin_for_ece_and_the_reliability_diagram() -> None:
    # One shared binning: bins [k/B, (k+1)/B) for k < B, and confidence exactly 1.0 in bin B.
    conf = torch.tensor([0.0, 0.5, 14 / 15 + 1e-3, 1.0 - 1e-3, 1.0], dtype=torch.float64)
    assert hm.calibration_bins(conf).tolist() == [0, 7, 14, 14, 15]
    probs = _two_class([0.95, 1.0, 1.0, 0.6])
    labels = torch.tensor([0, 0, 1, 0])
    rows = hm.reliability_bins(probs, labels)
    # 0.6 -> bin 9, 0.95 -> bin 14, both 1.0 -> bin 15 (the last): three rows in bin order
    assert [r["count"] for r in rows] == [1, 1, 2]
    assert rows[-1] == {"confidence": 1.0, "accuracy": 0.5, "count": 2}
    # ECE uses the same bins: the 1.0 pair (accuracy 1/2) is not pooled with 0.95 (accuracy 1).
    expected = (1 / 4) * 0.4 + (1 / 4) * 0.05 + (2 / 4) * 0.5
    assert hm.ece(probs, labels) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_ece_is_torchmetrics_to_the_bit_and_reliability_counts_sum_to_n(seed: int) -> None:
    from torchmetrics.functional.classification import multiclass_calibration_error

    g = torch.Generator().manual_seed(seed)
    probs = (torch.randn(300, 4, generator=g, dtype=torch.float64) * 4).softmax(-1)
    probs[:30] = torch.nn.functional.one_hot(torch.arange(30) % 4, 4).double()  # confidence 1.0
    labels = torch.randint(0, 4, (300,), generator=g)
    for n_bins in (1, 10, 15):
        reference = multiclass_calibration_error(probs, labels, num_classes=4, n_bins=n_bins)
        assert hm.ece(probs, labels, n_bins) == float(reference)
        rows = hm.reliability_bins(probs, labels, n_bins)
        assert sum(r["count"] for r in rows) == 300
        assert rows[-1]["count"] >= 30 and rows[-1]["confidence"] == 1.0
    resampled = hm.ece_resampled(probs, labels, torch.arange(300)[None])
    assert float(resampled[0]) == pytest.approx(hm.ece(probs, labels), abs=1e-6)


def test_adaptive_ece_hand_value() -> None:
    # Sorted confidences 0.6, 0.7 | 0.8, 0.9 (two equal-mass bins), correctness 1, 0 | 1, 1.
    probs = _two_class([0.8, 0.6, 0.9, 0.7])
    labels = torch.tensor([0, 0, 0, 1])
    expected = 0.5 * abs(0.5 - 0.65) + 0.5 * abs(1.0 - 0.85)
    assert hm.adaptive_ece(probs, labels, n_bins=2) == pytest.approx(expected)
    # Fewer examples than bins: every example is its own bin.
    per_example = (0.2 + 0.4 + 0.1 + 0.7) / 4
    assert hm.adaptive_ece(probs, labels) == pytest.approx(per_example)


def test_aurc_hand_value_and_ties() -> None:
    # Most confident first: right, wrong, right -> risks 0, 1/2, 1/3.
    probs = _two_class([0.9, 0.8, 0.7])
    labels = torch.tensor([0, 1, 0])
    assert hm.aurc(probs, labels) == pytest.approx((0 + 1 / 2 + 1 / 3) / 3)
    # A tie (one right, one wrong): expected risk at k=1 is 1/2 whatever the input order.
    tied = _two_class([0.8, 0.8])
    assert hm.aurc(tied, torch.tensor([0, 1])) == pytest.approx(0.5)
    assert hm.aurc(tied, torch.tensor([1, 0])) == pytest.approx(0.5)


def test_augrc_hand_values_and_ties() -> None:
    # Most confident first: right, wrong, right, wrong -> accepted errors E_k = 0, 1, 1, 2.
    # Trapezoid from (0, 0) over coverages k/4 of E_k / 4: (0 + 1 + 1 + 2 - 2/2) / 16 = 3/16.
    probs = _two_class([0.9, 0.8, 0.7, 0.6])
    labels = torch.tensor([0, 1, 0, 1])
    assert hm.augrc(probs, labels) == pytest.approx(3 / 16)
    # Same through (1 - AUROC_f) acc (1 - acc) + (1 - acc)^2 / 2: 3 of 4 (right, wrong) pairs are
    # ranked right-first, acc = 1/2.
    assert hm.augrc(probs, labels) == pytest.approx(0.25 * 0.25 + 0.125)
    # 0.8 and 0.7 tied (one wrong, one right): E_2 = 1/2 in either input order -> 2.5 / 16.
    tied = _two_class([0.9, 0.7, 0.7, 0.6])
    assert hm.augrc(tied, labels) == pytest.approx(2.5 / 16)
    assert hm.augrc(tied, torch.tensor([0, 0, 1, 1])) == pytest.approx(2.5 / 16)
    # perfect ranking: (1 - acc)^2 / 2; no error: 0; every prediction wrong: 1/2
    perfect = _two_class([0.9, 0.8, 0.7, 0.6])
    assert hm.augrc(perfect, torch.tensor([0, 0, 1, 1])) == pytest.approx(0.5 * 0.5**2)
    assert hm.augrc(perfect, torch.tensor([0, 0, 0, 0])) == 0.0
    assert hm.augrc(perfect, torch.tensor([1, 1, 1, 1])) == pytest.approx(0.5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_augrc_equals_its_auroc_form(seed: int) -> None:
    """``AUGRC = (1 - AUROC_f) acc (1 - acc) + (1 - acc)^2 / 2``, ties in AUROC_f counting 1/2."""
    g = torch.Generator().manual_seed(seed)
    n = 200
    top = (torch.rand(n, generator=g, dtype=torch.float64) * 8).round() / 16 + 0.5  # many ties
    probs = _two_class(top.tolist())
    labels = (torch.rand(n, generator=g, dtype=torch.float64) > top).long()  # 0 w.p. top
    correct = (probs.argmax(1) == labels).numpy()
    acc = float(correct.mean())
    auroc_f = roc_auc_score(correct, probs.max(1).values.numpy())
    expected = (1 - auroc_f) * acc * (1 - acc) + 0.5 * (1 - acc) ** 2
    assert hm.augrc(probs, labels) == pytest.approx(expected, abs=1e-12)
    shuffled = torch.randperm(n, generator=g)
    assert hm.augrc(probs[shuffled], labels[shuffled]) == pytest.approx(
        hm.augrc(probs, labels), abs=1e-12
    )


def test_against_torch_uncertainty() -> None:
    """Our aurc / augrc / adaptive_ece vs torch-uncertainty's (docs/metrics.md says why they
    differ): exact relations between the formulas on tie-free random inputs."""
    tu = pytest.importorskip("torch_uncertainty.metrics.classification")

    def theirs(metric, probs, labels) -> float:
        metric.update(probs, labels)
        return float(metric.compute())

    for n, c, seed in [(150, 10, 0), (97, 5, 1), (10, 3, 3)]:
        g = torch.Generator().manual_seed(seed)
        logits = torch.randn(n, c, generator=g, dtype=torch.float64) * 2
        noise = torch.randint(c, (n,), generator=g)
        labels = torch.where(torch.rand(n, generator=g) < 0.6, logits.argmax(1), noise)
        probs = logits.softmax(1)
        conf, pred = probs.max(1)
        errors = (pred != labels).double()[conf.argsort(descending=True)].cumsum(0)  # E_k
        risk = errors / torch.arange(1, n + 1)
        # torch-uncertainty: trapezoid over coverages 1/N..1, rescaled by N / (N - 1)
        t_aurc = theirs(tu.AURC(), probs, labels)
        ours = (t_aurc * (n - 1) + float(risk[0] + risk[-1]) / 2) / n
        assert hm.aurc(probs, labels) == pytest.approx(ours, abs=1e-6)
        t_augrc = theirs(tu.AUGRC(), probs, labels)
        ours = t_augrc * (n - 1) / n + float(errors[0]) / (2 * n * n)
        assert hm.augrc(probs, labels) == pytest.approx(ours, abs=1e-6)
        ace = tu.AdaptiveCalibrationError("multiclass", num_bins=15, num_classes=c)
        t_ace = theirs(ace, probs, labels)
        if n % 15 == 0:  # the same equal-mass bins
            assert hm.adaptive_ece(probs, labels) == pytest.approx(t_ace, abs=1e-6)
        elif n > 15:  # N mod 15 extra examples: theirs in the lowest bins, ours spread
            assert abs(hm.adaptive_ece(probs, labels) - t_ace) > 1e-3
        else:  # fewer examples than bins: empty bins give theirs NaN
            assert math.isnan(t_ace) and math.isfinite(hm.adaptive_ece(probs, labels))


def test_classification_metrics_keys_and_perfect_model() -> None:
    probs = torch.eye(3)
    out = hm.classification_metrics(probs, torch.tensor([0, 1, 2]))
    assert set(out) == {"accuracy", "nll", "brier", "ece", "adaptive_ece", "aurc", "augrc"}
    assert out["accuracy"] == 1.0
    assert out["brier"] == pytest.approx(0.0)
    assert out["ece"] == pytest.approx(0.0, abs=1e-6)
    assert out["aurc"] == pytest.approx(0.0)
    assert out["augrc"] == pytest.approx(0.0)
    assert all(isinstance(v, float) for v in out.values())


@pytest.mark.parametrize(
    ("probs", "labels", "name"),
    [
        (torch.full((3, 2), 0.5), torch.tensor([0, 1]), "labels"),  # length mismatch
        (torch.full((2, 2), 0.5), torch.tensor([0, 2]), "labels"),  # out of range
        (torch.full((2, 2), 0.5), torch.tensor([0.0, 1.0]), "labels"),  # float labels
        (torch.full((2, 2), 0.6), torch.tensor([0, 1]), "probs"),  # rows sum to 1.2
        (torch.tensor([[0.5, float("nan")]]), torch.tensor([0]), "probs"),
        (torch.full((2,), 0.5), torch.tensor([0, 1]), "probs"),  # wrong ndim
        (torch.tensor([[1.5, -0.5]]), torch.tensor([0]), "probs"),  # outside [0, 1]
    ],
)
def test_classification_metrics_reject_bad_input(
    probs: torch.Tensor, labels: torch.Tensor, name: str
) -> None:
    with pytest.raises(ValueError, match=name):
        hm.classification_metrics(probs, labels)


def test_n_bins_validated() -> None:
    with pytest.raises(ValueError, match="n_bins"):
        hm.ece(torch.eye(2), torch.tensor([0, 1]), n_bins=0)


# ---------------------------------------------------------------- OOD


def test_ood_metrics_hand_values() -> None:
    ood = torch.arange(1, 21, dtype=torch.float64)  # 20 OOD scores 1..20
    idd = torch.tensor([1.5, 2.5, 10.5, 30.0])
    out = hm.ood_metrics(idd, ood)
    # AUROC = P(ood > id): OOD above 1.5: 19, above 2.5: 18, above 10.5: 10, above 30: 0.
    assert out["auroc"] == pytest.approx((19 + 18 + 10 + 0) / 80)
    # 95% TPR needs 19 of 20 OOD flagged -> threshold 2 flags ID 2.5, 10.5, 30 -> FPR 3/4.
    assert out["fpr_at_95_tpr"] == pytest.approx(0.75)


def test_ood_metrics_ties_count_half_and_perfect_separation() -> None:
    tied = hm.ood_metrics(torch.tensor([1.0, 1.0]), torch.tensor([1.0]))
    assert tied["auroc"] == pytest.approx(0.5)
    perfect = hm.ood_metrics(torch.tensor([0.0, 1.0]), torch.tensor([5.0, 6.0]))
    assert perfect == pytest.approx(
        {"auroc": 1.0, "aupr_in": 1.0, "aupr_out": 1.0, "fpr_at_95_tpr": 0.0}
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ood_metrics_match_sklearn(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    idd = torch.randn(300, generator=g)
    ood = torch.randn(200, generator=g) + 0.7
    # Add exact ties and large values (float32 sigmoid would saturate these into ties).
    idd[:20] = torch.round(idd[:20])
    ood[:20] = torch.round(ood[:20])
    idd, ood = idd * 50, ood * 50
    out = hm.ood_metrics(idd, ood)
    y = torch.cat([torch.zeros(300), torch.ones(200)]).numpy()
    s = torch.cat([idd, ood]).numpy()
    assert out["auroc"] == pytest.approx(roc_auc_score(y, s), abs=1e-6)
    assert out["aupr_out"] == pytest.approx(average_precision_score(y, s), abs=1e-6)
    assert out["aupr_in"] == pytest.approx(average_precision_score(1 - y, -s), abs=1e-6)


@pytest.mark.parametrize("seed", [0, 1])
def test_rank_sum_auroc_equals_ood_metrics_auroc(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    idd, ood = torch.randn(150, generator=g), torch.randn(90, generator=g) + 0.5
    idd[:15], ood[:15] = torch.round(idd[:15]), torch.round(ood[:15])  # ties count 1/2
    # two computations of one AUROC: equal up to float rounding
    assert hm.auroc(idd, ood) == pytest.approx(hm.ood_metrics(idd, ood)["auroc"], abs=1e-6)
    assert hm.auroc(torch.tensor([1.0, 1.0]), torch.tensor([1.0])) == 0.5
    with pytest.raises(ValueError, match="ood_scores"):
        hm.auroc(idd, torch.tensor([float("nan")]))


def test_roc_points_run_from_the_origin_to_one_one_and_are_thinned() -> None:
    g = torch.Generator().manual_seed(4)
    idd, ood = torch.randn(2000, generator=g), torch.randn(2000, generator=g) + 0.3
    points = hm.roc_points(idd, ood, max_points=50)
    assert points[0] == (0.0, 0.0) and points[-1] == (1.0, 1.0)
    assert 50 <= len(points) <= 2 * 50 + 1
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in itertools.pairwise(points))
    with pytest.raises(ValueError, match="max_points"):
        hm.roc_points(idd, ood, max_points=0)


def test_fpr_at_95_tpr_matches_brute_force() -> None:
    g = torch.Generator().manual_seed(3)
    idd, ood = torch.randn(100, generator=g), torch.randn(60, generator=g) + 1.0
    best = 1.0
    for t in torch.cat([idd, ood]):
        tpr = float((ood >= t).double().mean())
        if tpr >= 0.95:
            best = min(best, float((idd >= t).double().mean()))
    assert hm.ood_metrics(idd, ood)["fpr_at_95_tpr"] == pytest.approx(best)


def test_ood_metrics_reject_bad_input() -> None:
    with pytest.raises(ValueError, match="id_scores"):
        hm.ood_metrics(torch.tensor([]), torch.tensor([1.0]))
    with pytest.raises(ValueError, match="ood_scores"):
        hm.ood_metrics(torch.tensor([1.0]), torch.tensor([float("nan")]))
    with pytest.raises(ValueError, match="ood_scores"):
        hm.ood_metrics(torch.tensor([1.0]), torch.ones(2, 2))
