"""The preprocessing a bundle ships with, and the one ``predict`` applies: never the workspace's.

``preprocessing.json`` (:data:`FORMAT`) in the bundle records how inputs become model inputs as
they were when the model was judged:

* text: ``max_length`` (tokens; longer texts are truncated, a batch is padded to the smallest of
  :func:`pad_lengths` that holds its longest text, so a served model meets a few sequence
  lengths, each warmed before serving, not every one) and the tokenizer, saved into the bundle's
  ``tokenizer/`` folder with the sha256 of each of its files and where it came from
  (``model.path``, or the family's built-in model);
* images: ``image_size`` (S x S, bilinear resize), ``channels`` (1: grayscale, 3: RGB) and the
  normalisation (uint8 / 255 into [0, 1], no mean/std shift:
  :func:`hydra_ops.models.factory.prepare_images`).

:func:`load_preprocessing` reads it back with every tokenizer file verified, and
:meth:`Preprocessing.batch` turns ``predict``'s inputs into a batch with it; a ``params.yaml``
that disagrees (another ``model.max_length``, ``model.path`` or image size) changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hydra_ops.hashing import sha256_bytes, sha256_file
from tasks.params.schema import PipelineConfig

PREPROCESSING_FILE = "preprocessing.json"
TOKENIZER_DIR = "tokenizer"
FORMAT = "hydra-ens-preprocessing/1"
#: What :func:`hydra_ops.models.factory.prepare_images` does to pixels: the only normalisation this
# code
#: applies, so a bundle recording another one is refused rather than served wrong.
NORMALISATION = {"divide_by": 255.0, "range": [0.0, 1.0], "mean": None, "std": None}
RESIZE = "bilinear"


def _files(folder: Path) -> dict[str, str]:
    return {
        f.relative_to(folder).as_posix(): sha256_file(f)
        for f in sorted(p for p in folder.rglob("*") if p.is_file())
    }


def write_preprocessing(cfg: PipelineConfig, out_dir: Path) -> dict[str, Any]:
    """Write ``preprocessing.json`` (and, for text, the ``tokenizer/`` folder) of ``cfg`` into
    ``out_dir`` (a bundle being built); returns the record."""
    out_dir = Path(out_dir)
    record: dict[str, Any] = {"format": FORMAT, "modality": cfg.modality}
    if cfg.modality == "text":
        from hydra_ops.data import text_tokenizer

        folder = out_dir / TOKENIZER_DIR
        text_tokenizer(cfg.model_folder).save_pretrained(str(folder))
        record |= {
            "max_length": cfg.model.max_length,
            "truncation": True,
            "padding": "longest",
            "tokenizer": {
                "folder": TOKENIZER_DIR,
                "from": cfg.model.path or f"built-in ({cfg.family} default)",
                "sha256": _files(folder),
            },
        }
    else:
        record |= {
            "image_size": cfg.model.vit.image_size,
            "channels": 1 if cfg.data.channels == 1 else 3,
            "resize": RESIZE,
            "normalisation": NORMALISATION,
        }
    (out_dir / PREPROCESSING_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def pad_lengths(max_length: int) -> tuple[int, ...]:
    """The sequence lengths a text batch is padded to: the powers of two from 8 below
    ``max_length``, then ``max_length`` (``64``: 8, 16, 32, 64)."""
    lengths, n = [], 8
    while n < max_length:
        lengths.append(n)
        n *= 2
    return (*lengths, max_length)


def pad_to(batch: dict[str, Any], length: int, pad_id: int) -> dict[str, Any]:
    """``batch`` (``input_ids``, ``attention_mask``, ``token_type_ids`` of ``[B, T]``) padded on
    the right to ``[B, length]``: ``pad_id`` tokens the attention mask leaves out. ValueError
    when ``T > length``."""
    import torch.nn.functional as F

    extra = length - int(batch["input_ids"].shape[1])
    if extra < 0:
        raise ValueError(f"pad_to: batch of length {batch['input_ids'].shape[1]} > {length}")
    if extra == 0:
        return batch
    fill = {"input_ids": pad_id, "attention_mask": 0, "token_type_ids": 0}
    return {k: F.pad(v, (0, extra), value=fill.get(k, 0)) for k, v in batch.items()}


@dataclass
class Preprocessing:
    """A bundle's preprocessing: ``record`` as in ``preprocessing.json``; ``tokenizer`` loaded from
    the bundle (text only)."""

    record: dict[str, Any]
    tokenizer: Any = None

    def describe(self) -> str:
        """One line: what turns inputs into model inputs (``predict``'s ``preprocessing``)."""
        r = self.record
        if r["modality"] == "text":
            digest = json.dumps(r["tokenizer"]["sha256"], sort_keys=True).encode()
            return (
                f"bundle tokenizer {sha256_bytes(digest)[:12]} "
                f"(from {r['tokenizer']['from']}), max_length {r['max_length']}"
            )
        channels = "grayscale" if r["channels"] == 1 else "RGB"
        return (
            f"bundle image preprocessing {r['image_size']}x{r['image_size']} {channels}, "
            f"{r['resize']} resize, /{r['normalisation']['divide_by']:g} into [0, 1]"
        )

    def pad_lengths(self) -> tuple[int, ...]:
        """The sequence lengths text batches are padded to (:func:`pad_lengths`; images: ())."""
        r = self.record
        return pad_lengths(int(r["max_length"])) if r["modality"] == "text" else ()

    def batch(self, inputs: list[str]) -> dict[str, Any]:
        """The model batch of ``inputs`` (texts, or paths of image files); texts padded to the
        smallest of :meth:`pad_lengths` that holds the longest."""
        import torch

        from hydra_ops.models.factory import make_text_batches, prepare_images

        r = self.record
        if r["modality"] == "text":
            batch = next(
                make_text_batches(
                    inputs, None, self.tokenizer, r["max_length"], batch_size=len(inputs)
                )
            )
            longest = int(batch["input_ids"].shape[1])
            length = next(n for n in self.pad_lengths() if n >= longest)
            return pad_to(batch, length, int(self.tokenizer.pad_token_id or 0))
        arrays = [_image_array(p, r["channels"]) for p in inputs]
        return {
            "pixel_values": torch.cat([prepare_images(a[None], r["image_size"]) for a in arrays])
        }


def _image_array(path: str, channels: int) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im = im.convert("L" if channels == 1 else "RGB")
            return np.asarray(im, dtype=np.uint8)
    except (OSError, UnidentifiedImageError) as err:
        raise ValueError(f"input {path!r} is not a readable image ({err})") from None


def _malformed(record: dict[str, Any]) -> str | None:
    """What is wrong with a ``preprocessing.json`` record's fields (None when nothing)."""

    def positive_int(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value > 0

    if record.get("modality") == "image":
        if not positive_int(record.get("image_size")) or record.get("channels") not in (1, 3):
            return "image_size must be a positive int and channels 1 or 3"
        return None
    if record.get("modality") != "text":
        return f"modality must be 'text' or 'image', got {record.get('modality')!r}"
    tokenizer = record.get("tokenizer")
    if not positive_int(record.get("max_length")):
        return "max_length must be a positive int"
    if (
        not isinstance(tokenizer, dict)
        or tokenizer.get("folder") != TOKENIZER_DIR
        or not isinstance(tokenizer.get("sha256"), dict)
        or not tokenizer["sha256"]
    ):
        return f"tokenizer must name the folder {TOKENIZER_DIR!r} and the sha256 of its files"
    return None


def load_preprocessing(directory: Path) -> Preprocessing:
    """The preprocessing of the bundle ``directory``: ``preprocessing.json`` validated and, for
    text, the bundled tokenizer with every file's sha256 checked (one-line ValueError)."""
    directory = Path(directory)
    path = directory / PREPROCESSING_FILE
    if not path.is_file():
        raise ValueError(
            f"bundle {directory}: no {PREPROCESSING_FILE} (the bundle predates shipped "
            "preprocessing); rebuild and promote it: hydra-ens run"
        )
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(
            f"bundle {directory}: {PREPROCESSING_FILE} is not valid JSON ({err})"
        ) from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"bundle {directory}: {PREPROCESSING_FILE} format must be {FORMAT!r}")
    if problem := _malformed(record):
        raise ValueError(f"bundle {directory}: {PREPROCESSING_FILE}: {problem}")
    if record["modality"] == "image":
        if record.get("normalisation") != NORMALISATION or record.get("resize") != RESIZE:
            raise ValueError(
                f"bundle {directory}: {PREPROCESSING_FILE} records a normalisation this code "
                f"does not apply ({record.get('normalisation')!r}, {record.get('resize')!r})"
            )
        return Preprocessing(record)
    from transformers import AutoTokenizer

    folder = directory / TOKENIZER_DIR
    if not folder.is_dir():
        raise ValueError(f"bundle {directory}: the tokenizer folder {folder.name!r} is missing")
    if _files(folder) != record["tokenizer"]["sha256"]:
        raise ValueError(
            f"bundle {directory}: {folder.name}/ does not match the sha256 that "
            f"{PREPROCESSING_FILE} records (tokenizer files changed)"
        )
    return Preprocessing(record, AutoTokenizer.from_pretrained(str(folder), local_files_only=True))
