"""Default shapes of the models hydra_ops builds from scratch (no torch import: the pipeline's
params schema reads them)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: ``model_type`` values of the ``config.json`` a text model folder may have.
TEXT_MODEL_TYPES = ("bert",)


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


def read_text_model_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``path``'s ``config.json`` as a dict; ValueError (one line naming the folder) unless it is a
    local BERT folder (``model_type`` in :data:`TEXT_MODEL_TYPES`)."""
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
    model_type = config.get("model_type")
    if model_type not in TEXT_MODEL_TYPES:
        raise ValueError(
            f"{str(file)!r} has model_type {model_type!r}, supported: "
            f"{', '.join(map(repr, TEXT_MODEL_TYPES))} (a BERT encoder such as MiniLM)"
        )
    return config


def text_model_shape(path: str | os.PathLike[str]) -> tuple[int, int]:
    """``(layers, heads per layer)`` from a BERT folder's ``config.json``
    (:func:`read_text_model_config`; ValueError too when a count is not a positive integer)."""
    config = read_text_model_config(path)
    file = Path(path) / "config.json"
    shape = []
    for key in ("num_hidden_layers", "num_attention_heads"):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{str(file)!r}: {key} must be a positive integer, got {value!r}")
        shape.append(value)
    return shape[0], shape[1]
