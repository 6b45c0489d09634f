"""hydra_ops.data.catalog: every data source declares its modality, classes and defaults once."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from hydra_ops.data import DataSpec
from hydra_ops.data.catalog import DATA_SOURCES, DataSource, data_modality, data_source


def test_the_registered_sources_and_what_they_declare() -> None:
    assert sorted(DATA_SOURCES) == sorted(
        ["bbc-news", "brown-genres", "mnist5k", "digits", "fashion-mnist", "folder", "csv", "jsonl"]
    )
    modality = {name: s.modality for name, s in DATA_SOURCES.items()}
    assert modality == {
        "bbc-news": "text",
        "brown-genres": "text",
        "csv": "text",
        "digits": "image",
        "fashion-mnist": "image",
        "folder": "files",
        "jsonl": "text",
        "mnist5k": "image",
    }
    assert [n for n, s in DATA_SOURCES.items() if s.needs_path] == ["csv", "folder", "jsonl"]
    held_out = {
        n: sorted(set(s.classes) - set(s.default_id_classes))
        for n, s in DATA_SOURCES.items()
        if s.classes is not None
    }
    assert held_out == {
        "bbc-news": ["tech"],
        "brown-genres": ["adventure", "humor", "mystery", "romance", "science_fiction"],
        "digits": ["8", "9"],
        "fashion-mnist": ["shirt"],
        "mnist5k": ["8", "9"],
    }
    assert {n: s.default_far_ood for n, s in DATA_SOURCES.items() if s.default_far_ood} == {
        "fashion-mnist": "mnist"
    }


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"modality": "audio"}, "modality must be one of text, image, files, got 'audio'"),
        ({"default_id_classes": ("a", "z")}, "default_id_classes ['z'] not in its classes"),
        ({"default_far_ood": "moon"}, "default_far_ood must be one of kaomoji, sample_images"),
    ],
)
def test_a_source_that_declares_something_impossible_is_refused_in_one_line(changes, message):
    fields = {"name": "x", "modality": "text", "load": None, "description": "x"}
    with pytest.raises(ValueError, match=r"^data source 'x': ") as err:
        DataSource(**{**fields, "classes": ("a", "b"), **changes})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_name_is_registered_once_and_an_unknown_one_is_named(tmp_path) -> None:
    with pytest.raises(ValueError, match="data source 'csv' is already registered"):
        DATA_SOURCES.register("csv", data_source("csv"))
    with pytest.raises(ValueError, match=r"^unknown data source 'x'; built-in sources: bbc-news"):
        data_source("x")


def test_a_folder_takes_the_modality_of_its_files(tmp_path) -> None:
    from PIL import Image

    (tmp_path / "img" / "a").mkdir(parents=True)
    (tmp_path / "img" / "a" / ".hidden.txt").write_text("x")
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "img" / "a" / "0.png")
    (tmp_path / "txt" / "a").mkdir(parents=True)
    (tmp_path / "txt" / "a" / "0.txt").write_text("some text")
    assert data_modality(DataSpec(name="folder", path=str(tmp_path / "img"))) == "image"
    assert data_modality(DataSpec(name="folder", path=str(tmp_path / "txt"))) == "text"
    assert data_modality(DataSpec(name="mnist5k")) == "image"


def test_the_catalog_is_read_without_numpy_or_torch() -> None:
    code = (
        "import sys; from hydra_ops.data.catalog import DATA_SOURCES; "
        "from hydra_ops.data.spec import DataSpec; DataSpec(name='digits'); "
        "print(len(DATA_SOURCES), 'numpy' in sys.modules or 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["8", "False"]


def test_a_source_whose_examples_contradict_its_modality_is_refused_in_one_line() -> None:
    from hydra_ops.data.build import build_splits
    from hydra_ops.data.catalog import register_source
    from hydra_ops.data.raw import RawData

    def load(spec) -> RawData:
        texts = [f"example {i}" for i in range(12)]
        return RawData(names=["a", "b"], labels=np.arange(12) % 2, texts=texts)

    register_source(DataSource(name="toy-liar", modality="image", load=load, description="x"))
    try:
        with pytest.raises(ValueError) as err:
            build_splits(DataSpec(name="toy-liar", near_ood_classes=["b"]))
    finally:
        DATA_SOURCES.unregister("toy-liar")
    assert str(err.value) == (
        "data source 'toy-liar' declares modality 'image' but loaded text examples"
    )
