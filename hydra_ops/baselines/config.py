"""What a saved efficient baseline keeps beside the base: its JSON config (written atomically,
read back with its format checked) and its own tensors (copied back in, every key and shape
checked)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from hydra_ops.atomic import atomic_write_bytes


def write_config(directory: str | os.PathLike[str], name: str, config: dict[str, Any]) -> None:
    """Write ``config`` as ``directory/name`` (sorted keys, atomically)."""
    text = json.dumps(config, indent=2, sort_keys=True) + "\n"
    atomic_write_bytes(Path(directory) / name, text.encode())


def read_config(
    directory: str | os.PathLike[str], name: str, fmt: str, what: str
) -> dict[str, Any]:
    """The parsed ``directory/name``; ValueError (one line) when it is missing, not JSON, or its
    ``format`` is not ``fmt`` (``what``: the model it saves, for the message)."""
    path = Path(directory) / name
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a saved {what} ({err})") from None
    if not isinstance(config, dict) or config.get("format") != fmt:
        found = config.get("format") if isinstance(config, dict) else None
        raise ValueError(f"{path}: format {found!r}, expected {fmt!r}")
    return config


def copy_state_into(own: Mapping[str, Tensor], state: Mapping[str, Tensor], what: str) -> None:
    """Copy ``state`` into the tensors of ``own`` (same keys); ValueError naming the first
    missing, unexpected or misshapen key (``what``: the tensors' name, for the message)."""
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(
            f"{what} do not fit this model: missing {missing[:1]}, unexpected "
            f"{unexpected[:1]} ({len(missing)} missing, {len(unexpected)} unexpected)"
        )
    for key, t in own.items():
        if tuple(state[key].shape) != tuple(t.shape):
            raise ValueError(
                f"{what} {key}: shape {tuple(state[key].shape)}, the model needs {tuple(t.shape)}"
            )
    with torch.no_grad():
        for key, t in own.items():
            t.copy_(state[key])
