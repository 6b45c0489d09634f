"""hydra_ops.adapters.deberta_v2: the variants it cannot reproduce are refused in one line."""

from __future__ import annotations

import pytest
import torch
from relative_models import tiny_relative_model

from hydra_ops.adapters import UnsupportedModelError, get_adapter


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"conv_kernel_size": 3}, "convolution layer"),
        ({"pos_att_type": ["p2c", "p2p"]}, r"pos_att_type=\['p2c', 'p2p'\]"),
        ({"pooler_hidden_size": 16}, "pooler_hidden_size=16"),
        ({"pooler_hidden_act": "softsign"}, "pooler_hidden_act='softsign'"),
    ],
)
def test_unsupported_variants_are_refused_in_one_line(overrides, message):
    model = tiny_relative_model("deberta_v3", **overrides)
    with pytest.raises(UnsupportedModelError, match=message) as err:
        get_adapter(model)
    assert "\n" not in str(err.value)


def test_the_position_term_names_what_the_attention_computes():
    spec = get_adapter(tiny_relative_model("deberta_v3")).position_scores()
    assert spec == {
        "kind": "disentangled",
        "config": {
            "terms": ["c2p", "p2c"],
            "scale_factor": 3,
            "span": 8,
            "position_buckets": 8,
            "max_relative_positions": 16,
            "separate_projections": False,
            "hidden_size": 32,
        },
    }


def test_separate_position_projections_are_pruned_with_their_heads():
    model = tiny_relative_model("deberta_v2")
    adapter = get_adapter(model)
    assert adapter.position_scores()["config"]["separate_projections"] is True
    full = adapter.attention_weights(1)
    assert set(full.position) == {
        "pos_key_weight",
        "pos_key_bias",
        "pos_query_weight",
        "pos_query_bias",
    }
    adapter.set_attention_weights(1, full.select_heads([3, 1]))
    attention = model.deberta.encoder.layer[1].attention.self
    assert attention.pos_key_proj.weight.shape == (16, 32)
    expected = full.position["pos_query_weight"][[3, 1]].reshape(16, 32)
    assert torch.equal(attention.pos_query_proj.weight, expected)
