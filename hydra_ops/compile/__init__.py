"""Compile backends for a merged :class:`~hydra_ops.merge.HydraEnsemble` (or any module with the
same call signature).

Public API (the pipeline's ``tasks/compile`` stage codes against this)::

    compile_model(model, backend, example_inputs, out_dir, *, max_batch=64, opt_batch=None)
        -> CompiledArtifact
    load_compiled(out_dir, device=None) -> CompiledArtifact
    verify_compiled(artifact, model, heldout_inputs, *, tolerance=None, min_agreement=1.0,
                    out_path=None) -> dict
    available_backends() -> dict[str, str | None]   # backend -> None if usable, else the reason
    median_latency_ms(call, repeats, device=None) -> (warm-up output, median ms)

Layout: :mod:`.inputs` (which tensors an artifact takes), :mod:`.backends` (one builder and
loader per backend, registered by name in ``BACKEND_REGISTRY``), :mod:`.artifact`
(:class:`CompiledArtifact`, :func:`load_compiled`), :mod:`.build` (one call's builds and its
``compiled.json``), :mod:`.auto` (the measured choice), :mod:`.verify`, :mod:`.latency`.

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

Every artifact directory holds the artifact file and ``compiled.json`` (:mod:`.artifact`).
Compiled calls return member logits ``[B, M, C]`` on the device of the first input; the batch
dimension (and, for text, the sequence dimension) is dynamic: batch in ``1..max_batch``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

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
from .auto import measure_fastest
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
from .verify import default_tolerance, verify_compiled

log = logging.getLogger(__name__)

BACKENDS = ("auto", *BACKEND_REGISTRY)
#: The backends ``auto`` measures when TensorRT is unavailable; on a tie the earlier one wins.
#: Read when :func:`compile_model` runs, so it can be narrowed (``monkeypatch.setattr``).
CPU_BACKENDS: tuple[str, ...] = ("inductor", "export", "onnxruntime")


def compile_model(
    model: nn.Module,
    backend: str,
    example_inputs: Mapping[str, Tensor] | Sequence[Tensor | None],
    out_dir: str | os.PathLike[str],
    *,
    max_batch: int = 64,
    opt_batch: int | None = None,
    auto_repeats: int = 5,
) -> CompiledArtifact:
    """Compile ``model`` with ``backend``, save the artifact under ``out_dir`` and load it back.

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
        auto_repeats: timed calls per backend when ``auto`` measures (after one warm-up).

    Returns:
        The loaded :class:`CompiledArtifact` (callable, and a mapping of its metadata).

    Raises:
        ValueError: unknown ``backend``, bad ``example_inputs``, ``max_batch`` or ``auto_repeats``.
        CompileError: the (explicitly requested) backend failed, or no backend could compile.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    if not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be an int >= 1, got {max_batch!r}")
    if not isinstance(auto_repeats, int) or auto_repeats < 1:
        raise ValueError(f"auto_repeats must be an int >= 1, got {auto_repeats!r}")
    names = input_names_of(example_inputs)
    tensors = arrange_inputs(example_inputs, names)
    if tensors[0].shape[0] > max_batch:
        raise ValueError(
            f"max_batch must be >= the example batch size {tensors[0].shape[0]}, got {max_batch}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    device, _ = model_device_dtype(model)
    tensors = tuple(t.to(device) for t in tensors)
    build = Build(model, tensors, names, out, max_batch, opt_batch or tensors[0].shape[0], backend)

    trt_reason = tensorrt_unavailable_reason() if backend in ("auto", "tensorrt") else None
    if backend == "auto" and trt_reason is None:
        try:
            return build.one("tensorrt")
        except Exception as error:
            log.warning("compile: tensorrt failed (%s); measuring the other backends", error)
            build.errors.append(f"tensorrt: {type(error).__name__}: {error}")
            return measure_fastest(build, CPU_BACKENDS, auto_repeats, "tensorrt failed")
    if backend in ("auto", "tensorrt") and trt_reason is not None:
        if backend == "tensorrt":
            log.warning("compile: tensorrt unavailable (%s); falling back to auto", trt_reason)
        return measure_fastest(
            build, CPU_BACKENDS, auto_repeats, f"tensorrt unavailable ({trt_reason})"
        )
    if (why := get_backend(backend).unavailable_reason()) is not None:
        raise CompileError(f"backend {backend!r} is unavailable: {why}")
    try:
        return build.one(backend)
    except CompileError:
        raise
    except Exception as error:
        raise CompileError(f"{backend}: {type(error).__name__}: {error}") from error


__all__ = [
    "ARTIFACT_FILES",
    "ATTENTION_OPS",
    "BACKENDS",
    "BACKEND_REGISTRY",
    "CPU_BACKENDS",
    "FORMAT",
    "IMAGE_INPUTS",
    "METADATA_FILE",
    "TEXT_INPUTS",
    "VERIFICATION_FILE",
    "Backend",
    "CompileError",
    "CompileRequest",
    "CompiledArtifact",
    "arrange_inputs",
    "attention_fallback_report",
    "available_backends",
    "compile_model",
    "default_tolerance",
    "device_description",
    "get_backend",
    "input_names_of",
    "library_versions",
    "load_compiled",
    "median_latency_ms",
    "register_backend",
    "tensorrt_unavailable_reason",
    "verify_compiled",
]
