import pytest
import torch
from tiny_models import FAMILIES, NUM_HEADS, NUM_LAYERS, tiny_inputs, tiny_model
from torch import nn

from hydra_ops.adapters import UnsupportedModelError, get_adapter
from hydra_ops.heads.gating import head_gates


@pytest.mark.parametrize("family", FAMILIES)
def test_adapter_reports_shape_and_runs(family):
    model = tiny_model(family)
    adapter = get_adapter(model)
    assert adapter.family == family
    assert adapter.num_layers == NUM_LAYERS
    assert adapter.heads_per_layer() == [NUM_HEADS] * NUM_LAYERS
    assert adapter.head_dim * NUM_HEADS == adapter.hidden_size == 32
    weights = adapter.attention_weights(0)
    assert weights.q_weight.shape == (32, 32) and weights.o_weight.shape == (32, 32)
    assert adapter.out_proj(0).in_features == NUM_HEADS * adapter.head_dim
    assert adapter.logits(tiny_inputs(family, 2)).shape == (2, 3)


@pytest.mark.parametrize("family", FAMILIES)
def test_unit_gates_change_nothing_and_zero_gates_do(family):
    model = tiny_model(family)
    adapter = get_adapter(model)
    batch = tiny_inputs(family, 3)
    with torch.no_grad():
        plain = adapter.logits(batch)
        with head_gates(model, torch.ones(NUM_LAYERS, NUM_HEADS)):
            gated = adapter.logits(batch)
        gates = torch.ones(NUM_LAYERS, NUM_HEADS)
        gates[1, 2] = 0.0
        with head_gates(model, gates):
            one_off = adapter.logits(batch)
        after = adapter.logits(batch)
    torch.testing.assert_close(gated, plain, rtol=0, atol=0)
    assert (one_off - plain).abs().max() > 1e-4
    torch.testing.assert_close(after, plain, rtol=0, atol=0)  # hooks removed


def test_gates_receive_gradients():
    model = tiny_model("bert")
    gates = torch.ones(NUM_LAYERS, NUM_HEADS, requires_grad=True)
    batch = tiny_inputs("bert", 4)
    with head_gates(model, gates):
        loss = get_adapter(model).logits(batch).logsumexp(-1).sum()
    loss.backward()
    assert gates.grad is not None and gates.grad.abs().sum() > 0


def test_unsupported_model_names_supported_families():
    with pytest.raises(UnsupportedModelError, match=r"bert.*hf_vit.*timm_vit"):
        get_adapter(nn.Linear(3, 3))


def test_bad_gate_shape_is_a_clear_error():
    model = tiny_model("bert")
    with pytest.raises(ValueError, match="gates"), head_gates(model, torch.ones(2, NUM_HEADS)):
        pass


def test_unsupported_timm_variant_is_refused():
    model = tiny_model("timm_vit", global_pool="map")
    with pytest.raises(UnsupportedModelError, match="attention pooling"):
        get_adapter(model)


def _loss_per_example(adapter, batch, labels):
    return torch.nn.functional.cross_entropy(adapter.logits(batch), labels, reduction="none")


@pytest.mark.parametrize("family", FAMILIES)
def test_per_example_gates_give_each_example_its_own_gradient(family):
    """[B, L, H] gates: one backward of the summed losses == one backward per example."""
    model = tiny_model(family).double()
    adapter = get_adapter(model)
    size = 4
    batch = tiny_inputs(family, size)
    if "pixel_values" in batch:
        batch["pixel_values"] = batch["pixel_values"].double()
    labels = torch.arange(size) % 3
    gates = torch.ones(size, NUM_LAYERS, NUM_HEADS, dtype=torch.float64, requires_grad=True)
    with head_gates(model, gates):
        loss = _loss_per_example(adapter, batch, labels).sum()
    (batched,) = torch.autograd.grad(loss, gates)
    looped = []
    for i in range(size):
        row = {k: v[i : i + 1] for k, v in batch.items()}
        shared = torch.ones(NUM_LAYERS, NUM_HEADS, dtype=torch.float64, requires_grad=True)
        with head_gates(model, shared):
            loss_i = _loss_per_example(adapter, row, labels[i : i + 1]).sum()
        looped.append(torch.autograd.grad(loss_i, shared)[0])
    torch.testing.assert_close(batched, torch.stack(looped), rtol=1e-6, atol=1e-6)
    assert batched.abs().max() > 1e-3  # the comparison is not between zeros


@pytest.mark.parametrize("family", FAMILIES)
def test_per_example_gates_act_on_their_own_example_only(family):
    model = tiny_model(family)
    adapter = get_adapter(model)
    batch = tiny_inputs(family, 3)
    shared = torch.ones(NUM_LAYERS, NUM_HEADS)
    shared[1, 2] = 0.0
    with torch.no_grad():
        with head_gates(model, shared):
            reference = adapter.logits(batch)
        with head_gates(model, shared.expand(3, -1, -1)):
            per_example = adapter.logits(batch)
        one_row = shared.expand(3, -1, -1).clone()
        one_row[1, 0, 0] = 0.0
        with head_gates(model, [one_row[:, layer] for layer in range(NUM_LAYERS)]):
            changed = adapter.logits(batch)
    torch.testing.assert_close(per_example, reference, rtol=0, atol=0)
    torch.testing.assert_close(changed[[0, 2]], reference[[0, 2]], rtol=0, atol=0)
    assert (changed[1] - reference[1]).abs().max() > 1e-4


def test_per_example_gates_need_a_batch_of_their_size():
    model = tiny_model("bert")
    gates = torch.ones(5, NUM_LAYERS, NUM_HEADS)
    with pytest.raises(ValueError, match="batch of 5"), head_gates(model, gates):
        get_adapter(model).logits(tiny_inputs("bert", 3))
    mixed = [torch.ones(2, NUM_HEADS), torch.ones(NUM_HEADS), torch.ones(2, NUM_HEADS)]
    with pytest.raises(ValueError, match="layer 1"), head_gates(model, mixed):
        pass


@pytest.mark.parametrize("family", FAMILIES)
def test_trunk_parameters_are_embeddings_and_first_blocks(family):
    model = tiny_model(family)
    adapter = get_adapter(model)
    ids = {id(p) for p in adapter.trunk_parameters(2)}
    embedding = {id(p) for p in adapter.embedding_parameters()}
    blocks = {id(p) for layer in range(2) for p in adapter.block(layer).parameters()}
    assert embedding and ids == embedding | blocks
    assert not ids & {id(p) for p in adapter.block(2).parameters()}
    assert adapter.trunk_parameters(0) == []
    with pytest.raises(ValueError, match=r"num_layers must be an int in 0\.\.3"):
        adapter.trunk_parameters(4)


def test_distilbert_has_no_token_types_and_ignores_those_a_batch_has():
    """DistilBERT's embeddings have no token-type table: a batch's ``token_type_ids`` (which a
    BERT-style tokenizer makes) change nothing, in the model and in its merged form."""
    from hydra_ops.hydra.merge import merge_members

    model = tiny_model("distilbert")
    assert not any("token_type" in n for n, _ in model.named_parameters())
    batch = tiny_inputs("distilbert", 5)
    typed = {**batch, "token_type_ids": torch.ones_like(batch["input_ids"])}
    hydra = merge_members([model], mode="stack")
    with torch.no_grad():
        assert torch.equal(get_adapter(model).logits(typed), get_adapter(model).logits(batch))
        assert torch.equal(hydra.batch_logits(typed), hydra.batch_logits(batch))
