"""A prepared split (:class:`hydra_ops.data.Split`) as contract batches, and its labels.

Batches follow docs/architecture.md: ``input_ids`` / ``attention_mask`` (/ ``token_type_ids``)
for text, ``pixel_values`` for images, plus ``labels`` when asked for (built by
:func:`hydra_ops.models.factory.make_text_batches` /
:func:`hydra_ops.models.factory.make_image_batches`).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from hydra_ops.data import augment
from hydra_ops.data.store import Split

Batch = dict[str, torch.Tensor]


@functools.cache
def text_tokenizer(model_path: str) -> Any:
    """The fast tokenizer of the local model folder ``model_path``, loaded once per process and
    never from a hub. There is no default: text must be tokenized by the folder its model is
    loaded from (another family's ids would be read as wrong words)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_path), local_files_only=True)


def split_batches(
    split: Split,
    batch_size: int,
    *,
    tokenizer: Any = None,
    max_length: int = 64,
    image_size: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    with_labels: bool = True,
    limit: int | None = None,
    pin_memory: bool = False,
    random_shift: int = 0,
) -> list[Batch]:
    """The first ``limit`` examples of ``split`` (all when None) as batches of ``batch_size``.

    Text splits need ``tokenizer`` (e.g. :func:`text_tokenizer`) and are cut at ``max_length``
    tokens; image splits are resized to ``image_size`` (None: the stored size). ``labels`` [B]
    long is included with ``with_labels``. With ``shuffle`` the order is a permutation drawn
    from ``seed`` only, so the same arguments give the same batches. ``pin_memory`` puts every
    tensor in page-locked memory, so the copies to a CUDA device are non-blocking
    (:func:`hydra_ops.models.runtime.move_batch`); it needs CUDA. ``random_shift`` k > 0 (image
    splits only, for training) translates every image by random offsets in ``{-k..k}`` pixels
    (:func:`hydra_ops.data.augment.random_shift`), drawn from a torch generator seeded with
    ``seed``, so the same arguments still give the same batches.
    """
    from hydra_ops.models.factory import make_image_batches, make_text_batches

    if split.texts is not None and tokenizer is None:
        raise ValueError(
            f"tokenizer is required for the text split {split.name!r} "
            "(e.g. hydra_ops.data.text_tokenizer(model_path))"
        )
    if random_shift and split.texts is not None:
        raise ValueError(
            f"random_shift: only image splits can be shifted; {split.name!r} holds texts "
            "(use random_shift=0)"
        )
    inputs = split.texts if split.texts is not None else split.images
    inputs = inputs if limit is None else inputs[:limit]
    labels = split.labels[: len(inputs)].tolist() if with_labels else None
    order = {"batch_size": batch_size, "shuffle": shuffle, "seed": seed}
    if split.texts is not None:
        built = list(make_text_batches(inputs, labels, tokenizer, max_length=max_length, **order))
    else:
        built = list(make_image_batches(inputs, labels, image_size=image_size, **order))
        if random_shift:
            generator = torch.Generator().manual_seed(int(seed))
            for b in built:
                b["pixel_values"] = augment.random_shift(b["pixel_values"], random_shift, generator)
    if pin_memory:
        if not torch.cuda.is_available():
            raise ValueError("pin_memory: needs CUDA (torch.cuda.is_available() is False)")
        built = [{k: v.pin_memory() for k, v in b.items()} for b in built]
    return built


def split_labels(split: Split) -> torch.Tensor:
    """``split.labels`` as a [N] long tensor (-1 marks the examples of an OOD split)."""
    return torch.as_tensor(np.asarray(split.labels), dtype=torch.long)
