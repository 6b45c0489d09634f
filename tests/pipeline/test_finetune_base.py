"""tasks.finetune_base on the built-in sources brown-genres and fashion-mnist, on the real assets:
the ``prepare_data`` stage's code on the quick profile's sizes, then a short ``finetune_base``
training of the source's model (MiniLM-L6 / the source's ViT) on what it wrote. The full DAG on
these sources is the studies' (docs/data.md); here: the stages accept them and a model learns."""

from __future__ import annotations

import numpy as np
import torch

from hydra_ops.data import sources, split_labels
from hydra_ops.data.catalog import DATA_SOURCES
from hydra_ops.data.catalog.brown_genres import GENRES
from hydra_ops.models.checkpoints import load_model
from hydra_ops.models.inference import logits
from tasks import prepare_data
from tasks.finetune_base import train_base
from tasks.params import resolve_params
from tasks.runtime import data
from tasks.runtime.layout import BASE


def prepare_and_train(name: str, root, sets: dict) -> tuple[object, dict, dict]:
    cfg = resolve_params("quick", sets={"data.name": name, "finetune.epochs": 2, **sets})
    summary = prepare_data.run(cfg, root)
    trained, _ = train_base(cfg, root, cfg.finetune_seed, root / BASE)
    return cfg, summary, trained


def check_model(cfg, root, trained: dict, num_classes: int) -> None:
    losses = trained["train"]["epoch_losses"]
    assert len(losses) == 2 and losses[1] < losses[0]  # it learns from the prepared split
    model = load_model(root / BASE)
    test = data.split(root, "test")
    out = logits(model, data.batches(cfg, test, 64))
    assert out.shape == (len(test), num_classes) and torch.isfinite(out).all()
    assert len(split_labels(test)) == len(test)


def test_brown_genres_prepares_by_document_and_trains(tmp_path):
    far = tmp_path / "far.jsonl"  # the source's far-OOD default (kaomoji) is bbc-news' too
    far.write_text('{"text": "(^_^)"}\n{"text": "(>_<)"}\n', encoding="utf-8")
    sets = {"data.far_ood": {"kind": "jsonl", "path": str(far)}}
    cfg, summary, trained = prepare_and_train("brown-genres", tmp_path, sets)
    assert cfg.modality == "text" and cfg.family == "bert"
    classes = list(DATA_SOURCES["brown-genres"].default_id_classes)
    assert summary["num_classes"] == 10 and data.manifest(tmp_path).classes == classes
    counts = summary["counts"]
    assert counts["train"] == counts["near_ood"] == 160 and counts["test"] > 50
    raw = sources.load_brown_genres(GENRES)
    doc_of = dict(zip(raw.texts, raw.groups, strict=True))
    genre_of = {t: raw.names[y] for t, y in zip(raw.texts, raw.labels, strict=True)}
    docs = {s: {doc_of[t] for t in data.split(tmp_path, s).texts} for s in ("train", "val", "test")}
    assert not (
        docs["train"] & docs["val"] or docs["train"] & docs["test"] or docs["val"] & docs["test"]
    )
    held = set(DATA_SOURCES["brown-genres"].classes) - set(classes)
    assert {genre_of[t] for t in data.split(tmp_path, "near_ood").texts} <= held
    assert not {genre_of[t] for t in data.split(tmp_path, "train").texts} & held
    check_model(cfg, tmp_path, trained, 10)


def test_fashion_mnist_prepares_and_trains(tmp_path):
    cfg, summary, trained = prepare_and_train("fashion-mnist", tmp_path, {})
    assert cfg.modality == "image" and cfg.family == "timm_vit"
    assert (cfg.model.vit.image_size, cfg.model.vit.patch_size) == (28, 7)
    manifest = data.manifest(tmp_path)
    assert "shirt" not in manifest.classes and len(manifest.classes) == 9
    assert summary["counts"]["train"] == 160 and summary["counts"]["far_ood"] == 100
    far = data.split(tmp_path, "far_ood")
    assert "MNIST" in manifest.splits["far_ood"].description
    assert far.images.shape[1:3] == (28, 28)
    test, shift = data.split(tmp_path, "test"), data.split(tmp_path, "shift")
    assert np.array_equal(split_labels(test), split_labels(shift))
    assert not np.array_equal(test.images, shift.images)
    check_model(cfg, tmp_path, trained, 9)
