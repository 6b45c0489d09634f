"""The compile backends, registered by name (as
``hydra_ops.hydra.grouped.ATTENTION_IMPLEMENTATIONS``).

``BACKEND_REGISTRY`` (a :class:`~hydra_ops.registry.Registry`) maps a name to its
:class:`Backend` (builder, loader, artifact file, availability check); ``auto`` is reserved (it
chooses among them): ``tensorrt`` (:mod:`.tensorrt`), ``inductor`` and ``export``
(:mod:`.export`, one shared ``torch.export`` program), ``onnxruntime`` (:mod:`.onnx_runtime`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from hydra_ops.registry import Registry

from .base import Backend, CompileError, CompileRequest, Runner
from .export import EXPORT, INDUCTOR
from .onnx_runtime import ONNXRUNTIME
from .tensorrt import (
    ATTENTION_OPS,
    TENSORRT,
    attention_fallback_report,
    tensorrt_unavailable_reason,
)

BACKEND_REGISTRY: Registry[Backend] = Registry("backend", reserved=("auto",))


def register_backend(backend: Backend) -> Backend:
    """Add ``backend`` to :data:`BACKEND_REGISTRY` under its name (ValueError if taken or
    ``auto``); :func:`~hydra_ops.compile.compile_model` takes it from then on."""
    return BACKEND_REGISTRY.register(backend.name, backend)


for _backend in (TENSORRT, INDUCTOR, EXPORT, ONNXRUNTIME):
    register_backend(_backend)


def get_backend(name: str) -> Backend:
    """The registered backend ``name`` (ValueError naming the registered ones otherwise)."""
    return BACKEND_REGISTRY.get(name, "backend")


def available_backends() -> dict[str, str | None]:
    """Every registered backend -> ``None`` if usable here, else the reason it is not."""
    return {name: backend.unavailable_reason() for name, backend in BACKEND_REGISTRY.items()}


def load_runner(name: str, directory: Path, device: torch.device) -> Runner:
    """Load backend ``name``'s artifact from ``directory`` as a runner on ``device``."""
    backend = get_backend(name)
    return backend.load(directory / backend.artifact_file, device)


__all__ = [
    "ATTENTION_OPS",
    "BACKEND_REGISTRY",
    "Backend",
    "CompileError",
    "CompileRequest",
    "Runner",
    "attention_fallback_report",
    "available_backends",
    "get_backend",
    "load_runner",
    "register_backend",
    "tensorrt_unavailable_reason",
]
