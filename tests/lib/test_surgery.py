"""hydra_ops.heads.surgery: physical head removal equals gating the removed heads to zero."""

import copy

import pytest
import torch
from tiny_models import FAMILIES, NUM_HEADS, NUM_LAYERS, TEXT_FAMILIES, tiny_inputs, tiny_model

from hydra_ops.adapters import get_adapter
from hydra_ops.heads.gating import head_gates
from hydra_ops.heads.plans import HeadPlan
from hydra_ops.heads.surgery import head_plan_of, prune_heads

PLAN = HeadPlan(((0, 3), (2,), (0, 1, 2)))


def plan_gates(plan: HeadPlan, heads_per_layer: list[int]) -> list[torch.Tensor]:
    """0/1 gates that keep exactly ``plan``'s heads: a list of ``[H_l]`` float tensors."""
    plan.validate_for(heads_per_layer)
    gates = []
    for layer, n in enumerate(heads_per_layer):
        g = torch.zeros(n)
        g[list(plan.heads(layer))] = 1.0
        gates.append(g)
    return gates


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("batch_size", [1, 7])
def test_pruned_model_equals_gated_model(family, batch_size):
    model = tiny_model(family)
    adapter = get_adapter(model)
    batch = tiny_inputs(family, batch_size)
    with torch.no_grad(), head_gates(model, plan_gates(PLAN, adapter.heads_per_layer())):
        gated = adapter.logits(batch)
    pruned = prune_heads(copy.deepcopy(model), PLAN)
    pruned_adapter = get_adapter(pruned)
    with torch.no_grad():
        out = pruned_adapter.logits(batch)
    assert pruned_adapter.heads_per_layer() == [2, 1, 3]
    assert (out - gated).abs().max().item() <= 1e-6
    n_before = sum(p.numel() for p in model.parameters())
    n_after = sum(p.numel() for p in pruned.parameters())
    removed_heads = NUM_LAYERS * NUM_HEADS - PLAN.total_heads()
    assert n_before - n_after == removed_heads * adapter.head_dim * (4 * 32 + 3)


@pytest.mark.parametrize("family", TEXT_FAMILIES)
def test_a_pruned_model_runs_the_same_under_each_attention_implementation(family):
    """transformers' eager and sdpa attention both read the pruned head count from the weights."""
    outs = []
    for implementation in ("eager", "sdpa"):
        model = prune_heads(tiny_model(family), PLAN)
        model.set_attn_implementation(implementation)
        assert model.config._attn_implementation == implementation
        with torch.no_grad():
            outs.append(get_adapter(model).logits(tiny_inputs(family, 7)))
    assert (outs[0] - outs[1]).abs().max().item() <= 1e-5


def test_pruning_twice_tracks_original_indices():
    model = prune_heads(tiny_model("bert"), PLAN)
    prune_heads(model, HeadPlan(((1,), (0,), (0, 2))))
    assert head_plan_of(model).kept == ((3,), (2,), (0, 2))


def test_removing_every_head_of_a_layer_is_refused():
    with pytest.raises(ValueError, match="layer 1 keeps no head"):
        prune_heads(tiny_model("bert"), HeadPlan.from_layers([[0], [], [1]]))


def test_plan_out_of_range_is_refused():
    with pytest.raises(ValueError, match="only 4 heads"):
        prune_heads(tiny_model("timm_vit"), HeadPlan(((0,), (7,), (1,))))
