"""The library calls the stages make: logits over batches (one call for a classifier and a Hydra
model), member checkpoints bound to their base, plans files, a split as batches."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tiny_models import make_members, member_plans, positional, tiny_inputs, tiny_model

from hydra_ops.data import Split, split_batches, split_labels
from hydra_ops.heads.plans import load_plans, save_plans
from hydra_ops.hydra.merge import merge_members
from hydra_ops.models.checkpoints import (
    CheckpointError,
    load_member,
    load_pruned,
    save_member,
    save_model,
)
from hydra_ops.models.inference import logits
from hydra_ops.models.training import model_logits


@pytest.mark.parametrize("family", ["bert", "timm_vit"])
def test_logits_of_a_classifier_and_of_a_hydra_model(family):
    batches = [tiny_inputs(family, 3, seed=1), tiny_inputs(family, 2, seed=2)]
    model = tiny_model(family).train()
    single = logits(model, batches)
    assert single.shape == (5, 3) and single.dtype == torch.float32
    with torch.no_grad():
        direct = torch.cat([model_logits(model.eval(), b) for b in batches])
    model.train()
    assert torch.equal(single, direct)
    assert model.training  # mode restored
    hydra = merge_members(make_members(family, member_plans(2), fine_tuned=True))
    members = logits(hydra, batches)
    assert members.shape == (5, 2, 3)
    with torch.no_grad():
        direct = torch.cat([hydra(*positional(b)) for b in batches])
    assert torch.equal(members, direct.float())
    with pytest.raises(ValueError, match="batches is empty"):
        logits(hydra, [])


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


def test_plans_file_bytes_and_round_trip(tmp_path):
    plans = member_plans(3)
    path = save_plans(tmp_path / "p" / "plans.json", plans, strategy="topk")
    expected = {"plans": [p.to_dict() for p in plans], "strategy": "topk"}
    assert path.read_text() == json.dumps(expected, indent=2) + "\n"
    assert load_plans(path) == plans
    with pytest.raises(ValueError, match="is missing"):
        load_plans(tmp_path / "nope.json")
    path.write_text('{"plans": [{"0": []}]}')
    with pytest.raises(ValueError, match="not a valid plans file"):
        load_plans(path)


def test_split_batches_limit_labels_and_tokenizer_required():
    images = np.arange(5 * 4 * 4, dtype=np.uint8).reshape(5, 4, 4)
    split = Split("val", "image", ["a", "b"], np.array([0, 1, 1, 0, 1]), images=images)
    batches = split_batches(split, 2, image_size=8, limit=3)
    assert [b["pixel_values"].shape for b in batches] == [(2, 1, 8, 8), (1, 1, 8, 8)]
    assert torch.cat([b["labels"] for b in batches]).tolist() == [0, 1, 1]
    assert "labels" not in split_batches(split, 5, with_labels=False)[0]
    assert split_labels(split).tolist() == [0, 1, 1, 0, 1]
    text = Split("val", "text", ["a", "b"], np.array([0, 1]), texts=["x", "y"])
    with pytest.raises(ValueError, match="tokenizer is required"):
        split_batches(text, 2)
