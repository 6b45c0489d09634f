"""Glue between the stages and hydra_ops: data splits as batches, base models, pruned members.

* Batches follow the contract (``input_ids``/``attention_mask``/... or ``pixel_values``,
  + ``labels``).
* Base models are ``hydra_ops.checkpoints`` folders (safetensors + checkpoint.json, verified).
* Pruned members are ``hydra_ops.checkpoints`` folders too (the checkpoint records the head plan
  and loading re-prunes); their metadata holds the base checkpoint's weights hash.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from hydra_ops.plans import HeadPlan
from tasks.common import DATA
from tasks.params import PipelineConfig

Batch = dict[str, torch.Tensor]


# ---- data ----
@functools.cache
def _manifest(data_dir: str):
    from hydra_ops.data import load_manifest

    return load_manifest(data_dir)


def manifest(root: Path):
    """The prepared data's manifest (``DataIntegrityError`` if missing or malformed)."""
    return _manifest(str(Path(root) / DATA))


@functools.cache
def _split(data_dir: str, name: str):
    from hydra_ops.data import load_split

    return load_split(data_dir, name)


def split(root: Path, name: str):
    """A prepared split, its file verified against the manifest's sha256."""
    return _split(str(Path(root) / DATA), name)


@functools.cache
def tokenizer_for(model_path: str | None):
    from transformers import AutoTokenizer

    from hydra_ops.models import default_text_model_path

    path = model_path or str(default_text_model_path())
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def batches(
    cfg: PipelineConfig,
    data,
    batch_size: int,
    shuffle: bool = False,
    seed: int = 0,
    with_labels: bool = True,
    limit: int | None = None,
) -> list[Batch]:
    """A split (``hydra_ops.data.Split``) as a list of contract batches."""
    from hydra_ops.models import make_image_batches, make_text_batches

    labels = data.labels if with_labels else None
    if data.texts is not None:
        texts = data.texts if limit is None else data.texts[:limit]
        labels = None if labels is None else labels[: len(texts)]
        return list(
            make_text_batches(
                texts,
                None if labels is None else labels.tolist(),
                tokenizer_for(cfg.model.path),
                max_length=cfg.model.max_length,
                batch_size=batch_size,
                shuffle=shuffle,
                seed=seed,
            )
        )
    images = data.images if limit is None else data.images[:limit]
    labels = None if labels is None else labels[: len(images)]
    return list(
        make_image_batches(
            images,
            None if labels is None else labels.tolist(),
            batch_size=batch_size,
            image_size=cfg.model.vit.image_size,
            shuffle=shuffle,
            seed=seed,
        )
    )


def train_batches_fn(cfg: PipelineConfig, root: Path, seed: int):
    """``epoch -> batches`` of the training split, reshuffled per epoch from ``seed + epoch``."""
    train = split(root, "train")

    def fn(epoch: int) -> list[Batch]:
        return batches(cfg, train, cfg.finetune.batch_size, shuffle=True, seed=seed + epoch)

    return fn


# ---- base models ----
def new_base(cfg: PipelineConfig, root: Path, seed: int) -> nn.Module:
    """A fresh base model for the prepared data: MiniLM (+ new head) or a random-init timm ViT."""
    from hydra_ops.models import build_timm_vit, load_text_classifier

    man = manifest(root)
    classes = list(man.classes)
    if cfg.family == "bert":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # the new classifier head's initialisation
            model, _ = load_text_classifier(len(classes), cfg.model.path, classes)
        return model
    vit = cfg.model.vit
    shape = man.image_shape or [vit.image_size, vit.image_size]
    in_chans = int(shape[2]) if len(shape) == 3 else 1
    return build_timm_vit(
        vit.image_size,
        in_chans,
        len(classes),
        depth=vit.depth,
        embed_dim=vit.embed_dim,
        num_heads=vit.num_heads,
        patch_size=vit.patch_size,
        mlp_ratio=vit.mlp_ratio,
        seed=seed,
    )


def fine_tune(
    cfg: PipelineConfig,
    root: Path,
    model: nn.Module,
    *,
    epochs: int,
    lr: float,
    seed: int,
    frozen_layers: int | None = None,
) -> dict[str, Any]:
    """Fine-tune ``model`` in place on the train split; ``frozen_layers = k`` freezes the
    embeddings and the first ``k`` layers (see :func:`hydra_ops.training.freeze_layers`).

    Returns the ``TrainReport`` as a dict, wall-clock timings included (:func:`split_timings`
    separates them before anything is cached)."""
    from hydra_ops.training import fine_tune as _fine_tune

    report = _fine_tune(
        model,
        train_batches_fn(cfg, root, seed),
        epochs=epochs,
        lr=lr,
        weight_decay=cfg.finetune.weight_decay,
        warmup_ratio=cfg.finetune.warmup_ratio,
        seed=seed,
        progress=os.environ.get("HYDRA_ENS_PROGRESS", "1") != "0",
        frozen_layers=frozen_layers,
    )
    return report.to_dict()


#: ``TrainReport`` fields that are wall-clock measurements: they differ between two runs that give
#: the same weights, so they go to the stage's uncached metrics or the log, never into a cached
#: output.
TIMING_FIELDS = ("epoch_seconds", "total_seconds")


def split_timings(report: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(record, timings)`` of a :func:`fine_tune` report: ``record`` is what the same inputs
    always give (loss curve, steps, lr, seed, trainable parameters) and may be cached;
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


def save_base(model: nn.Module, directory: Path, metadata: dict[str, Any]) -> Path:
    """Write a checkpoint (a DVC-cached output): the same model and metadata give the same bytes.

    ``metadata`` must hold no wall-clock field (ValueError naming it; :func:`split_timings`), and
    the Hugging Face config's ``_name_or_path`` (the absolute folder the pretrained weights were
    read from, which differs between checkouts) is stored empty.
    """
    from hydra_ops.checkpoints import save_model

    if timing := _timing_keys(metadata):
        raise ValueError(
            f"metadata: {', '.join(timing)} is a wall-clock timing; a cached checkpoint holds only "
            "what the same inputs always give (put timings in the stage's metrics or the log)"
        )
    config = getattr(model, "config", None)
    name_or_path = getattr(config, "_name_or_path", None)
    if name_or_path:
        config._name_or_path = ""
    try:
        return save_model(model, directory, extra_metadata=metadata)
    finally:
        if name_or_path:
            config._name_or_path = name_or_path


def load_base(directory: Path) -> nn.Module:
    from hydra_ops.checkpoints import load_model

    return load_model(directory)


def base_weights_hash(directory: Path) -> str:
    from hydra_ops.checkpoints import read_checkpoint_metadata

    return str(read_checkpoint_metadata(directory)["weights_sha256"])


# ---- pruned members: hydra_ops.checkpoints folders that record their head plan ----
def pruned_copy(base_dir: Path, plan: HeadPlan) -> nn.Module:
    from hydra_ops.surgery import prune_heads

    model = load_base(base_dir)
    prune_heads(model, plan)
    return model


def save_member(model: nn.Module, directory: Path, base_dir: Path, extra: dict) -> None:
    """Write a (pruned) member checkpoint into ``directory``; the plan is recorded by
    ``hydra_ops.checkpoints`` from the model itself, the base's weights hash goes in metadata."""
    save_base(model, directory, {"base_weights_sha256": base_weights_hash(base_dir), **extra})


def load_member(directory: Path, base_dir: Path) -> nn.Module:
    """Rebuild a member saved by :func:`save_member` (ValueError on a corrupt/mismatched file)."""
    from hydra_ops.checkpoints import CheckpointError, read_checkpoint_metadata

    try:
        model = load_base(directory)
    except CheckpointError as err:
        raise ValueError(
            f"member {directory}: checkpoint is missing, truncated or tampered with ({err}); "
            "rerun finetune_members"
        ) from None
    cut_from = read_checkpoint_metadata(directory)["metadata"].get("base_weights_sha256")
    if cut_from != base_weights_hash(base_dir):
        raise ValueError(f"member {directory}: cut from a different base model than {base_dir}")
    return model


# ---- plans ----
def read_plans(path: Path) -> list[HeadPlan]:
    data = json.loads(Path(path).read_text())
    return [HeadPlan.from_layers(p) for p in data["plans"]]


def plans_json(plans: Sequence[HeadPlan]) -> dict[str, Any]:
    return {"plans": [{str(i): list(h) for i, h in enumerate(p.kept)} for p in plans]}


# ---- inference ----
@torch.no_grad()
def logits_of(model: nn.Module, data_batches: Sequence[Batch]) -> torch.Tensor:
    """Single model: [N, C] logits."""
    from hydra_ops.training import evaluate_logits

    logits, _ = evaluate_logits(model, data_batches)
    return logits.float()


@torch.no_grad()
def hydra_logits(hydra: nn.Module, data_batches: Sequence[Batch]) -> torch.Tensor:
    """Hydra model: [N, M, C] member logits."""
    hydra.eval()
    out = []
    for b in data_batches:
        if "pixel_values" in b:
            out.append(hydra(b["pixel_values"]))
        else:
            out.append(
                hydra(
                    b["input_ids"],
                    attention_mask=b.get("attention_mask"),
                    token_type_ids=b.get("token_type_ids"),
                )
            )
    return torch.cat(out).float()


def labels_of(data) -> torch.Tensor:
    return torch.as_tensor(np.asarray(data.labels), dtype=torch.long)
