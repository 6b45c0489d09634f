"""The precision a model stage runs in: ``runtime.precision`` resolved per stage, machine and shape.

``auto`` (the default) goes through :func:`hydra_ops.perf.precision_probe.choose_precision`: fp32
with no measurement on a device without native bf16 (the exact fp32 path of the stage), else a short
probe of both precisions on the stage's real model and a real batch (training stages: a few training
steps; inference stages: forward timing and bf16-vs-fp32 agreement within
``compile.tolerance_low_precision`` / ``compile.min_agreement``, the check compile applies to a
bf16 artifact), decided by the margin rule (:mod:`hydra_ops.margin`). Probes are kept in the
project's hardware record (:mod:`tasks.runtime.hardware`: ``hardware/<machine kind>.json``,
tracked by git): the same machine kind and shape get the same answer on every run, in every
clone, and members fine-tuned in parallel share one probe; the stage's resolved precision goes to
``hardware/choices.yaml``, its DVC dependency.

The stage logs :meth:`~hydra_ops.perf.precision_probe.PrecisionChoice.describe` and records
:func:`precision_record` (precision and request, what the same inputs on this machine always give)
in its cached outputs and :meth:`~hydra_ops.perf.precision_probe.PrecisionChoice.to_dict` (reason,
timings, source) in its uncached metrics. Since ``auto`` may give different weights on different
machines, a version's ``precisions`` (``models/hydra``'s metadata, shown in the model card) say
what each stage resolved to; ``--set runtime.precision=fp32`` (or ``bf16``) pins it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from hydra_ops.measurements import MeasurementCache
from hydra_ops.models.runtime import Runtime, resolve_device
from hydra_ops.perf.precision_probe import (
    Bf16Support,
    PrecisionChoice,
    Timings,
    Use,
    choose_precision,
)
from tasks.params.core import CoreConfig
from tasks.runtime import data, hardware

log = logging.getLogger("hydra_ens")


def measurement_cache(root: Path) -> MeasurementCache:
    """This machine kind's hardware record (:func:`tasks.runtime.hardware.record`)."""
    return hardware.record(root)


def needs_probe(cfg: CoreConfig) -> bool:
    """Whether ``auto`` must measure here (native bf16); False: no model needs loading for it."""
    if cfg.runtime.precision != "auto":
        return False
    return Bf16Support.of(resolve_device(cfg.runtime.device)).native


def stage_runtime(
    cfg: CoreConfig,
    root: Path,
    stage: str,
    use: Use,
    model_fn: Callable[[], torch.nn.Module] | None = None,
    batches_fn: Callable[[], Sequence[dict]] | None = None,
    measure_fn: Callable[..., tuple[Timings, dict[str, Any] | None]] | None = None,
    *,
    log_runtime: bool = True,
) -> tuple[Runtime, PrecisionChoice]:
    """``(runtime, choice)`` of ``stage``; ``model_fn`` / ``batches_fn`` build the probe's model
    and batches, called only when ``auto`` measures (see module doc). An inference stage passes
    ``measure_fn(model, batches, device, tolerance=, min_agreement=)``
    (:func:`hydra_ops.perf.inference_probe.time_inference`; not imported here, so that the training
    stages do not depend on the compile code it uses). Logs the choice and, with
    ``log_runtime``, the runtime line (:meth:`Runtime.describe`)."""
    device = resolve_device(cfg.runtime.device)
    model = batches = measure = None
    if needs_probe(cfg):
        if model_fn is None or batches_fn is None:
            raise ValueError(f"{stage}: precision auto needs the model and a batch to measure")
        model, batches = model_fn(), list(batches_fn())
        if measure_fn is not None:

            def measure() -> tuple[Timings, dict[str, Any] | None]:
                return measure_fn(
                    model,
                    batches,
                    device,
                    tolerance=cfg.compile.tolerance_low_precision,
                    min_agreement=cfg.compile.min_agreement,
                )

    choice = choose_precision(
        cfg.runtime.precision,
        device,
        use,
        model=model,
        batches=batches or (),
        cache=measurement_cache(root),
        tolerance=cfg.compile.tolerance_low_precision,
        measure=measure,
    )
    rt = Runtime(device, choice.precision, choice.reason)
    dvc_stage, _, unit = stage.partition(" ")
    if dvc_stage in hardware.STAGES:
        label = f"{use} precision" + (f" {unit}" if unit else "")
        hardware.note_choice(root, dvc_stage, label, choice.precision)
    log.info("%s: %s", stage, choice.describe())
    if log_runtime:
        log.info(rt.describe())
    return rt, choice


def precision_record(cfg: CoreConfig, rt: Runtime) -> dict[str, Any]:
    """What a cached output records of its precision: the resolved one and the request."""
    return {"precision": rt.precision, "requested": cfg.runtime.precision, "device": rt.device.type}


def check_batches(batches: Sequence[dict], examples: int) -> list[dict]:
    """The first batches of ``batches`` holding at least ``examples`` examples (at least one):
    what an inference probe times (the first) and checks bf16 against fp32 on (all)."""
    out, seen = [], 0
    for batch in batches:
        out.append(batch)
        seen += int(next(iter(batch.values())).shape[0])
        if seen >= examples:
            break
    return out


def probe_batch(cfg: CoreConfig, root: Path) -> list[dict]:
    """The first ``finetune.batch_size`` training examples in file order, one batch with labels:
    what a training stage's precision probe times (the same for every seed and unit)."""
    n = cfg.finetune.batch_size
    return data.batches(cfg, data.split(root, "train"), n, limit=n)[:1]
