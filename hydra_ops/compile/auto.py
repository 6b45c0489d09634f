"""``auto``'s measured choice: build every candidate backend, check it against the eager model,
time it, keep the fastest that agrees.

Each candidate is built, checked against the eager model on the example inputs (max abs difference
of member probabilities within :func:`~hydra_ops.compile.verify.default_tolerance`) and timed on
them (one warm-up, then the median of ``repeats`` calls). Every trial is recorded under
``auto_selection`` in the metadata; only the winner's artifact file is kept. Which backend wins
depends on the machine (docs/benchmarks.md: inductor on an AVX2 CPU, ONNX Runtime on an AVX-512
one).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import torch

from .artifact import CompiledArtifact, model_device_dtype
from .backends import BACKEND_REGISTRY, CompileError, get_backend
from .build import Build, Built
from .latency import median_latency_ms
from .verify import default_tolerance

# The package's one logger: callers filter compile messages on this name.
log = logging.getLogger("hydra_ops.compile")


def measure_fastest(
    build: Build, candidates: Sequence[str], repeats: int, fallback_reason: str
) -> CompiledArtifact:
    """Build, check and time every available backend of ``candidates`` (in order; on a tie the
    earlier wins) and keep the fastest that agrees with the eager model.

    Raises:
        CompileError: no candidate built and agreed (every reason is in the message).
    """
    start = time.perf_counter()
    device, dtype = model_device_dtype(build.model)
    tolerance = default_tolerance(dtype)
    with torch.no_grad():
        reference = build.model(*build.tensors).float().softmax(-1)
    trials: dict[str, dict[str, Any]] = {}
    usable: dict[str, Built] = {}
    for name in candidates:
        backend = BACKEND_REGISTRY.get(name)  # an unknown name fails in build() below
        if backend is not None and (why := backend.unavailable_reason()) is not None:
            build.errors.append(f"{name}: {why}")
            continue
        t0 = time.perf_counter()
        try:
            built = build.build(name)
            runner = built[0]
            output, median_ms = median_latency_ms(
                lambda runner=runner: runner(*build.tensors), repeats, device
            )
        except Exception as error:
            build.errors.append(f"{name}: {type(error).__name__}: {error}")
            log.warning("compile: %s failed (%s); measuring the others", name, error)
            continue
        diff = float((output.float().softmax(-1) - reference).abs().max())
        trials[name] = {
            "median_ms": round(median_ms, 3),
            "max_abs_diff_member_probs": diff,
            "build_and_time_seconds": round(time.perf_counter() - t0, 2),
        }
        if diff > tolerance:
            build.errors.append(f"{name}: max |dp| {diff:.2e} > {tolerance:g} vs eager")
            continue
        usable[name] = built
    if not usable:
        raise CompileError("no backend could compile the model: " + "; ".join(build.errors))
    choice = min(usable, key=lambda b: trials[b]["median_ms"])
    kept = get_backend(choice).artifact_file
    for name in trials:  # keep only the chosen artifact
        if get_backend(name).artifact_file != kept:
            (build.out / get_backend(name).artifact_file).unlink(missing_ok=True)
    log.info(
        "compile: auto chose %s (%s)",
        choice,
        ", ".join(f"{b} {t['median_ms']:.1f} ms" for b, t in trials.items()),
    )
    runner, extra, run_device = usable[choice]
    selection = {
        "batch": int(build.tensors[0].shape[0]),
        "repeats": repeats,
        "tolerance": tolerance,
        "trials": trials,
    }
    extra = {**extra, "auto_selection": selection}
    return build.finish(choice, runner, extra, run_device, start, fallback_reason)
