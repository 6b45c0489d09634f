"""hydra_ops.hydra.ensemble: the merged network (member-major streams, predict_proba, uncertainty,
switching its attention implementation)."""

import copy

import pytest
import torch
from tiny_models import (
    FAMILIES,
    make_members,
    member_plans,
    positional,
    tiny_inputs,
    tiny_model,
)

from hydra_ops.adapters import get_adapter
from hydra_ops.heads.plans import HeadPlan
from hydra_ops.heads.surgery import prune_heads
from hydra_ops.hydra.grouped import ATTENTION_IMPLEMENTATIONS
from hydra_ops.hydra.merge import merge_members

ATOL = 1e-5


def member_logits(members, batch):
    with torch.no_grad():
        return torch.stack([get_adapter(m).logits(batch) for m in members], dim=1)


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
