"""tasks.select_members: shared-layer plans keep the trunk whole, and merge exactly."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_inputs

from hydra_ops.hydra.merge import merge_members
from tasks.params import resolve_params


@pytest.mark.parametrize("method", ["taylor", "circuit"])
def test_shared_layers_plans_keep_the_trunk_whole_and_merge_exactly(tmp_path, method):
    """select_members with merge.shared_layers = 2: layers 0-1 of every plan (and of the naive
    plan) keep all heads, the later layers are the strategy's (circuits from a search that skipped
    the trunk, or overlap-penalised top-k); such members merge with a 2-layer trunk, exactly."""
    from tiny_models import NUM_HEADS, NUM_LAYERS, tiny_model

    from hydra_ops.heads.plans import load_plans
    from hydra_ops.heads.surgery import prune_heads
    from hydra_ops.scoring import random_scores, score_heads
    from tasks import select_members
    from tasks.runtime.layout import PLANS, SCORES

    base = tiny_model("bert")
    sets = {"scoring.method": method, "members.heads_per_layer": 2, "merge.shared_layers": 2}
    cfg = resolve_params("quick", sets=sets)
    if method == "circuit":
        val = [{**tiny_inputs("bert", 6, seed=1), "labels": torch.tensor([0, 1, 2, 0, 1, 2])}]
        scores = score_heads(
            base,
            "circuit",
            val_batches=val,
            objective="nll",
            num_circuits=cfg.members.num_members,
            heads_per_layer=2,
            shared_layers=2,
            progress=False,
        )
    else:
        scores = random_scores(base, seed=3)
    (tmp_path / SCORES).mkdir(parents=True)
    scores.save(tmp_path / SCORES / "scores.safetensors")
    summary = select_members.run(cfg, tmp_path)
    plans = load_plans(tmp_path / PLANS / "plans.json")
    assert summary["shared_layers"] == 2 and len(plans) == cfg.members.num_members
    if method == "circuit":
        assert plans == list(scores.circuits)
    naive = load_plans(tmp_path / PLANS / "naive_plan.json")
    for plan in [*plans, *naive]:
        assert plan.num_layers == NUM_LAYERS
        assert plan.heads(0) == plan.heads(1) == tuple(range(NUM_HEADS))
        assert len(plan.heads(2)) == 2
    pruned = summary["jaccard_per_layer"][2:]
    assert summary["jaccard_mean_pruned_layers"] == pytest.approx(sum(pruned) / len(pruned))
    members = []
    for plan in plans:
        member = tiny_model("bert")
        prune_heads(member, plan)
        members.append(member)
    hydra = merge_members(members, shared_layers=2).eval()
    batch = tiny_inputs("bert", 5)
    with torch.no_grad():
        merged = hydra(batch["input_ids"], batch["attention_mask"])
        separate = torch.stack([m(**batch).logits for m in members], dim=1)
    torch.testing.assert_close(merged, separate, rtol=0, atol=1e-5)
