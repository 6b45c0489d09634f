import pytest
import torch
from tiny_models import FAMILIES, NUM_HEADS, NUM_LAYERS, tiny_inputs, tiny_model
from torch import nn

from hydra_ops.adapters import UnsupportedModelError, get_adapter
from hydra_ops.gating import head_gates


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
