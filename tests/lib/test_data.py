"""hydra_ops.data: sources, stratified deterministic splits, verified manifests, bad input."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest
from PIL import Image

from hydra_ops.data import (
    DataIntegrityError,
    DataSpec,
    bbc_news_folder,
    char_noise,
    load_manifest,
    load_split,
    materialise_splits,
    patch_shuffle,
    stratified_split,
)


def levenshtein(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


@pytest.fixture(scope="module")
def bbc(tmp_path_factory):
    out = tmp_path_factory.mktemp("bbc") / "data"
    manifest = materialise_splits({"name": "bbc-news", "max_per_split": 40, "seed": 3}, out)
    return out, manifest


def test_stratified_split_is_deterministic_disjoint_and_stratified():
    labels = np.repeat([0, 1, 2], [50, 30, 20])
    a = stratified_split(labels, (0.7, 0.15, 0.15), seed=1)
    b = stratified_split(labels, (0.7, 0.15, 0.15), seed=1)
    c = stratified_split(labels, (0.7, 0.15, 0.15), seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))
    joined = np.concatenate(a)
    assert sorted(joined.tolist()) == list(range(100))  # a partition
    for part, frac in zip(a, (0.7, 0.15, 0.15), strict=True):
        counts = np.bincount(labels[part], minlength=3)
        assert np.all(np.abs(counts - frac * np.array([50, 30, 20])) <= 1)


def test_stratified_split_rejects_tiny_class():
    labels = np.array([0, 0, 0, 0, 1, 1])
    with pytest.raises(ValueError, match="class '1' has 2 example"):
        stratified_split(labels, (0.7, 0.15, 0.15), seed=0)


def test_bbc_news_splits_manifest_and_provenance(bbc):
    out, manifest = bbc
    assert manifest.classes == ["business", "entertainment", "politics", "sports"]
    assert set(manifest.splits) == {
        "train",
        "val",
        "test",
        "shift",
        "near_ood",
        "far_ood",
        "ood_val",
    }
    assert manifest.duplicates_removed > 0
    on_disk = json.loads((out / "manifest.json").read_text())
    for name, info in manifest.splits.items():
        assert on_disk["splits"][name]["sha256"] == info.sha256
        split = load_split(out, name)
        assert len(split) == info.count <= 40
        if info.kind == "id":
            assert dict(Counter(manifest.classes[i] for i in split.labels)) == {
                k: v for k, v in info.counts_per_class.items() if v
            }
            assert set(info.counts_per_class.values()) != {0}
        else:
            assert set(split.labels.tolist()) == {-1}
    train = load_split(out, "train").texts
    test = load_split(out, "test").texts
    assert not set(train) & set(test)
    tech = {
        p.read_text(encoding="utf-8", errors="replace")
        for p in (bbc_news_folder() / "tech").iterdir()
    }
    assert set(load_split(out, "near_ood").texts) <= tech
    assert not set(train) & tech
    far = load_split(out, "far_ood").texts
    assert all(len(t) < 60 for t in far) and len(set(far)) == len(far)
    # OOD validation = word-shuffled ID val texts, never an OOD test set
    val, ood_val = load_split(out, "val").texts, load_split(out, "ood_val").texts
    assert [sorted(t.split()) for t in val] == [sorted(t.split()) for t in ood_val]
    assert val != ood_val
    assert "word-shuffled" in manifest.ood_val_provenance
    assert not set(ood_val) & (set(far) | set(load_split(out, "near_ood").texts))


def test_materialise_is_deterministic_and_atomic(bbc, tmp_path):
    _, first = bbc
    out = tmp_path / "again"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    again = materialise_splits({"name": "bbc-news", "max_per_split": 40, "seed": 3}, out)
    assert {k: v.sha256 for k, v in again.splits.items()} == {
        k: v.sha256 for k, v in first.splits.items()
    }
    assert not (out / "stale.txt").exists()  # replaced as a whole
    assert [p.name for p in tmp_path.iterdir()] == ["again"]  # no temp folder left


def test_corrupted_and_truncated_files_give_clear_errors(bbc, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(bbc[0], out)
    path = out / "val.jsonl"
    data = bytearray(path.read_bytes())
    data[10] ^= 0x20
    path.write_bytes(bytes(data))
    with pytest.raises(DataIntegrityError, match=r"val\.jsonl"):
        load_split(out, "val")
    (out / "test.jsonl").write_bytes((out / "test.jsonl").read_bytes()[:100])
    with pytest.raises(DataIntegrityError, match=r"test\.jsonl"):
        load_split(out, "test")
    with pytest.raises(ValueError, match="available"):
        load_split(out, "nope")


def test_char_noise_rate_and_seed():
    rng = np.random.default_rng(0)
    text = "the quick brown fox jumps over the lazy dog " * 10
    noisy, edits = char_noise(text, 0.2, rng)
    assert abs(edits / len(text) - 0.2) < 0.05
    dist = levenshtein(text, noisy)
    assert 0 < dist <= 2 * edits  # a swap costs 2 single-char edits
    assert dist / len(text) > 0.1
    same, n0 = char_noise(text, 0.0, np.random.default_rng(0))
    assert same == text and n0 == 0
    assert char_noise(text, 0.2, np.random.default_rng(5)) == char_noise(
        text, 0.2, np.random.default_rng(5)
    )
    with pytest.raises(ValueError, match="severity"):
        char_noise(text, 1.5, rng)


def test_shift_split_is_noisy_test_at_severity(bbc):
    out, manifest = bbc
    test, shift = load_split(out, "test"), load_split(out, "shift")
    assert np.array_equal(test.labels, shift.labels)
    t, s = test.texts[0][:300], shift.texts[0][:300]
    assert t != s
    assert levenshtein(t, s) / len(t) < 0.35  # default severity 0.1
    assert manifest.source["config"]["shift_severity"] == 0.1


def _texts(n: int, word: str) -> list[str]:
    return [f"{word} item {i} {word}" for i in range(n)]


def test_user_csv_and_jsonl_sources(tmp_path):
    rows = [(t, "a") for t in _texts(10, "apple")] + [(t, "b") for t in _texts(10, "berry")]
    rows += [(t, "c") for t in _texts(10, "cherry")]
    csv_path = tmp_path / "d.csv"
    csv_path.write_text("text,label\n" + "".join(f'"{t}",{lab}\n' for t, lab in rows))
    m = materialise_splits(
        {"name": "csv", "path": str(csv_path), "id_classes": ["a", "b"], "seed": 1},
        tmp_path / "csv_out",
    )
    assert m.classes == ["a", "b"]
    assert m.splits["train"].counts_per_class == {"a": 7, "b": 7}
    near = load_split(tmp_path / "csv_out", "near_ood").texts
    assert all("cherry" in t for t in near) and len(near) == 10
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in rows))
    m2 = materialise_splits({"name": "jsonl", "path": str(jsonl)}, tmp_path / "j_out")
    assert m2.classes == ["a", "b", "c"] and "near_ood" not in m2.splits
    with pytest.raises(ValueError, match=r"label\(s\) \['c'\] not in classes"):
        materialise_splits(
            {"name": "jsonl", "path": str(jsonl), "classes": ["a", "b"]}, tmp_path / "bad"
        )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "x"}\n')
    with pytest.raises(ValueError, match="line 1 needs keys"):
        materialise_splits({"name": "jsonl", "path": str(bad)}, tmp_path / "bad2")


def test_user_text_folder_with_user_ood_sets(tmp_path):
    root = tmp_path / "corpus"
    for cls in ("x", "y"):
        (root / cls).mkdir(parents=True)
        for i, t in enumerate(_texts(8, cls)):
            (root / cls / f"{i}.txt").write_bytes(t.encode() + b"\xff")  # bad utf-8 replaced
    ood = tmp_path / "ood.csv"
    ood.write_text("text\n" + "".join(f"ood {i}\n" for i in range(5)))
    oodv = tmp_path / "oodv"
    oodv.mkdir()
    (oodv / "a.txt").write_text("validation ood")
    m = materialise_splits(
        {
            "name": "folder",
            "path": str(root),
            "far_ood": {"kind": "csv", "path": str(ood)},
            "ood_val": {"kind": "folder", "path": str(oodv)},
        },
        tmp_path / "out",
    )
    assert m.classes == ["x", "y"]
    assert load_split(tmp_path / "out", "far_ood").texts == [f"ood {i}" for i in range(5)]
    assert load_split(tmp_path / "out", "ood_val").texts == ["validation ood"]
    assert "\ufffd" in load_split(tmp_path / "out", "train").texts[0]
    (root / "z").mkdir()
    with pytest.raises(ValueError, match=r"class folder .*z.* is empty"):
        materialise_splits({"name": "folder", "path": str(root)}, tmp_path / "o2")


def test_user_image_folder(tmp_path):
    root = tmp_path / "imgs"
    rng = np.random.default_rng(0)
    for c, cls in enumerate(("dark", "light", "mid")):
        (root / cls).mkdir(parents=True)
        for i in range(6):
            px = rng.integers(0, 80, (12, 12)) + 80 * c
            Image.fromarray(px.astype(np.uint8)).save(root / cls / f"{i}.png")
    m = materialise_splits(
        {"name": "folder", "path": str(root), "id_classes": ["dark", "light"], "far_ood": "noise"},
        tmp_path / "out",
    )
    assert m.modality == "image" and m.image_shape == [12, 12]
    train = load_split(tmp_path / "out", "train")
    assert train.images.dtype == np.uint8 and train.images.shape[1:] == (12, 12)
    assert load_split(tmp_path / "out", "near_ood").images.shape == (6, 12, 12)
    assert (tmp_path / "out" / "train.safetensors").is_file()


def test_digits_image_source(tmp_path):
    m = materialise_splits({"name": "digits", "shift_severity": 0.5}, tmp_path / "d")
    assert m.classes == [str(i) for i in range(8)] and m.image_shape == [8, 8]
    test, shift = load_split(tmp_path / "d", "test"), load_split(tmp_path / "d", "shift")
    assert test.images.shape == shift.images.shape and test.images.dtype == np.uint8
    assert np.abs(test.images.astype(int) - shift.images.astype(int)).mean() > 10
    near = load_split(tmp_path / "d", "near_ood")
    assert len(near) == m.splits["near_ood"].count == 354  # all 8s and 9s
    far = load_split(tmp_path / "d", "far_ood")
    assert far.images.shape == (500, 8, 8)
    val, ood_val = load_split(tmp_path / "d", "val"), load_split(tmp_path / "d", "ood_val")
    assert np.array_equal(
        np.sort(val.images.reshape(len(val), -1), 1),
        np.sort(ood_val.images.reshape(len(val), -1), 1),
    )
    assert not np.array_equal(val.images, ood_val.images)
    assert "patch-shuffled" in m.ood_val_provenance


def test_mnist5k_shapes(tmp_path):
    m = materialise_splits({"name": "mnist5k", "max_per_split": 80}, tmp_path / "m")
    train = load_split(tmp_path / "m", "train")
    assert train.images.shape == (80, 28, 28) and m.splits["train"].counts_per_class["0"] == 10
    assert load_split(tmp_path / "m", "far_ood").images.shape == (80, 28, 28)


def test_patch_shuffle_keeps_patches():
    x = np.arange(2 * 8 * 8, dtype=np.uint8).reshape(2, 8, 8)
    y = patch_shuffle(x, np.random.default_rng(0), grid=4)

    def patches(a):
        return sorted(
            a[i : i + 2, j : j + 2].tobytes() for i in range(0, 8, 2) for j in range(0, 8, 2)
        )

    assert patches(x[0]) == patches(y[0]) and not np.array_equal(x, y)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"name": "imagenet"}, "unknown data source 'imagenet'; built-in sources: bbc-news"),
        ({"name": "csv"}, "needs 'path'"),
        ({"name": "bbc-news", "typo_key": 1}, "typo_key"),
        ({"name": "bbc-news", "train_frac": 0.9}, "must be 1"),
        ({"name": "bbc-news", "shift_severity": 2}, "shift_severity"),
        ({"name": "bbc-news", "id_classes": ["business", "cooking"]}, "cooking"),
        ({"name": "folder", "path": "/nonexistent/x"}, "does not exist"),
        ({"name": "digits", "ood_val": "word_shuffle"}, "image sources allow"),
    ],
)
def test_bad_configs_raise_value_error(tmp_path, config, message):
    with pytest.raises(ValueError, match=message):
        materialise_splits(config, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_ood_val_cannot_be_an_ood_test_set(tmp_path):
    ood = {"kind": "csv", "path": str(tmp_path / "o.csv")}
    with pytest.raises(ValueError, match="ood_val must not be an OOD test set"):
        DataSpec(name="bbc-news", far_ood=ood, ood_val=ood)


def test_missing_manifest(tmp_path):
    with pytest.raises(DataIntegrityError, match="no manifest"):
        load_manifest(tmp_path)
    assert list(tmp_path.iterdir()) == []  # reading writes nothing, not even a leftover


# ---- data that cannot train a classifier is refused in prepare_data, with one line ----


def _csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("text,label\n" + "".join(f'"{t}",{lab}\n' for t, lab in rows))
    return path


def _refused(tmp_path: Path, config: dict, *patterns: str) -> str:
    """The ValueError of materialise_splits(config): one line, matching every pattern."""
    with pytest.raises(ValueError) as info:
        materialise_splits(config, tmp_path / "out")
    msg = str(info.value)
    assert "\n" not in msg, msg
    for pattern in patterns:
        assert pattern in msg, msg
    assert not (tmp_path / "out").exists()
    return msg


def test_one_class_csv_is_refused(tmp_path):
    path = _csv(tmp_path / "one.csv", [(t, "spam") for t in _texts(12, "spam")])
    _refused(
        tmp_path,
        {"name": "csv", "path": str(path)},
        "one.csv",
        "only 1 in-distribution class ['spam']",
        "needs at least 2",
    )


def test_near_ood_hold_out_leaving_one_id_class_is_refused(tmp_path):
    rows = [(t, "a") for t in _texts(6, "apple")] + [(t, "b") for t in _texts(6, "berry")]
    path = _csv(tmp_path / "two.csv", rows)
    _refused(
        tmp_path,
        {"name": "csv", "path": str(path), "near_ood_classes": ["b"]},
        "only 1 in-distribution class ['a'] after holding out near-OOD class(es) ['b']",
        "choose at least 2 data.id_classes among ['a', 'b']",
    )


def test_near_ood_classes_are_held_out_of_the_default_id_classes(tmp_path):
    rows = [(t, c) for c in "abc" for t in _texts(6, f"word{c}")]
    path = _csv(tmp_path / "three.csv", rows)
    m = materialise_splits(
        {"name": "csv", "path": str(path), "near_ood_classes": ["c"]}, tmp_path / "out"
    )
    assert m.classes == ["a", "b"] and m.splits["near_ood"].count == 6


def test_class_too_small_for_every_split_is_refused(tmp_path):
    rows = [(t, "a") for t in _texts(10, "apple")] + [(t, "b") for t in _texts(2, "berry")]
    rows += [(t, "c") for t in _texts(1, "cherry")]
    path = _csv(tmp_path / "small.csv", rows)
    _refused(
        tmp_path,
        {"name": "csv", "path": str(path)},
        "small.csv",
        "class 'b' has 2 example(s)",
        "needs at least 3 to appear in every split (train/val/test = 0.7/0.15/0.15)",
        "also too small: 'c' (1)",
    )
    # three rows, two of them the same text: 2 after de-duplication
    rows = [(t, "a") for t in _texts(10, "apple")] + [("x", "b"), ("x", "b"), ("y", "b")]
    _refused(
        tmp_path,
        {"name": "csv", "path": str(_csv(tmp_path / "dup.csv", rows))},
        "class 'b' has 2 example(s) after dropping 1 duplicate text(s)",
    )


def test_class_with_exactly_the_minimum_lands_in_every_split(tmp_path):
    rows = [(t, "a") for t in _texts(10, "apple")] + [(t, "b") for t in _texts(3, "berry")]
    m = materialise_splits(
        {"name": "csv", "path": str(_csv(tmp_path / "min.csv", rows))}, tmp_path / "out"
    )
    for name in ("train", "val", "test"):
        assert m.splits[name].counts_per_class["b"] >= 1


def test_empty_texts_are_refused_with_their_lines(tmp_path):
    rows = [(t, "a") for t in _texts(5, "apple")] + [(t, "b") for t in _texts(5, "berry")]
    rows[1] = ("", "a")  # line 3 (header is line 1)
    rows[6] = ("  \t ", "b")  # line 8
    path = _csv(tmp_path / "holes.csv", rows)
    _refused(
        tmp_path,
        {"name": "csv", "path": str(path)},
        "holes.csv",
        "column 'text' has 2 empty or whitespace-only text(s) at line 3, line 8",
    )
    jsonl = tmp_path / "holes.jsonl"
    jsonl.write_text(
        "".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in rows[:4])
        + json.dumps({"text": None, "label": "a"})
        + "\n"
    )
    _refused(
        tmp_path,
        {"name": "jsonl", "path": str(jsonl)},
        "holes.jsonl",
        "2 empty or whitespace-only text(s) at line 2, line 5",
    )


def test_empty_labels_are_refused(tmp_path):
    path = tmp_path / "nolabel.csv"
    path.write_text("text,label\nhello there,a\nfine day,\nsee you,b\n")
    _refused(
        tmp_path,
        {"name": "csv", "path": str(path)},
        "nolabel.csv",
        "column 'label' is empty at 1 row(s) (line 3)",
    )


def test_empty_text_files_are_refused_by_name(tmp_path):
    root = tmp_path / "corpus"
    for cls in ("x", "y"):
        (root / cls).mkdir(parents=True)
        for i, t in enumerate(_texts(4, cls)):
            (root / cls / f"{i}.txt").write_text(t)
    (root / "y" / "blank.txt").write_text("\n \n")
    _refused(
        tmp_path,
        {"name": "folder", "path": str(root)},
        "1 empty or whitespace-only text(s) at y/blank.txt",
    )
    ood = tmp_path / "ood"
    ood.mkdir()
    (ood / "empty.txt").write_text("")
    (root / "y" / "blank.txt").unlink()
    _refused(
        tmp_path,
        {"name": "folder", "path": str(root), "far_ood": {"kind": "folder", "path": str(ood)}},
        "far_ood",
        "at empty.txt",
    )


def _image_folder(root: Path, per_class: int = 4) -> Path:
    rng = np.random.default_rng(0)
    for c, cls in enumerate(("dark", "light")):
        (root / cls).mkdir(parents=True)
        for i in range(per_class):
            px = rng.integers(0, 80, (8, 8)) + 80 * c
            Image.fromarray(px.astype(np.uint8)).save(root / cls / f"{i}.png")
    return root


def test_unreadable_images_are_refused_by_name(tmp_path):
    root = _image_folder(tmp_path / "imgs")
    (root / "light" / "notes.png").write_text("this is not a picture")
    _refused(
        tmp_path,
        {"name": "folder", "path": str(root), "far_ood": "noise"},
        "cannot read image file",
        str(root / "light" / "notes.png"),
    )
    (root / "light" / "notes.png").unlink()
    good = (root / "dark" / "0.png").read_bytes()
    (root / "dark" / "cut.png").write_bytes(good[: len(good) // 2])  # truncated
    _refused(
        tmp_path,
        {"name": "folder", "path": str(root), "far_ood": "noise"},
        str(root / "dark" / "cut.png"),
    )


def test_image_class_folder_without_images_is_refused(tmp_path):
    root = _image_folder(tmp_path / "imgs")
    (root / "zebra").mkdir()
    (root / "zebra" / "readme.txt").write_text("no images here")
    _refused(
        tmp_path,
        {"name": "folder", "path": str(root), "far_ood": "noise"},
        "class folder",
        "zebra",
        "has no image files",
    )


def test_repeated_class_names_are_refused():
    with pytest.raises(ValueError, match=r"id_classes lists \['a'\] more than once"):
        DataSpec(name="csv", path="x.csv", id_classes=["a", "b", "a"])
