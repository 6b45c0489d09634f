"""What a compile backend is: a named builder and loader of one artifact file."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

#: A loaded artifact: positional input tensors -> member logits ``[B, M, C]``.
Runner = Callable[..., Tensor]


class CompileError(RuntimeError):
    """A backend could not compile, save or load the model."""


@dataclass(frozen=True)
class CompileRequest:
    """What a backend's builder gets: the model (eval mode), the example tensors in ``names``
    order (on the model's device), the artifact file to write (atomically), the largest batch the
    artifact must accept and TensorRT's optimisation batch."""

    model: nn.Module
    tensors: tuple[Tensor, ...]
    names: list[str]
    target: Path
    max_batch: int
    opt_batch: int


def always_available() -> str | None:
    return None


def any_precision(precision: str, device: torch.device) -> str | None:
    return None


@dataclass(frozen=True)
class Backend:
    """One compile backend.

    ``compile(request)`` writes ``request.target`` (the ``artifact_file``; backends with the same
    file share one build per :func:`~hydra_ops.compile.compile_model` call) and returns extra
    metadata, ``load(path, device)`` turns the file into a :data:`Runner`,
    ``unavailable_reason()`` is ``None`` when the backend can run here (it never imports an
    optional library that needs CUDA without CUDA), ``precision_reason(precision, device)`` is
    ``None`` when the backend runs a model of that precision (``fp32``/``bf16``/``fp16``) on that
    device, else why not, and ``device`` is the device the artifact always runs on (``None``: the
    model's).
    """

    name: str
    artifact_file: str
    compile: Callable[[CompileRequest], dict[str, Any]]
    load: Callable[[Path, torch.device], Runner]
    unavailable_reason: Callable[[], str | None] = always_available
    device: str | None = None
    precision_reason: Callable[[str, torch.device], str | None] = any_precision


def no_grad_runner(fn: Runner) -> Runner:
    """``fn`` called under ``torch.no_grad()``."""

    def run(*tensors: Tensor) -> Tensor:
        with torch.no_grad():
            return fn(*tensors)

    return run
