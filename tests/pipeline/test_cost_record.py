"""tasks.evaluation.cost: the cost record evaluate writes (metrics/cost.json), every model timed in
one process (real tiny torch models; no timing asserted, only the record's invariants)."""

from __future__ import annotations

import os

import torch


def test_the_cost_record_times_every_model_in_one_process():
    from tasks.evaluation.cost import measure_cost

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


def test_the_hydra_is_timed_as_its_eager_model_and_the_shipped_artifact_apart():
    """Like with like: the Hydra's ratio comes from its eager model, whatever ships; a compiled
    artifact is timed in the same rounds and reported under ``shipped`` only."""
    from types import SimpleNamespace

    from tasks.evaluation.cost import measure_candidates

    torch.manual_seed(0)
    x = torch.randn(4, 16)
    small, wide = torch.nn.Linear(16, 16), torch.nn.Linear(16, 48)
    calls: list[str] = []

    def run(name, module):
        return lambda b: (calls.append(name), module(b))[1]

    hydra = SimpleNamespace(
        name="hydra",
        fn=run("artifact", small),
        eager=run("eager", wide),
        parameters=1,
        scored_by="compiled inductor (bf16 on cpu)",
    )
    single = SimpleNamespace(name="single", fn=run("single", small), parameters=1)
    cost = measure_candidates([hydra, single], x, rounds=2, batch_size=4, precision="fp32")
    assert sorted(cost["models"]) == ["hydra", "single"]
    assert cost["models"]["hydra"]["flops_ratio"] == 3.0  # the eager (wide) model's FLOPs
    shipped = cost["shipped"]
    assert shipped["model"] == "hydra" and shipped["artifact"] == hydra.scored_by
    assert shipped["flops_ratio"] == 1.0 and shipped["ratio_low"] <= shipped["ratio_high"]
    assert {"artifact", "eager", "single"} <= set(calls)
    no_artifact = measure_candidates([single], x, rounds=2)
    assert "shipped" not in no_artifact


def test_the_hydra_is_timed_at_the_stage_precision_and_its_latency_is_what_ships() -> None:
    from types import SimpleNamespace

    from tasks.candidates.compared import ShippedHydra
    from tasks.evaluation.cost import latency_from_cost, measure_candidates

    x = torch.randn(4, 16)
    calls: list[str] = []

    def run(name):
        return lambda b: (calls.append(name), b)[1]

    hydra = ShippedHydra(
        run("artifact"), 1, 3, "compiled inductor (bf16 on cpu)", run("fp32 eager"), run("bf16")
    )
    single = SimpleNamespace(name="single", fn=run("single"), parameters=1)
    cost = measure_candidates([hydra, single], x, rounds=3, batch_size=4, precision="bf16")
    # the cost row times the eager model at the stage's precision, never the fp32 reference
    assert "fp32 eager" not in calls and {"bf16", "artifact", "single"} <= set(calls)
    latency = latency_from_cost(cost)
    assert latency["hydra"] == cost["shipped"]["median_ms"]
    assert latency["single"] == cost["models"]["single"]["median_ms"]
    assert sorted(latency) == ["hydra", "single"]
