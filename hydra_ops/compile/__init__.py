"""Compile backends for a merged :class:`~hydra_ops.merge.HydraEnsemble` (or any module with the
same call signature).

Public API (the pipeline's ``tasks/compile`` stage codes against this)::

    compile_model(model, backend, example_inputs, out_dir, *, max_batch=64, opt_batch=None,
                  precision="fp32", heldout_inputs=(), tolerance=None, min_agreement=1.0)
        -> CompiledArtifact
    load_compiled(out_dir, device=None) -> CompiledArtifact
    verify_compiled(artifact, model, heldout_inputs, *, tolerance=None, min_agreement=1.0,
                    out_path=None) -> dict
    available_backends() -> dict[str, str | None]   # backend -> None if usable, else the reason
    median_latency_ms(call, repeats, device=None) -> (warm-up output, median ms)

Layout: :mod:`.inputs` (which tensors an artifact takes), :mod:`.backends` (one builder and
loader per backend, registered by name in ``BACKEND_REGISTRY``), :mod:`.artifact`
(:class:`CompiledArtifact`, :func:`load_compiled`), :mod:`.build` (one call's builds and its
``compiled.json``), :mod:`.precision` (dtypes, casting, the fast-bf16 check), :mod:`.auto` (the
measured choice), :mod:`.verify`, :mod:`.latency`.

Backends (``BACKENDS``):

* ``tensorrt``: Torch-TensorRT, dynamo path, dynamic batch, saved as an ExportedProgram; attention
  must stay in TensorRT (:mod:`.backends.tensorrt`). Imported lazily, only when CUDA is present;
  otherwise one log line says so and ``auto``'s measured choice is used.
* ``inductor``: the ``torch.export`` program below, run through ``torch.compile`` (inductor)
  on load.
* ``export``: a ``torch.export`` program saved with ``torch.export.save`` (``program.pt2``); it
  loads with ``torch.export.load`` without importing ``hydra_ops`` (no project classes in the file).
* ``onnxruntime``: ``torch.onnx.export`` (dynamo exporter) to ``model.onnx``, run by an ONNX Runtime
  ``InferenceSession``.
* ``auto``: ``tensorrt`` on CUDA when importable. Otherwise *measured* over ``CPU_BACKENDS``
  (:mod:`.auto`): the fastest backend that agrees with the eager model is kept.

Precisions (:mod:`.precision`): ``fp32`` (default; the model as it is), ``bf16``, ``fp16`` (CUDA
only) or ``auto``. A candidate is (backend, precision); ``auto`` precision measures every
precision the device runs fast (bf16 only with ``amx_bf16``/``avx512_bf16`` on CPU) against the
fp32 eager model and never keeps one that disagrees beyond its tolerance; it logs one line saying
why the kept precision ships (on a CPU without fast bf16: ``auto precision keeps fp32: bf16 skipped
(CPU has no fast bf16 ...)``), recorded as ``precision_reason`` in ``compiled.json``. ONNX Runtime's
CPU execution provider has no bf16 kernels, so on CPU it is an fp32-only candidate.

Every artifact directory holds the artifact file and ``compiled.json`` (:mod:`.artifact`; it
records ``precision``, ``device`` and ``device_name``). Compiled calls return float32 member
logits ``[B, M, C]`` (computed at the artifact's precision) on the device of the first input; the
batch dimension (and, for text, the sequence dimension) is dynamic: batch in ``1..max_batch``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from .artifact import (
    FORMAT,
    METADATA_FILE,
    VERIFICATION_FILE,
    CompiledArtifact,
    device_description,
    library_versions,
    load_compiled,
    model_device_dtype,
)
from .auto import measure_fastest, note_precision, precision_reason
from .backends import (
    ARTIFACT_FILES,
    ATTENTION_OPS,
    BACKEND_REGISTRY,
    Backend,
    CompileError,
    CompileRequest,
    attention_fallback_report,
    available_backends,
    get_backend,
    register_backend,
    tensorrt_unavailable_reason,
)
from .build import Build
from .inputs import IMAGE_INPUTS, TEXT_INPUTS, arrange_inputs, input_names_of
from .latency import median_latency_ms
from .precision import (
    DEFAULT_TOLERANCES,
    DTYPES,
    PRECISIONS,
    CastModel,
    cast_batch,
    cast_model,
    fast_bf16_unavailable_reason,
    precision_name,
    precision_unavailable_reason,
)
from .verify import compare_logits, default_tolerance, verify_compiled

log = logging.getLogger(__name__)

BACKENDS = ("auto", *BACKEND_REGISTRY)
#: The backends ``auto`` measures when TensorRT is unavailable; on a tie the earlier one wins.
#: Read when :func:`compile_model` runs, so it can be narrowed (``monkeypatch.setattr``).
CPU_BACKENDS: tuple[str, ...] = ("inductor", "export", "onnxruntime")
#: ``compile_model``'s ``precision`` values.
PRECISIONS_ALLOWED = ("fp32", "bf16", "fp16", "auto")


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
) -> CompiledArtifact:
    """Compile ``model`` with ``backend`` at ``precision``, save the artifact under ``out_dir``
    and load it back.

    Args:
        model: a merged :class:`~hydra_ops.merge.HydraEnsemble` in eval mode (any module with the
            call signature ``(inputs, attention_mask=None, token_type_ids=None) -> Tensor`` works).
        backend: one of ``BACKENDS``. ``auto``: TensorRT when usable, else the fastest backend of
            ``CPU_BACKENDS`` measured here (module docstring). ``tensorrt`` without CUDA /
            Torch-TensorRT logs one line and falls back to ``auto``'s measured choice.
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

    Returns:
        The loaded :class:`CompiledArtifact` (callable, and a mapping of its metadata; its
        ``precision`` and ``device`` say what it computes in and where).

    Raises:
        ValueError: unknown ``backend`` or ``precision``, bad ``example_inputs``, ``max_batch``,
            ``auto_repeats``, ``tolerance`` or ``min_agreement``.
        CompileError: the (explicitly requested) backend or precision failed or cannot run here,
            or no candidate compiled and agreed.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
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

    def measure(backends: Sequence[str], fallback: str | None) -> CompiledArtifact:
        return measure_fastest(
            build,
            [(b, p) for b in backends for p in precisions],
            auto_repeats,
            fallback,
            heldout=heldout,
            tolerances=tolerances,
            min_agreement=min_agreement,
            skipped=skipped,
        )

    if backend == "auto" and trt_reason is None:
        try:
            if len(precisions) == 1:
                note_precision(build, precisions[0], {}, skipped)
                return build.one("tensorrt", precisions[0])
            return measure(["tensorrt"], None)
        except Exception as error:
            log.warning("compile: tensorrt failed (%s); measuring the other backends", error)
            build.errors.append(f"tensorrt: {type(error).__name__}: {error}")
            precisions, skipped = _precisions(precision, device)
            return measure(CPU_BACKENDS, "tensorrt failed")
    if backend in ("auto", "tensorrt") and trt_reason is not None:
        if backend == "tensorrt":
            log.warning("compile: tensorrt unavailable (%s); falling back to auto", trt_reason)
        return measure(CPU_BACKENDS, f"tensorrt unavailable ({trt_reason})")
    chosen = get_backend(backend)
    if (why := chosen.unavailable_reason()) is not None:
        raise CompileError(f"backend {backend!r} is unavailable: {why}")
    if len(precisions) > 1:
        return measure([backend], None)
    run_device = torch.device(chosen.device) if chosen.device is not None else device
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


__all__ = [
    "ARTIFACT_FILES",
    "ATTENTION_OPS",
    "BACKENDS",
    "BACKEND_REGISTRY",
    "CPU_BACKENDS",
    "DEFAULT_TOLERANCES",
    "DTYPES",
    "FORMAT",
    "IMAGE_INPUTS",
    "METADATA_FILE",
    "PRECISIONS",
    "PRECISIONS_ALLOWED",
    "TEXT_INPUTS",
    "VERIFICATION_FILE",
    "Backend",
    "CastModel",
    "CompileError",
    "CompileRequest",
    "CompiledArtifact",
    "arrange_inputs",
    "attention_fallback_report",
    "available_backends",
    "cast_batch",
    "cast_model",
    "compare_logits",
    "compile_model",
    "default_tolerance",
    "device_description",
    "fast_bf16_unavailable_reason",
    "get_backend",
    "input_names_of",
    "library_versions",
    "load_compiled",
    "median_latency_ms",
    "note_precision",
    "precision_name",
    "precision_reason",
    "precision_unavailable_reason",
    "register_backend",
    "tensorrt_unavailable_reason",
    "verify_compiled",
]
