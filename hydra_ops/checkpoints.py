"""Saving and loading base models as safetensors + a JSON config, verified by sha256.

Layout of a checkpoint folder::

    model.safetensors     the state dict (tied weights stored once)
    checkpoint.json       {"format_version", "family", "config", "weights_sha256", "head_plan",
                           "metadata"}

``head_plan`` (kept heads per layer, original indices) is set for a model pruned by
:func:`hydra_ops.surgery.prune_heads`: loading rebuilds the unpruned architecture from ``config``,
prunes it to that plan, then loads the weights.

``family`` is ``bert`` / ``hf_vit`` (``config`` = ``model.config.to_dict()``) or ``timm_vit``
(``config`` = the ``VisionTransformer`` constructor kwargs, see
:func:`hydra_ops.models.timm_vit_kwargs`). Loading never touches the network.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .atomic import atomic_write_dir
from .hashing import sha256_file

WEIGHTS = "model.safetensors"
META = "checkpoint.json"
FORMAT_VERSION = 1
FAMILIES = ("bert", "hf_vit", "timm_vit")


class CheckpointError(ValueError):
    """A checkpoint folder is missing a file, or a file is truncated, corrupt or tampered with."""


def model_family(model: nn.Module) -> str:
    """``bert`` | ``hf_vit`` | ``timm_vit`` (ValueError naming the supported ones otherwise)."""
    name = type(model).__name__
    if name == "BertForSequenceClassification":
        return "bert"
    if name == "ViTForImageClassification":
        return "hf_vit"
    from timm.models.vision_transformer import VisionTransformer

    if isinstance(model, VisionTransformer):
        return "timm_vit"
    raise ValueError(
        f"save_model: unsupported model type {name}; supported families: {', '.join(FAMILIES)} "
        "(BertForSequenceClassification, ViTForImageClassification, timm VisionTransformer)"
    )


def _timm_kwargs(model: nn.Module) -> dict[str, Any]:
    """Constructor kwargs recorded by build_timm_vit, or recovered from the module's shapes."""
    recorded = getattr(model, "hydra_init_kwargs", None)
    if recorded is not None:
        return dict(recorded)
    patch = model.patch_embed
    img = patch.img_size
    blocks = list(model.blocks)
    embed_dim = int(model.embed_dim)
    return {
        "img_size": int(img[0]),
        "patch_size": int(patch.patch_size[0]),
        "in_chans": int(patch.proj.in_channels),
        "num_classes": int(model.num_classes),
        "embed_dim": embed_dim,
        "depth": len(blocks),
        # head_dim survives pruning, the head count does not
        "num_heads": embed_dim // int(blocks[0].attn.head_dim),
        "mlp_ratio": blocks[0].mlp.fc1.out_features / embed_dim,
        "class_token": model.cls_token is not None,
        "global_pool": model.global_pool,
        "qkv_bias": blocks[0].attn.qkv.bias is not None,
        # LayerScale present or not; its values come from the weights file
        "init_values": None if isinstance(blocks[0].ls1, nn.Identity) else 1.0,
    }


def _model_config(model: nn.Module, family: str) -> dict[str, Any]:
    if family == "timm_vit":
        return _timm_kwargs(model)
    return model.config.to_dict()


def _state_dict_for_save(model: nn.Module) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors; aliases of one storage (tied weights) kept once."""
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen:
            continue
        seen.add(key)
        out[name] = tensor.detach().to("cpu").contiguous().clone()
    return out


def _head_plan_dict(model: nn.Module) -> dict[str, list[int]] | None:
    """The pruned model's kept heads (original indices), or None for an unpruned model."""
    from .surgery import PLAN_ATTRIBUTE

    plan = getattr(model, PLAN_ATTRIBUTE, None)
    return None if plan is None else plan.to_dict()


def save_model(
    model: nn.Module,
    directory: str | os.PathLike[str],
    extra_metadata: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` to ``directory`` atomically (temp folder next to it, then rename).

    ``extra_metadata`` must be JSON-serialisable (e.g. class names, the train report).
    Returns the checkpoint folder.
    """
    from safetensors.torch import save_file

    family = model_family(model)
    out = Path(directory)
    with atomic_write_dir(out, mode=0o755) as tmp:
        save_file(_state_dict_for_save(model), str(tmp / WEIGHTS), metadata={"format": "pt"})
        meta = {
            "format_version": FORMAT_VERSION,
            "family": family,
            "config": _model_config(model, family),
            "weights_sha256": sha256_file(tmp / WEIGHTS),
            "head_plan": _head_plan_dict(model),
            "metadata": extra_metadata or {},
        }
        try:
            text = json.dumps(meta, indent=2, sort_keys=True, default=str)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"extra_metadata is not JSON-serialisable: {exc}") from None
        (tmp / META).write_text(text + "\n", encoding="utf-8")
    return out


def read_checkpoint_metadata(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The parsed ``checkpoint.json`` (CheckpointError if missing or malformed)."""
    path = Path(directory) / META
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {str(path)!r} is missing")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"checkpoint file {str(path)!r} is not valid JSON: {exc}") from None
    missing = [k for k in ("family", "config", "weights_sha256") if k not in meta]
    if missing or meta.get("family") not in FAMILIES:
        raise CheckpointError(
            f"checkpoint file {str(path)!r} is malformed: missing {missing} or unknown family "
            f"{meta.get('family')!r} (allowed: {', '.join(FAMILIES)})"
        )
    return meta


def _build_empty(family: str, config: dict[str, Any]) -> nn.Module:
    if family == "timm_vit":
        from timm.models.vision_transformer import VisionTransformer

        model = VisionTransformer(**config)
        model.hydra_init_kwargs = dict(config)
        return model
    if family == "bert":
        from transformers import BertConfig, BertForSequenceClassification

        return BertForSequenceClassification(BertConfig.from_dict(config))
    from transformers import ViTConfig, ViTForImageClassification

    return ViTForImageClassification(ViTConfig.from_dict(config))


def load_model(directory: str | os.PathLike[str], verify: bool = True) -> nn.Module:
    """Rebuild the model saved by :func:`save_model`, in eval mode, on CPU.

    Raises:
        CheckpointError: a file is missing; ``model.safetensors``'s sha256 differs from the one
            recorded (truncated, corrupt or tampered); the weights do not fit the config.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(directory)
    meta = read_checkpoint_metadata(folder)
    weights = folder / WEIGHTS
    if not weights.is_file():
        raise CheckpointError(f"checkpoint file {str(weights)!r} is missing")
    if verify:
        digest = sha256_file(weights)
        if digest != meta["weights_sha256"]:
            raise CheckpointError(
                f"checkpoint file {str(weights)!r} is truncated, corrupt or was modified: sha256 "
                f"{digest[:12]}... != recorded {str(meta['weights_sha256'])[:12]}..."
            )
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint file {str(weights)!r} cannot be read: {exc}") from None
    try:
        model = _build_empty(meta["family"], dict(meta["config"]))
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(
            f"checkpoint file {str(folder / META)!r}: config cannot build a "
            f"{meta['family']} model: {exc}"
        ) from None
    if meta.get("head_plan") is not None:
        from .plans import HeadPlan
        from .surgery import prune_heads

        try:
            prune_heads(model, HeadPlan.from_dict(meta["head_plan"]))
        except ValueError as exc:
            raise CheckpointError(
                f"checkpoint file {str(folder / META)!r}: invalid head_plan: {exc}"
            ) from None
    expected = model.state_dict()
    unexpected = sorted(set(state) - set(expected))
    missing = sorted(set(expected) - set(state))
    # Tied weights are stored once; a missing key is fine only when it is tied to a stored one.
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    really_missing = [k for k in missing if k not in tied and not k.endswith("decoder.weight")]
    shape_bad = [k for k in state if k in expected and state[k].shape != expected[k].shape]
    if unexpected or really_missing or shape_bad:
        raise CheckpointError(
            f"checkpoint file {str(weights)!r} does not match its config: unexpected "
            f"{unexpected[:3]}, missing {really_missing[:3]}, wrong shape {shape_bad[:3]}"
        )
    model.load_state_dict(state, strict=False)
    if hasattr(model, "tie_weights") and missing:
        model.tie_weights()
    model.eval()
    return model
