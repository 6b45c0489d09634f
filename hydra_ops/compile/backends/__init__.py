"""The compile backends, registered by name (as
``hydra_ops.hydra.grouped.ATTENTION_IMPLEMENTATIONS``).

``BACKEND_REGISTRY`` maps a name to its :class:`Backend` (builder, loader, artifact file,
availability check): ``tensorrt`` (:mod:`.tensorrt`), ``inductor`` and ``export``
(:mod:`.export`, one shared ``torch.export`` program), ``onnxruntime`` (:mod:`.onnx_runtime`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from .base import Backend, CompileError, CompileRequest, Runner
from .export import EXPORT, INDUCTOR
from .onnx_runtime import ONNXRUNTIME
from .tensorrt import (
    ATTENTION_OPS,
    TENSORRT,
    attention_fallback_report,
    tensorrt_unavailable_reason,
)

BACKEND_REGISTRY: dict[str, Backend] = {}
#: Backend name -> its artifact file, kept in step with the registry by :func:`register_backend`.
ARTIFACT_FILES: dict[str, str] = {}


def register_backend(backend: Backend) -> Backend:
    """Add ``backend`` to :data:`BACKEND_REGISTRY` under its name (ValueError if taken)."""
    if backend.name in BACKEND_REGISTRY or backend.name == "auto":
        raise ValueError(f"backend name {backend.name!r} is already taken")
    BACKEND_REGISTRY[backend.name] = backend
    ARTIFACT_FILES[backend.name] = backend.artifact_file
    return backend


for _backend in (TENSORRT, INDUCTOR, EXPORT, ONNXRUNTIME):
    register_backend(_backend)


def get_backend(name: str) -> Backend:
    """The registered backend ``name`` (ValueError naming the registered ones otherwise)."""
    if name not in BACKEND_REGISTRY:
        raise ValueError(f"backend must be one of {list(BACKEND_REGISTRY)}, got {name!r}")
    return BACKEND_REGISTRY[name]


def available_backends() -> dict[str, str | None]:
    """Every registered backend -> ``None`` if usable here, else the reason it is not."""
    return {name: backend.unavailable_reason() for name, backend in BACKEND_REGISTRY.items()}


def load_runner(name: str, directory: Path, device: torch.device) -> Runner:
    """Load backend ``name``'s artifact from ``directory`` as a runner on ``device``."""
    backend = get_backend(name)
    return backend.load(directory / backend.artifact_file, device)


__all__ = [
    "ARTIFACT_FILES",
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
