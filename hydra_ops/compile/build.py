"""One :func:`~hydra_ops.compile.compile_model` call: build backends into a directory, then write
``compiled.json`` for the one kept."""

from __future__ import annotations

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

#: A built backend: its runner, the metadata its builder returned and the device it runs on.
Built = tuple[Runner, dict[str, Any], torch.device]


@dataclass
class Build:
    """Builds backends of ``model`` into ``out`` and writes the metadata of the one kept.

    ``errors`` collects ``"<backend>: <why>"`` for every backend that failed (``failed_backends``
    in ``compiled.json``).
    """

    model: nn.Module
    tensors: tuple[Tensor, ...]
    names: list[str]
    out: Path
    max_batch: int
    opt_batch: int
    requested: str
    errors: list[str] = field(default_factory=list)
    # artifact file -> its builder's metadata: backends sharing a file (export, inductor) build once
    _written: dict[str, dict[str, Any]] = field(default_factory=dict)

    def build(self, name: str) -> Built:
        """Write backend ``name``'s artifact (once per call for a shared file) and load it."""
        backend = get_backend(name)
        device, _ = model_device_dtype(self.model)
        extra = self._written.get(backend.artifact_file)
        if extra is None:
            target = self.out / backend.artifact_file
            extra = backend.compile(
                CompileRequest(
                    self.model, self.tensors, self.names, target, self.max_batch, self.opt_batch
                )
            )
            self._written[backend.artifact_file] = extra
        run_device = torch.device(backend.device) if backend.device is not None else device
        return load_runner(name, self.out, run_device), extra, run_device

    def one(self, name: str) -> CompiledArtifact:
        """Build backend ``name`` and keep it."""
        start = time.perf_counter()
        runner, extra, run_device = self.build(name)
        return self.finish(name, runner, extra, run_device, start, None)

    def finish(
        self,
        name: str,
        runner: Runner,
        extra: dict[str, Any],
        run_device: torch.device,
        start: float,
        fallback_reason: str | None,
    ) -> CompiledArtifact:
        """Write ``compiled.json`` (after the artifact) and return the loaded artifact."""
        _, dtype = model_device_dtype(self.model)
        artifact_path = self.out / get_backend(name).artifact_file
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
        write_json(self.out / METADATA_FILE, metadata)
        return CompiledArtifact(name, self.out, metadata, runner)
