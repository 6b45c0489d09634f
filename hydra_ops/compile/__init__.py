"""Compile backends for a merged :class:`~hydra_ops.hydra.merge.HydraEnsemble` (or any module with
the same call signature).

Public API (what the pipeline's compile stage codes against)::

    compile_model(model, backend, example_inputs, out_dir, *, max_batch=64, opt_batch=None,
                  precision="fp32", heldout_inputs=(), tolerance=None, min_agreement=1.0)
        -> CompiledArtifact
    load_compiled(out_dir, device=None) -> CompiledArtifact
    verify_compiled(artifact, model, heldout_inputs, *, tolerance=None, min_agreement=1.0,
                    out_path=None) -> dict
    verify_compiled_by_split(artifact, model, {split: batches}, *, tolerance=None,
                             min_agreement=1.0, reference=None) -> dict   # overall + per split
    eager_outputs(model, {split: batches}) -> {split: logits}   # a reference to check against
    available_backends() -> dict[str, str | None]   # backend -> None if usable, else the reason
    median_latency_ms(call, repeats, device=None) -> (warm-up output, median ms)

Layout: :mod:`.compiler` (:func:`compile_model`), :mod:`.inputs` (which tensors an artifact
takes), :mod:`.backends` (one builder and loader per backend, registered by name in
``BACKEND_REGISTRY``), :mod:`.artifact`
(:class:`CompiledArtifact`, :func:`load_compiled`), :mod:`.build` (one call's builds and its
``compiled.json``), :mod:`.precision` (dtypes, casting, the fast-bf16 check), :mod:`.auto` (the
measured choice), :mod:`.verify`, :mod:`.latency`.

Backends (:func:`backend_names`: ``auto`` and every registered one):

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
precision the device runs fast (bf16 only where :func:`hydra_ops.models.runtime.bf16_supported`
finds it native) against the fp32 eager model and never keeps one that disagrees beyond its
tolerance; it logs one line saying why the kept precision ships (on a CPU without native bf16:
``auto precision keeps fp32: bf16 skipped (CPU has neither amx_bf16 nor avx512_bf16 ...)``),
recorded as ``precision_reason`` in ``compiled.json``. ONNX Runtime's
CPU execution provider has no bf16 kernels, so on CPU it is an fp32-only candidate.

Every artifact directory holds the artifact file and ``compiled.json`` (:mod:`.artifact`; it
records ``precision``, ``device`` and ``device_name``). Compiled calls return float32 member
logits ``[B, M, C]`` (computed at the artifact's precision) on the device of the first input; the
batch dimension (and, for text, the sequence dimension) is dynamic: batch in ``1..max_batch``.
"""

from .artifact import (
    FORMAT,
    METADATA_FILE,
    VERIFICATION_FILE,
    CompiledArtifact,
    device_description,
    library_versions,
    load_compiled,
)
from .auto import note_precision, precision_reason
from .backends import (
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
from .compiler import CPU_BACKENDS, PRECISIONS_ALLOWED, backend_names, compile_model
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
from .verify import (
    compare_logits,
    default_tolerance,
    eager_outputs,
    verify_compiled,
    verify_compiled_by_split,
)

__all__ = [
    "ATTENTION_OPS",
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
    "backend_names",
    "cast_batch",
    "cast_model",
    "compare_logits",
    "compile_model",
    "default_tolerance",
    "device_description",
    "eager_outputs",
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
    "verify_compiled_by_split",
]
