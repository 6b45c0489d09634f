"""hydra_ops.adapters.deberta_v2: the variants it cannot reproduce are refused in one line."""

from __future__ import annotations

import pytest
from relative_models import tiny_relative_model

from hydra_ops.adapters import UnsupportedModelError, get_adapter


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"conv_kernel_size": 3}, "convolution layer"),
        ({"share_att_key": False}, "share_att_key=false"),
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
        },
    }
