"""``auto``'s measured choice: build every candidate (backend, precision), check it against the
fp32 eager model, time it, keep the fastest that agrees.

Each candidate is the model at that precision (:func:`~hydra_ops.compile.precision.cast_model`)
built with that backend. It is checked against the **fp32 eager** model on the example batch and
the held-out batches (max |dp| of ensemble probabilities within the precision's tolerance and
ensemble argmax agreement >= ``min_agreement``, :func:`~hydra_ops.compile.verify.compare_logits`)
and timed on the example batch (one warm-up, then the median of ``repeats`` calls). A candidate
that disagrees is never kept. Every trial (backend, precision, max |dp|, agreement, ok or why not,
median ms) is recorded under ``auto_selection`` in the metadata, keyed ``"<backend>/<precision>"``;
only the winner's artifact file is kept. Which backend wins depends on the machine
(docs/benchmarks.md: inductor on an AVX2 CPU, ONNX Runtime on an AVX-512 one).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from .artifact import CompiledArtifact, model_device_dtype
from .backends import BACKEND_REGISTRY, CompileError, get_backend
from .build import Build, Built
from .latency import median_latency_ms
from .verify import compare_logits

# The package's one logger: callers filter compile messages on this name.
log = logging.getLogger("hydra_ops.compile")

#: One candidate: (backend name, precision).
Candidate = tuple[str, str]


def trial_key(backend: str, precision: str) -> str:
    return f"{backend}/{precision}"


def measure_fastest(
    build: Build,
    candidates: Sequence[Candidate],
    repeats: int,
    fallback_reason: str | None,
    *,
    heldout: Sequence[tuple[Tensor, ...]] = (),
    tolerances: Mapping[str, float],
    min_agreement: float = 1.0,
    skipped: Mapping[str, str] | None = None,
) -> CompiledArtifact:
    """Build, check and time every available candidate of ``candidates`` (in order; on a tie the
    earlier wins) and keep the fastest that agrees with the fp32 eager model.

    Args:
        heldout: further input tuples (``build.names`` order) the check runs on besides the
            example batch.
        tolerances: precision -> max |dp| of ensemble probabilities allowed.
        skipped: precision -> why ``auto`` did not try it (recorded as is).

    Raises:
        CompileError: no candidate built and agreed (every reason is in the message).
    """
    start = time.perf_counter()
    device, _ = model_device_dtype(build.model)
    batches = [build.tensors, *heldout]
    with torch.no_grad():
        reference = torch.cat([build.model(*b).float().cpu() for b in batches])
    trials: dict[str, dict[str, Any]] = {}
    usable: dict[str, tuple[Candidate, Built]] = {}
    for name, precision in candidates:
        key = trial_key(name, precision)
        trial: dict[str, Any] = {"backend": name, "precision": precision, "ok": False}
        backend = BACKEND_REGISTRY.get(name)  # an unknown name fails in build() below
        if backend is not None and (why := backend.unavailable_reason()) is not None:
            build.errors.append(f"{name}: {why}")
            continue
        if backend is not None and (why := backend.precision_reason(precision, device)):
            trials[key] = {**trial, "why_not": why}
            continue
        t0 = time.perf_counter()
        try:
            built = build.build(name, precision)
            runner = built[0]
            output, median_ms = median_latency_ms(
                lambda runner=runner: runner(*build.tensors), repeats, device
            )
            with torch.no_grad():
                outputs = [output] + [runner(*b) for b in batches[1:]]
            compiled = torch.cat([o.float().cpu() for o in outputs])
        except Exception as error:
            build.errors.append(f"{key}: {type(error).__name__}: {error}")
            log.warning("compile: %s failed (%s); measuring the others", key, error)
            trials[key] = {**trial, "why_not": f"{type(error).__name__}: {error}"[:300]}
            continue
        tolerance = tolerances[precision]
        check = compare_logits(reference, compiled, tolerance, min_agreement)
        trials[key] = {
            **trial,
            "ok": check["passed"],
            "max_abs_diff_probs": check["max_abs_diff_probs"],
            "max_abs_diff_member_probs": check["max_abs_diff_member_probs"],
            "argmax_agreement": check["argmax_agreement"],
            "tolerance": tolerance,
            "median_ms": round(median_ms, 3),
            "build_and_time_seconds": round(time.perf_counter() - t0, 2),
        }
        if not check["passed"]:
            why = (
                f"max |dp| {check['max_abs_diff_probs']:.2e} (tolerance {tolerance:g}), "
                f"argmax agreement {check['argmax_agreement']:.4f} (min {min_agreement:g}) "
                "vs fp32 eager"
            )
            trials[key]["why_not"] = why
            build.errors.append(f"{key}: {why}")
            continue
        usable[key] = ((name, precision), built)
    if not usable:
        raise CompileError("no backend could compile the model: " + "; ".join(build.errors))
    choice = min(usable, key=lambda k: trials[k]["median_ms"])
    (name, precision), (runner, extra, run_device) = usable[choice]
    kept = get_backend(name).artifact_file
    for trial in trials.values():  # keep only the chosen artifact (fp32 builds live in out)
        if (
            trial["backend"] in BACKEND_REGISTRY
            and get_backend(trial["backend"]).artifact_file != kept
        ):
            (build.out / get_backend(trial["backend"]).artifact_file).unlink(missing_ok=True)
    if precision != "fp32":
        (build.out / kept).unlink(missing_ok=True)  # an fp32 build of the same file
    log.info(
        "compile: auto chose %s (%s)",
        choice,
        ", ".join(f"{k} {t['median_ms']:.1f} ms" for k, t in trials.items() if "median_ms" in t),
    )
    selection = {
        "batch": int(build.tensors[0].shape[0]),
        "heldout_examples": int(sum(b[0].shape[0] for b in batches[1:])),
        "repeats": repeats,
        "tolerance": tolerances.get(precision),
        "tolerances": dict(tolerances),
        "min_agreement": float(min_agreement),
        "skipped_precisions": dict(skipped or {}),
        "trials": trials,
    }
    extra = {**extra, "auto_selection": selection}
    return build.finish(name, runner, extra, run_device, start, fallback_reason, precision)
