"""hydra_ops.uq.checks: labels and scores checked at the boundary, errors naming the argument."""

from __future__ import annotations

import pytest
import torch

from hydra_ops.uq.checks import validate_labels, validate_scores


def test_labels_come_back_long_and_bad_labels_name_the_argument():
    labels = validate_labels([0, 2, 1], num_examples=3, num_classes=3)
    assert labels.dtype == torch.long and labels.tolist() == [0, 2, 1]
    with pytest.raises(ValueError, match=r"^y must be an integer tensor of class ids"):
        validate_labels(torch.tensor([0.0, 1.0]), 2, 3, name="y")
    with pytest.raises(
        ValueError, match=r"^labels must have shape \[3\] to match probs, got \(2,\)"
    ):
        validate_labels([0, 1], 3, 3)
    with pytest.raises(ValueError, match=r"^labels must lie in \[0, 3\), got values in \[-1, 3\]"):
        validate_labels([-1, 3, 0], 3, 3)


def test_scores_come_back_float64_and_bad_scores_name_the_argument():
    scores = validate_scores([1, 2, 3], "id_scores")
    assert scores.dtype == torch.float64 and scores.tolist() == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match=r"^id_scores must be a non-empty 1-D tensor"):
        validate_scores(torch.zeros(2, 2), "id_scores")
    with pytest.raises(ValueError, match=r"^ood_scores contains NaN or infinite values"):
        validate_scores([0.0, float("inf")], "ood_scores")
