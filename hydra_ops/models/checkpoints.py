"""Saving and loading models (bases, pruned members) as safetensors + a JSON config, verified
by sha256.

Layout of a checkpoint folder::

    model.safetensors     the state dict (tied weights stored once)
    checkpoint.json       {"format_version", "family", "config", "weights_sha256", "head_plan",
                           "metadata"}

``head_plan`` (kept heads per layer, original indices) is set for a model pruned by
:func:`hydra_ops.heads.surgery.prune_heads`: loading rebuilds the unpruned architecture from
``config``, prunes it to that plan, then loads the weights.

``family`` is a registered family (``hydra_ops.adapters.FAMILIES``); its adapter class writes
``config`` (:meth:`~hydra_ops.adapters.ModelAdapter.model_config`: ``model.config.to_dict()`` for
a Hugging Face family, the ``VisionTransformer`` constructor kwargs for ``timm_vit``) and rebuilds
the model from it (:meth:`~hydra_ops.adapters.ModelAdapter.build_model`). Loading never touches
the network.

A checkpoint is a cacheable output: the same model and metadata give the same bytes. So
``metadata`` holds no wall-clock field (:data:`TIMING_FIELDS`, see :func:`split_timings`) and the
Hugging Face config's ``_name_or_path`` (the folder the pretrained weights were read from, which
differs between checkouts) is stored empty.

Members (:func:`save_member` / :func:`load_member`) are checkpoints of pruned models that record
the ``weights_sha256`` of the base they were cut from; loading checks it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from hydra_ops.atomic import atomic_write_dir
from hydra_ops.hashing import sha256_file

if TYPE_CHECKING:
    from hydra_ops.heads.plans import HeadPlan

WEIGHTS = "model.safetensors"
META = "checkpoint.json"
FORMAT_VERSION = 1
#: ``TrainReport`` fields that are wall-clock measurements: they differ between two runs that give
#: the same weights, so they go to a stage's uncached metrics or the log, never into a checkpoint.
TIMING_FIELDS = ("epoch_seconds", "total_seconds")


class CheckpointError(ValueError):
    """A checkpoint folder is missing a file, or a file is truncated, corrupt or tampered with."""


def _families() -> tuple[str, ...]:
    from hydra_ops.adapters import FAMILIES

    return tuple(FAMILIES)


def model_family(model: nn.Module) -> str:
    """The registered family of ``model`` (ValueError naming the supported ones otherwise)."""
    from hydra_ops.adapters import UnsupportedModelError, adapter_class

    try:
        return adapter_class(model).family
    except UnsupportedModelError:
        raise ValueError(
            f"save_model: unsupported model type {type(model).__name__}; supported families: "
            f"{', '.join(_families())}"
        ) from None


def split_timings(report: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(record, timings)`` of a ``TrainReport.to_dict()``: ``record`` is what the same inputs
    always give (loss curve, steps, lr, seed, trainable parameters) and may go into a checkpoint;
    ``timings`` holds the :data:`TIMING_FIELDS`."""
    record = {k: v for k, v in report.items() if k not in TIMING_FIELDS}
    timings = {k: report[k] for k in TIMING_FIELDS if k in report}
    return record, timings


def _timing_keys(obj: Any, prefix: str = "") -> list[str]:
    """Dotted paths of :data:`TIMING_FIELDS` keys anywhere in a JSON-like ``obj``."""
    if isinstance(obj, dict):
        return [
            p
            for k, v in obj.items()
            for p in ([f"{prefix}{k}"] if k in TIMING_FIELDS else _timing_keys(v, f"{prefix}{k}."))
        ]
    if isinstance(obj, list | tuple):
        return [p for i, v in enumerate(obj) for p in _timing_keys(v, f"{prefix}{i}.")]
    return []


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


def _portable_config(model: nn.Module) -> dict[str, Any]:
    """The adapter's :meth:`~hydra_ops.adapters.ModelAdapter.model_config`, taken with the Hugging
    Face config's ``_name_or_path`` emptied (and restored afterwards)."""
    from hydra_ops.adapters import adapter_class

    config = getattr(model, "config", None)
    name_or_path = getattr(config, "_name_or_path", None)
    if name_or_path:
        config._name_or_path = ""
    try:
        return adapter_class(model).model_config(model)
    finally:
        if name_or_path:
            config._name_or_path = name_or_path


def _head_plan_dict(model: nn.Module) -> dict[str, list[int]] | None:
    """The pruned model's kept heads (original indices), or None for an unpruned model."""
    from hydra_ops.heads.surgery import PLAN_ATTRIBUTE

    plan = getattr(model, PLAN_ATTRIBUTE, None)
    return None if plan is None else plan.to_dict()


def save_model(
    model: nn.Module,
    directory: str | os.PathLike[str],
    extra_metadata: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` to ``directory`` atomically (temp folder next to it, then rename); the same
    model and metadata give the same bytes (module docstring).

    ``extra_metadata`` must be JSON-serialisable (e.g. class names, the train record) and hold no
    :data:`TIMING_FIELDS` key (ValueError naming it). Returns the checkpoint folder.
    """
    from safetensors.torch import save_file

    family = model_family(model)
    if timing := _timing_keys(extra_metadata or {}):
        raise ValueError(
            f"metadata: {', '.join(timing)} is a wall-clock timing; a cached checkpoint holds only "
            "what the same inputs always give (put timings in the stage's metrics or the log)"
        )
    out = Path(directory)
    with atomic_write_dir(out) as tmp:
        save_file(_state_dict_for_save(model), str(tmp / WEIGHTS), metadata={"format": "pt"})
        meta = {
            "format_version": FORMAT_VERSION,
            "family": family,
            "config": _portable_config(model),
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
    if missing or meta.get("family") not in _families():
        raise CheckpointError(
            f"checkpoint file {str(path)!r} is malformed: missing {missing} or unknown family "
            f"{meta.get('family')!r} (allowed: {', '.join(_families())})"
        )
    return meta


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
    from hydra_ops.adapters import FAMILIES

    try:
        model = FAMILIES[meta["family"]].adapter_class().build_model(dict(meta["config"]))
    except (TypeError, ValueError, KeyError) as exc:
        raise CheckpointError(
            f"checkpoint file {str(folder / META)!r}: config cannot build a "
            f"{meta['family']} model: {exc}"
        ) from None
    if meta.get("head_plan") is not None:
        from hydra_ops.heads.plans import HeadPlan
        from hydra_ops.heads.surgery import prune_heads

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


def weights_hash(directory: str | os.PathLike[str]) -> str:
    """The ``weights_sha256`` recorded in a checkpoint (CheckpointError if missing/malformed)."""
    return str(read_checkpoint_metadata(directory)["weights_sha256"])


def load_pruned(directory: str | os.PathLike[str], plan: HeadPlan) -> nn.Module:
    """The checkpoint's model with its heads pruned to ``plan`` (a fresh copy each call)."""
    from hydra_ops.heads.surgery import prune_heads

    model = load_model(directory)
    prune_heads(model, plan)
    return model


def save_member(
    model: nn.Module,
    directory: str | os.PathLike[str],
    base_dir: str | os.PathLike[str],
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write a (pruned) member as a checkpoint whose metadata records ``base_weights_sha256``,
    the weights hash of the base checkpoint in ``base_dir`` it was cut from (the head plan is
    recorded from the model itself, see :func:`save_model`)."""
    meta = {"base_weights_sha256": weights_hash(base_dir), **(metadata or {})}
    return save_model(model, directory, meta)


def load_member(directory: str | os.PathLike[str], base_dir: str | os.PathLike[str]) -> nn.Module:
    """Rebuild a member saved by :func:`save_member`.

    Raises:
        CheckpointError: the member's files are missing, truncated or tampered with, or it was cut
            from another base than the checkpoint in ``base_dir``.
    """
    try:
        model = load_model(directory)
    except CheckpointError as err:
        raise CheckpointError(
            f"member {directory}: checkpoint is missing, truncated or tampered with ({err})"
        ) from None
    cut_from = read_checkpoint_metadata(directory)["metadata"].get("base_weights_sha256")
    if cut_from != weights_hash(base_dir):
        raise CheckpointError(
            f"member {directory}: cut from a different base model than {base_dir}"
        )
    return model
