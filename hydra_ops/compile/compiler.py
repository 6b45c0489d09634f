"""``compile_model``: one model compiled with a backend at a precision, or the measured choice
among them (``auto``), saved, loaded back and checked against the eager model (see the package
docstring for the backends and precisions)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from hydra_ops.measurements import MeasurementCache

from .artifact import CompiledArtifact, model_device_dtype
from .auto import measure_fastest, note_precision
from .backends import BACKEND_REGISTRY, CompileError, get_backend, tensorrt_unavailable_reason
from .build import Build
from .inputs import arrange_inputs, input_names_of
from .precision import (
    DEFAULT_TOLERANCES,
    PRECISIONS,
    fast_bf16_unavailable_reason,
    precision_name,
    precision_unavailable_reason,
)

log = logging.getLogger("hydra_ops.compile")

#: The backends ``auto`` measures when TensorRT is unavailable; on a tie the earlier one wins.
#: Read when :func:`compile_model` runs, so a test can narrow it here (``monkeypatch.setattr`` on
#: this module, ``hydra_ops.compile.compiler``).
CPU_BACKENDS: tuple[str, ...] = ("inductor", "export", "onnxruntime")
#: ``compile_model``'s ``precision`` values.
PRECISIONS_ALLOWED = ("fp32", "bf16", "fp16", "auto")


def backend_names() -> tuple[str, ...]:
    """``compile_model``'s ``backend`` values now: ``auto`` and every registered backend (read
    from the registry at each call, so one added later with ``register_backend`` is in)."""
    return ("auto", *BACKEND_REGISTRY.names())


def compile_model(
    model: nn.Module,
    backend: str,
    example_inputs: Mapping[str, Tensor] | Sequence[Tensor | None],
    out_dir: str | os.PathLike[str],
    *,
    max_batch: int = 64,
    opt_batch: int | None = None,
    auto_repeats: int = 5,
    precision: str = "fp32",
    heldout_inputs: Sequence[Mapping[str, Tensor] | Sequence[Tensor | None]] = (),
    tolerance: float | Mapping[str, float] | None = None,
    min_agreement: float = 1.0,
    measurements: MeasurementCache | None = None,
    eager_ms: Mapping[str, float] | None = None,
) -> CompiledArtifact:
    """Compile ``model`` with ``backend`` at ``precision``, save the artifact under ``out_dir``
    and load it back.

    Args:
        model: a merged :class:`~hydra_ops.hydra.merge.HydraEnsemble` in eval mode (any module with
            the call signature ``(inputs, attention_mask=None, token_type_ids=None) -> Tensor``
            works).
        backend: one of :func:`backend_names`. ``auto``: TensorRT when usable, else the fastest
            backend of ``CPU_BACKENDS`` measured here (module docstring). ``tensorrt`` without
            CUDA / Torch-TensorRT logs one line and falls back to ``auto``'s measured choice.
        example_inputs: one contract batch (mapping) or the model's positional tensors; sets the
            input names and the non-batch shape (TensorRT), is the export trace input and what
            ``auto`` times the backends on (use a batch of the size you will serve).
        out_dir: directory for the artifact and ``compiled.json`` (created if needed).
        max_batch: largest batch the artifact must accept (dynamic batch ``1..max_batch``).
        opt_batch: TensorRT's optimisation batch (default: the example's batch size).
        auto_repeats: timed calls per candidate when ``auto`` measures (after one warm-up).
        precision: one of ``PRECISIONS_ALLOWED``. ``fp32`` (default): the model as it is (an fp32
            model gives the same artifact as before precisions existed). ``bf16``/``fp16``: the
            model cast to that dtype (:class:`~hydra_ops.compile.precision.CastModel`: fp32
            inputs and fp32 logits, so the call convention is unchanged); ``fp16`` only on CUDA.
            ``auto``: every precision this device runs fast is a candidate (bf16 is skipped on a
            CPU without ``amx_bf16``/``avx512_bf16``); the candidates (backend, precision) are
            measured and the fastest that agrees with the fp32 eager model is kept; one log line
            (and ``precision_reason`` in the metadata) says why the kept precision ships.
        heldout_inputs: further batches the measured check runs on (besides the example).
        tolerance: max |dp| of ensemble probabilities vs the fp32 eager model, one float for every
            precision or ``{precision: float}`` (default :data:`DEFAULT_TOLERANCES`).
        min_agreement: minimum ensemble argmax agreement with the fp32 eager model.
        measurements: ``auto``'s timings on this machine and shape are kept there, and
            candidates that lost by a wide margin before are skipped (:mod:`.auto`).
        eager_ms: ``{precision: median ms}`` of ``model``'s eager forward on the device it is
            on, for the precisions that agree with fp32 (e.g. the inference precision probe):
            ``auto`` measures the candidates of a precision
            :data:`~hydra_ops.compile.auto.SKIP_RATIO` x slower than the fastest only if no faster
            candidate agrees (:mod:`.auto`). Not applied to a backend that runs elsewhere
            (TensorRT: CUDA).

    Returns:
        The loaded :class:`CompiledArtifact` (callable, and a mapping of its metadata; its
        ``precision`` and ``device`` say what it computes in and where).

    Raises:
        ValueError: unknown ``backend`` or ``precision``, bad ``example_inputs``, ``max_batch``,
            ``auto_repeats``, ``tolerance`` or ``min_agreement``.
        CompileError: the (explicitly requested) backend or precision failed or cannot run here,
            or no candidate compiled and agreed.
    """
    if backend != "auto" and backend not in BACKEND_REGISTRY:
        raise ValueError(BACKEND_REGISTRY.unknown(backend, "backend", also=("auto",)))
    if precision not in PRECISIONS_ALLOWED:
        raise ValueError(f"precision must be one of {list(PRECISIONS_ALLOWED)}, got {precision!r}")
    if not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be an int >= 1, got {max_batch!r}")
    if not isinstance(auto_repeats, int) or auto_repeats < 1:
        raise ValueError(f"auto_repeats must be an int >= 1, got {auto_repeats!r}")
    if not 0.0 <= min_agreement <= 1.0:
        raise ValueError(f"min_agreement must be in [0, 1], got {min_agreement!r}")
    tolerances = _tolerances(tolerance)
    names = input_names_of(example_inputs)
    tensors = arrange_inputs(example_inputs, names)
    if tensors[0].shape[0] > max_batch:
        raise ValueError(
            f"max_batch must be >= the example batch size {tensors[0].shape[0]}, got {max_batch}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    device, dtype = model_device_dtype(model)
    if precision == "fp32" and precision_name(dtype) != "fp32":
        precision = precision_name(dtype)  # "as the model is": a bf16 model stays bf16
    tensors = tuple(t.to(device) for t in tensors)
    heldout = [tuple(t.to(device) for t in arrange_inputs(b, names)) for b in heldout_inputs]
    build = Build(
        model,
        tensors,
        names,
        out,
        max_batch,
        opt_batch or tensors[0].shape[0],
        backend,
        requested_precision=precision,
    )

    trt_reason = tensorrt_unavailable_reason() if backend in ("auto", "tensorrt") else None
    precisions, skipped = _precisions(
        precision,
        torch.device("cuda") if trt_reason is None and backend in ("auto", "tensorrt") else device,
    )

    def measure(
        backends: Sequence[str], fallback: str | None, eager: Mapping[str, float] | None
    ) -> CompiledArtifact:
        return measure_fastest(
            build,
            [(b, p) for b in backends for p in precisions],
            auto_repeats,
            fallback,
            heldout=heldout,
            tolerances=tolerances,
            min_agreement=min_agreement,
            skipped=skipped,
            measurements=measurements,
            eager_ms=eager,
        )

    if backend == "auto" and trt_reason is None:
        try:
            if len(precisions) == 1:
                note_precision(build, precisions[0], {}, skipped)
                return build.one("tensorrt", precisions[0])
            # TensorRT's candidates run on CUDA: eager_ms timed the model on its own device
            return measure(["tensorrt"], None, None)
        except Exception as error:
            log.warning("compile: tensorrt failed (%s); measuring the other backends", error)
            build.errors.append(f"tensorrt: {type(error).__name__}: {error}")
            precisions, skipped = _precisions(precision, device)
            return measure(CPU_BACKENDS, "tensorrt failed", eager_ms)
    if backend in ("auto", "tensorrt") and trt_reason is not None:
        if backend == "tensorrt":
            log.warning("compile: tensorrt unavailable (%s); falling back to auto", trt_reason)
        return measure(CPU_BACKENDS, f"tensorrt unavailable ({trt_reason})", eager_ms)
    chosen = get_backend(backend)
    if (why := chosen.unavailable_reason()) is not None:
        raise CompileError(f"backend {backend!r} is unavailable: {why}")
    run_device = torch.device(chosen.device) if chosen.device is not None else device
    if len(precisions) > 1:
        return measure([backend], None, eager_ms if run_device.type == device.type else None)
    if (why := chosen.precision_reason(precisions[0], run_device)) is not None:
        raise CompileError(f"backend {backend!r} cannot run precision {precisions[0]!r}: {why}")
    note_precision(build, precisions[0], {}, skipped)
    try:
        return build.one(backend, precisions[0])
    except CompileError:
        raise
    except Exception as error:
        raise CompileError(f"{backend}: {type(error).__name__}: {error}") from error


def _tolerances(tolerance: float | Mapping[str, float] | None) -> dict[str, float]:
    """``{precision: max |dp|}`` from ``compile_model``'s ``tolerance`` argument."""
    if tolerance is None:
        return dict(DEFAULT_TOLERANCES)
    if isinstance(tolerance, Mapping):
        unknown = set(tolerance) - set(PRECISIONS)
        if unknown:
            raise ValueError(f"tolerance keys must be in {list(PRECISIONS)}, got {sorted(unknown)}")
        values = {**DEFAULT_TOLERANCES, **{k: float(v) for k, v in tolerance.items()}}
    else:
        values = dict.fromkeys(PRECISIONS, float(tolerance))
    if any(not v > 0 for v in values.values()):
        raise ValueError(f"tolerance must be > 0, got {tolerance!r}")
    return values


def _precisions(precision: str, device: torch.device) -> tuple[list[str], dict[str, str]]:
    """The precisions to try for ``precision`` on ``device`` and why the others are skipped
    (``auto`` only; an explicit fp16 request without CUDA is a CompileError)."""
    if precision != "auto":
        if (why := precision_unavailable_reason(precision, device)) is not None:
            raise CompileError(f"precision {precision!r} cannot run on {device}: {why}")
        return [precision], {}
    skipped: dict[str, str] = {}
    for p in PRECISIONS:
        why = precision_unavailable_reason(p, device)
        if why is None and p != "fp32":
            why = fast_bf16_unavailable_reason(device) if p == "bf16" else None
        if why is not None:
            skipped[p] = why
    # the one log line saying why (auto.note_precision) comes once the choice is made
    return [p for p in PRECISIONS if p not in skipped], skipped
