"""Saving and loading a :class:`~hydra_ops.merge.HydraEnsemble` with no network and no base weights.

A saved model is a directory with two files:

* ``model.safetensors``: every parameter and buffer (the calibration temperature included);
* ``hydra.json``: the architecture description the model was built from (family, embedding
  config, per-layer head counts, which parameters are per member, plans, mode, attention
  implementation), the SHA-256 of ``model.safetensors``, a hash of the base weights the members
  were cut from (when given), library versions and free-form ``metadata``.

Both files are written to temporary names in the target directory and renamed into place, the
weights first, so an interrupted save never leaves a ``hydra.json`` pointing at partial weights.
``load_hydra`` verifies the hash before parsing the weights: a truncated or tampered file raises
:class:`HydraFormatError` (a ``ValueError``) naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from .atomic import atomic_write_bytes, atomic_write_file
from .merge import HydraEnsemble

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "hydra.json"
FORMAT = "hydra-ens/1"


class HydraFormatError(ValueError):
    """A saved Hydra directory is missing, truncated, tampered with or of an unknown format."""


def sha256_file(path: str | os.PathLike[str], chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def state_dict_hash(module_or_state: nn.Module | Mapping[str, torch.Tensor]) -> str:
    """Hex SHA-256 over a state dict's names, dtypes, shapes and bytes (order-independent)."""
    state = (
        module_or_state.state_dict() if isinstance(module_or_state, nn.Module) else module_or_state
    )
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def library_versions() -> dict[str, str]:
    """Versions of the libraries that define what a saved model computes."""
    import safetensors
    import transformers

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "safetensors": safetensors.__version__,
    }
    try:
        import timm

        versions["timm"] = timm.__version__
    except ImportError:  # pragma: no cover - timm is a dependency, but loading needs no timm model
        pass
    return versions


def save_hydra(
    model: HydraEnsemble,
    directory: str | os.PathLike[str],
    *,
    base_weights_hash: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Save ``model`` to ``directory`` (created if needed); returns the directory path.

    Args:
        model: the merged model.
        directory: target directory; existing ``model.safetensors`` / ``hydra.json`` are replaced.
        base_weights_hash: hash of the base model the members came from (provenance).
        metadata: extra JSON-serialisable fields stored under ``"metadata"``.
    """
    if not isinstance(model, HydraEnsemble):
        raise ValueError(f"model must be a HydraEnsemble, got {type(model).__name__}")
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    atomic_write_file(
        out / WEIGHTS_FILE, lambda tmp: save_file(state, str(tmp), metadata={"format": FORMAT})
    )
    weights_sha = sha256_file(out / WEIGHTS_FILE)
    config = {
        "format": FORMAT,
        "architecture": model.architecture,
        "weights_sha256": weights_sha,
        "base_weights_hash": base_weights_hash,
        "dtype": str(next(iter(state.values())).dtype).removeprefix("torch."),
        "temperature": float(model.temperature),
        "library_versions": library_versions(),
        "metadata": dict(metadata or {}),
    }
    atomic_write_bytes(out / CONFIG_FILE, json.dumps(config, indent=2, sort_keys=True).encode())
    return out


def read_hydra_config(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The parsed ``hydra.json`` of a saved model (``HydraFormatError`` if unreadable)."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise HydraFormatError(f"{path}: not found; is {directory} a saved Hydra model directory?")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise HydraFormatError(f"{path}: not valid JSON ({error}); the file is corrupt") from error
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        found = config.get("format") if isinstance(config, dict) else None
        raise HydraFormatError(f"{path}: format must be {FORMAT!r}, found {found!r}")
    return config


def load_hydra(
    directory: str | os.PathLike[str], map_location: str | torch.device = "cpu"
) -> HydraEnsemble:
    """Rebuild a saved model from ``directory``; bit-exact with what was saved.

    Raises:
        HydraFormatError: a file is missing, truncated, tampered with or inconsistent.
    """
    config = read_hydra_config(directory)
    weights = Path(directory) / WEIGHTS_FILE
    if not weights.is_file():
        raise HydraFormatError(f"{weights}: not found")
    actual = sha256_file(weights)
    if actual != config.get("weights_sha256"):
        raise HydraFormatError(
            f"{weights}: SHA-256 {actual[:12]}... does not match the "
            f"{str(config.get('weights_sha256'))[:12]}... "
            f"recorded in {CONFIG_FILE}; the file is truncated or was modified"
        )
    try:
        state = load_file(weights, device=str(map_location))
    except (SafetensorError, OSError, ValueError) as error:
        raise HydraFormatError(f"{weights}: unreadable safetensors file ({error})") from error
    try:
        model = HydraEnsemble(config["architecture"])
    except (KeyError, TypeError, ValueError) as error:
        raise HydraFormatError(
            f"{Path(directory) / CONFIG_FILE}: invalid architecture description ({error})"
        ) from error
    dtype = next(iter(state.values())).dtype
    model.to(dtype=dtype, device=map_location)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as error:
        raise HydraFormatError(
            f"{weights}: weights do not match the architecture in {CONFIG_FILE} ({error})"
        ) from error
    return model.eval()
