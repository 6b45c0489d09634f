"""hydra_ops.models.checkpoints: base and member checkpoints, bit-exact round trips, refused when
tampered with or cut from another base."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import FAMILIES, member_plans, tiny_inputs, tiny_model
from transformers import BertConfig, BertForSequenceClassification

from hydra_ops.adapters import get_adapter
from hydra_ops.heads.plans import HeadPlan
from hydra_ops.heads.surgery import head_plan_of, prune_heads
from hydra_ops.models.checkpoints import (
    CheckpointError,
    load_member,
    load_model,
    load_pruned,
    read_checkpoint_metadata,
    save_member,
    save_model,
)
from hydra_ops.models.factory import (
    build_timm_vit,
)
from hydra_ops.models.inference import logits

PLAN = HeadPlan(((0, 3), (2,), (0, 1, 2)))


def test_a_member_loads_only_against_the_base_it_was_cut_from(tmp_path):
    save_model(tiny_model("bert", seed=0), tmp_path / "base")
    save_model(tiny_model("bert", seed=1), tmp_path / "other")
    plan = member_plans(1)[0]
    member = load_pruned(tmp_path / "base", plan)
    save_member(member, tmp_path / "member", tmp_path / "base", {"member": 0})
    loaded = load_member(tmp_path / "member", tmp_path / "base")
    batch = tiny_inputs("bert", 2)
    assert torch.equal(logits(loaded, [batch]), logits(member, [batch]))
    with pytest.raises(CheckpointError, match="cut from a different base model"):
        load_member(tmp_path / "member", tmp_path / "other")
    (tmp_path / "member" / "model.safetensors").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="truncated or tampered"):
        load_member(tmp_path / "member", tmp_path / "base")


def tiny_bert(num_labels: int = 3) -> BertForSequenceClassification:
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=32,
        max_position_embeddings=32,
        num_labels=num_labels,
    )
    return BertForSequenceClassification(cfg).eval()


def tiny_vit():
    return build_timm_vit(
        image_size=8,
        in_chans=1,
        num_classes=3,
        depth=2,
        embed_dim=16,
        num_heads=4,
        patch_size=2,
        seed=0,
    ).eval()


def _same_state(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_bert_round_trip_is_bit_exact(tmp_path):
    model = tiny_bert()
    save_model(model, tmp_path / "ckpt", {"classes": ["a", "b", "c"]})
    loaded = load_model(tmp_path / "ckpt")
    assert type(loaded) is BertForSequenceClassification
    assert _same_state(model, loaded)
    ids = torch.randint(0, 50, (2, 7))
    mask = torch.ones_like(ids)
    assert torch.equal(
        model(input_ids=ids, attention_mask=mask).logits,
        loaded(input_ids=ids, attention_mask=mask).logits,
    )
    meta = read_checkpoint_metadata(tmp_path / "ckpt")
    assert meta["family"] == "bert" and meta["metadata"] == {"classes": ["a", "b", "c"]}
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temp folder left


def test_timm_vit_round_trip_is_bit_exact(tmp_path):
    model = tiny_vit()
    save_model(model, tmp_path / "vit")
    loaded = load_model(tmp_path / "vit")
    assert _same_state(model, loaded)
    x = torch.rand(2, 1, 8, 8)
    assert torch.equal(model(x), loaded(x))
    assert read_checkpoint_metadata(tmp_path / "vit")["config"]["img_size"] == 8


def test_tampered_truncated_and_missing_files(tmp_path):
    save_model(tiny_bert(), tmp_path / "c")
    weights = tmp_path / "c" / "model.safetensors"
    good = weights.read_bytes()
    data = bytearray(good)
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(
        CheckpointError, match=r"model\.safetensors.*truncated, corrupt or was modified"
    ):
        load_model(tmp_path / "c")
    weights.write_bytes(good[:200])
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        load_model(tmp_path / "c")
    with pytest.raises(CheckpointError, match="cannot be read"):  # hash skipped, parse fails
        load_model(tmp_path / "c", verify=False)
    weights.write_bytes(good)
    meta = tmp_path / "c" / "checkpoint.json"
    meta.write_text("{not json")
    with pytest.raises(CheckpointError, match=r"checkpoint\.json"):
        load_model(tmp_path / "c")
    meta.unlink()
    with pytest.raises(CheckpointError, match="missing"):
        load_model(tmp_path / "c")
    assert issubclass(CheckpointError, ValueError)


def test_config_that_does_not_fit_weights(tmp_path):
    save_model(tiny_bert(), tmp_path / "c")
    meta_path = tmp_path / "c" / "checkpoint.json"
    meta = json.loads(meta_path.read_text())
    meta["config"]["hidden_size"] = 32
    meta["config"]["intermediate_size"] = 64
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="does not match its config"):
        load_model(tmp_path / "c")


def test_save_rejects_unknown_model(tmp_path):
    with pytest.raises(ValueError, match=r"supported families: bert, roberta, .*, timm_vit"):
        save_model(torch.nn.Linear(2, 2), tmp_path / "x")


@pytest.mark.parametrize("family", FAMILIES)
def test_pruned_member_checkpoint_round_trip(tmp_path, family):
    from hydra_ops.models.checkpoints import load_model, save_model

    pruned = prune_heads(tiny_model(family), PLAN)
    save_model(pruned, tmp_path / "member")
    loaded = load_model(tmp_path / "member")
    assert head_plan_of(loaded) == PLAN
    assert get_adapter(loaded).heads_per_layer() == [2, 1, 3]
    batch = tiny_inputs(family, 3)
    with torch.no_grad():
        assert torch.equal(get_adapter(loaded).logits(batch), get_adapter(pruned).logits(batch))


@pytest.mark.parametrize("model_type", ["xlm-roberta", "camembert"])
def test_roberta_copies_load_back_as_their_own_class(tmp_path, model_type):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.for_model(
        model_type,
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=3,
        pad_token_id=1,
    )
    model = AutoModelForSequenceClassification.from_config(config).eval()
    prune_heads(model, HeadPlan(((0, 2), (1,))))
    save_model(model, tmp_path / "c")
    loaded = load_model(tmp_path / "c")
    assert type(loaded) is type(model) and read_checkpoint_metadata(tmp_path / "c")["family"] == (
        "roberta"
    )
    ids = torch.tensor([[0, 5, 9, 2], [0, 7, 1, 1]])
    mask = (ids != 1).long()
    assert torch.equal(
        model(input_ids=ids, attention_mask=mask).logits,
        loaded(input_ids=ids, attention_mask=mask).logits,
    )
