"""``auto``'s measured choice: build every candidate (backend, precision), check it against the
fp32 eager model, time it, keep the fastest that agrees.

Each candidate is the model at that precision (:func:`~hydra_ops.compile.precision.cast_model`)
built with that backend. It is checked against the **fp32 eager** model on the example batch and
the held-out batches (max |dp| of ensemble probabilities within the precision's tolerance and
ensemble argmax agreement >= ``min_agreement``, :func:`~hydra_ops.compile.verify.compare_logits`)
and timed on the example batch (one warm-up, then ``repeats`` timed calls). A candidate that
disagrees is never kept. Of those that agree, the one that ships is decided by the margin rule
(:func:`pick`, :func:`hydra_ops.margin.clearly_faster`), not by the lowest median: the default is
the first agreeing candidate in a fixed order (fp32 before bf16 before fp16, then the backends in
the order given), and a later candidate replaces the current pick only when it is clearly faster
(its fastest call >= 1.15x faster and its slowest call faster than the pick's fastest). So two
runs whose timings differ by noise ship the same candidate. Every trial (backend, precision, max
|dp|, agreement, ok or why not, median ms and every round) is recorded under ``auto_selection``
in the metadata, keyed ``"<backend>/<precision>"``, with the rule; only the winner's artifact
file is kept. When the precision was ``auto``, :func:`note_precision`
logs ONE line saying why the kept precision ships (for fp32: each other precision skipped, failed
its check, could not be built, or agreed but was slower) and records it as ``precision_reason``.
Which backend wins depends on the machine (docs/benchmarks.md: inductor on an AVX2 CPU, ONNX
Runtime on an AVX-512 one).

**Fewer losers measured.** With a :class:`~hydra_ops.measurements.MeasurementCache`
(``measurements``), the medians of every candidate that was timed are kept per machine
(:func:`~hydra_ops.measurements.machine_key`), model signature and example shape. A later call on
the same machine and shape does not build a candidate that was at least :data:`SKIP_RATIO` times
slower than that measurement's fastest agreeing candidate (:func:`skip_losers`): it is recorded
as skipped under ``auto_selection["skipped_candidates"]`` with its reason (no timings: those go
to the log), and one log line names each. Should every measured candidate fail, the skipped ones
are measured after all.

**A cheaper probe first.** Without such history (a new machine, a fresh clone), building the
candidates is most of the cost (an inductor build takes tens of seconds on 2 cores), and a
precision's compiled speed follows its eager speed: a matrix-multiply-bound model gains from
bf16 about what its eager forward gains. So given the model's eager timings per precision on this
machine (``eager_ms``: e.g. the inference precision probe of :mod:`hydra_ops.perf`, which no
build needs), every candidate of a precision whose eager forward is at least :data:`SKIP_RATIO`
times slower than the fastest agreeing precision's is deferred (:func:`defer_slower_precisions`):
skipped as above with its reason, and measured after all should no candidate of a faster
precision agree.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from hydra_ops.margin import DEFAULT_MARGIN, clearly_faster, describe_rule
from hydra_ops.measurements import MeasurementCache, machine_key

from .artifact import CompiledArtifact, model_device_dtype
from .backends import BACKEND_REGISTRY, CompileError, get_backend
from .build import Build, Built
from .latency import latency_rounds_ms
from .precision import PRECISIONS
from .verify import compare_logits

# The package's one logger: callers filter compile messages on this name.
log = logging.getLogger("hydra_ops.compile")

#: One candidate: (backend name, precision).
Candidate = tuple[str, str]
#: A candidate earlier measured at least this many times slower than the fastest agreeing one
#: (same machine, model signature and shape) is not measured again.
SKIP_RATIO: float = 2.0
#: The measurement cache's kind for ``auto``'s timings.
CACHE_KIND = "compile/auto"


def skip_losers(
    candidates: Sequence[Candidate],
    history: Mapping[str, Mapping[str, Any]] | None,
    ratio: float = SKIP_RATIO,
) -> tuple[list[Candidate], dict[str, str]]:
    """``(to measure, skipped)``: ``history`` maps trial keys to an earlier measurement's
    ``{"median_ms", "ok"}``; a candidate whose earlier median is >= ``ratio`` x the fastest
    earlier candidate that agreed (``ok``) is skipped, with a one-line reason. Without history,
    or without an agreeing candidate in it, nothing is skipped; the fastest is never skipped."""
    ok = [t["median_ms"] for t in (history or {}).values() if t.get("ok") and t.get("median_ms")]
    if not ok:
        return list(candidates), {}
    best = min(ok)
    why = (
        f"lost by >= {ratio:g}x to the fastest agreeing candidate in an earlier measurement on "
        "this machine and shape"
    )

    def lost(candidate: Candidate) -> str | None:
        earlier = (history or {}).get(trial_key(*candidate), {}).get("median_ms")
        return why if earlier is not None and earlier >= ratio * best else None

    return _set_aside(candidates, lost)


def defer_slower_precisions(
    candidates: Sequence[Candidate],
    eager_ms: Mapping[str, float] | None,
    ratio: float = SKIP_RATIO,
) -> tuple[list[Candidate], dict[str, str]]:
    """``(to measure first, deferred)``: ``eager_ms`` maps a precision to the median milliseconds
    of the eager model's forward at that precision on this machine, for the precisions that agree
    with fp32 (fp32 always does); a candidate whose precision is at least ``ratio`` x slower than
    the fastest precision of ``candidates`` listed there is deferred, with a one-line reason
    (no timings: it is recorded in the artifact's metadata). Fewer than two of the candidates'
    precisions timed: nothing is deferred."""
    timed = {p: float(ms) for p, ms in (eager_ms or {}).items() if ms and ms > 0}
    present = {p for _, p in candidates if p in timed}
    if len(present) < 2:
        return list(candidates), {}
    best = min(present, key=lambda p: timed[p])

    def slower(candidate: Candidate) -> str | None:
        precision = candidate[1]
        if precision == best or timed.get(precision, 0.0) < ratio * timed[best]:
            return None
        return (
            f"eager {precision} >= {ratio:g}x slower than eager {best} on this machine "
            "(precision probe); measured only if no faster candidate agrees"
        )

    return _set_aside(candidates, slower)


def _set_aside(
    candidates: Sequence[Candidate], why_not: Callable[[Candidate], str | None]
) -> tuple[list[Candidate], dict[str, str]]:
    """``(kept, set aside)``: ``why_not(candidate)`` is the reason to set it aside, or None."""
    keep, aside = [], {}
    for candidate in candidates:
        if (why := why_not(candidate)) is None:
            keep.append(candidate)
        else:
            aside[trial_key(*candidate)] = why
    return keep, aside


def history_key(build: Build) -> dict[str, Any]:
    """What ``auto``'s timings depend on besides the machine: the model's class, parameter
    count and dtype, the example inputs' shapes and dtypes, and the number of timed repeats."""
    params = list(build.model.parameters())
    return {
        "model": type(build.model).__name__,
        "parameters": sum(p.numel() for p in params),
        "dtype": str(params[0].dtype) if params else "none",
        "inputs": [[list(t.shape), str(t.dtype)] for t in build.tensors],
    }


def trial_key(backend: str, precision: str) -> str:
    return f"{backend}/{precision}"


def precision_reason(
    chosen: str, trials: Mapping[str, Mapping[str, Any]], skipped: Mapping[str, str]
) -> str:
    """Why ``auto`` precision ships ``chosen``, in one line without timings (those are run facts).

    ``trials``: ``auto_selection["trials"]`` (may be empty: one candidate, nothing measured);
    ``skipped``: precision -> why it was not tried. For ``fp32`` every other precision gets its
    reason: skipped (why), failed its check vs the fp32 eager model (its closest trial's numbers),
    could not be built (the first error), or agreed but was slower.
    """
    if chosen != "fp32":
        return f"{chosen} is the fastest candidate that agrees with the fp32 eager model"
    parts = []
    for p in PRECISIONS:
        if p == "fp32":
            continue
        if p in skipped:
            parts.append(f"{p} skipped ({skipped[p]})")
            continue
        mine = [t for t in trials.values() if t.get("precision") == p]
        checked = [t for t in mine if "max_abs_diff_probs" in t]
        if any(t.get("ok") for t in mine):
            parts.append(f"{p} agreed but was slower")
        elif checked:
            closest = min(checked, key=lambda t: t["max_abs_diff_probs"])
            parts.append(f"{p} failed its check ({closest.get('why_not', 'disagreed')})")
        elif mine:
            parts.append(f"{p} could not be built ({str(mine[0].get('why_not', ''))[:120]})")
        else:
            parts.append(f"{p} not tried")
    return " ".join("; ".join(parts).split()) or "fp32 is the only precision"


def note_precision(
    build: Build,
    chosen: str,
    trials: Mapping[str, Mapping[str, Any]],
    skipped: Mapping[str, str],
) -> None:
    """For an ``auto`` precision request: log the one line of :func:`precision_reason` and keep
    it for ``compiled.json`` (``build.precision_reason``); nothing for an explicit precision."""
    if build.requested_precision != "auto":
        return
    build.precision_reason = precision_reason(chosen, trials, skipped)
    verb = "keeps" if chosen == "fp32" else "ships"
    log.info("compile: auto precision %s %s: %s", verb, chosen, build.precision_reason)


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
    measurements: MeasurementCache | None = None,
    eager_ms: Mapping[str, float] | None = None,
) -> CompiledArtifact:
    """Build, check and time every available candidate of ``candidates`` (in order; on a tie the
    earlier wins) and keep the fastest that agrees with the fp32 eager model.

    Args:
        heldout: further input tuples (``build.names`` order) the check runs on besides the
            example batch.
        tolerances: precision -> max |dp| of ensemble probabilities allowed.
        skipped: precision -> why ``auto`` did not try it (recorded as is).
        measurements: where earlier timings on this machine and shape are kept; candidates that
            lost by :data:`SKIP_RATIO` there are skipped (module doc). None: measure every one.
        eager_ms: precision -> the eager model's median ms on this machine, for the precisions
            that agree with fp32; candidates of a precision :data:`SKIP_RATIO` x slower than the
            fastest are deferred (:func:`defer_slower_precisions`). None: nothing deferred.

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
    key, machine = history_key(build), machine_key(device)
    history = measurements.get(CACHE_KIND, key, machine) if measurements is not None else None
    to_measure, skipped_candidates = skip_losers(candidates, history)
    for k, why in skipped_candidates.items():
        log.info("compile: auto skips %s (%s ms earlier): %s", k, history[k]["median_ms"], why)
    to_measure, deferred = defer_slower_precisions(to_measure, eager_ms)
    for k, why in deferred.items():
        ms = {p: round(float(v), 1) for p, v in (eager_ms or {}).items()}
        log.info("compile: auto defers %s (eager ms %s): %s", k, ms, why)
    skipped_candidates.update(deferred)

    def measure(chosen: list[Candidate]) -> None:
        _try(
            build,
            chosen,
            repeats,
            device,
            batches,
            reference,
            trials,
            usable,
            tolerances,
            min_agreement,
        )

    measure(to_measure)
    if not usable and skipped_candidates:
        log.warning("compile: no measured candidate agreed; measuring the skipped ones too")
        late = [c for c in candidates if trial_key(*c) in skipped_candidates]
        skipped_candidates = {}
        measure(late)
    if measurements is not None:
        timed = {
            k: {"median_ms": t["median_ms"], "ok": bool(t["ok"])}
            for k, t in trials.items()
            if "median_ms" in t
        }
        # a skipped candidate keeps its earlier timing, so it stays skipped next time
        kept = {k: v for k, v in (history or {}).items() if k in skipped_candidates}
        measurements.put(CACHE_KIND, key, machine, {**kept, **timed})
    return _keep_fastest(
        build,
        trials,
        usable,
        repeats,
        batches,
        tolerances,
        min_agreement,
        skipped,
        skipped_candidates,
        start,
        fallback_reason,
        list(dict.fromkeys(b for b, _ in candidates)),
    )


def _try(
    build: Build,
    candidates: Sequence[Candidate],
    repeats: int,
    device: torch.device,
    batches: Sequence[tuple[Tensor, ...]],
    reference: Tensor,
    trials: dict[str, dict[str, Any]],
    usable: dict[str, tuple[Candidate, Built]],
    tolerances: Mapping[str, float],
    min_agreement: float,
) -> None:
    """Build, check and time ``candidates`` into ``trials`` (and the agreeing ones ``usable``)."""
    for name, precision in candidates:
        key = trial_key(name, precision)
        trial: dict[str, Any] = {"backend": name, "precision": precision, "ok": False}
        # an unknown name fails in build() below
        backend = BACKEND_REGISTRY.get(name) if name in BACKEND_REGISTRY else None
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
            output, rounds = latency_rounds_ms(
                lambda runner=runner: runner(*build.tensors), repeats, device
            )
            median_ms = statistics.median(rounds)
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
            "rounds_ms": [round(r, 3) for r in rounds],
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


def fixed_order(keys: Sequence[str], backends: Sequence[str] = ()) -> list[str]:
    """Trial keys (``backend/precision``) in :func:`pick`'s order: by precision (fp32, bf16,
    fp16), then by the backend's place in ``backends`` (those not there last, by name)."""
    rank = {p: i for i, p in enumerate(PRECISIONS)}
    place = {b: i for i, b in enumerate(backends)}

    def order(key: str) -> tuple[int, int, str]:
        backend, precision = key.split("/")
        return rank.get(precision, len(rank)), place.get(backend, len(place)), backend

    return sorted(keys, key=order)


def pick(
    agreeing: Sequence[str],
    trials: Mapping[str, Mapping[str, Any]],
    backends: Sequence[str] = (),
    margin: float = DEFAULT_MARGIN,
) -> str:
    """The candidate that ships of ``agreeing`` (trial keys whose ``trials`` entries hold
    ``rounds_ms``): the first in :func:`fixed_order`, replaced in turn by each later one that is
    :func:`~hydra_ops.margin.clearly_faster` than the current pick. ValueError when empty."""
    if not agreeing:
        raise ValueError("pick: no agreeing candidate")
    order = fixed_order(agreeing, backends)
    current = order[0]
    for key in order[1:]:
        mine = trials[key].get("rounds_ms") or [trials[key]["median_ms"]]
        theirs = trials[current].get("rounds_ms") or [trials[current]["median_ms"]]
        if clearly_faster(mine, theirs, margin):
            current = key
    return current


def _keep_fastest(
    build: Build,
    trials: dict[str, dict[str, Any]],
    usable: dict[str, tuple[Candidate, Built]],
    repeats: int,
    batches: Sequence[tuple[Tensor, ...]],
    tolerances: Mapping[str, float],
    min_agreement: float,
    skipped: Mapping[str, str] | None,
    skipped_candidates: Mapping[str, str],
    start: float,
    fallback_reason: str | None,
    backends: Sequence[str] = (),
) -> CompiledArtifact:
    """Keep the :func:`pick` of ``usable``, delete the other artifact files, record it all."""
    if not usable:
        raise CompileError("no backend could compile the model: " + "; ".join(build.errors))
    choice = pick(list(usable), trials, backends)
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
        "rule": describe_rule(),
        "trials": trials,
    }
    if skipped_candidates:
        selection["skipped_candidates"] = dict(skipped_candidates)
    extra = {**extra, "auto_selection": selection}
    # a precision none of whose candidates was measured: skipped as a loser, say so
    losers = {
        p: skipped_candidates[k]
        for k, p in ((k, k.split("/")[1]) for k in skipped_candidates)
        if not any(t.get("precision") == p for t in trials.values())
    }
    note_precision(build, precision, trials, {**losers, **(skipped or {})})
    return build.finish(name, runner, extra, run_device, start, fallback_reason, precision)
