"""A compiled artifact on disk and in memory.

An artifact directory holds the backend's artifact file and ``compiled.json`` (:data:`FORMAT`:
backend, requested backend, fallback reason, input names, dynamic dims, dtype, device, library
versions, SHA-256 of the artifact and of the source weights). Both are written to a temporary
name in the same directory and renamed into place, the artifact first, so ``compiled.json`` never
points at a partial file.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..atomic import atomic_write_bytes
from ..hashing import sha256_file
from ..versions import library_versions as _library_versions
from .backends import load_runner
from .inputs import arrange_inputs

METADATA_FILE = "compiled.json"
VERIFICATION_FILE = "verification.json"
FORMAT = "hydra-ens-compiled/1"
#: Optional libraries whose versions ``compiled.json`` records (``None`` when not installed).
COMPILE_LIBRARIES = ("onnx", "onnxruntime", "onnxscript", "torch_tensorrt", "tensorrt")


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
        """``[B, C]`` mean of the member softmaxes (no temperature), as
        :func:`hydra_ops.uq.calibration.ensemble_log_probs` computes it."""
        from hydra_ops.uq.calibration import ensemble_log_probs

        return ensemble_log_probs(self(*inputs).float()).exp()

    def __getitem__(self, key: str) -> Any:
        return self.metadata[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.metadata)

    def __len__(self) -> int:
        return len(self.metadata)


def load_compiled(
    out_dir: str | os.PathLike[str], device: str | torch.device | None = None
) -> CompiledArtifact:
    """Load an artifact directory written by :func:`~hydra_ops.compile.compile_model` (artifact
    hash verified).

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
    if not artifact.is_file() or sha256_file(artifact) != metadata["artifact_sha256"]:
        raise ValueError(f"{artifact}: missing or its SHA-256 does not match {METADATA_FILE}")
    run_device = torch.device(device) if device is not None else torch.device(metadata["device"])
    metadata = {**metadata, "device": str(run_device)}
    return CompiledArtifact(
        backend, directory, metadata, load_runner(backend, directory, run_device)
    )


def write_json(path: Path, payload: Mapping[str, Any]) -> None:
    """``payload`` as indented, key-sorted JSON, written atomically."""
    atomic_write_bytes(path, json.dumps(payload, indent=2, sort_keys=True, default=str).encode())


def library_versions() -> dict[str, str | None]:
    """Versions of everything that can change what an artifact computes."""
    return _library_versions(optional=COMPILE_LIBRARIES)


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def model_device_dtype(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    """Device and dtype of the model's first parameter (CPU float32 without parameters)."""
    param = next(iter(model.parameters()), None)
    if param is None:
        return torch.device("cpu"), torch.float32
    return param.device, param.dtype
