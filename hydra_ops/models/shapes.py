"""Default shapes of the models hydra_ops builds from scratch, and the family and shape of a local
model folder from its ``config.json`` (no torch import: the pipeline's params schema reads them)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra_ops.adapters.family import ModelFamily, family_of_model_type


@dataclass(frozen=True)
class VitShape:
    """The from-scratch timm ViT's shape; its defaults are the one default for the library and
    for any params schema built on it (the pipeline's ``model.vit`` reads them from here)."""

    image_size: int = 16
    patch_size: int = 4
    embed_dim: int = 96
    depth: int = 4
    num_heads: int = 6
    mlp_ratio: float = 2.0


VIT_DEFAULTS = VitShape()


def read_model_folder(path: str | os.PathLike[str]) -> tuple[dict[str, Any], ModelFamily]:
    """``(config.json as a dict, its family)`` of a local model folder; ValueError (one line naming
    the folder) unless its ``model_type`` is one a registered family loads
    (:attr:`~hydra_ops.adapters.family.ModelFamily.model_types`; the message lists them)."""
    file = Path(path) / "config.json"
    if not file.is_file():
        raise ValueError(f"{str(path)!r} is not a local model folder (no config.json)")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"{str(file)!r} is not readable JSON ({reason})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{str(file)!r} must hold a JSON object")
    return config, family_of_model_type(config.get("model_type"), repr(str(file)))


def model_folder_shape(path: str | os.PathLike[str]) -> tuple[int, int]:
    """``(layers, heads per layer)`` from a model folder's ``config.json`` (its family's
    ``shape_keys``; :func:`read_model_folder`; ValueError too when a count is not a positive
    integer)."""
    config, family = read_model_folder(path)
    file = Path(path) / "config.json"
    shape = []
    for key in family.shape_keys:
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{str(file)!r}: {key} must be a positive integer, got {value!r}")
        shape.append(value)
    return shape[0], shape[1]
