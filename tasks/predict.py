"""``hydra-ens predict``: the prod model, resolved through the registry, on texts or image files.

For each input: the predicted class, its (calibrated) probability, and the uncertainty of the
member predictions: total predictive entropy, mutual information, member disagreement.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from hydra_ops.config import PipelineConfig
from tasks import models_io
from tasks.registry import resolve_prod_dir


def _image_array(path: str, channels: int) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im = im.convert("L" if channels == 1 else "RGB")
            return np.asarray(im, dtype=np.uint8)
    except (OSError, UnidentifiedImageError) as err:
        raise ValueError(f"input {path!r} is not a readable image ({err})") from None


def predict(
    cfg: PipelineConfig, root: Path, inputs: list[str]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from hydra_ops.merge import ensemble_probabilities
    from hydra_ops.models import make_text_batches, prepare_images
    from hydra_ops.serialization import load_hydra
    from hydra_ops.uncertainty import decompose

    if not inputs:
        raise ValueError("inputs: give at least one text (or image file for image models)")
    model_dir, prod = resolve_prod_dir(root, cfg.promote.model_name, cfg.promote.stage)
    hydra = load_hydra(model_dir)
    if cfg.modality == "text":
        batch = next(
            make_text_batches(
                inputs,
                None,
                models_io.tokenizer_for(cfg.model.path),
                cfg.model.max_length,
                batch_size=len(inputs),
            )
        )
    else:
        channels = 1 if cfg.data.channels == 1 else 3
        arrays = [_image_array(p, channels) for p in inputs]
        size = cfg.model.vit.image_size
        pixels = torch.cat([prepare_images(a[None], size) for a in arrays])
        batch = {"pixel_values": pixels}
    with torch.no_grad():
        member_logits = models_io.hydra_logits(hydra, [batch])
    probs = ensemble_probabilities(member_logits, float(hydra.temperature))
    unc = decompose(member_logits.softmax(-1))
    names = hydra.class_names or [str(i) for i in range(probs.shape[-1])]
    rows = []
    for i, text in enumerate(inputs):
        c = int(probs[i].argmax())
        rows.append(
            {
                "input": text,
                "class": names[c],
                "prob": float(probs[i, c]),
                "entropy": float(unc["total_entropy"][i]),
                "mutual_information": float(unc["mutual_information"][i]),
                "disagreement": float(unc["disagreement"][i]),
            }
        )
    return rows, prod
