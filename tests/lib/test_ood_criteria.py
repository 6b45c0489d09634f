"""hydra_ops.uq.ood_criteria: per-example OOD scores, by hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from hydra_ops.uq.ood_criteria import OOD_CRITERIA, ood_scores
from hydra_ops.uq.uncertainty import decompose, entropy


def test_ood_scores_kinds() -> None:
    member_probs = torch.tensor([[[0.9, 0.1], [0.1, 0.9]], [[0.8, 0.2], [0.8, 0.2]]])
    probs = member_probs.mean(dim=1)
    logits = torch.tensor([[2.0, 0.0], [0.0, 0.0]])
    torch.testing.assert_close(ood_scores(probs), torch.tensor([-0.5, -0.8]))
    torch.testing.assert_close(ood_scores(probs, kind="entropy"), entropy(probs))
    mi = ood_scores(probs, member_probs=member_probs, kind="mutual_information")
    assert mi[0] > 0 and mi[1] == pytest.approx(0.0, abs=1e-6)
    energy = ood_scores(probs, logits=logits, kind="energy")
    torch.testing.assert_close(energy, torch.tensor([-math.log(math.exp(2) + 1), -math.log(2)]))
    # [N, M, C] logits: mean member energy.
    stacked = torch.stack([logits, logits * 0], dim=1)
    expected = (energy + torch.tensor(-math.log(2.0))) / 2
    torch.testing.assert_close(ood_scores(probs, logits=stacked, kind="energy"), expected)


def test_ood_scores_disagreement_hand_values() -> None:
    """1 - (fraction of members voting for the ensemble's argmax class)."""
    member_probs = torch.tensor(
        [
            [[0.6, 0.3, 0.1], [0.5, 0.2, 0.3], [0.2, 0.7, 0.1]],  # votes 0, 0, 1; ensemble 0
            [[0.1, 0.1, 0.8], [0.2, 0.2, 0.6], [0.3, 0.0, 0.7]],  # all vote 2
            [[0.55, 0.45, 0.0], [0.0, 0.45, 0.55], [0.3, 0.4, 0.3]],  # ensemble 1: one vote
        ]
    )
    probs = member_probs.mean(dim=1)
    scores = ood_scores(probs, member_probs=member_probs, kind="disagreement")
    torch.testing.assert_close(scores, torch.tensor([1 / 3, 0.0, 2 / 3]))
    torch.testing.assert_close(scores, decompose(member_probs)["disagreement"])
    # the ensemble's class is the argmax of ``probs`` (e.g. calibrated): class 1 for row 0
    shifted = probs.clone()
    shifted[0] = torch.tensor([0.2, 0.7, 0.1])
    again = ood_scores(shifted, member_probs=member_probs, kind="disagreement")
    assert again[0].item() == pytest.approx(2 / 3)
    # one member always agrees with itself
    one = ood_scores(probs, member_probs=probs[:, None], kind="disagreement")
    assert torch.equal(one, torch.zeros(3))
    assert "disagreement" in OOD_CRITERIA


def test_ood_scores_reject_bad_input() -> None:
    probs = torch.full((2, 2), 0.5)
    with pytest.raises(ValueError, match="kind"):
        ood_scores(probs, kind="odin")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="member_probs"):
        ood_scores(probs, kind="mutual_information")
    with pytest.raises(ValueError, match="member_probs"):
        ood_scores(probs, member_probs=torch.full((3, 2, 2), 0.5), kind="mutual_information")
    with pytest.raises(ValueError, match="member_probs"):
        ood_scores(probs, kind="disagreement")
    with pytest.raises(ValueError, match="member_probs"):
        ood_scores(probs, member_probs=torch.full((2, 2, 3), 1 / 3), kind="disagreement")
    with pytest.raises(ValueError, match="logits"):
        ood_scores(probs, kind="energy")
    with pytest.raises(ValueError, match="logits"):
        ood_scores(probs, logits=torch.zeros(2, 3), kind="energy")


def test_every_registered_criterion_declares_what_it_needs_and_means() -> None:
    from hydra_ops.uq.ood_criteria.base import NEEDS, OodCriterion

    assert list(OOD_CRITERIA) == ["msp", "entropy", "energy", "mutual_information", "disagreement"]
    for name, criterion in OOD_CRITERIA.items():
        assert issubclass(criterion, OodCriterion), name
        assert set(criterion.needs) <= set(NEEDS) and criterion.meaning, name
    needs_members = [n for n, c in OOD_CRITERIA.items() if c.needs_members()]
    assert needs_members == ["mutual_information", "disagreement"]


def test_a_criterion_sees_only_what_it_declared_and_its_direction_orients_it() -> None:
    from hydra_ops.uq.ood_criteria.base import OodCriterion, OodInputs

    seen: list[OodInputs] = []

    class Confidence(OodCriterion):
        higher_is_ood = False
        meaning = "max prob"

        def statistic(self, inputs: OodInputs) -> torch.Tensor:
            seen.append(inputs)
            return inputs.probs.max(dim=1).values

    OOD_CRITERIA.register("confidence", Confidence)
    try:
        probs = torch.tensor([[0.9, 0.1], [0.6, 0.4]])
        members = torch.stack([probs, probs], dim=1)
        scores = ood_scores(
            probs, member_probs=members, logits=torch.zeros(2, 2), kind="confidence"
        )
    finally:
        OOD_CRITERIA.unregister("confidence")
    torch.testing.assert_close(scores, torch.tensor([-0.9, -0.6]))
    assert seen[0].member_probs is None and seen[0].logits is None


def test_the_registry_lists_names_without_importing_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys; from hydra_ops.uq.ood_criteria import OOD_CRITERIA; "
        "print(list(OOD_CRITERIA), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("]")[1].strip() == "False"
