"""hydra_ops.heads.selection: plan validity, the strategies' defining properties, per-member
budgets, bad input."""

from __future__ import annotations

import pytest
import torch
from tiny_models import NUM_HEADS, NUM_LAYERS

from hydra_ops.heads.plans import HeadPlan, plan_overlap
from hydra_ops.heads.selection import (
    STRATEGIES,
    default_heads_per_layer,
    diversity_report,
    select_members,
)
from hydra_ops.scoring import HeadScores

L, H = 6, 12


@pytest.fixture
def scores() -> torch.Tensor:
    return torch.rand(L, H, generator=torch.Generator().manual_seed(0))


def _assert_valid(plans: list[HeadPlan], num_members: int, k: int) -> None:
    assert len(plans) == num_members
    for plan in plans:
        assert plan.num_layers == L
        assert plan.num_kept() == [k] * L
        plan.validate_for([H] * L)
        for layer in range(L):
            assert list(plan.heads(layer)) == sorted(set(plan.heads(layer)))


@pytest.mark.parametrize("strategy", ["gumbel_topk", "overlap_penalty"])
@pytest.mark.parametrize("k", [1, 4, 12])
def test_plans_are_valid(scores: torch.Tensor, strategy: str, k: int) -> None:
    _assert_valid(select_members(scores, 3, k, strategy, seed=1), 3, k)


def test_default_budget_is_four_heads_for_twelve_heads_three_members(scores) -> None:
    assert default_heads_per_layer(12, 3) == 4
    _assert_valid(select_members(scores, 3), 3, 4)


def test_per_layer_budget(scores: torch.Tensor) -> None:
    budget = [1, 2, 3, 4, 5, 6]
    plans = select_members(scores, 2, budget, "overlap_penalty")
    assert all(p.num_kept() == budget for p in plans)


def test_topk_picks_the_argmax_heads(scores: torch.Tensor) -> None:
    (plan,) = select_members(scores, 1, 4, "topk")
    for layer in range(L):
        expected = set(torch.argsort(scores[layer], descending=True)[:4].tolist())
        assert set(plan.heads(layer)) == expected


def test_topk_ties_go_to_lower_index() -> None:
    (plan,) = select_members(torch.zeros(2, 5), 1, 2, "topk")
    assert plan.kept == ((0, 1), (0, 1))


def test_topk_rejects_several_members(scores: torch.Tensor) -> None:
    with pytest.raises(ValueError, match=r"num_members.*overlap_penalty"):
        select_members(scores, 3, 4, "topk")


def test_overlap_penalty_lowers_jaccard(scores: torch.Tensor) -> None:
    same = select_members(scores, 3, 4, "overlap_penalty", penalty=0.0)
    diverse = select_members(scores, 3, 4, "overlap_penalty", penalty=1.0)
    mild = select_members(scores, 3, 4, "overlap_penalty", penalty=0.2)
    assert plan_overlap(same).overall == 1.0
    assert same[0] == select_members(scores, 1, 4, "topk")[0]
    # penalty=1 with k * M <= H: every held head ranks below every free head -> disjoint members.
    assert plan_overlap(diverse).overall == 0.0
    assert plan_overlap(diverse).overall <= plan_overlap(mild).overall < 1.0
    # the first member is always the top-k plan
    assert diverse[0] == same[0]


def test_overlap_penalty_reuses_heads_when_budget_exceeds_heads(scores) -> None:
    plans = select_members(scores, 3, 8, "overlap_penalty", penalty=1.0)
    report = diversity_report(plans, H)
    assert report["coverage"] == 1.0
    assert 0.0 < report["jaccard_mean"] < 1.0


def test_gumbel_is_deterministic_per_seed(scores: torch.Tensor) -> None:
    a = select_members(scores, 3, 4, "gumbel_topk", seed=7)
    b = select_members(scores, 3, 4, "gumbel_topk", seed=7)
    c = select_members(scores, 3, 4, "gumbel_topk", seed=8)
    assert a == b
    assert a != c
    assert plan_overlap(a).overall < 1.0


def test_gumbel_temperature_limits(scores: torch.Tensor) -> None:
    topk = select_members(scores, 1, 4, "topk")[0]
    cold = select_members(scores, 3, 4, "gumbel_topk", seed=0, temperature=1e-6)
    assert all(p == topk for p in cold)
    hot = select_members(scores, 3, 4, "gumbel_topk", seed=0, temperature=1e3)
    warm = select_members(scores, 3, 4, "gumbel_topk", seed=0, temperature=0.5)
    assert plan_overlap(hot).overall < plan_overlap(cold).overall
    assert plan_overlap(warm).overall < 1.0


def test_gumbel_is_invariant_to_per_layer_scale(scores: torch.Tensor) -> None:
    scaled = scores * torch.logspace(-3, 3, L)[:, None] + 5.0
    assert select_members(scores, 3, 4, "gumbel_topk", seed=3) == select_members(
        scaled, 3, 4, "gumbel_topk", seed=3
    )


def test_circuits_strategy_returns_the_circuits(scores: torch.Tensor) -> None:
    circuits = select_members(scores, 3, 4, "overlap_penalty")
    hs = HeadScores(scores, "circuit", meta={}, circuits=circuits)
    assert select_members(hs, 2, 4, "circuits") == circuits[:2]
    with pytest.raises(ValueError, match="num_members"):
        select_members(hs, 4, 4, "circuits")
    with pytest.raises(ValueError, match="heads_per_layer"):
        select_members(hs, 3, 3, "circuits")
    with pytest.raises(ValueError, match="circuit"):
        select_members(HeadScores(scores, "taylor"), 3, 4, "circuits")


@pytest.fixture(scope="module")
def circuit_runs() -> dict:
    """Circuit scores of a tiny BERT (3 layers x 4 heads, 2 circuits of 2 heads) per penalty."""
    from tiny_models import tiny_inputs, tiny_model

    from hydra_ops.scoring import score_heads

    model = tiny_model("bert")
    batch = {**tiny_inputs("bert", 6), "labels": torch.arange(6) % 3}
    runs: dict = {}
    for penalty in (None, 0.0, 2.0):
        runs[penalty] = score_heads(
            model,
            "circuit",
            val_batches=[batch],
            num_circuits=2,
            heads_per_layer=2,
            overlap_penalty=penalty,
            progress=False,
        )
    runs[0.5] = runs[None]  # the default: its meta records 0.5 (checked below)
    return runs


def test_circuits_honour_the_overlap_penalty(circuit_runs) -> None:
    overlap = {}
    for penalty in (0.0, 0.5, 2.0):
        plans = select_members(circuit_runs[penalty], 2, 2, "circuits", penalty=penalty)
        assert plans == circuit_runs[penalty].circuits
        overlap[penalty] = plan_overlap(plans).overall
    assert overlap[0.0] > overlap[0.5] > overlap[2.0]
    assert overlap == pytest.approx({0.0: 1.0, 0.5: 7 / 9, 2.0: 0.0})
    # circuits searched with one penalty are not silently used for another
    with pytest.raises(ValueError, match=r"searched with overlap_penalty=0\.5.*rescore"):
        select_members(circuit_runs[0.5], 2, 2, "circuits", penalty=2.0)


def test_circuits_default_penalty_is_the_old_hard_coded_one(circuit_runs) -> None:
    """``None`` resolves to 0.5 in the search and in the selection: the plans found before the
    penalty became a parameter (same model, data and seed)."""
    old = [
        HeadPlan(((2, 3), (2, 3), (0, 2))),
        HeadPlan(((1, 3), (2, 3), (0, 2))),
    ]
    default = circuit_runs[None]
    assert default.meta["overlap_penalty"] == 0.5
    assert default.circuits == old
    assert select_members(default, 2, 2, "circuits") == old
    assert select_members(default, 2, 2, "circuits", penalty=None) == old


def test_accepts_head_scores(scores: torch.Tensor) -> None:
    assert select_members(HeadScores(scores, "taylor"), 1, 4, "topk") == select_members(
        scores, 1, 4, "topk"
    )


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_scores_rejected(scores: torch.Tensor, bad: float) -> None:
    scores[2, 3] = bad
    with pytest.raises(ValueError, match=r"scores.*finite"):
        select_members(scores, 3, 4)


@pytest.mark.parametrize("shape", [(12,), (2, 3, 4), (0, 12)])
def test_wrong_shape_rejected(shape: tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="scores"):
        select_members(torch.rand(shape), 3, 1)


def test_bad_arguments(scores: torch.Tensor) -> None:
    with pytest.raises(ValueError, match=r"heads_per_layer.*1\.\.12"):
        select_members(scores, 3, 0)
    with pytest.raises(ValueError, match=r"heads_per_layer.*1\.\.12"):
        select_members(scores, 3, 13)
    with pytest.raises(ValueError, match="heads_per_layer"):
        select_members(scores, 3, [4, 4])
    with pytest.raises(ValueError, match="num_members"):
        select_members(scores, 0, 4)
    with pytest.raises(ValueError, match="strategy.*" + ", ".join(STRATEGIES)):
        select_members(scores, 3, 4, "best")
    with pytest.raises(ValueError, match="temperature"):
        select_members(scores, 3, 4, "gumbel_topk", temperature=0.0)
    with pytest.raises(ValueError, match="penalty"):
        select_members(scores, 3, 4, "overlap_penalty", penalty=-1.0)


def test_diversity_report_values() -> None:
    plans = [
        HeadPlan.from_layers([[0, 1], [0]]),
        HeadPlan.from_layers([[1, 2], [0]]),
    ]
    report = diversity_report(plans, 4)
    assert report["jaccard_per_layer"] == pytest.approx([1 / 3, 1.0])
    assert report["jaccard_mean"] == pytest.approx(2 / 3)
    assert report["coverage_per_layer"] == pytest.approx([3 / 4, 1 / 4])
    assert report["coverage"] == pytest.approx(4 / 8)
    assert report["heads_per_member"] == [3, 3]
    with pytest.raises(ValueError, match="plans"):
        diversity_report([])
    with pytest.raises(ValueError):
        diversity_report(plans, 2)


# ----- per-member head budgets -------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["overlap_penalty", "gumbel_topk"])
def test_per_member_budgets_give_plans_of_the_given_sizes(strategy):
    scores = torch.rand(NUM_LAYERS, NUM_HEADS, generator=torch.Generator().manual_seed(0))
    budgets = [[4, 1, 1], [4, 2, 2], [4, 3, 3]]
    plans = select_members(scores, 3, budgets, strategy, seed=0)
    assert [p.num_kept() for p in plans] == budgets
    # the same budget for every member, nested or not, gives the same plans as before
    same = select_members(scores, 3, [[4, 2, 2]] * 3, strategy, seed=0)
    assert same == select_members(scores, 3, [4, 2, 2], strategy, seed=0)
    with pytest.raises(ValueError, match="2 per-member budgets but num_members=3"):
        select_members(scores, 3, budgets[:2], strategy)
