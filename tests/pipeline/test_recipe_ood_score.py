"""CONTRIBUTING.md's recipe "Adding an OOD score", followed with a toy criterion defined here: once
registered, the params check accepts it, the evaluate stage's ``ood_by_score`` and its report
table carry it, and ``predict`` rows score with it, with nothing else edited."""

from __future__ import annotations

import pytest
import torch

from hydra_ops.uq.ood_criteria import OOD_CRITERIA
from hydra_ops.uq.ood_criteria.base import OodCriterion, OodInputs

TOY = "toy_logit_gap"


class LogitGap(OodCriterion):
    """The gap between the two largest mean member logits: a wide gap is in-distribution.

    Shape: logits [N, M, C] -> [N].
    """

    needs = frozenset({"logits"})
    higher_is_ood = False
    meaning = "-(gap between the two largest mean member logits / T)"

    def statistic(self, inputs: OodInputs) -> torch.Tensor:
        assert inputs.logits is not None and inputs.member_probs is None  # only what it needs
        top2 = inputs.logits.mean(dim=1).topk(2, dim=-1).values
        return top2[:, 0] - top2[:, 1]


@pytest.fixture
def toy():
    OOD_CRITERIA.register(TOY, LogitGap)
    yield LogitGap
    OOD_CRITERIA.unregister(TOY)


def _logits(gaps: list[float], members: int = 2, classes: int = 3) -> torch.Tensor:
    """[N, M, C] member logits whose mean has top-2 gap ``gaps[n]`` (members differ by +-0.1)."""
    rows = torch.zeros(len(gaps), classes)
    rows[:, 0] = torch.tensor(gaps)
    spread = torch.linspace(-0.1, 0.1, members)[None, :, None] * torch.ones(1, 1, classes)
    spread[..., 0] = 0.0
    return rows[:, None, :] + spread


def _outputs() -> dict[str, torch.Tensor]:
    return {
        "test": _logits([4.0, 5.0, 6.0, 7.0]),
        "near_ood": _logits([0.5, 1.0, 1.5]),
        "far_ood": _logits([0.1, 5.5, 0.2]),
    }


def test_the_toy_score_appears_in_the_evaluate_stage_ood_metrics(toy):
    from hydra_ops.metrics import ood_metrics
    from tasks.evaluation.scorecard import ood_by_score
    from tasks.reports.evaluate_markdown import ood_score_table

    out, t = _outputs(), 2.0
    by_score = ood_by_score(out, t, members=2)
    for split in ("near_ood", "far_ood"):
        assert list(by_score[split]) == list(OOD_CRITERIA)  # every score, the toy last
        gap = {s: -_logits_gap(out[s], t) for s in ("test", split)}
        assert by_score[split][TOY] == ood_metrics(gap["test"], gap[split])
    assert by_score["near_ood"][TOY]["auroc"] == 1.0  # every near-OOD gap is below every ID gap
    assert by_score["far_ood"][TOY]["auroc"] == pytest.approx(10 / 12)  # gap 5.5 beats 2 of 4
    one = ood_by_score(out, t, members=1)  # needs logits only: defined for a single model too
    assert one["near_ood"][TOY] == by_score["near_ood"][TOY]
    assert one["near_ood"]["mutual_information"] is None
    table = ood_score_table({"models": {"hydra": {"ood_by_score": by_score}}})
    assert TOY in table.splitlines()[0] and "1.0000 / 0.0000" in table


def _logits_gap(logits: torch.Tensor, t: float) -> torch.Tensor:
    top2 = (logits / t).mean(dim=1).topk(2, dim=-1).values
    return top2[:, 0] - top2[:, 1]


def test_the_params_check_accepts_the_toy_score_only_once_registered(toy):
    from tasks.params import ConfigError, check_names, resolve_params

    cfg = resolve_params("quick", sets={"evaluate.ood_score": TOY})
    check_names(cfg)  # what the CLI runs before anything is written
    assert cfg.evaluate.ood_score == TOY
    OOD_CRITERIA.unregister(TOY)
    try:
        with pytest.raises(ConfigError) as err:
            check_names(cfg)
    finally:
        OOD_CRITERIA.register(TOY, LogitGap)
    assert str(err.value) == (
        f"params: evaluate.ood_score: unknown OOD score '{TOY}'; allowed: msp, entropy, energy, "
        "mutual_information, disagreement"
    )


def test_predict_rows_score_with_the_toy_and_say_what_it_measures(toy):
    from tasks.serving.predict import legend, rows_from_member_logits

    logits = _logits([4.0, 0.5])
    rows = rows_from_member_logits(
        ["a", "b"],
        logits,
        temperature=1.0,
        class_names=None,
        thresholds=None,
        default_score_kind=TOY,
    )
    assert [r["ood_score_kind"] for r in rows] == [TOY, TOY]
    assert [r["ood_score"] for r in rows] == pytest.approx((-_logits_gap(logits, 1.0)).tolist())
    assert LogitGap.meaning in legend(3, 2, TOY, None)
