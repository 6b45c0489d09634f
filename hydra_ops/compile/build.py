"""One :func:`~hydra_ops.compile.compile_model` call: build backends into a directory, then write
``compiled.json`` for the one kept."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..hashing import sha256_file, state_dict_sha256
from .artifact import (
    FORMAT,
    METADATA_FILE,
    CompiledArtifact,
    device_description,
    library_versions,
    model_device_dtype,
    write_json,
)
from .backends import CompileRequest, Runner, get_backend, load_runner
from .inputs import dynamic_dims
from .precision import DTYPES, cast_model

#: A built backend: its runner, the metadata its builder returned and the device it runs on.
Built = tuple[Runner, dict[str, Any], torch.device]


@dataclass
class Build:
    """Builds backends of ``model`` into ``out`` and writes the metadata of the one kept.

    ``errors`` collects ``"<backend>: <why>"`` for every backend that failed (``failed_backends``
    in ``compiled.json``). ``model`` is the fp32 source; an ``fp32`` build writes into ``out``
    itself (as before precisions existed), a low-precision one builds :func:`cast_model`'s copy
    into ``out/.<precision>/`` until :meth:`finish` moves the kept file into ``out``.
    """

    model: nn.Module
    tensors: tuple[Tensor, ...]
    names: list[str]
    out: Path
    max_batch: int
    opt_batch: int
    requested: str
    requested_precision: str = "fp32"
    errors: list[str] = field(default_factory=list)
    #: ``auto`` precision only: the one line saying why the kept precision ships
    #: (``precision_reason`` in ``compiled.json``; :func:`~hydra_ops.compile.auto.note_precision`).
    precision_reason: str | None = None
    # (artifact file, precision) -> its builder's metadata: backends sharing a file (export,
    # inductor) build once per precision
    _written: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    _cast: dict[str, nn.Module] = field(default_factory=dict)

    def directory(self, precision: str) -> Path:
        """Where ``precision``'s artifacts are built (``out`` for fp32)."""
        return self.out if precision == "fp32" else self.out / f".{precision}"

    def model_at(self, precision: str) -> nn.Module:
        """The model to compile for ``precision`` (cast once per call)."""
        if precision not in self._cast:
            self._cast[precision] = cast_model(self.model, precision)
        return self._cast[precision]

    def build(self, name: str, precision: str = "fp32") -> Built:
        """Write backend ``name``'s artifact at ``precision`` (once per call for a shared file)
        and load it."""
        backend = get_backend(name)
        device, _ = model_device_dtype(self.model)
        directory = self.directory(precision)
        extra = self._written.get((backend.artifact_file, precision))
        if extra is None:
            directory.mkdir(parents=True, exist_ok=True)
            target = directory / backend.artifact_file
            extra = backend.compile(
                CompileRequest(
                    self.model_at(precision),
                    self.tensors,
                    self.names,
                    target,
                    self.max_batch,
                    self.opt_batch,
                )
            )
            self._written[(backend.artifact_file, precision)] = extra
        run_device = torch.device(backend.device) if backend.device is not None else device
        return load_runner(name, directory, run_device), extra, run_device

    def one(self, name: str, precision: str = "fp32") -> CompiledArtifact:
        """Build backend ``name`` at ``precision`` and keep it."""
        start = time.perf_counter()
        runner, extra, run_device = self.build(name, precision)
        return self.finish(name, runner, extra, run_device, start, None, precision)

    def finish(
        self,
        name: str,
        runner: Runner,
        extra: dict[str, Any],
        run_device: torch.device,
        start: float,
        fallback_reason: str | None,
        precision: str = "fp32",
    ) -> CompiledArtifact:
        """Move the kept artifact into ``out`` (low precision), drop the other precisions'
        builds, write ``compiled.json`` (after the artifact) and return the loaded artifact."""
        artifact_path = self.out / get_backend(name).artifact_file
        if precision != "fp32":
            os.replace(self.directory(precision) / artifact_path.name, artifact_path)
        for other in {p for _, p in self._written} - {"fp32"}:
            shutil.rmtree(self.directory(other), ignore_errors=True)
        metadata: dict[str, Any] = {
            "format": FORMAT,
            "backend": name,
            "requested_backend": self.requested,
            "fallback_reason": fallback_reason if name != self.requested else None,
            "failed_backends": list(self.errors),
            "artifact": artifact_path.name,
            "artifact_sha256": sha256_file(artifact_path),
            "source_weights_sha256": state_dict_sha256(self.model),
            "input_names": self.names,
            "dynamic_dims": {n: list(d.values()) for n, d in dynamic_dims(self.names).items()},
            "max_batch": self.max_batch,
            "dtype": str(DTYPES[precision]).removeprefix("torch."),
            "precision": precision,
            "requested_precision": self.requested_precision,
            **({"precision_reason": self.precision_reason} if self.precision_reason else {}),
            "device": str(run_device),
            "device_name": device_description(run_device),
            "num_members": getattr(self.model, "num_members", None),
            "attention_implementation": getattr(self.model, "attention_implementation", None),
            "compile_seconds": round(time.perf_counter() - start, 3),
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "library_versions": library_versions(),
            **extra,
        }
        write_json(self.out / METADATA_FILE, metadata)
        return CompiledArtifact(name, self.out, metadata, runner)
