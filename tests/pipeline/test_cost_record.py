"""tasks.cost: the cost record evaluate writes (metrics/cost.json), every model timed in one
process (real tiny torch models; no timing asserted, only the record's invariants)."""

from __future__ import annotations

import os

import torch


def test_the_cost_record_times_every_model_in_one_process():
    from tasks.cost import measure_cost

    torch.manual_seed(0)
    x = torch.randn(4, 16)
    small, big = torch.nn.Linear(16, 16), torch.nn.Linear(16, 64)
    models = [
        ("hydra", lambda: (small(x), small(x)), 2 * 272),
        ("single", lambda: small(x), 272),
        ("deep_ensemble", lambda: big(x), 1088),
    ]
    cost = measure_cost(models, rounds=3, batch=4, precision="fp32")
    assert cost["reference"] == "single" and cost["pid"] == os.getpid() and cost["rounds"] == 3
    m = cost["models"]
    assert sorted(m) == ["deep_ensemble", "hydra", "single"]
    assert m["single"]["ratio"] == 1.0 and m["single"]["ratio_low"] == 1.0
    assert m["hydra"]["flops"] == 2 * 2 * 4 * 16 * 16 and m["hydra"]["flops_ratio"] == 2.0
    assert (
        m["deep_ensemble"]["flops_ratio"] == 4.0 and m["deep_ensemble"]["parameters_ratio"] == 4.0
    )
    for e in m.values():
        assert e["ratio_low"] <= e["ratio"] <= e["ratio_high"] and e["median_ms"] > 0
