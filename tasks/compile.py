"""Stage ``compile``: the compiled artifact of the *calibrated* model, the one that ships.

``hydra_ops.compile.compile_model`` builds the artifact of ``models/hydra`` for
``compile.backend`` (``auto``: TensorRT on CUDA when importable, else the fastest CPU backend
measured on the first check batch; ``eager``: no compilation, recorded as such) and
``hydra_ops.compile.verify_compiled_by_split`` re-checks the loaded artifact against the eager
model on held-out examples of every split evaluate scores (ID test, shift, near-OOD, far-OOD; up
to ``compile.check_examples`` each, none of them the trace example), text at several sequence
lengths (:func:`check_batches`), and on every example of those splits as evaluate batches them
(``<split>/all``, :func:`whole_split_batches`: what the gate judges): max abs difference of
ensemble probabilities and argmax agreement, overall and per split.
``compile.precision`` (default ``auto``: each (backend, precision) candidate the device runs fast
is measured against the fp32 eager model on the sample check batches, the fastest that agrees
within ``tolerance_fp32`` / ``tolerance_low_precision`` and ``min_agreement`` is chosen and then
checked on every example, where a low precision that fails ships the same backend in fp32; one
log line and ``precision_reason`` say why, e.g. why fp32 was kept; or ``fp32``, ``bf16``,
``fp16``). Building
candidates is most of ``auto``'s cost, so the candidates of a precision whose eager forward is at
least twice as slow (the inference precision probe ``calibrate`` ran on the same model,
:func:`eager_precision_ms`) are built only if no faster one agrees. The check
uses the tolerance of the precision that ships (``check.tolerance``), and evaluate scores the
artifact itself, beside the eager model (:mod:`tasks.candidates.compared`). The gate judges that
check against that same tolerance (``threshold: compile_tolerance``); with ``eager`` there is
nothing to check and the gate reports the compile checks as ``not applicable``.

``auto`` (backend or precision) is a hardware choice (:mod:`tasks.runtime.hardware`): measured
once per machine kind and model shape, the shipped candidate picked by the margin rule
(:func:`hydra_ops.compile.auto.pick`), and kept in the project's hardware record with every
trial's timings; a later run on the same kind builds the recorded candidate only
(:func:`compile_choice`). Should the recorded low-precision candidate disagree with this model's
fp32 eager forward, the same backend ships fp32.

Cached (``models/compiled``): the artifact and its ``compiled.json`` (backend, precision, device,
library versions, the check, and ``source``: the sha256 of every file of the calibrated model it
was compiled from, which evaluate, gate, bundle and ``predict`` check;
:mod:`tasks.release.custody`). Run facts that differ between two runs of the same params (build
seconds, the timings of ``auto``'s trials, the creation time) go to ``metrics/compile.json``
only, so the cached output hashes the same every time the same backend is chosen.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hydra_ops.data import Split, split_batches, text_tokenizer
from hydra_ops.measurements import MeasurementCache, machine_kind
from hydra_ops.models.runtime import resolve_device
from tasks.params.core import CoreConfig
from tasks.release.custody import source_record
from tasks.runtime.data import batches, split
from tasks.runtime.hardware import note_choice
from tasks.runtime.layout import COMPILED, HYDRA, METRICS
from tasks.runtime.outputs import publish_dir, write_json
from tasks.runtime.precision import check_batches as probe_batches
from tasks.runtime.precision import measurement_cache, needs_probe, stage_runtime
from tasks.runtime.stage import stage_main

#: The params view this stage validates ``params.yaml`` with (the sections it reads).
SCHEMA = CoreConfig

log = logging.getLogger("hydra_ens")

#: Fields of ``compiled.json`` that are facts of one run, not of the artifact.
RUN_FACTS = ("compile_seconds", "created_utc")
#: Trial fields that are timings (run facts: ``metrics/compile.json`` only).
TIMING_FIELDS = ("median_ms", "rounds_ms", "build_and_time_seconds")
#: The hardware record's kind for compile's choice.
CHOICE_KIND = "compile/choice"
#: ``compiled.json`` fields that say how ``auto`` chose: recorded with the choice, restored when
#: the recorded candidate is built, so the metadata is the same either way.
CHOICE_FIELDS = ("fallback_reason", "failed_backends", "precision_reason", "auto_selection")


def _split_run_facts(meta: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(artifact metadata, run facts)``: timings move out of what DVC caches."""
    meta = dict(meta)
    facts = {k: meta.pop(k) for k in RUN_FACTS if k in meta}
    selection = meta.get("auto_selection")
    if selection:
        timings = {
            b: {k: t[k] for k in TIMING_FIELDS if k in t}
            for b, t in selection["trials"].items()
            if "median_ms" in t  # a candidate that could not be built has no timing
        }
        trials = {
            b: {k: v for k, v in t.items() if k not in TIMING_FIELDS}
            for b, t in selection["trials"].items()
        }
        meta["auto_selection"] = {**selection, "trials": trials}
        if timings:
            facts["auto_selection_timings"] = timings
    return meta, facts


#: The splits compile's check draws held-out examples from: every split evaluate scores.
CHECK_SPLITS = ("test", "shift", "near_ood", "far_ood")


def check_lengths(max_length: int) -> tuple[int, ...]:
    """The token lengths text check batches are cut at, longest first: ``max_length``, its half
    and its quarter (at least 8; distinct values only)."""
    return tuple(sorted({max_length, max(8, max_length // 2), max(8, max_length // 4)})[::-1])


def _part(data: Split, start: int, stop: int) -> Split:
    """Examples ``start:stop`` of ``data`` as a split of their own."""
    return dataclasses.replace(
        data,
        labels=data.labels[start:stop],
        texts=None if data.texts is None else data.texts[start:stop],
        images=None if data.images is None else data.images[start:stop],
    )


def check_batches(cfg: CoreConfig, root: Path) -> tuple[dict, dict[str, list[dict]]]:
    """``(example, held-out)``: the batch the artifact is traced and timed on, and
    ``{split: batches}`` of held-out examples that compile's check compares with the eager model.

    The example is the first ``evaluate.batch_size`` ID test examples (at most half the split, so
    some stay held out). Held out: up to ``compile.check_examples`` examples of every split of
    :data:`CHECK_SPLITS` that the example does not hold, in batches of ``evaluate.batch_size``;
    text examples are cut at each length of :func:`check_lengths` in turn (a contiguous share
    each), so the dynamic sequence dimension is checked at several lengths, not one.
    """
    size = cfg.evaluate.batch_size
    test = split(root, "test")
    n_example = min(size, max(1, len(test) // 2))
    example = batches(cfg, test, n_example, with_labels=False, limit=n_example)[0]
    tokenizer = text_tokenizer(cfg.model_folder) if test.texts is not None else None
    lengths = check_lengths(cfg.model.max_length) if tokenizer is not None else (None,)
    heldout: dict[str, list[dict]] = {}
    for name in CHECK_SPLITS:
        data = split(root, name)
        start = n_example if name == "test" else 0
        part = _part(data, start, start + cfg.compile.check_examples)
        bounds = np.linspace(0, len(part), len(lengths) + 1).astype(int)
        heldout[name] = [
            b
            for length, lo, hi in zip(lengths, bounds[:-1], bounds[1:], strict=True)
            if hi > lo
            for b in split_batches(
                _part(part, lo, hi),
                size,
                tokenizer=tokenizer,
                max_length=length or cfg.model.max_length,
                image_size=cfg.model.vit.image_size,
                with_labels=False,
            )
        ]
    return example, {k: v for k, v in heldout.items() if v}


def whole_split_batches(cfg: CoreConfig, root: Path) -> dict[str, list[dict]]:
    """``{"<split>/all": batches}``: every example of each split of :data:`CHECK_SPLITS`, batched
    as evaluate batches them (``evaluate.batch_size``, ``model.max_length``), so the shipped
    artifact is checked by compile on what the gate judges, not only on a sample of it."""
    return {
        f"{name}/all": batches(cfg, data, cfg.evaluate.batch_size, with_labels=False)
        for name in CHECK_SPLITS
        if len(data := split(root, name))
    }


def eager_precision_ms(
    cfg: CoreConfig, root: Path, hydra: torch.nn.Module
) -> dict[str, float] | None:
    """``{precision: median ms}`` of the calibrated Hydra's eager forward on this machine, for the
    precisions that agree with fp32: the inference precision probe ``calibrate`` ran on the same
    model and validation batches (read back from the hardware record; measured here if it is
    missing). ``auto`` builds the candidates of a much slower precision only if no faster one
    agrees (:mod:`hydra_ops.compile.auto`). None when nothing is measured here:
    ``compile.precision`` or ``runtime.precision`` pinned, no native bf16, or model stages on a
    GPU (the probe would time the GPU; the candidates ``auto`` measures without TensorRT run on
    the CPU, where the calibrated model is loaded)."""
    from hydra_ops.perf.inference_probe import time_inference

    if cfg.compile.precision != "auto" or resolve_device(cfg.runtime.device).type != "cpu":
        return None
    if not needs_probe(cfg):
        return None
    val = batches(cfg, split(root, "val"), cfg.evaluate.batch_size)
    _, choice = stage_runtime(
        cfg,
        root,
        "compile (eager probe)",
        "inference",
        lambda: hydra,
        lambda: probe_batches(val, cfg.compile.check_examples),
        time_inference,
        log_runtime=False,
    )
    timings, check = choice.timings or {}, choice.check or {}
    ms = {"fp32": timings.get("fp32_median_ms")}
    if check.get("passed"):
        ms["bf16"] = timings.get("bf16_median_ms")
    return {p: float(v) for p, v in ms.items() if v}


def build_artifact(
    cfg: CoreConfig,
    hydra: torch.nn.Module,
    example: dict,
    heldout: dict[str, list[dict]],
    out_dir: Path,
    *,
    backend: str | None = None,
    precision: str | None = None,
    measurements: MeasurementCache | None = None,
    eager_ms: dict[str, float] | None = None,
) -> Any:
    """:func:`hydra_ops.compile.compile_model` of ``hydra`` for ``compile.backend`` and
    ``compile.precision`` (or the given ``backend`` / ``precision``), checked on ``example`` and
    every batch of ``heldout`` (:func:`check_batches`) at the configured tolerances; returns the
    loaded artifact."""
    from hydra_ops.compile import compile_model

    return compile_model(
        hydra,
        backend=backend or cfg.compile.backend,
        example_inputs=example,
        out_dir=out_dir,
        precision=precision or cfg.compile.precision,
        heldout_inputs=[b for group in heldout.values() for b in group],
        tolerance={p: cfg.compile.tolerance(p) for p in ("fp32", "bf16", "fp16")},
        min_agreement=cfg.compile.min_agreement,
        measurements=measurements,
        eager_ms=eager_ms,
    )


def choice_key(cfg: CoreConfig, hydra: torch.nn.Module, example: dict) -> dict[str, Any]:
    """What compile's ``auto`` choice depends on besides the machine kind: the request, the
    model's class, size and dtype, the example batch's shapes and the agreement criteria."""
    params = list(hydra.parameters())
    return {
        "requested": [cfg.compile.backend, cfg.compile.precision],
        "model": type(hydra).__name__,
        "parameters": sum(p.numel() for p in params),
        "dtype": str(params[0].dtype),
        "inputs": {k: list(v.shape) for k, v in sorted(example.items()) if torch.is_tensor(v)},
        "tolerances": {p: cfg.compile.tolerance(p) for p in ("fp32", "bf16", "fp16")},
        "min_agreement": cfg.compile.min_agreement,
    }


def compile_choice(
    cfg: CoreConfig,
    root: Path,
    hydra: torch.nn.Module,
    example: dict,
    heldout: dict[str, list[dict]],
    out_dir: Path,
    whole: dict[str, list[dict]] | None = None,
) -> tuple[Any, dict[str, Any], str, dict[str, Any]]:
    """``(artifact, how it was chosen, source, check)``: with nothing ``auto`` in ``compile``, the
    configured build (source ``configured``); else the recorded choice of this machine kind and
    :func:`choice_key` built as such (``recorded``), or, never measured here, ``auto`` measured
    now and its pick recorded (``measured``). ``how`` holds :data:`CHOICE_FIELDS`; ``check`` is
    the shipped artifact against the fp32 eager model on ``heldout`` and ``whole``
    (:func:`whole_split_batches`; :func:`verify`). ``auto`` chooses on ``heldout`` alone; a
    low-precision choice whose check fails (a recorded one on this model, or one that agreed on
    the sample but not on every example) ships the same backend in fp32."""
    from hydra_ops.compile import eager_outputs

    groups = {**heldout, **(whole or {})}
    reference = eager_outputs(hydra, groups)  # one eager pass, whatever is checked against it
    measurements = measurement_cache(root)
    if "auto" not in (cfg.compile.backend, cfg.compile.precision):
        artifact = build_artifact(cfg, hydra, example, heldout, out_dir)
        how = {k: artifact[k] for k in CHOICE_FIELDS if k in artifact}
        return artifact, how, "configured", verify(cfg, artifact, hydra, groups, reference)
    key, machine = choice_key(cfg, hydra, example), machine_kind()
    recorded = measurements.get(CHOICE_KIND, key, machine)
    if recorded is not None:
        backend, precision = recorded["backend"], recorded["precision"]
        log.info("compile: %s/%s, this machine kind's recorded choice", backend, precision)
        artifact = build_artifact(
            cfg, hydra, example, heldout, out_dir, backend=backend, precision=precision
        )
        how, source = dict(recorded["how"]), "recorded"
    else:
        artifact = build_artifact(
            cfg,
            hydra,
            example,
            heldout,
            out_dir,
            measurements=measurements,
            eager_ms=eager_precision_ms(cfg, root, hydra),
        )
        how, _ = _split_run_facts({k: artifact[k] for k in CHOICE_FIELDS if k in artifact})
        value = {"backend": artifact["backend"], "precision": artifact["precision"], "how": how}
        selection = artifact.get("auto_selection") or {}
        record = {**value, "trials": selection.get("trials", {})}
        measurements.put(CHOICE_KIND, key, machine, record)
        source = "measured"
    check = verify(cfg, artifact, hydra, groups, reference)
    if artifact["precision"] != "fp32" and not check["passed"]:
        backend, precision = artifact["backend"], artifact["precision"]
        failed = [name for name, part in check["splits"].items() if not part["passed"]] or ["all"]
        log.warning(
            "compile: %s failed on %s: %s/fp32 ships", precision, ", ".join(failed), backend
        )
        artifact = build_artifact(
            cfg, hydra, example, heldout, out_dir, backend=backend, precision="fp32"
        )
        how, worst = dict(how), check["max_abs_diff_probs"]
        how["precision_reason"] = (
            f"{precision} failed this model's check (max |dp| {worst:.3g}, on {', '.join(failed)})"
        )
        check = verify(cfg, artifact, hydra, groups, reference)
    return artifact, how, source, check


def verify(
    cfg: CoreConfig,
    artifact: Any,
    hydra: torch.nn.Module,
    groups: dict[str, list[dict]],
    reference: dict[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """``artifact`` against the fp32 eager ``hydra`` (its outputs ``reference`` when given) on
    every batch of ``groups``, at its precision's tolerance
    (:func:`hydra_ops.compile.verify_compiled_by_split`): the check ``compiled.json`` records and
    the gate reads."""
    from hydra_ops.compile import verify_compiled_by_split

    return verify_compiled_by_split(
        artifact,
        hydra,
        groups,
        tolerance=cfg.compile.tolerance(artifact["precision"]),
        min_agreement=cfg.compile.min_agreement,
        reference=reference,
    )


def run(cfg: CoreConfig, root: Path) -> dict[str, Any]:
    from hydra_ops.compile import METADATA_FILE, precision_name
    from hydra_ops.hydra.serialization import load_hydra

    source_hashes = source_record(root)  # hashed before loading: the record names what was loaded
    hydra = load_hydra(root / HYDRA)
    requested = cfg.compile.backend
    facts: dict[str, Any] = {}
    with publish_dir(root / COMPILED) as tmp:
        if requested == "eager":
            meta: dict[str, Any] = {
                "backend": "eager",
                "requested_backend": requested,
                "precision": precision_name(next(hydra.parameters()).dtype),
                "requested_precision": cfg.compile.precision,
                "device": "cpu",
                "source": source_hashes,
                "check": None,
            }
        else:
            example, heldout = check_batches(cfg, root)
            whole = whole_split_batches(cfg, root)
            artifact, how, source, result = compile_choice(
                cfg, root, hydra, example, heldout, tmp, whole
            )
            note_choice(
                root,
                "compile",
                "artifact",
                {"backend": artifact["backend"], "precision": artifact["precision"]},
            )
            meta = {k: v for k, v in dict(artifact).items() if k not in CHOICE_FIELDS}
            meta.update(
                how,
                requested_backend=requested,
                requested_precision=cfg.compile.precision,
            )
            meta, facts = _split_run_facts(meta)
            if source == "measured":
                facts.update(_split_run_facts(dict(artifact))[1])
            facts["choice_source"] = source
            meta.update(source=source_hashes, check=result)
        (tmp / METADATA_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    check_result = meta["check"]
    metrics = {
        "backend": meta["backend"],
        "requested_backend": requested,
        "precision": meta["precision"],
        "device": meta["device"],
        "applicable": check_result is not None,
        "compile_max_abs_diff": None
        if check_result is None
        else check_result["max_abs_diff_probs"],
        "compile_argmax_agreement": (
            None if check_result is None else check_result["argmax_agreement"]
        ),
        "check_examples": None if check_result is None else check_result["num_examples"],
        "check_splits": None
        if check_result is None
        else {k: v["num_examples"] for k, v in check_result["splits"].items()},
        "check_seq_lengths": None if check_result is None else check_result["seq_lengths"],
        "tolerance": cfg.compile.tolerance(meta["precision"]),
        "precision_reason": meta.get("precision_reason"),
        "torch": torch.__version__,
        **facts,
    }
    write_json(root / METRICS / "compile.json", metrics)
    if check_result is None:
        log.info("compile: backend eager (requested): nothing compiled, compile checks n/a")
    else:
        log.info(
            "compile: backend %s (requested %s, %s on %s), max |dp| %.2e, argmax agreement %.4f "
            "on %d held-out examples of %s at lengths %s",
            meta["backend"],
            requested,
            meta["precision"],
            meta["device"],
            check_result["max_abs_diff_probs"],
            check_result["argmax_agreement"],
            check_result["num_examples"],
            ", ".join(check_result["splits"]),
            check_result["seq_lengths"] or "n/a (images)",
        )
    return meta


def main() -> None:
    stage_main("compile", run, SCHEMA)


if __name__ == "__main__":
    main()
