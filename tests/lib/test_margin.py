"""The margin rule of every measured hardware choice: a faster option wins only clearly."""

from __future__ import annotations

import pytest

from hydra_ops.margin import clearly_faster, describe_rule


@pytest.mark.parametrize(
    ("challenger", "default", "expected"),
    [
        ((0.5, 0.6, 0.7), (1.0, 1.1, 1.2), True),  # 2x, rounds apart
        ((0.9, 0.9, 0.9), (1.0, 1.0, 1.0), False),  # 1.11x: inside the 15% margin
        ((0.86, 0.87), (1.0, 1.0), True),  # 1.16x, rounds apart
        ((0.5, 0.5, 1.05), (1.0, 1.2, 1.3), False),  # 2x, but one round slower than 1.0
        ((0.463,), (0.472,), False),  # a 1.8% difference between two backends
        ((1.0, 1.0), (0.5, 0.5), False),  # slower
    ],
)
def test_clearly_faster(challenger, default, expected):
    assert clearly_faster(challenger, default, 0.15) is expected


def test_swapping_noise_never_flips_both_ways():
    a, b = (1.00, 1.02, 1.05), (0.97, 1.01, 1.10)
    assert not clearly_faster(a, b) and not clearly_faster(b, a)


def test_bad_input_is_one_clear_error():
    with pytest.raises(ValueError, match="at least one"):
        clearly_faster((), (1.0,))
    with pytest.raises(ValueError, match="margin"):
        clearly_faster((1.0,), (1.0,), -0.1)
    assert "1.15x" in describe_rule(0.15)
