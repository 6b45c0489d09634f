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

Backends (``BACKENDS``):

* ``tensorrt``: Torch-TensorRT, dynamo path (``torch_tensorrt.compile(ir="dynamo")``),
  precision from the model's dtype (explicit typing; 2.13+ ignores ``enabled_precisions``),
  dynamic batch via ``torch_tensorrt.Input(min_shape, opt_shape, max_shape)``, saved with
  ``torch_tensorrt.save`` as an ExportedProgram. A dry run first checks that attention is not
  partitioned back to PyTorch.
  Imported lazily, only when CUDA is present; otherwise one log line says so and ``auto``'s
  measured choice is used.
* ``inductor``: the ``torch.export`` program below, run through ``torch.compile`` (inductor)
  on load.
* ``export``: a ``torch.export`` program saved with ``torch.export.save`` (``program.pt2``); it
  loads with ``torch.export.load`` without importing ``hydra_ops`` (no project classes in the file).
* ``onnxruntime``: ``torch.onnx.export`` (dynamo exporter) to ``model.onnx``, run by an ONNX Runtime
  ``InferenceSession``.
* ``auto``: ``tensorrt`` on CUDA when importable. Otherwise *measured*: every available backend of
  ``CPU_BACKENDS`` is built, checked against the eager model on the example inputs (max abs
  difference of member probabilities within :func:`default_tolerance`) and timed on them (one
  warm-up, then the median of ``auto_repeats`` calls); the fastest that agrees is kept, and every
  trial is recorded under ``auto_selection`` in the metadata. Which backend wins depends on the
  machine (docs/benchmarks.md: inductor on an AVX2 CPU, ONNX Runtime on an AVX-512 one).

Every artifact directory holds the artifact file and ``compiled.json`` (backend, requested backend,
fallback reason, input names, dynamic dims, dtype, device, library versions, SHA-256 of the
artifact and of the source weights). Files are written to a temporary name in the same directory
and renamed into place, the artifact first, so ``compiled.json`` never points at a partial file.

Inputs follow the contract: a batch mapping (``input_ids``/``attention_mask``/``token_type_ids`` or
``pixel_values``; other keys such as ``labels`` are ignored) or the model's positional tensors
``(inputs, attention_mask, token_type_ids)``. The batch dimension (and, for text, the sequence
dimension) is dynamic: batch in ``1..max_batch``. Compiled calls return member logits ``[B, M, C]``
on the device of the first input.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .atomic import atomic_write_bytes, atomic_write_file

log = logging.getLogger(__name__)

BACKENDS = ("auto", "tensorrt", "inductor", "export", "onnxruntime")
#: The backends ``auto`` measures when TensorRT is unavailable; on a tie the earlier one wins.
CPU_BACKENDS: tuple[str, ...] = ("inductor", "export", "onnxruntime")
METADATA_FILE = "compiled.json"
VERIFICATION_FILE = "verification.json"
FORMAT = "hydra-ens-compiled/1"
ARTIFACT_FILES = {
    "tensorrt": "trt.ep",
    "inductor": "program.pt2",
    "export": "program.pt2",
    "onnxruntime": "model.onnx",
}
TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
IMAGE_INPUTS = ("pixel_values",)
# Ops whose presence in a PyTorch-executed TensorRT partition means attention fell back.
ATTENTION_OPS = ("scaled_dot_product", "bmm", "baddbmm", "softmax", "matmul")


class CompileError(RuntimeError):
    """A backend could not compile, save or load the model."""


# ----- inputs ---------------------------------------------------------------------------------
def input_names_of(example_inputs: Mapping[str, Tensor] | Sequence[Tensor | None]) -> list[str]:
    """Names of the positional inputs an artifact is compiled for (contract order)."""
    if isinstance(example_inputs, Mapping):
        if "pixel_values" in example_inputs:
            return ["pixel_values"]
        if "input_ids" not in example_inputs:
            raise ValueError(
                "example_inputs must have 'input_ids' or 'pixel_values', "
                f"got keys {sorted(example_inputs)}"
            )
        names = [n for n in TEXT_INPUTS if example_inputs.get(n) is not None]
        if "token_type_ids" in names and "attention_mask" not in names:
            names.insert(1, "attention_mask")
        return names
    tensors = list(example_inputs)
    if not tensors or not isinstance(tensors[0], Tensor):
        raise ValueError("example_inputs must be a batch mapping or a non-empty tuple of tensors")
    if tensors[0].is_floating_point():
        return ["pixel_values"]
    names = [n for n, t in zip(TEXT_INPUTS, tensors, strict=False) if t is not None]
    if len(tensors) > 2 and tensors[2] is not None and "attention_mask" not in names:
        names.insert(1, "attention_mask")
    return names


def arrange_inputs(
    inputs: Mapping[str, Tensor] | Sequence[Tensor | None], names: Sequence[str]
) -> tuple[Tensor, ...]:
    """The tensors for ``names`` from a batch mapping or positional tuple.

    A missing ``attention_mask`` becomes all ones and a missing ``token_type_ids`` all zeros
    (what the model does without them), so an artifact compiled with them accepts batches without.
    """
    if isinstance(inputs, Mapping):
        given = {k: v for k, v in inputs.items() if v is not None}
    else:
        seq = list(inputs)
        order = IMAGE_INPUTS if seq and seq[0].is_floating_point() else TEXT_INPUTS
        given = {n: t for n, t in zip(order, seq, strict=False) if t is not None}
    first = given.get(names[0])
    if first is None:
        raise ValueError(f"inputs must provide {names[0]!r}, got {sorted(given)}")
    out = []
    for name in names:
        if name in given:
            out.append(given[name])
        elif name == "attention_mask":
            out.append(torch.ones(first.shape[:2], dtype=torch.long, device=first.device))
        elif name == "token_type_ids":
            out.append(torch.zeros(first.shape[:2], dtype=torch.long, device=first.device))
        else:  # pragma: no cover - names come from input_names_of
            raise ValueError(f"inputs must provide {name!r}")
    return tuple(out)


def _dynamic_dims(names: Sequence[str]) -> dict[str, dict[int, str]]:
    """Which dims of each input are dynamic: batch always, sequence for text."""
    return {n: ({0: "batch"} if n == "pixel_values" else {0: "batch", 1: "seq"}) for n in names}


# ----- artifact --------------------------------------------------------------------------------
@dataclass
class CompiledArtifact(Mapping[str, Any]):
    """A compiled model: call it like the eager model; as a mapping it is its metadata.

    ``artifact(batch)`` or ``artifact(inputs, attention_mask, token_type_ids)`` ->
    member logits ``[B, M, C]`` on the first input's device. ``dict(artifact)`` is the content of
    ``compiled.json``.
    """

    backend: str
    directory: Path
    metadata: dict[str, Any]
    runner: Callable[..., Tensor] = field(repr=False)

    @property
    def input_names(self) -> list[str]:
        return list(self.metadata["input_names"])

    @property
    def device(self) -> torch.device:
        return torch.device(self.metadata["device"])

    def __call__(self, *inputs: Any) -> Tensor:
        source = inputs[0] if len(inputs) == 1 and isinstance(inputs[0], Mapping) else inputs
        tensors = arrange_inputs(source, self.input_names)
        home = tensors[0].device
        out = self.runner(*(t.to(self.device) for t in tensors))
        return out.to(home)

    @torch.no_grad()
    def predict_proba(self, *inputs: Any) -> Tensor:
        """``[B, C]`` mean of the member softmaxes (no temperature)."""
        return self(*inputs).float().softmax(dim=-1).mean(dim=1)

    def __getitem__(self, key: str) -> Any:
        return self.metadata[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.metadata)

    def __len__(self) -> int:
        return len(self.metadata)


# ----- small utilities ---------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _atomic_json(path: Path, payload: Mapping[str, Any]) -> None:
    atomic_write_bytes(path, json.dumps(payload, indent=2, sort_keys=True, default=str).encode())


def library_versions() -> dict[str, str | None]:
    """Versions of everything that can change what an artifact computes."""
    versions: dict[str, str | None] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    for module in ("onnx", "onnxruntime", "onnxscript", "torch_tensorrt", "tensorrt"):
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            versions[module] = None
            continue
        if module in ("torch_tensorrt", "tensorrt") and not torch.cuda.is_available():
            versions[module] = "installed (not imported: no CUDA)"
            continue
        try:
            versions[module] = getattr(importlib.import_module(module), "__version__", "unknown")
        except Exception as error:  # a broken optional install must not break compile
            versions[module] = f"import failed: {type(error).__name__}"
    return versions


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def _model_device_dtype(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    param = next(iter(model.parameters()), None)
    if param is None:
        return torch.device("cpu"), torch.float32
    return param.device, param.dtype


def _state_hash(model: nn.Module) -> str:
    digest = hashlib.sha256()
    state = model.state_dict()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        if tensor.numel():
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


# ----- availability ----------------------------------------------------------------------------
def tensorrt_unavailable_reason() -> str | None:
    """None when Torch-TensorRT can be used here, else why not (never imports it without CUDA)."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    if importlib.util.find_spec("torch_tensorrt") is None:
        return "torch_tensorrt is not installed"
    return None


def _cpu_backend_unavailable_reason(backend: str) -> str | None:
    if backend == "onnxruntime":
        for module in ("onnxruntime", "onnx", "onnxscript"):
            if importlib.util.find_spec(module) is None:
                return f"{module} is not installed"
    return None


def available_backends() -> dict[str, str | None]:
    """Every concrete backend -> ``None`` if usable here, else the reason it is not."""
    result: dict[str, str | None] = {"tensorrt": tensorrt_unavailable_reason()}
    for backend in CPU_BACKENDS:
        result[backend] = _cpu_backend_unavailable_reason(backend)
    return result


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")


# ----- export programs --------------------------------------------------------------------------
def _trace_inputs(tensors: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """Example tensors for tracing: a batch of 1 is repeated to 2 (a size-1 dim would be
    specialised and the dynamic batch refused)."""
    if tensors[0].shape[0] != 1:
        return tensors
    return tuple(torch.cat([t, t]) for t in tensors)


def _export_program(
    model: nn.Module, tensors: tuple[Tensor, ...], names: Sequence[str], max_batch: int
) -> torch.export.ExportedProgram:
    """``torch.export`` with a dynamic batch (and, for text, sequence) dimension."""
    tensors = _trace_inputs(tensors)
    batch = torch.export.Dim("batch", min=1, max=max(2, max_batch))
    seq = torch.export.Dim.AUTO
    dims = _dynamic_dims(names)
    shapes = tuple(
        {i: (batch if label == "batch" else seq) for i, label in dims[n].items()} for n in names
    )
    try:
        return torch.export.export(model, tensors, dynamic_shapes=shapes, strict=False)
    except Exception as error:
        raise CompileError(f"torch.export failed: {type(error).__name__}: {error}") from error


def _load_program_module(path: Path) -> nn.Module:
    return torch.export.load(str(path)).module()


# ----- backends ---------------------------------------------------------------------------------
def _compile_export(
    model: nn.Module, tensors: tuple[Tensor, ...], names: list[str], out: Path, max_batch: int
) -> dict[str, Any]:
    program = _export_program(model, tensors, names, max_batch)
    target = out / ARTIFACT_FILES["export"]
    atomic_write_file(target, lambda p: torch.export.save(program, str(p)))
    return {}


def _compile_onnxruntime(
    model: nn.Module, tensors: tuple[Tensor, ...], names: list[str], out: Path, max_batch: int
) -> dict[str, Any]:
    dims = _dynamic_dims(names)
    batch = torch.export.Dim("batch", min=1, max=max(2, max_batch))
    shapes = tuple(
        {i: (batch if label == "batch" else torch.export.Dim.AUTO) for i, label in dims[n].items()}
        for n in names
    )
    target = out / ARTIFACT_FILES["onnxruntime"]
    traced = _trace_inputs(tensors)

    def write(path: Path) -> None:
        program = torch.onnx.export(
            model,
            traced,
            input_names=list(names),
            output_names=["logits"],
            dynamic_shapes=shapes,
            dynamo=True,
            external_data=False,
            optimize=True,
            verbose=False,
        )
        if program is None:  # pragma: no cover - dynamo=True always returns a program
            raise CompileError("torch.onnx.export returned no program")
        program.save(str(path), external_data=False)

    try:
        atomic_write_file(target, write)
    except CompileError:
        raise
    except Exception as error:
        raise CompileError(f"ONNX export failed: {type(error).__name__}: {error}") from error
    return {"opset": _onnx_opset(target)}


def _onnx_opset(path: Path) -> int | None:
    try:
        import onnx

        proto = onnx.load(str(path), load_external_data=False)
        return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    except Exception:  # metadata only
        return None


def attention_fallback_report(graph_module: nn.Module) -> list[str]:
    """Attention-like ops a Torch-TensorRT partitioned module still runs in PyTorch.

    Torch-TensorRT names TensorRT partitions ``_run_on_acc_<i>`` and PyTorch partitions
    ``_run_on_gpu_<i>``; ops at the top level of the graph also run in PyTorch. Returns
    ``"<partition>: <op>"`` strings for every attention-like op outside TensorRT (empty = all in).
    """
    found: list[str] = []

    def scan(module: nn.Module, where: str) -> None:
        graph = getattr(module, "graph", None)
        if graph is None:
            return
        for node in graph.nodes:
            if node.op == "call_function":
                target = str(getattr(node.target, "__name__", node.target))
                if any(op in target for op in ATTENTION_OPS):
                    found.append(f"{where}: {target}")

    scan(graph_module, "<top level>")
    for name, child in graph_module.named_children():
        if name.startswith("_run_on_acc"):
            continue
        scan(child, name)
    return found


def _tensorrt_inputs(tensors: tuple[Tensor, ...], max_batch: int, opt_batch: int) -> list[Any]:
    import torch_tensorrt

    specs = []
    for t in tensors:
        rest = tuple(t.shape[1:])
        specs.append(
            torch_tensorrt.Input(
                min_shape=(1, *rest),
                opt_shape=(min(opt_batch, max_batch), *rest),
                max_shape=(max_batch, *rest),
                dtype=t.dtype,
            )
        )
    return specs


def _compile_tensorrt(
    model: nn.Module,
    tensors: tuple[Tensor, ...],
    names: list[str],
    out: Path,
    max_batch: int,
    opt_batch: int,
) -> dict[str, Any]:
    import torch_tensorrt

    model = model.to("cuda")
    tensors = tuple(t.to("cuda") for t in tensors)
    specs = _tensorrt_inputs(tensors, max_batch, opt_batch)
    settings = {
        "ir": "dynamo",
        "arg_inputs": specs,
        "use_explicit_typing": True,  # precision = the model's dtype
        "min_block_size": 1,
        "truncate_double": True,
    }
    dry = torch_tensorrt.compile(model, dryrun=True, **settings)
    fallback = attention_fallback_report(dry)
    if fallback:
        raise CompileError(
            "Torch-TensorRT would run attention in PyTorch: " + "; ".join(fallback[:5])
        )
    trt_module = torch_tensorrt.compile(model, **settings)
    target = out / ARTIFACT_FILES["tensorrt"]

    def write(path: Path) -> None:
        torch_tensorrt.save(
            trt_module, str(path), output_format="exported_program", arg_inputs=list(specs)
        )

    atomic_write_file(target, write)
    return {
        "tensorrt_partitions": sorted(
            n for n, _ in trt_module.named_children() if n.startswith("_run_on_acc")
        ),
        "attention_in_tensorrt": True,
        "opt_batch": opt_batch,
    }


def _build_runner(backend: str, directory: Path, device: torch.device) -> Callable[..., Tensor]:
    path = directory / ARTIFACT_FILES[backend]
    if backend == "export":
        module = _load_program_module(path)
        return _no_grad(module)
    if backend == "inductor":
        module = _load_program_module(path)
        return _no_grad(torch.compile(module, backend="inductor", dynamic=True))
    if backend == "tensorrt":
        import torch_tensorrt

        module = torch_tensorrt.load(str(path)).module()
        return _no_grad(module)
    if backend == "onnxruntime":
        return _onnxruntime_runner(path, device)
    raise ValueError(f"backend must be one of {list(ARTIFACT_FILES)}, got {backend!r}")


def _no_grad(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    def run(*tensors: Tensor) -> Tensor:
        with torch.no_grad():
            return fn(*tensors)

    return run


def _onnxruntime_runner(path: Path, device: torch.device) -> Callable[..., Tensor]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    providers = ["CPUExecutionProvider"]
    if device.type == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
        providers.insert(0, "CUDAExecutionProvider")
    session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
    input_names = [i.name for i in session.get_inputs()]

    def run(*tensors: Tensor) -> Tensor:
        feed = {
            name: t.detach().cpu().numpy() for name, t in zip(input_names, tensors, strict=False)
        }
        (logits,) = session.run(["logits"], feed)
        return torch.from_numpy(logits).to(tensors[0].device)

    return run


# ----- public API -------------------------------------------------------------------------------
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
    _check_backend(backend)
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
    device, _ = _model_device_dtype(model)
    tensors = tuple(t.to(device) for t in tensors)
    build = _Build(model, tensors, names, out, max_batch, opt_batch or tensors[0].shape[0], backend)

    trt_reason = tensorrt_unavailable_reason() if backend in ("auto", "tensorrt") else None
    if backend == "auto" and trt_reason is None:
        try:
            return build.one("tensorrt")
        except Exception as error:
            log.warning("compile: tensorrt failed (%s); measuring the other backends", error)
            build.errors.append(f"tensorrt: {type(error).__name__}: {error}")
            return build.fastest(auto_repeats, "tensorrt failed")
    if backend in ("auto", "tensorrt") and trt_reason is not None:
        if backend == "tensorrt":
            log.warning("compile: tensorrt unavailable (%s); falling back to auto", trt_reason)
        return build.fastest(auto_repeats, f"tensorrt unavailable ({trt_reason})")
    if (why := _cpu_backend_unavailable_reason(backend)) is not None:
        raise CompileError(f"backend {backend!r} is unavailable: {why}")
    try:
        return build.one(backend)
    except CompileError:
        raise
    except Exception as error:
        raise CompileError(f"{backend}: {type(error).__name__}: {error}") from error


@dataclass
class _Build:
    """One :func:`compile_model` call: builds backends into ``out`` and writes the metadata."""

    model: nn.Module
    tensors: tuple[Tensor, ...]
    names: list[str]
    out: Path
    max_batch: int
    opt_batch: int
    requested: str
    errors: list[str] = field(default_factory=list)
    _exported: dict[str, Any] | None = None  # export and inductor share one program file

    def build(self, backend: str) -> tuple[Callable[..., Tensor], dict[str, Any], torch.device]:
        """Write ``backend``'s artifact (once per call for the shared program) and load it."""
        device, _ = _model_device_dtype(self.model)
        if backend in ("export", "inductor") and self._exported is not None:
            extra = self._exported
        else:
            extra = _compile_one(
                backend,
                self.model,
                self.tensors,
                self.names,
                self.out,
                self.max_batch,
                self.opt_batch,
            )
            if backend in ("export", "inductor"):
                self._exported = extra
        run_device = torch.device("cuda") if backend == "tensorrt" else device
        return _build_runner(backend, self.out, run_device), extra, run_device

    def one(self, backend: str) -> CompiledArtifact:
        start = time.perf_counter()
        runner, extra, run_device = self.build(backend)
        return self.finish(backend, runner, extra, run_device, start, None)

    def fastest(self, repeats: int, fallback_reason: str) -> CompiledArtifact:
        """Build, check and time every available CPU backend; keep the fastest that agrees."""
        start = time.perf_counter()
        device, dtype = _model_device_dtype(self.model)
        tolerance = default_tolerance(dtype)
        with torch.no_grad():
            reference = self.model(*self.tensors).float().softmax(-1)
        trials: dict[str, dict[str, Any]] = {}
        usable: dict[str, tuple[Callable[..., Tensor], dict[str, Any], torch.device]] = {}
        for backend in CPU_BACKENDS:
            if (why := _cpu_backend_unavailable_reason(backend)) is not None:
                self.errors.append(f"{backend}: {why}")
                continue
            t0 = time.perf_counter()
            try:
                built = self.build(backend)
                runner = built[0]
                output, median_ms = median_latency_ms(
                    lambda runner=runner: runner(*self.tensors), repeats, device
                )
            except Exception as error:
                self.errors.append(f"{backend}: {type(error).__name__}: {error}")
                log.warning("compile: %s failed (%s); measuring the others", backend, error)
                continue
            diff = float((output.float().softmax(-1) - reference).abs().max())
            trials[backend] = {
                "median_ms": round(median_ms, 3),
                "max_abs_diff_member_probs": diff,
                "build_and_time_seconds": round(time.perf_counter() - t0, 2),
            }
            if diff > tolerance:
                self.errors.append(f"{backend}: max |dp| {diff:.2e} > {tolerance:g} vs eager")
                continue
            usable[backend] = built
        if not usable:
            raise CompileError("no backend could compile the model: " + "; ".join(self.errors))
        choice = min(usable, key=lambda b: trials[b]["median_ms"])
        for backend in trials:  # keep only the chosen artifact
            if ARTIFACT_FILES[backend] != ARTIFACT_FILES[choice]:
                (self.out / ARTIFACT_FILES[backend]).unlink(missing_ok=True)
        log.info(
            "compile: auto chose %s (%s)",
            choice,
            ", ".join(f"{b} {t['median_ms']:.1f} ms" for b, t in trials.items()),
        )
        runner, extra, run_device = usable[choice]
        selection = {
            "batch": int(self.tensors[0].shape[0]),
            "repeats": repeats,
            "tolerance": tolerance,
            "trials": trials,
        }
        extra = {**extra, "auto_selection": selection}
        return self.finish(choice, runner, extra, run_device, start, fallback_reason)

    def finish(
        self,
        backend: str,
        runner: Callable[..., Tensor],
        extra: dict[str, Any],
        run_device: torch.device,
        start: float,
        fallback_reason: str | None,
    ) -> CompiledArtifact:
        """Write ``compiled.json`` (after the artifact) and return the loaded artifact."""
        _, dtype = _model_device_dtype(self.model)
        artifact_path = self.out / ARTIFACT_FILES[backend]
        metadata: dict[str, Any] = {
            "format": FORMAT,
            "backend": backend,
            "requested_backend": self.requested,
            "fallback_reason": fallback_reason if backend != self.requested else None,
            "failed_backends": list(self.errors),
            "artifact": artifact_path.name,
            "artifact_sha256": _sha256(artifact_path),
            "source_weights_sha256": _state_hash(self.model),
            "input_names": self.names,
            "dynamic_dims": {n: list(d.values()) for n, d in _dynamic_dims(self.names).items()},
            "max_batch": self.max_batch,
            "dtype": str(dtype).removeprefix("torch."),
            "device": str(run_device),
            "device_name": device_description(run_device),
            "num_members": getattr(self.model, "num_members", None),
            "attention_implementation": getattr(self.model, "attention_implementation", None),
            "compile_seconds": round(time.perf_counter() - start, 3),
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "library_versions": library_versions(),
            **extra,
        }
        _atomic_json(self.out / METADATA_FILE, metadata)
        return CompiledArtifact(backend, self.out, metadata, runner)


def median_latency_ms(
    call: Callable[[], Tensor], repeats: int, device: torch.device | None = None
) -> tuple[Tensor, float]:
    """``(output of one warm-up call, median milliseconds of repeats further calls)``, no grad.

    The warm-up is where inductor compiles and ONNX Runtime allocates its arena; on CUDA each call
    is synchronised before the clock stops.
    """

    def timed_call() -> Tensor:
        out = call()
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
        return out

    with torch.no_grad():
        output = timed_call()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            timed_call()
            times.append(time.perf_counter() - t0)
    return output, statistics.median(times) * 1e3


def _compile_one(
    backend: str,
    model: nn.Module,
    tensors: tuple[Tensor, ...],
    names: list[str],
    out: Path,
    max_batch: int,
    opt_batch: int,
) -> dict[str, Any]:
    if backend == "tensorrt":
        return _compile_tensorrt(model, tensors, names, out, max_batch, opt_batch)
    if backend in ("export", "inductor"):
        return _compile_export(model, tensors, names, out, max_batch)
    if backend == "onnxruntime":
        return _compile_onnxruntime(model, tensors, names, out, max_batch)
    raise ValueError(f"backend must be one of {list(ARTIFACT_FILES)}, got {backend!r}")


def load_compiled(
    out_dir: str | os.PathLike[str], device: str | torch.device | None = None
) -> CompiledArtifact:
    """Load an artifact directory written by :func:`compile_model` (artifact hash verified).

    Raises:
        ValueError: missing/unknown ``compiled.json`` or an artifact whose hash does not match.
    """
    directory = Path(out_dir)
    meta_path = directory / METADATA_FILE
    if not meta_path.is_file():
        raise ValueError(f"out_dir {str(directory)!r} has no {METADATA_FILE}")
    metadata = json.loads(meta_path.read_text())
    if metadata.get("format") != FORMAT:
        raise ValueError(f"{meta_path}: format must be {FORMAT!r}, got {metadata.get('format')!r}")
    backend = metadata["backend"]
    artifact = directory / metadata["artifact"]
    if not artifact.is_file() or _sha256(artifact) != metadata["artifact_sha256"]:
        raise ValueError(f"{artifact}: missing or its SHA-256 does not match {METADATA_FILE}")
    run_device = torch.device(device) if device is not None else torch.device(metadata["device"])
    metadata = {**metadata, "device": str(run_device)}
    return CompiledArtifact(
        backend, directory, metadata, _build_runner(backend, directory, run_device)
    )


def _batches(
    inputs: Mapping[str, Tensor] | Sequence[Any] | Iterable[Any],
) -> list[Any]:
    if isinstance(inputs, Mapping):
        return [inputs]
    items = list(inputs)
    if items and isinstance(items[0], Tensor):
        return [tuple(items)]
    return items


def default_tolerance(dtype: torch.dtype) -> float:
    """Max abs difference of probabilities allowed for an artifact of this dtype."""
    return 1e-4 if dtype in (torch.float32, torch.float64) else 2e-2


@torch.no_grad()
def verify_compiled(
    artifact: Callable[..., Tensor],
    model: nn.Module,
    heldout_inputs: Mapping[str, Tensor] | Sequence[Any] | Iterable[Any],
    *,
    tolerance: float | None = None,
    min_agreement: float = 1.0,
    out_path: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Re-check a compiled artifact against the eager model on held-out inputs.

    Args:
        artifact: a :class:`CompiledArtifact` (or any callable with its call convention).
        model: the eager merged model it was compiled from.
        heldout_inputs: one batch (mapping or positional tuple) or an iterable of batches.
        tolerance: max allowed abs difference of ensemble probabilities (default by dtype: 1e-4
            for fp32, 2e-2 for fp16/bf16).
        min_agreement: minimum fraction of examples whose ensemble argmax agrees.
        out_path: if given, the result is also written there as JSON (atomically).

    Returns:
        ``{"backend", "passed", "max_abs_diff_probs", "max_abs_diff_member_probs",
        "max_abs_diff_logits", "argmax_agreement", "member_argmax_agreement", "num_examples",
        "tolerance", "min_agreement"}``; ``passed`` is what the gate stage checks.
    """
    if not 0.0 <= min_agreement <= 1.0:
        raise ValueError(f"min_agreement must be in [0, 1], got {min_agreement!r}")
    batches = _batches(heldout_inputs)
    if not batches:
        raise ValueError("heldout_inputs must hold at least one batch")
    _, dtype = _model_device_dtype(model)
    tol = default_tolerance(dtype) if tolerance is None else float(tolerance)
    model.eval()
    names = getattr(artifact, "input_names", None)
    eager_out, compiled_out = [], []
    for batch in batches:
        tensors = arrange_inputs(batch, names or input_names_of(batch))
        eager_out.append(model(*tensors).float().cpu())
        compiled_out.append(artifact(*tensors).float().cpu())
    eager, compiled = torch.cat(eager_out), torch.cat(compiled_out)
    if eager.shape != compiled.shape:
        raise ValueError(f"compiled output shape {tuple(compiled.shape)} != {tuple(eager.shape)}")
    pe_m, pc_m = eager.softmax(-1), compiled.softmax(-1)
    pe, pc = pe_m.mean(1), pc_m.mean(1)
    result = {
        "backend": getattr(artifact, "backend", "callable"),
        "num_examples": int(eager.shape[0]),
        "max_abs_diff_probs": float((pe - pc).abs().max()),
        "max_abs_diff_member_probs": float((pe_m - pc_m).abs().max()),
        "max_abs_diff_logits": float((eager - compiled).abs().max()),
        "argmax_agreement": float((pe.argmax(-1) == pc.argmax(-1)).float().mean()),
        "member_argmax_agreement": float((pe_m.argmax(-1) == pc_m.argmax(-1)).float().mean()),
        "tolerance": tol,
        "min_agreement": float(min_agreement),
    }
    result["passed"] = bool(
        result["max_abs_diff_probs"] <= tol and result["argmax_agreement"] >= min_agreement
    )
    if out_path is not None:
        target = Path(out_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        _atomic_json(target, result)
    return result
