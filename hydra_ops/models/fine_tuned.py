"""A user's fine-tuned classifier as the base: a local Hugging Face ``*ForSequenceClassification``
folder whose trained head and ``id2label`` are kept.

* :func:`checkpoint_labels`: the label names a folder's ``config.json`` declares (one-line
  ValueError when it is no fine-tuned classifier);
* :func:`match_labels`: the permutation that puts the checkpoint's labels in the data's class
  order (one-line ValueError naming both lists when the names differ);
* :func:`load_fine_tuned`: the model with its head rows in the data's order, offline.

No torch import at module level: the params schema reads :func:`checkpoint_labels`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: The architecture suffix a fine-tuned text classifier's ``config.json`` names.
CLASSIFIER_SUFFIX = "ForSequenceClassification"


def _config(path: str | os.PathLike[str]) -> dict[str, Any]:
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
    return config


def checkpoint_labels(path: str | os.PathLike[str]) -> list[str]:
    """The label names of the fine-tuned classifier in ``path``, in its output order.

    ValueError (one line naming the folder) unless its ``config.json`` names a
    ``*ForSequenceClassification`` architecture and an ``id2label`` of indices 0..C-1, C >= 2.
    """
    config = _config(path)
    file = str(Path(path) / "config.json")
    architectures = config.get("architectures") or []
    if not any(str(a).endswith(CLASSIFIER_SUFFIX) for a in architectures):
        raise ValueError(
            f"{file!r} names no *{CLASSIFIER_SUFFIX} architecture (got {architectures!r}): "
            "finetune.from_checkpoint needs a fine-tuned classifier with its trained head"
        )
    id2label = config.get("id2label")
    if not isinstance(id2label, dict) or len(id2label) < 2:
        raise ValueError(f"{file!r} has no id2label of at least 2 labels (got {id2label!r})")
    try:
        by_index = {int(k): str(v) for k, v in id2label.items()}
    except ValueError:
        raise ValueError(
            f"{file!r}: id2label keys must be integers, got {list(id2label)}"
        ) from None
    if sorted(by_index) != list(range(len(by_index))):
        raise ValueError(f"{file!r}: id2label keys must be 0..{len(by_index) - 1}")
    labels = [by_index[i] for i in range(len(by_index))]
    if len(set(labels)) != len(labels):
        raise ValueError(f"{file!r}: id2label names a label twice ({labels})")
    return labels


def match_labels(labels: Sequence[str], classes: Sequence[str]) -> list[int]:
    """``order`` such that ``labels[order[i]] == classes[i]``: where each of the data's classes
    sits in the checkpoint's outputs. ValueError (one line naming both lists) unless the two
    hold the same names."""
    if sorted(labels) != sorted(classes) or len(set(classes)) != len(classes):
        raise ValueError(
            f"the checkpoint's labels {list(labels)} are not the data's classes {list(classes)}: "
            "the ID classes must be exactly the labels the classifier was trained on"
        )
    position = {name: i for i, name in enumerate(labels)}
    return [position[c] for c in classes]


def _output_layer(model: Any, num_labels: int) -> Any:
    """The classifier's last ``nn.Linear`` with ``num_labels`` outputs (``classifier`` or
    ``classifier.out_proj`` depending on the family)."""
    from torch import nn

    head = getattr(model, "classifier", None)
    linears = [] if head is None else [m for m in head.modules() if isinstance(m, nn.Linear)]
    if not linears or linears[-1].out_features != num_labels:
        raise ValueError(
            f"{type(model).__name__}: no classifier layer with {num_labels} outputs to reorder"
        )
    return linears[-1]


def load_fine_tuned(path: str | os.PathLike[str], classes: Sequence[str]) -> Any:
    """The fine-tuned classifier in ``path`` (offline, every weight from the folder, eval mode)
    with its output rows reordered to ``classes`` and its ``id2label`` saying so.

    Shape: logits [B, C], column ``i`` is ``classes[i]``.

    Raises:
        ValueError: (one line) :func:`checkpoint_labels`, :func:`match_labels`, or a weight the
            folder lacks (it would be randomly initialised).
    """
    import torch
    from transformers import AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    order = match_labels(checkpoint_labels(path), classes)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model, info = AutoModelForSequenceClassification.from_pretrained(
            str(path), local_files_only=True, output_loading_info=True
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    missing = sorted(info.get("missing_keys", ()))
    if missing:
        raise ValueError(
            f"model.path {str(path)!r}: {len(missing)} weight(s) missing from the checkpoint "
            f"(e.g. {missing[:3]}), they would be random: give the fine-tuned classifier's folder"
        )
    layer = _output_layer(model, len(classes))
    index = torch.tensor(order)
    with torch.no_grad():
        layer.weight.copy_(layer.weight[index].clone())
        if layer.bias is not None:
            layer.bias.copy_(layer.bias[index].clone())
    model.config.id2label = {i: str(c) for i, c in enumerate(classes)}
    model.config.label2id = {str(c): i for i, c in enumerate(classes)}
    model.eval()
    return model
