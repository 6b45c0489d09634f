"""``onnxruntime``: ``torch.onnx.export`` (dynamo exporter) to ``model.onnx``, run by an ONNX
Runtime ``InferenceSession`` (CUDA provider first when the device is CUDA and it has one)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ...atomic import atomic_write_file
from ..inputs import dynamic_shapes, trace_inputs
from .base import Backend, CompileError, CompileRequest, Runner

REQUIRED_MODULES = ("onnxruntime", "onnx", "onnxscript")


def onnxruntime_unavailable_reason() -> str | None:
    for module in REQUIRED_MODULES:
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed"
    return None


def has_cuda_provider() -> bool:
    """Whether this ONNX Runtime build has the CUDA execution provider (``onnxruntime-gpu``)."""
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


def onnxruntime_precision_reason(precision: str, device: torch.device) -> str | None:
    """ONNX Runtime's CPU execution provider has no bf16 kernels (onnxruntime 1.32: "Could not
    find an implementation for Add(14)"), so it is a bf16 candidate only where its CUDA provider
    runs the session: on a CUDA device with an ``onnxruntime-gpu`` build. (A CPU-only build on a
    CUDA machine runs the session on the CPU: measured on an H200 host, the bf16 build failed
    there after its export.)"""
    if precision != "bf16":
        return None
    if device.type != "cuda":
        return "onnxruntime's CPU execution provider has no bf16 kernels (fp32 only on CPU)"
    if not has_cuda_provider():
        return (
            "this onnxruntime has no CUDA execution provider and its CPU provider has no bf16 "
            "kernels"
        )
    return None


#: Node metadata that names this checkout's source files: two builds of one model in two
#: checkouts would differ in bytes.
STACK_TRACE_KEY = "pkg.torch.onnx.stack_trace"


def drop_stack_traces(model: Any) -> None:
    """Remove :data:`STACK_TRACE_KEY` from every node of an ``onnx_ir`` model (its functions
    included)."""
    import onnx_ir as ir

    graphs = [model.graph, *model.functions.values()]
    for graph in graphs:
        for node in ir.traversal.RecursiveGraphIterator(graph):
            node.metadata_props.pop(STACK_TRACE_KEY, None)


def compile_onnxruntime(request: CompileRequest) -> dict[str, Any]:
    shapes = dynamic_shapes(request.names, request.max_batch)
    traced = trace_inputs(request.tensors)

    def write(path: Path) -> None:
        program = torch.onnx.export(
            request.model,
            traced,
            input_names=list(request.names),
            output_names=["logits"],
            dynamic_shapes=shapes,
            dynamo=True,
            external_data=False,
            optimize=True,
            verbose=False,
        )
        if program is None:  # pragma: no cover - dynamo=True always returns a program
            raise CompileError("torch.onnx.export returned no program")
        drop_stack_traces(program.model)
        program.save(str(path), external_data=False)

    try:
        atomic_write_file(request.target, write)
    except CompileError:
        raise
    except Exception as error:
        raise CompileError(f"ONNX export failed: {type(error).__name__}: {error}") from error
    return {"opset": onnx_opset(request.target)}


def onnx_opset(path: Path) -> int | None:
    """The default-domain opset of an ONNX file (``None`` if it cannot be read)."""
    try:
        import onnx

        proto = onnx.load(str(path), load_external_data=False)
        return next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), None)
    except Exception:  # metadata only
        return None


def load_onnxruntime(path: Path, device: torch.device) -> Runner:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    providers = ["CPUExecutionProvider"]
    if device.type == "cuda" and has_cuda_provider():
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


ONNXRUNTIME = Backend(
    "onnxruntime",
    "model.onnx",
    compile_onnxruntime,
    load_onnxruntime,
    unavailable_reason=onnxruntime_unavailable_reason,
    precision_reason=onnxruntime_precision_reason,
)
