"""CONTRIBUTING.md's "Adding a model family", followed with a toy family defined here: a BERT-like
classifier class of its own, one adapter, one registration; it then works through head surgery,
the exact merge, checkpoints and the params schema like a built-in family."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import member_plans, perturbed, positional, tiny_inputs
from transformers import BertConfig, BertForSequenceClassification

from hydra_ops.adapters import FAMILIES, ModelFamily, get_adapter, register_family
from hydra_ops.adapters.bert import BertAdapter, BertEmbeddingStage
from hydra_ops.heads.gating import head_gates
from hydra_ops.heads.plans import HeadPlan
from hydra_ops.heads.surgery import prune_heads
from hydra_ops.hydra.merge import merge_members
from hydra_ops.models.checkpoints import load_model, save_model


# step 1: the model classes (in a real family: the library's own)
class ToyConfig(BertConfig):
    model_type = "toy-bert"


class ToyForSequenceClassification(BertForSequenceClassification):
    config_class = ToyConfig


# step 2: the adapter module (here BERT's layout answers every question of the protocol)
class ToyEmbeddingStage(BertEmbeddingStage):
    pass


class ToyAdapter(BertAdapter):
    hf_classes = {"toy-bert": (ToyConfig, ToyForSequenceClassification)}  # noqa: RUF012


# step 3: one registration
TOY = ModelFamily(
    name="toy",
    modality="text",
    library=ToyForSequenceClassification.__module__.partition(".")[0],
    adapter=ToyAdapter,
    embedding_stage=ToyEmbeddingStage,
    classes=("ToyForSequenceClassification",),
    model_types=("toy-bert",),
    lr=2e-5,
    builder="..models.factory:build_pretrained_base",
)


@pytest.fixture
def toy_family():
    register_family(TOY)
    yield TOY
    FAMILIES.unregister(TOY.name)


def tiny_toy(seed: int = 0) -> ToyForSequenceClassification:
    torch.manual_seed(seed)
    config = ToyConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=3,
        max_position_embeddings=32,
    )
    return perturbed(ToyForSequenceClassification(config), seed + 1000, scale=0.1).eval()


def test_the_toy_is_not_taken_for_a_bert_and_is_refused_unregistered():
    with pytest.raises(ValueError, match="unsupported model type ToyForSequenceClassification"):
        get_adapter(tiny_toy())


def test_surgery_equals_gating_for_the_toy(toy_family):
    model = tiny_toy()
    adapter = get_adapter(model)
    assert (adapter.family, adapter.modality, adapter.heads_per_layer()) == ("toy", "text", [4] * 3)
    batch = tiny_inputs("bert", 5)
    plan = HeadPlan(((0, 3), (1,), (0, 1, 2)))
    gates = torch.zeros(3, 4)
    for layer in range(3):
        gates[layer, list(plan.heads(layer))] = 1
    with torch.no_grad(), head_gates(model, gates):
        gated = adapter.logits(batch)
    pruned = prune_heads(copy.deepcopy(model), plan)
    with torch.no_grad():
        assert (get_adapter(pruned).logits(batch) - gated).abs().max() <= 1e-5
    assert get_adapter(pruned).heads_per_layer() == [2, 1, 3]


@pytest.mark.parametrize("mode", ["stack", "average"])
def test_the_toy_merges_exactly_and_round_trips(toy_family, tmp_path, mode):
    base = tiny_toy()
    members = [
        perturbed(prune_heads(copy.deepcopy(base), p), 100 + i)
        for i, p in enumerate(member_plans(2))
    ]
    if mode == "average":  # equal non-attention weights: the average merge is then exact too
        members = [prune_heads(copy.deepcopy(base), p) for p in member_plans(2)]
    hydra = merge_members(members, mode=mode)
    batch = tiny_inputs("bert", 6)
    with torch.no_grad():
        ref = torch.stack([get_adapter(m).logits(batch) for m in members], dim=1)
        assert (hydra(*positional(batch)) - ref).abs().max() <= 1e-5
    assert hydra.architecture["family"] == "toy"
    save_model(members[0], tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    assert type(loaded) is ToyForSequenceClassification
    with torch.no_grad():
        assert torch.equal(get_adapter(loaded).logits(batch), ref[:, 0])


def test_the_params_schema_reads_the_toy_from_its_folder(toy_family, tmp_path):
    from tasks.params import validate_params
    from tasks.params.names import check_names

    tiny_toy().config.save_pretrained(tmp_path)
    cfg = validate_params({"model": {"path": str(tmp_path)}})
    assert (cfg.family, cfg.model_shape, cfg.base_lr) == ("toy", (3, 4), 2e-5)
    named = validate_params({"model": {"path": str(tmp_path), "family": "toy"}})
    check_names(named)  # the toy is an allowed model.family
    assert named.family == "toy"
