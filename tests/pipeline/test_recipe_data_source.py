"""CONTRIBUTING.md's recipe "Adding a data source", followed with toy sources defined here: once
registered, the params schema accepts the name and derives the modality it declares, and the
prepare_data stage writes its splits, with nothing else edited."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hydra_ops.data.catalog import DATA_SOURCES, DataSource, register_source
from hydra_ops.data.raw import RawData

CLASSES = ("river", "mountain", "desert")
PER_CLASS = 20


def _load_words(spec) -> RawData:
    texts = [f"a {c} scene number {i} seen from the {c} side" for c in CLASSES for i in range(20)]
    labels = np.repeat(np.arange(len(CLASSES)), PER_CLASS)
    return RawData(names=list(CLASSES), labels=labels, texts=texts, description="toy scenes")


def _load_images(spec) -> RawData:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(3 * PER_CLASS, 8, 8), dtype=np.uint8)
    labels = np.repeat(np.arange(3), PER_CLASS)
    return RawData(names=["a", "b", "c"], labels=labels, images=images, description="toy noise")


@pytest.fixture
def toy_sources():
    register_source(
        DataSource(
            name="toy-scenes",
            modality="text",
            load=_load_words,
            description="toy scenes",
            classes=CLASSES,
            default_id_classes=CLASSES[:2],
        )
    )
    register_source(
        DataSource(name="toy-noise", modality="image", load=_load_images, description="noise")
    )
    yield
    DATA_SOURCES.unregister("toy-scenes")
    DATA_SOURCES.unregister("toy-noise")


def test_the_params_schema_reads_the_toy_sources_modality(toy_sources):
    from tasks.params import resolve_params

    text = resolve_params("quick", sets={"data.name": "toy-scenes"})
    assert text.modality == "text" and text.family == "bert"
    # no default ID classes: the near-OOD set must be named, as for a user source
    image = resolve_params("quick", sets={"data.name": "toy-noise", "data.near_ood_classes": ["c"]})
    assert image.modality == "image" and image.family == "timm_vit"


def test_prepare_data_writes_the_toy_sources_splits(toy_sources, tmp_path, monkeypatch):
    from tasks import prepare_data
    from tasks.params import resolve_params

    monkeypatch.chdir(tmp_path)
    far = tmp_path / "far.csv"  # a small far-OOD set (the text default, kaomoji, takes seconds)
    far.write_text("text\n" + "".join(f"unrelated line {i} about tea\n" for i in range(12)))
    sets = {"data.name": "toy-scenes", "data.far_ood": {"kind": "csv", "path": str(far)}}
    summary = prepare_data.run(resolve_params("quick", sets=sets), tmp_path)
    assert summary["source"] == "toy-scenes" and summary["modality"] == "text"
    counts = summary["counts"]
    assert counts["train"] + counts["val"] + counts["test"] == 2 * PER_CLASS  # river, mountain
    assert counts["near_ood"] == PER_CLASS  # desert, the class the source holds out
    assert counts["far_ood"] == 12
    manifest = json.loads((tmp_path / "data" / "prepared" / "manifest.json").read_text())
    assert manifest["classes"] == ["river", "mountain"]
    assert json.loads((tmp_path / "metrics" / "data.json").read_text()) == summary


def test_an_unregistered_source_is_refused_in_one_line_naming_the_registered(tmp_path):
    from tasks.params import resolve_params

    with pytest.raises(ValueError) as err:
        resolve_params("quick", sets={"data.name": "toy-scenes"})
    assert "unknown data source 'toy-scenes'; built-in sources: bbc-news" in str(err.value)
