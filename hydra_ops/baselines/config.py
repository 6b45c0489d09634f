"""The JSON config file a saved efficient baseline keeps beside its weights: written atomically,
read back with its format checked."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

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
