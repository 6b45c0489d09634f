"""Exactness of the grouped merge against the members it was built from."""

import copy

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
from torch.utils._python_dispatch import TorchDispatchMode

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


def test_switching_attention_implementation_keeps_outputs():
    members = make_members("bert", member_plans(3), fine_tuned=True)
    hydra = merge_members(members, attention="padded_bmm")
    batch = tiny_inputs("bert", 4)
    with torch.no_grad():
        before = hydra(*positional(batch))
        after = hydra.set_attention_implementation("block_diagonal")(*positional(batch))
    assert hydra.attention_implementation == "block_diagonal"
    assert (before - after).abs().max().item() <= ATOL


def test_predict_proba_and_uncertainty():
    members = make_members("bert", member_plans(3), fine_tuned=True)
    hydra = merge_members(members)
    batch = tiny_inputs("bert", 6)
    args = positional(batch)
    probs = hydra.predict_proba(*args)
    ref = member_logits(members, batch).softmax(-1).mean(1)
    torch.testing.assert_close(probs, ref, rtol=1e-5, atol=1e-6)
    hydra.set_temperature(2.0)
    hotter = hydra.predict_proba(*args)
    assert (hotter.amax(-1) < probs.amax(-1)).all()
    unc = hydra.uncertainty(*args)
    for key in ("total_entropy", "expected_entropy", "mutual_information", "disagreement"):
        assert unc[key].shape == (6,)
    assert (unc["mutual_information"] >= 0).all()
    with pytest.raises(ValueError, match="temperature"):
        hydra.set_temperature(0.0)


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


# ----- member-major streams: no layout copies --------------------------------------------------
class _CopyLog(TorchDispatchMode):
    """Sizes (elements) of every clone / cat / stack / copy_ run under it."""

    def __init__(self):
        super().__init__()
        self.ops = {"clone", "contiguous", "cat", "stack", "copy_", "copy"}
        self.sizes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in self.ops:
            self.sizes.append((out if isinstance(out, torch.Tensor) else args[0]).numel())
        return out


def _block_inputs(hydra, batch):
    seen = []
    hooks = [
        block.register_forward_hook(lambda _m, args, out: seen.append((args, out)))
        for block in [*hydra.trunk, *hydra.blocks]
    ]
    with torch.no_grad():
        hydra(*positional(batch))
    for hook in hooks:
        hook.remove()
    return seen


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attention", sorted(ATTENTION_IMPLEMENTATIONS))
def test_streams_are_member_major_and_contiguous_between_blocks(family, attention):
    base = tiny_model(family)
    plans = [HeadPlan(((0, 1, 2, 3), (m,), ((m + 1) % 4, (m + 2) % 4))) for m in range(3)]
    members = [prune_heads(copy.deepcopy(base), p) for p in plans]
    hydra = merge_members(members, mode="average", attention=attention, shared_layers=1)
    batch = tiny_inputs(family, 5)
    seen = _block_inputs(hydra, batch)
    assert len(seen) == 3
    (trunk_in, _mask), trunk_out = seen[0]
    assert trunk_in.shape[:2] == (1, 5) and trunk_out.shape == trunk_in.shape
    for (x, _mask), out in seen[1:]:
        assert x.shape[:2] == (3, 5) and out.shape == x.shape  # [M, B, T, D]
        assert out.is_contiguous()


def test_padded_bmm_block_makes_no_activation_copies():
    members = make_members("bert", member_plans(3, unequal=True), fine_tuned=True)
    hydra = merge_members(members, attention="padded_bmm")
    batch = tiny_inputs("bert", 4, padded=True)
    (x, mask), _ = _block_inputs(hydra, batch)[1]
    for block_attention in ("padded_bmm", "member_gemm"):
        block = hydra.blocks[1]
        block.attention = block.attention.to_implementation(
            ATTENTION_IMPLEMENTATIONS[block_attention]
        )
        log = _CopyLog()
        with torch.no_grad(), log:
            block(x, mask)
        # only the [M*B, 1, 1, T] boolean mask may be copied; member_gemm stacks its M outputs
        big = [n for n in log.sizes if n > mask.numel() * 3]
        assert big == ([] if block_attention == "padded_bmm" else [x.numel()])


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
