"""Member diversity: the pairwise measures on hand-made logits, per-member training data, the
anchored NCL objective, per-member head budgets."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from tiny_models import NUM_HEADS, NUM_LAYERS, tiny_inputs, tiny_model

from hydra_ops.data.members import member_indices, subset
from hydra_ops.data.store import Split
from hydra_ops.heads.selection import select_members
from hydra_ops.models.diversity_loss import anchored_ncl_penalty, anchored_ncl_term
from hydra_ops.models.training import fine_tune
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


# ----- per-member training data ------------------------------------------------------------------
LABELS = np.array([0] * 10 + [1] * 7 + [2] * 5)


def test_full_gives_every_member_the_whole_split():
    idx = [member_indices(LABELS, 3, m, "full", seed=7) for m in range(3)]
    assert all(np.array_equal(i, np.arange(len(LABELS))) for i in idx)


def test_bootstrap_resamples_differ_between_members_and_repeat_for_a_seed():
    idx = [member_indices(LABELS, 3, m, "bootstrap", seed=7) for m in range(3)]
    assert all(len(i) == len(LABELS) and i.min() >= 0 and i.max() < len(LABELS) for i in idx)
    assert not np.array_equal(idx[0], idx[1]) and not np.array_equal(idx[1], idx[2])
    assert all(len(np.unique(i)) < len(LABELS) for i in idx)  # drawn with replacement
    assert np.array_equal(idx[1], member_indices(LABELS, 3, 1, "bootstrap", seed=7))
    assert not np.array_equal(idx[1], member_indices(LABELS, 3, 1, "bootstrap", seed=8))


def test_shards_are_disjoint_stratified_and_cover_the_split():
    idx = [member_indices(LABELS, 3, m, "shards", seed=7) for m in range(3)]
    together = np.concatenate(idx)
    assert np.array_equal(np.sort(together), np.arange(len(LABELS)))  # disjoint and complete
    assert sorted(len(i) for i in idx) == [7, 7, 8]
    for i in idx:
        counts = np.bincount(LABELS[i], minlength=3)
        assert all(counts[c] in (n // 3, -(-n // 3)) for c, n in enumerate(np.bincount(LABELS)))
    with pytest.raises(ValueError, match="cannot make 5 shards"):
        member_indices(LABELS[:4], 5, 0, "shards", seed=0)
    with pytest.raises(ValueError, match="allowed: full, bootstrap, shards"):
        member_indices(LABELS, 3, 0, "bagging", seed=0)


def test_subset_keeps_the_chosen_examples_in_order():
    texts = [f"t{i}" for i in range(5)]
    split = Split("train", "text", ["a", "b"], np.array([0, 1, 0, 1, 0]), texts=texts)
    sub = subset(split, np.array([4, 1, 1]))
    assert sub.texts == ["t4", "t1", "t1"] and sub.labels.tolist() == [0, 1, 1]
    images = np.arange(5 * 4, dtype=np.uint8).reshape(5, 2, 2)
    isplit = Split("train", "image", ["a", "b"], np.array([0, 1, 0, 1, 0]), images=images)
    assert np.array_equal(subset(isplit, np.array([3, 0])).images, images[[3, 0]])
    with pytest.raises(ValueError, match=r"indices must lie in 0..4"):
        subset(split, np.array([5]))


# ----- the anchored NCL objective ---------------------------------------------------------------
def test_ncl_penalty_value_bounds_and_gradient_sign():
    anchor = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    same = anchor.log().clone().requires_grad_(True)
    assert anchored_ncl_penalty(same, anchor).item() == pytest.approx(0.0, abs=1e-7)
    logits = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, -1.0]], requires_grad=True)
    p = logits.softmax(-1)
    want = -((p - anchor) ** 2).sum(-1).mean()
    pen = anchored_ncl_penalty(logits, anchor)
    assert pen.item() == pytest.approx(want.item(), abs=1e-7)
    assert -2.0 <= pen.item() <= 0.0
    # d penalty / d p = -(2 / B)(p - q): chain it through the softmax Jacobian
    (grad,) = torch.autograd.grad(pen, logits)
    dp = -(2 / 2) * (p - anchor).detach()
    jac = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    torch.testing.assert_close(grad, (jac.detach() @ dp[:, :, None]).squeeze(-1))
    # a gradient-descent step on the penalty moves the prediction away from the anchor
    with torch.no_grad():
        stepped = logits - 0.5 * grad
    before = ((logits.softmax(-1) - anchor) ** 2).sum()
    after = ((stepped.softmax(-1) - anchor) ** 2).sum()
    assert after > before


def _labelled(seed: int) -> dict[str, torch.Tensor]:
    batch = tiny_inputs("bert", 6, seed=seed)
    batch["labels"] = torch.randint(3, (6,), generator=torch.Generator().manual_seed(seed))
    return batch


def test_ncl_objective_changes_the_member_weights_and_strength_zero_does_not():
    base = tiny_model("bert")
    batches = [_labelled(s) for s in (1, 2)]

    def train(loss_term):
        model = copy.deepcopy(base)
        fine_tune(
            model,
            lambda _e: batches,
            epochs=1,
            lr=1e-3,
            progress=False,
            log_fn=None,
            loss_term=loss_term,
        )
        return model.state_dict()

    plain = train(None)
    ncl = train(anchored_ncl_term(copy.deepcopy(base), 0.5))
    zero = train(anchored_ncl_term(copy.deepcopy(base), 0.0))
    assert any(not torch.equal(plain[k], ncl[k]) for k in plain)
    assert all(torch.equal(plain[k], zero[k]) for k in plain)
    with pytest.raises(ValueError, match="strength must be a number >= 0"):
        anchored_ncl_term(base, -1.0)


def test_ncl_anchor_runs_in_the_fine_tunes_precision():
    base = tiny_model("bert")
    seen: list[torch.dtype] = []
    anchor = copy.deepcopy(base)
    query = anchor.bert.encoder.layer[0].attention.self.query
    query.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    batch = _labelled(1)
    logits = base(**{k: v for k, v in batch.items() if k != "labels"}).logits
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        value = anchored_ncl_term(anchor, 0.5, precision)(logits.float(), batch)
        assert seen[-1] == dtype and value.dtype == torch.float32
        assert -1.0 <= value.item() <= 0.0  # strength 0.5 times a penalty in [-2, 0]


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
