"""hydra_ops.perf.cost: interleaved rounds, the ratio of medians with its round bootstrap, FLOPs. No
timing is asserted (speed lives in benchmarks/): the structure, exact FLOPs and the statistics."""

import statistics

import pytest
import torch

from hydra_ops.perf.cost import count_flops, interleaved_ms, ratio_interval


def test_interleaved_rounds_run_every_call_once_per_round_in_shuffled_orders():
    order: list[str] = []
    calls = {name: (lambda n=name: order.append(n)) for name in ("a", "b", "c")}
    times = interleaved_ms(calls, rounds=6, seed=1)
    assert sorted(times) == ["a", "b", "c"] and all(len(t) == 6 for t in times.values())
    assert all(t >= 0 for ts in times.values() for t in ts)
    warmup, rounds = order[:3], [order[3 + 3 * r : 6 + 3 * r] for r in range(6)]
    assert warmup == ["a", "b", "c"] and all(sorted(r) == ["a", "b", "c"] for r in rounds)
    assert len({tuple(r) for r in rounds}) > 1  # the order changes between rounds
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        interleaved_ms(calls, rounds=0)


def test_ratio_of_medians_and_its_round_bootstrap():
    num, den = [2.0, 2.2, 1.8, 2.1, 1.9], [1.0, 1.1, 0.9, 1.0, 1.0]
    r = ratio_interval(num, den, n_resamples=500, seed=0)
    assert r["ratio"] == pytest.approx(statistics.median(num) / statistics.median(den))
    assert r["low"] <= r["ratio"] <= r["high"] and r["high"] - r["low"] > 0
    assert ratio_interval(num, den, n_resamples=500, seed=0) == r  # seeded
    same = ratio_interval([3.0, 3.0, 3.0], [1.5, 1.5, 1.5])
    assert same == {"ratio": 2.0, "low": 2.0, "high": 2.0}
    with pytest.raises(ValueError, match="same, non-zero number of rounds"):
        ratio_interval([1.0], [1.0, 2.0])


def test_flops_of_a_matmul_are_exact():
    a, b = torch.randn(4, 8), torch.randn(8, 16)
    assert count_flops(lambda: a @ b) == 2 * 4 * 8 * 16
    layer = torch.nn.Linear(8, 3)
    x = torch.randn(5, 8)
    assert count_flops(lambda: layer(x)) == 2 * 5 * 8 * 3
    assert count_flops(lambda: x + 1) == 0  # elementwise ops have no FLOP formula
