"""``tensorrt``: Torch-TensorRT, dynamo path (``torch_tensorrt.compile(ir="dynamo")``).

Precision comes from the model's dtype (explicit typing; 2.13+ ignores ``enabled_precisions``),
the batch is dynamic through ``torch_tensorrt.Input(min_shape, opt_shape, max_shape)``, and the
artifact is saved with ``torch_tensorrt.save`` as an ExportedProgram (``trt.ep``). A dry run first
checks that attention is not partitioned back to PyTorch. ``torch_tensorrt`` is imported only
inside the builder and loader, which run only when :func:`tensorrt_unavailable_reason` is ``None``
(CUDA present), so importing this module never imports it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ...atomic import atomic_write_file
from .base import Backend, CompileError, CompileRequest, Runner, no_grad_runner

# Ops whose presence in a PyTorch-executed TensorRT partition means attention fell back.
ATTENTION_OPS = ("scaled_dot_product", "bmm", "baddbmm", "softmax", "matmul")


def tensorrt_unavailable_reason() -> str | None:
    """None when Torch-TensorRT can be used here, else why not (never imports it without CUDA)."""
    if not torch.cuda.is_available():
        return "no CUDA device"
    if importlib.util.find_spec("torch_tensorrt") is None:
        return "torch_tensorrt is not installed"
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


def compile_tensorrt(request: CompileRequest) -> dict[str, Any]:
    import torch_tensorrt

    model = request.model.to("cuda")
    tensors = tuple(t.to("cuda") for t in request.tensors)
    specs = _tensorrt_inputs(tensors, request.max_batch, request.opt_batch)
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

    def write(path: Path) -> None:
        torch_tensorrt.save(
            trt_module, str(path), output_format="exported_program", arg_inputs=list(specs)
        )

    atomic_write_file(request.target, write)
    return {
        "tensorrt_partitions": sorted(
            n for n, _ in trt_module.named_children() if n.startswith("_run_on_acc")
        ),
        "attention_in_tensorrt": True,
        "opt_batch": request.opt_batch,
    }


def load_tensorrt(path: Path, device: torch.device) -> Runner:
    import torch_tensorrt

    return no_grad_runner(torch_tensorrt.load(str(path)).module())


TENSORRT = Backend(
    "tensorrt",
    "trt.ep",
    compile_tensorrt,
    load_tensorrt,
    unavailable_reason=tensorrt_unavailable_reason,
    device="cuda",
)
