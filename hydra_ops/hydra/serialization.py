"""Saving and loading a :class:`~hydra_ops.hydra.ensemble.HydraEnsemble` with no network or base
weights.

A saved model is a directory with two files:

* ``model.safetensors``: every parameter and buffer (the calibration temperature included);
* ``hydra.json``: the architecture description the model was built from (family, embedding
  config, per-layer head counts, which parameters are per member, plans, mode, attention
  implementation), the SHA-256 of ``model.safetensors``, a hash of the base weights the members
  were cut from (when given), the weights' dtype, the temperature, library versions and free-form
  ``metadata``.

Both files are written to temporary names in the target directory and renamed into place, the
weights first, so an interrupted save never leaves a ``hydra.json`` pointing at partial weights.

``load_hydra`` refuses, with a one-line :class:`HydraFormatError` (a ``ValueError``) naming the
file, before it builds anything:

* a ``hydra.json`` or ``model.safetensors`` whose SHA-256 differs from the one the caller expects
  (``expected_config_sha256`` / ``expected_weights_sha256``, e.g. recorded in a bundle);
* weights whose SHA-256 differs from the one ``hydra.json`` records (truncated or tampered);
* a ``hydra.json`` inconsistent with itself or with the weights (:func:`check_hydra_config`,
  defined with the format's names in :mod:`hydra_ops.hydra.format`).

The model computes with the ``temperature`` buffer in the weights; ``hydra.json``'s ``temperature``
field only describes it, so the two must be the same value bit for bit or the file is refused.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from hydra_ops.atomic import atomic_write_bytes, atomic_write_file
from hydra_ops.hashing import sha256_bytes, sha256_file, state_dict_sha256
from hydra_ops.hydra.format import (
    CLASSIFIER_WEIGHT_KEY,
    CONFIG_FILE,
    FORMAT,
    TEMPERATURE_KEY,
    WEIGHTS_FILE,
    HydraFormatError,
    check_hydra_config,
)
from hydra_ops.messages import one_line
from hydra_ops.versions import library_versions as _library_versions

from .ensemble import HydraEnsemble

__all__ = [
    "CLASSIFIER_WEIGHT_KEY",
    "CONFIG_FILE",
    "FORMAT",
    "TEMPERATURE_KEY",
    "WEIGHTS_FILE",
    "HydraFormatError",
    "check_hydra_config",
    "config_sha256",
    "library_versions",
    "load_hydra",
    "read_hydra_config",
    "save_hydra",
    "sha256_file",
    "state_dict_hash",
    "weights_sha256",
]

_SHA256 = re.compile(r"[0-9a-f]{64}")


def config_sha256(directory: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of the bytes of ``directory``'s ``hydra.json``.

    Record it next to :func:`weights_sha256` and pass both to :func:`load_hydra` to refuse a
    config edited after the recording (``hydra.json`` cannot hold its own hash).
    """
    return sha256_bytes(_config_bytes(directory))


def weights_sha256(directory: str | os.PathLike[str]) -> str:
    """Hex SHA-256 of the bytes of ``directory``'s ``model.safetensors``."""
    path = Path(directory) / WEIGHTS_FILE
    if not path.is_file():
        raise HydraFormatError(f"{path}: not found")
    return sha256_file(path)


#: The old name of :func:`hydra_ops.hashing.state_dict_sha256` (public API).
state_dict_hash = state_dict_sha256


def library_versions() -> dict[str, str]:
    """Versions of the libraries that define what a saved model computes (timm only when
    installed: loading needs no timm model)."""
    versions = _library_versions(("transformers", "safetensors"), ("timm",), missing="omit")
    return cast(dict[str, str], versions)  # missing="omit" leaves no None


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
        "dtype": str(state[TEMPERATURE_KEY].dtype).removeprefix("torch."),
        "temperature": float(state[TEMPERATURE_KEY]),
        "library_versions": library_versions(),
        "metadata": dict(metadata or {}),
    }
    atomic_write_bytes(out / CONFIG_FILE, json.dumps(config, indent=2, sort_keys=True).encode())
    return out


def _config_bytes(directory: str | os.PathLike[str]) -> bytes:
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise HydraFormatError(f"{path}: not found; is {directory} a saved Hydra model directory?")
    return path.read_bytes()


def _parse_config(data: bytes, path: Path) -> dict[str, Any]:
    try:
        config = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise HydraFormatError(
            f"{path}: not valid JSON ({one_line(error)}); the file is corrupt"
        ) from error
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        found = config.get("format") if isinstance(config, dict) else None
        raise HydraFormatError(f"{path}: format must be {FORMAT!r}, found {found!r}")
    return config


def read_hydra_config(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The parsed ``hydra.json`` of a saved model (``HydraFormatError`` if unreadable)."""
    return _parse_config(_config_bytes(directory), Path(directory) / CONFIG_FILE)


def _check_expected_sha256(argument: str, value: str | None) -> None:
    if value is not None and (not isinstance(value, str) or not _SHA256.fullmatch(value)):
        raise ValueError(
            f"{argument} must be None or a 64-character lower-case hex SHA-256, got {value!r}"
        )


def load_hydra(
    directory: str | os.PathLike[str],
    map_location: str | torch.device = "cpu",
    *,
    expected_config_sha256: str | None = None,
    expected_weights_sha256: str | None = None,
) -> HydraEnsemble:
    """Rebuild a saved model from ``directory``; bit-exact with what was saved.

    Args:
        directory: a directory written by :func:`save_hydra`.
        map_location: device for the weights.
        expected_config_sha256: when given, :func:`config_sha256` of ``hydra.json`` must equal it.
        expected_weights_sha256: when given, :func:`weights_sha256` of the weights must equal it.

    Raises:
        ValueError: an ``expected_*`` argument is not a hex SHA-256.
        HydraFormatError: a file is missing, truncated, tampered with, differs from the expected
            hash or is inconsistent (see :func:`check_hydra_config`); checked before anything is
            built.
    """
    _check_expected_sha256("expected_config_sha256", expected_config_sha256)
    _check_expected_sha256("expected_weights_sha256", expected_weights_sha256)
    config_path = Path(directory) / CONFIG_FILE
    data = _config_bytes(directory)
    if expected_config_sha256 is not None:
        actual = sha256_bytes(data)
        if actual != expected_config_sha256:
            raise HydraFormatError(
                f"{config_path}: SHA-256 {actual[:12]}... does not match the expected "
                f"{expected_config_sha256[:12]}...; the config was modified since it was recorded"
            )
    config = _parse_config(data, config_path)
    weights = Path(directory) / WEIGHTS_FILE
    if not weights.is_file():
        raise HydraFormatError(f"{weights}: not found")
    actual = sha256_file(weights)
    if expected_weights_sha256 is not None and actual != expected_weights_sha256:
        raise HydraFormatError(
            f"{weights}: SHA-256 {actual[:12]}... does not match the expected "
            f"{expected_weights_sha256[:12]}...; the weights were modified since they were recorded"
        )
    if actual != config.get("weights_sha256"):
        raise HydraFormatError(
            f"{weights}: SHA-256 {actual[:12]}... does not match the "
            f"{str(config.get('weights_sha256'))[:12]}... "
            f"recorded in {CONFIG_FILE}; the file is truncated or was modified"
        )
    try:
        state = load_file(weights, device=str(map_location))
    except (SafetensorError, OSError, ValueError) as error:
        raise HydraFormatError(
            f"{weights}: unreadable safetensors file ({one_line(error)})"
        ) from error
    check_hydra_config(config, state, config_path)
    model = HydraEnsemble(config["architecture"])
    model.to(dtype=getattr(torch, config["dtype"]), device=map_location)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as error:  # pragma: no cover - the layout check above covers this
        raise HydraFormatError(
            f"{weights}: weights do not match the architecture in {CONFIG_FILE} ({one_line(error)})"
        ) from error
    return model.eval()
