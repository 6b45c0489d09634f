"""``export`` and ``inductor``: one ``torch.export`` program (``program.pt2``).

``export`` runs the program as saved; it loads with ``torch.export.load`` without importing
``hydra_ops`` (no project classes in the file). ``inductor`` runs it through ``torch.compile``
(inductor, dynamic shapes) on load.
"""

from __future__ import annotations

import io
import logging
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ...atomic import atomic_write_bytes
from ..inputs import dynamic_shapes, trace_inputs
from .base import Backend, CompileError, CompileRequest, Runner, no_grad_runner

PROGRAM_FILE = "program.pt2"


def export_program(
    model: nn.Module, tensors: tuple[Tensor, ...], names: list[str], max_batch: int
) -> torch.export.ExportedProgram:
    """``torch.export`` with a dynamic batch (and, for text, sequence) dimension."""
    try:
        return torch.export.export(
            model,
            trace_inputs(tensors),
            dynamic_shapes=dynamic_shapes(names, max_batch),
            strict=False,
        )
    except Exception as error:
        raise CompileError(f"torch.export failed: {type(error).__name__}: {error}") from error


def drop_stack_traces(program: torch.export.ExportedProgram) -> None:
    """Remove the ``stack_trace`` of every node (it names this checkout's source files)."""
    for module in program.graph_module.modules():
        graph = getattr(module, "graph", None)
        if isinstance(graph, torch.fx.Graph):
            for node in graph.nodes:
                node.meta.pop("stack_trace", None)


def compile_export(request: CompileRequest) -> dict[str, Any]:
    program = export_program(request.model, request.tensors, request.names, request.max_batch)
    # saved to memory first: saved to a path, the archive's folder is named after the temp file;
    # and without the source paths in each node's stack trace: both would make two builds of one
    # program (in two checkouts) differ in bytes
    drop_stack_traces(program)
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    atomic_write_bytes(request.target, buffer.getvalue())
    return {}


def load_export(path: Path, device: torch.device) -> Runner:
    return no_grad_runner(torch.export.load(str(path)).module())


class _NoCudaHomeNotice(logging.Filter):
    """Drops ``No CUDA runtime is found, using CUDA_HOME=...``: inductor's C++ builder imports
    ``torch.utils.cpp_extension``, which looks for a CUDA toolkit when imported and says so when
    it finds one without a GPU, on every first call of a CPU artifact. The CPU kernels it builds
    never use CUDA, so the line is noise there."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No CUDA runtime is found")


def quiet_cuda_home_notice() -> None:
    """Install :class:`_NoCudaHomeNotice` on torch's ``cpp_extension`` logger (once)."""
    logger = logging.getLogger("torch.utils.cpp_extension")
    if not any(isinstance(f, _NoCudaHomeNotice) for f in logger.filters):
        logger.addFilter(_NoCudaHomeNotice())


def load_inductor(path: Path, device: torch.device) -> Runner:
    if device.type == "cpu":
        quiet_cuda_home_notice()
    module = torch.export.load(str(path)).module()
    return no_grad_runner(torch.compile(module, backend="inductor", dynamic=True))


EXPORT = Backend("export", PROGRAM_FILE, compile_export, load_export)
INDUCTOR = Backend("inductor", PROGRAM_FILE, compile_export, load_inductor)
