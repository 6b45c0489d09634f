"""Inputs of a compiled artifact: which positional tensors it takes, in contract order.

A batch mapping (``input_ids``/``attention_mask``/``token_type_ids`` or ``pixel_values``; other
keys such as ``labels`` are ignored) or the model's positional tensors
``(inputs, attention_mask, token_type_ids)``. The batch dimension (and, for text, the sequence
dimension) is dynamic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
IMAGE_INPUTS = ("pixel_values",)


def input_names_of(example_inputs: Mapping[str, Tensor] | Sequence[Tensor | None]) -> list[str]:
    """Names of the positional inputs an artifact is compiled for (contract order)."""
    if isinstance(example_inputs, Mapping):
        if "pixel_values" in example_inputs:
            return ["pixel_values"]
        if "input_ids" not in example_inputs:
            raise ValueError(
                "example_inputs must have 'input_ids' or 'pixel_values', "
                f"got keys {sorted(example_inputs)}"
            )
        names = [n for n in TEXT_INPUTS if example_inputs.get(n) is not None]
        if "token_type_ids" in names and "attention_mask" not in names:
            names.insert(1, "attention_mask")
        return names
    tensors = list(example_inputs)
    if not tensors or not isinstance(tensors[0], Tensor):
        raise ValueError("example_inputs must be a batch mapping or a non-empty tuple of tensors")
    if tensors[0].is_floating_point():
        return ["pixel_values"]
    names = [n for n, t in zip(TEXT_INPUTS, tensors, strict=False) if t is not None]
    if len(tensors) > 2 and tensors[2] is not None and "attention_mask" not in names:
        names.insert(1, "attention_mask")
    return names


def arrange_inputs(
    inputs: Mapping[str, Tensor] | Sequence[Tensor | None], names: Sequence[str]
) -> tuple[Tensor, ...]:
    """The tensors for ``names`` from a batch mapping or positional tuple.

    A missing ``attention_mask`` becomes all ones and a missing ``token_type_ids`` all zeros
    (what the model does without them), so an artifact compiled with them accepts batches without.
    """
    if isinstance(inputs, Mapping):
        given = {k: v for k, v in inputs.items() if v is not None}
    else:
        seq = list(inputs)
        order = IMAGE_INPUTS if seq and seq[0].is_floating_point() else TEXT_INPUTS
        given = {n: t for n, t in zip(order, seq, strict=False) if t is not None}
    first = given.get(names[0])
    if first is None:
        raise ValueError(f"inputs must provide {names[0]!r}, got {sorted(given)}")
    out = []
    for name in names:
        if name in given:
            out.append(given[name])
        elif name == "attention_mask":
            out.append(torch.ones(first.shape[:2], dtype=torch.long, device=first.device))
        elif name == "token_type_ids":
            out.append(torch.zeros(first.shape[:2], dtype=torch.long, device=first.device))
        else:  # pragma: no cover - names come from input_names_of
            raise ValueError(f"inputs must provide {name!r}")
    return tuple(out)


def dynamic_dims(names: Sequence[str]) -> dict[str, dict[int, str]]:
    """Which dims of each input are dynamic: batch always, sequence for text."""
    return {n: ({0: "batch"} if n == "pixel_values" else {0: "batch", 1: "seq"}) for n in names}


def dynamic_shapes(names: Sequence[str], max_batch: int) -> tuple[dict[int, object], ...]:
    """``torch.export`` dynamic shapes for ``names``: batch ``1..max(2, max_batch)``, sequence
    ``Dim.AUTO``."""
    batch = torch.export.Dim("batch", min=1, max=max(2, max_batch))
    dims = dynamic_dims(names)
    return tuple(
        {i: (batch if label == "batch" else torch.export.Dim.AUTO) for i, label in dims[n].items()}
        for n in names
    )


def trace_inputs(tensors: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
    """Example tensors for tracing: a batch of 1 is repeated to 2 (a size-1 dim would be
    specialised and the dynamic batch refused)."""
    if tensors[0].shape[0] != 1:
        return tensors
    return tuple(torch.cat([t, t]) for t in tensors)
