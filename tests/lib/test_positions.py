"""Relative-position families (MPNet, DeBERTa-v2/v3): head surgery and the grouped merge are exact
with each family's position term (hydra_ops.hydra.positions), in every grouped implementation;
scoring runs; merged models and pruned checkpoints round-trip."""

from __future__ import annotations

import copy
import functools
import json

import pytest
import torch
from relative_models import VARIANTS, relative_inputs, relative_members, tiny_relative_model
from tiny_models import member_plans

from hydra_ops.adapters import get_adapter
from hydra_ops.heads.gating import head_gates
from hydra_ops.heads.plans import HeadPlan
from hydra_ops.heads.surgery import head_plan_of, prune_heads
from hydra_ops.hydra.format import HydraFormatError
from hydra_ops.hydra.grouped import ATTENTION_IMPLEMENTATIONS
from hydra_ops.hydra.merge import merge_members
from hydra_ops.hydra.serialization import load_hydra, save_hydra
from hydra_ops.models.checkpoints import load_model, save_model
from hydra_ops.scoring import score_heads

ATOL = 1e-5
PLAN = HeadPlan(((0, 2), (3,), (1, 2, 3)))
IMPLEMENTATIONS = sorted(ATTENTION_IMPLEMENTATIONS)


def logits(model, batch) -> torch.Tensor:
    with torch.no_grad():
        return get_adapter(model).logits(batch)


def member_logits(members, batch) -> torch.Tensor:
    return torch.stack([logits(m, batch) for m in members], dim=1)


def hydra_logits(hydra, batch) -> torch.Tensor:
    with torch.no_grad():
        return hydra.batch_logits(batch)


def plan_gates(plan: HeadPlan, heads: int = 4) -> list[torch.Tensor]:
    gates = []
    for layer in plan.kept:
        g = torch.zeros(heads)
        g[list(layer)] = 1.0
        gates.append(g)
    return gates


# ----- head surgery ----------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_pruned_model_equals_the_model_with_the_other_heads_gated_off(variant):
    model = tiny_relative_model(variant)
    batch = relative_inputs(variant, 5)
    with torch.no_grad(), head_gates(model, plan_gates(PLAN)):
        gated = get_adapter(model).logits(batch)
    pruned = prune_heads(copy.deepcopy(model), PLAN)
    assert get_adapter(pruned).heads_per_layer() == [2, 1, 3]
    out = logits(pruned, batch)
    assert (out - gated).abs().max().item() <= ATOL
    assert (out - logits(model, batch)).abs().max().item() > 1e-3  # pruning changed something


@pytest.mark.parametrize("variant", VARIANTS)
def test_pruning_twice_is_pruning_once_to_the_composed_plan(variant):
    model = tiny_relative_model(variant)
    batch = relative_inputs(variant, 4)
    twice = prune_heads(copy.deepcopy(model), HeadPlan(((0, 2, 3), (1, 3), (1, 2, 3))))
    twice = prune_heads(twice, HeadPlan(((0, 1), (1,), (0, 1, 2))))
    assert head_plan_of(twice) == PLAN
    once = prune_heads(copy.deepcopy(model), PLAN)
    assert (logits(twice, batch) - logits(once, batch)).abs().max().item() <= 1e-6


def test_a_pruned_mpnet_reads_its_own_heads_bias_columns():
    model = tiny_relative_model("mpnet")
    pruned = prune_heads(copy.deepcopy(model), PLAN)
    attn = [pruned.mpnet.encoder.layer[i].attention.attn for i in range(3)]
    assert [a.bias_heads.tolist() for a in attn] == [list(k) for k in PLAN.kept]
    assert set(pruned.state_dict()) == {  # the buffer is not a weight: same keys, fewer rows
        k for k in model.state_dict() if "relative_attention_bias" in k or k in pruned.state_dict()
    }


# ----- the merge ------------------------------------------------------------------------------
@functools.cache
def unequal_members(variant: str, num_members: int) -> tuple:
    """Members with unequal head counts, built once per module (the merge only reads them)."""
    return tuple(relative_members(variant, member_plans(num_members, unequal=True)))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("num_members", [1, 2, 3])
@pytest.mark.parametrize("attention", IMPLEMENTATIONS)
def test_stack_merge_equals_members(variant, num_members, attention):
    members = list(unequal_members(variant, num_members))
    hydra = merge_members(members, mode="stack", attention=attention)
    assert (
        hydra.architecture["positions"]["kind"] == get_adapter(members[0]).position_scores()["kind"]
    )
    for size in (1, 5):
        batch = relative_inputs(variant, size)
        out = hydra_logits(hydra, batch)
        assert out.shape == (size, num_members, 3)
        assert (out - member_logits(members, batch)).abs().max().item() <= ATOL


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("attention", IMPLEMENTATIONS)
def test_shared_trunk_forks_after_the_neck(variant, attention):
    base = tiny_relative_model(variant)
    plans = [HeadPlan(((0, 1, 2, 3), (m,), ((m + 1) % 4, (m + 2) % 4))) for m in range(3)]
    members = [prune_heads(copy.deepcopy(base), p) for p in plans]
    with torch.no_grad():  # fine-tuned apart above the neck
        for i, member in enumerate(members):
            for p in get_adapter(member).block(2).parameters():
                p.add_(0.05 * (i + 1))
    hydra = merge_members(members, mode="stack", attention=attention, shared_layers=1)
    assert hydra.shared_layers == 1
    batch = relative_inputs(variant, 5)
    assert (hydra_logits(hydra, batch) - member_logits(members, batch)).abs().max() <= ATOL


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_position_term_is_what_makes_the_merge_exact(variant):
    members = relative_members(variant, member_plans(2))
    hydra = merge_members(members)
    batch = relative_inputs(variant, 4)
    exact = hydra_logits(hydra, batch)
    for block in hydra.blocks:
        position = block.attention.position
        if variant == "mpnet":
            with torch.no_grad():
                position.bias.zero_()
        else:
            position.config = {**position.config, "terms": []}
    assert (hydra_logits(hydra, batch) - exact).abs().max().item() > 1e-3


@pytest.mark.parametrize("variant", VARIANTS)
def test_switching_implementation_keeps_the_position_term(variant):
    members = relative_members(variant, member_plans(3))
    hydra = merge_members(members, attention="padded_bmm")
    batch = relative_inputs(variant, 4)
    reference = hydra_logits(hydra, batch)
    for name in IMPLEMENTATIONS:
        hydra.set_attention_implementation(name)
        assert all(b.attention.position is not None for b in hydra.blocks)
        assert (hydra_logits(hydra, batch) - reference).abs().max().item() <= ATOL


def test_an_mpnet_shared_trunk_refuses_members_whose_bias_tables_differ():
    base = tiny_relative_model("mpnet")
    full = HeadPlan(((0, 1, 2, 3), (0,), (1,)))
    members = [prune_heads(copy.deepcopy(base), full) for _ in range(2)]
    with torch.no_grad():
        members[1].mpnet.encoder.relative_attention_bias.weight.add_(0.5)
    with pytest.raises(ValueError, match="relative position weights"):
        merge_members(members, shared_layers=1)


@pytest.mark.parametrize("variant", ["deberta_v3"])
def test_deberta_members_with_their_own_relative_embeddings_get_their_own_stage(variant):
    members = relative_members(variant, member_plans(2))  # nudged apart: rel embeddings differ
    hydra = merge_members(members)
    assert hydra.architecture["embedding"]["per_member"] is True
    batch = relative_inputs(variant, 3)
    assert (hydra_logits(hydra, batch) - member_logits(members, batch)).abs().max() <= ATOL


# ----- scoring --------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["mpnet", "deberta_v3"])
def test_taylor_and_circuit_scoring_run(variant):
    model = tiny_relative_model(variant)
    g = torch.Generator().manual_seed(3)
    train = []
    for seed in (5, 6):
        batch = relative_inputs(variant, 6, seed=seed)
        batch["labels"] = torch.randint(3, (6,), generator=g)
        train.append(batch)
    taylor = score_heads(model, "taylor", train_batches=train, progress=False)
    assert taylor.scores.shape == (3, 4) and torch.isfinite(taylor.scores).all()
    assert (taylor.scores > 0).any()
    ood = [relative_inputs(variant, 6, seed=9)]
    circuit = score_heads(
        model,
        "circuit",
        val_batches=train,
        ood_val_batches=ood,
        num_circuits=2,
        heads_per_layer=2,
        progress=False,
    )
    assert len(circuit.circuits) == 2
    for plan in circuit.circuits:
        assert all(len(layer) == 2 for layer in plan.kept)


# ----- save and load --------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", ["stack", "average"])
def test_merged_model_round_trip_is_bit_exact(tmp_path, variant, mode):
    hydra = merge_members(relative_members(variant, member_plans(3)), mode, "block_diagonal")
    save_hydra(hydra, tmp_path / "m")
    loaded = load_hydra(tmp_path / "m")
    batch = relative_inputs(variant, 5)
    assert torch.equal(hydra_logits(hydra, batch), hydra_logits(loaded, batch))
    assert loaded.architecture["positions"] == hydra.architecture["positions"]


def test_a_saved_hydra_with_an_unknown_position_kind_is_refused(tmp_path):
    hydra = merge_members(relative_members("mpnet", member_plans(2)))
    save_hydra(hydra, tmp_path / "m")
    config_path = tmp_path / "m" / "hydra.json"
    config = json.loads(config_path.read_text())
    config["architecture"]["positions"]["kind"] = "rotary"
    config_path.write_text(json.dumps(config))
    with pytest.raises(HydraFormatError, match="rotary"):
        load_hydra(tmp_path / "m")


@pytest.mark.parametrize("variant", VARIANTS)
def test_pruned_checkpoint_round_trip(tmp_path, variant):
    pruned = prune_heads(tiny_relative_model(variant), PLAN)
    save_model(pruned, tmp_path / "member")
    loaded = load_model(tmp_path / "member")
    assert head_plan_of(loaded) == PLAN
    assert get_adapter(loaded).heads_per_layer() == [2, 1, 3]
    batch = relative_inputs(variant, 3)
    assert torch.equal(logits(loaded, batch), logits(pruned, batch))


# ----- compile --------------------------------------------------------------------------------
def test_a_merged_model_compiles_to_onnx_and_agrees(tmp_path):
    import hydra_ops.compile as hc

    variant = "deberta_v3"  # the position term with projected embeddings; MPNet's is a lookup

    hydra = merge_members(relative_members(variant, member_plans(2)))
    heldout = [relative_inputs(variant, 3, seed=11), relative_inputs(variant, 5, seed=12)]
    artifact = hc.compile_model(
        hydra, "onnxruntime", relative_inputs(variant, 4), tmp_path, heldout_inputs=heldout
    )
    assert artifact.backend == "onnxruntime"
    batch = heldout[1]
    inputs = [batch[name] for name in artifact.input_names]
    with torch.no_grad():
        expected = hydra_logits(hydra, batch)
    assert (artifact(*inputs) - expected).abs().max().item() <= ATOL
