"""Cost of every model a run evaluates, measured side by side in one process: ``metrics/cost.json``.

Every model (Hydra, single, naive pruned, control, Deep Ensemble, MC Dropout: the candidates of
``evaluate``) is timed on the same batch, backend and precision, in ``evaluate.cost_rounds``
interleaved rounds (:func:`hydra_ops.perf.cost.interleaved_ms`), and reported as a ratio to the same
run's single model with a 95% bootstrap interval over rounds
(:func:`hydra_ops.perf.cost.ratio_interval`), beside its FLOPs per batch
(``torch.utils.flop_counter``) and parameter count. Ratios within one process are what a
recommendation can rank: absolute latencies of two runs differ by more than the gaps between
models (the text study saw one model at 875-1,221 ms across runs).

``metrics/cost.json``::

    {"reference": "single", "rounds": R, "batch": B, "device": "...", "precision": "fp32",
     "pid": 1234, "models": {name: {"median_ms", "ratio", "ratio_low", "ratio_high", "flops",
     "flops_ratio", "parameters", "parameters_ratio"}},
     "shipped": {"model": "hydra", "artifact": "compiled inductor (bf16 on cpu)", ...}}

Every model is timed as an eager module at the stage's precision (the Hydra too: its eager
model); a compiled artifact that ships is timed in the same rounds and reported under
``shipped`` only (:func:`measure_candidates`). A model's ``median_ms`` is its ``latency_ms``
(``metrics/latency.json``; the Hydra's is the shipped artifact's): one timing per model and run.

Like ``metrics/latency.json`` it is a fact of this run on this machine, kept out of
``metrics/evaluate.json`` (the evaluation a gate verdict is bound to).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hydra_ops.perf.cost import count_flops, interleaved_ms, ratio_interval
from tasks.runtime.outputs import COST_FILE

__all__ = [
    "COST_FILE",
    "REFERENCE",
    "SHIPPED",
    "latency_from_cost",
    "measure_candidates",
    "measure_cost",
]

log = logging.getLogger("hydra_ens")

#: The model every ratio is taken to.
REFERENCE = "single"
#: The shipped artifact's row while it is timed; reported apart, under ``"shipped"``.
SHIPPED = "hydra_shipped"


def measure_cost(
    models: Sequence[tuple[str, Callable[[], Any], int]],
    rounds: int,
    device: torch.device | None = None,
    batch: int | None = None,
    precision: str | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """The cost record of ``models`` (``(name, call, parameters)``, ``call()`` one forward pass
    of the model on the timing batch), all timed in this process; ratios to :data:`REFERENCE`
    when it is among them, else to the first model."""
    if not models:
        raise ValueError("measure_cost needs at least one model")
    calls = {name: call for name, call, _ in models}
    params = {name: int(p) for name, _, p in models}
    reference = REFERENCE if REFERENCE in calls else models[0][0]
    flops = {name: count_flops(call) for name, call in calls.items()}
    times = interleaved_ms(calls, rounds, device, seed)
    out: dict[str, Any] = {}
    for name in sorted(calls):
        ratio = ratio_interval(times[name], times[reference], seed=seed)
        out[name] = {
            "median_ms": sorted(times[name])[len(times[name]) // 2],
            "ratio": ratio["ratio"],
            "ratio_low": ratio["low"],
            "ratio_high": ratio["high"],
            "flops": flops[name],
            "flops_ratio": flops[name] / flops[reference] if flops[reference] else None,
            "parameters": params[name],
            "parameters_ratio": params[name] / params[reference] if params[reference] else None,
        }
        log.info(
            "cost %-14s %.2fx %s [%.2f, %.2f], %.3g FLOPs, %s parameters",
            name,
            ratio["ratio"],
            reference,
            ratio["low"],
            ratio["high"],
            flops[name],
            f"{params[name]:,}",
        )
    return {
        "reference": reference,
        "rounds": rounds,
        "batch": batch,
        "device": None if device is None else str(device),
        "precision": precision,
        "pid": os.getpid(),
        "models": out,
    }


def measure_candidates(
    candidates: Sequence[Any],
    batch: Any,
    rounds: int,
    device: torch.device | None = None,
    batch_size: int | None = None,
    precision: str | None = None,
) -> dict[str, Any]:
    """:func:`measure_cost` of ``evaluate``'s candidates on ``batch``, like with like.

    Every model is timed as its eager module (the Hydra's eager model, not the compiled artifact
    that ships), so a ratio compares architectures on one backend and precision, never a bf16
    inductor program with an fp32 eager baseline. Where a compiled artifact ships it is timed in
    the same interleaved rounds and reported apart, under ``"shipped"`` (its ratio to the same
    single model, and ``artifact``: what it is), never among ``models``.
    """
    timed: list[tuple[str, Callable[[], Any], int]] = []
    shipped: tuple[str, Callable[[], Any], int] | None = None
    artifact = None
    for c in candidates:
        eager = getattr(c, "timed_eager", None) or getattr(c, "eager", None)
        run = eager if eager is not None else c.fn
        timed.append((c.name, lambda run=run: run(batch), c.parameters))
        if eager is not None:
            shipped = (SHIPPED, lambda c=c: c.fn(batch), c.parameters)
            artifact = getattr(c, "scored_by", None)
    if shipped is not None:
        timed.append(shipped)
    cost = measure_cost(timed, rounds, device, batch_size, precision)
    if shipped is not None:
        cost["shipped"] = {"model": "hydra", "artifact": artifact, **cost["models"].pop(SHIPPED)}
    return cost


def latency_from_cost(cost: dict[str, Any]) -> dict[str, float]:
    """``metrics/latency.json``: each model's median ms from ``cost``'s rounds; the Hydra's is its
    shipped artifact's where one was timed (what a user of the Hydra waits for)."""
    latency = {name: entry["median_ms"] for name, entry in cost["models"].items()}
    if "shipped" in cost:
        latency[cost["shipped"]["model"]] = cost["shipped"]["median_ms"]
    return latency
