"""Per-source defaults (tasks/params/source_defaults.py): image sources get their own training
defaults, layered under every user choice, and the default text run's params are untouched."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from tasks.params import (
    PROFILES,
    ConfigError,
    apply_sets,
    load_params,
    resolve_params,
    to_raw,
    validate_params,
    write_params,
)
from tasks.params.source_defaults import SOURCE_DEFAULTS, source_defaults
from tasks.runtime import data

REPO = Path(__file__).resolve().parents[2]


def leaves(tree: dict, prefix: str = "") -> dict[str, object]:
    """``{"a.b": value}`` for every non-dict value of a nested dict."""
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_mnist5k_gets_its_image_defaults():
    cfg = resolve_params("default", sets={"data.name": "mnist5k"})
    assert (cfg.model.vit.image_size, cfg.model.vit.patch_size) == (28, 7)
    assert (cfg.finetune.epochs, cfg.finetune.batch_size, cfg.finetune.random_shift) == (20, 32, 1)
    assert cfg.family == "timm_vit"
    plain = validate_params({"data": {"name": "mnist5k"}})  # validation alone adds no layer
    assert (plain.model.vit.image_size, plain.finetune.epochs) == (16, 3)


@pytest.mark.parametrize("name", sorted(SOURCE_DEFAULTS))
def test_every_entry_resolves_and_is_applied(name):
    for profile in PROFILES:
        cfg = resolve_params(profile, sets={"data.name": name})
        assert cfg.modality == "image"
    resolved = leaves(to_raw(resolve_params("default", sets={"data.name": name})))
    for key, value in leaves(SOURCE_DEFAULTS[name]).items():
        assert resolved[key] == value, key


def test_user_choices_win_over_source_defaults(tmp_path):
    sets = {"data.name": "mnist5k", "finetune.epochs": 2, "model.vit.patch_size": 4}
    cfg = resolve_params("default", sets=sets)
    assert cfg.finetune.epochs == 2 and cfg.model.vit.patch_size == 4
    assert cfg.model.vit.image_size == 28  # what the user left alone still comes from the source
    file = {"data": {"name": "mnist5k"}, "finetune": {"random_shift": 0, "batch_size": 8}}
    cfg = resolve_params("default", overrides=file)  # data.name from a params file
    assert (cfg.finetune.random_shift, cfg.finetune.batch_size, cfg.finetune.epochs) == (0, 8, 20)
    cfg = resolve_params("default", overrides=file, sets={"finetune.batch_size": 4})
    assert cfg.finetune.batch_size == 4  # --set over the file
    written = write_params(resolve_params("default", sets=sets), tmp_path / "params.yaml")
    assert load_params(written) == resolve_params("default", sets=sets)  # round trip


def test_set_alone_swaps_source_defaults_and_keeps_hand_edits():
    """``hydra-ens run --set data.name=...`` on an existing params.yaml (tasks.params.apply_sets):
    the new source's defaults arrive, the old one's leave, a hand edit stays."""
    text = to_raw(resolve_params("default"))
    text["finetune"]["lr"] = 1e-4  # a hand edit
    text["scoring"]["method"] = "taylor"
    image = apply_sets(text, {"data.name": "mnist5k"})
    assert (image.model.vit.image_size, image.model.vit.patch_size) == (28, 7)
    assert (image.finetune.epochs, image.finetune.batch_size, image.finetune.random_shift) == (
        20,
        32,
        1,
    )
    assert (image.finetune.lr, image.scoring.method) == (1e-4, "taylor")
    back = apply_sets(to_raw(image), {"data.name": "bbc-news"})
    assert leaves(to_raw(back)) == leaves(text)
    explicit = apply_sets(text, {"data.name": "mnist5k", "finetune.epochs": 5})
    assert (explicit.finetune.epochs, explicit.model.vit.image_size) == (5, 28)


def test_set_on_a_csv_project_keeps_its_data_section(tmp_path):
    csv = tmp_path / "d.csv"
    csv.write_text("text,label\n" + "".join(f"t{i},{'abc'[i % 3]}\n" for i in range(40)))
    sets = {"data.name": "csv", "data.path": str(csv), "data.near_ood_classes": ["c"]}
    raw = to_raw(resolve_params("quick", sets=sets))
    edited = apply_sets(raw, {"finetune.epochs": 2})
    assert edited.finetune.epochs == 2 and edited.data.path == str(csv)
    assert leaves(to_raw(edited)) == leaves(raw) | {"finetune.epochs": 2}


def test_set_without_a_new_source_changes_only_that_key():
    text = to_raw(resolve_params("quick"))
    edited = to_raw(apply_sets(text, {"members.num_members": 2}))
    changed = {k for k, v in leaves(edited).items() if leaves(text).get(k) != v}
    assert changed == {"members.num_members"} and edited["profile"] == "quick"


def test_a_clash_with_the_source_shape_names_the_key():
    with pytest.raises(ConfigError, match=r"model\.vit\.patch_size: must divide"):
        resolve_params("default", sets={"data.name": "mnist5k", "model.vit.image_size": 16})


def test_quick_profile_stays_quick_on_image_sources():
    default = validate_params({"data": {"name": "mnist5k"}}).model.vit
    for name in SOURCE_DEFAULTS:
        cfg = resolve_params("quick", sets={"data.name": name})
        quick = PROFILES["quick"]
        assert cfg.finetune.epochs == quick["finetune"]["epochs"] == 1
        assert cfg.finetune.batch_size == quick["finetune"]["batch_size"]
        assert cfg.data.max_per_split == quick["data"]["max_per_split"]
        vit = cfg.model.vit  # no more tokens, width or depth per step than the global shape
        tokens = (vit.image_size // vit.patch_size) ** 2
        assert tokens <= (default.image_size // default.patch_size) ** 2
        assert (vit.embed_dim, vit.depth, vit.mlp_ratio) <= (
            default.embed_dim,
            default.depth,
            default.mlp_ratio,
        )


def test_text_params_are_unchanged():
    for profile in PROFILES:
        assert to_raw(resolve_params(profile)) == to_raw(
            validate_params(PROFILES[profile] | {"profile": profile})
        )
    raw = to_raw(resolve_params("default"))
    assert "random_shift" not in raw["finetune"]  # omitted while off: same params.yaml as before
    repo = yaml.safe_load((REPO / "params.yaml").read_text())  # the default text run's file
    assert to_raw(resolve_params("default", overrides=repo)) == to_raw(validate_params(repo))
    for name in ("bbc-news", "csv", "jsonl", "folder"):
        assert source_defaults({"data": {"name": name}}) == {}


def test_source_defaults_is_a_copy_and_tolerates_bad_sections():
    got = source_defaults({"data": {"name": "mnist5k"}})
    got["finetune"]["epochs"] = 999
    assert SOURCE_DEFAULTS["mnist5k"]["finetune"]["epochs"] != 999
    assert source_defaults({}) == {} and source_defaults({"data": [1]}) == {}
    with pytest.raises(ConfigError, match="data"):
        resolve_params("default", overrides={"data": [1]})


@pytest.mark.parametrize(
    ("sets", "words"),
    [
        ({"finetune.random_shift": 1}, "must be 0 for text data"),
        ({"data.name": "mnist5k", "finetune.random_shift": 28}, "must be < model.vit.image_size"),
        ({"data.name": "mnist5k", "finetune.random_shift": -1}, "greater than or equal to 0"),
    ],
)
def test_bad_random_shift_names_the_key(sets, words):
    with pytest.raises(ConfigError) as info:
        resolve_params("default", sets=sets)
    msg = str(info.value)
    assert len(msg.splitlines()) == 1 and msg.startswith("params: finetune.random_shift: "), msg
    assert words in msg


def test_train_batches_apply_random_shift(tmp_path):
    """tasks.runtime.data.train_batches shifts the training images by ``finetune.random_shift``
    (same examples and order, seeded per epoch); evaluation batches never are."""

    from hydra_ops.data import materialise_splits
    from tasks.runtime.layout import DATA

    materialise_splits({"name": "digits", "max_per_split": 24}, tmp_path / DATA)
    sets = {"data.name": "digits", "data.max_per_split": 24}
    off = resolve_params("quick", sets={**sets, "finetune.random_shift": 0})
    on = resolve_params("quick", sets={**sets, "finetune.random_shift": 1})
    plain, shifted = data.train_batches(off, tmp_path, 0)(0), data.train_batches(on, tmp_path, 0)
    first, again, later = shifted(0), shifted(0), shifted(1)
    assert [b["labels"].tolist() for b in first] == [b["labels"].tolist() for b in plain]
    pixels = [torch.cat([b["pixel_values"] for b in bs]) for bs in (plain, first, again, later)]
    assert torch.equal(pixels[1], pixels[2])  # same seed and epoch, same shifts
    assert not torch.equal(pixels[0], pixels[1]) and not torch.equal(pixels[1], pixels[3])
    val = data.split(tmp_path, "val")
    assert torch.equal(
        torch.cat([b["pixel_values"] for b in data.batches(on, val, 8)]),
        torch.cat([b["pixel_values"] for b in data.batches(off, val, 8)]),
    )


@pytest.mark.parametrize("name", ["brown-genres", "fashion-mnist"])
def test_sources_resolve_on_every_profile(name):
    for profile in ("default", "quick"):
        cfg = resolve_params(profile, sets={"data.name": name})
        assert cfg.data.name == name
        assert cfg.modality == ("text" if name == "brown-genres" else "image")


def test_switching_to_fashion_mnist_brings_its_data_sizes():
    """``hydra-ens run --set data.name=fashion-mnist`` on the default params.yaml: the data values
    at the old source's defaults (splits, cap) follow the new source; a hand-set one stays."""
    text = to_raw(resolve_params("default"))
    image = apply_sets(text, {"data.name": "fashion-mnist"})
    assert (image.data.train_frac, image.data.max_per_split) == (0.9, 15000)
    assert apply_sets(to_raw(image), {"data.name": "bbc-news"}).data.max_per_split is None
    fracs = {"train_frac": 0.6, "val_frac": 0.2, "test_frac": 0.2}
    edited = {**text, "data": {**text["data"], "shift_severity": 0.3, **fracs}}
    kept = apply_sets(edited, {"data.name": "fashion-mnist"}).data
    assert (kept.shift_severity, kept.train_frac, kept.val_frac) == (0.3, 0.6, 0.2)
    assert kept.max_per_split == 15000


def test_fashion_mnists_hydra_shares_three_of_four_layers_and_a_study_spec_can_pin_two():
    """The fashion-mnist study's cheapest Hydra (docs/study.md) is the source's default; the
    specs that ran before it pin the trunk they ran with."""
    assert resolve_params("default", sets={"data.name": "fashion-mnist"}).shared_layers == 3
    assert resolve_params("default").shared_layers == 3  # BBC News: L/2 of MiniLM's 6
    pinned = resolve_params(
        "default", sets={"data.name": "fashion-mnist", "merge.shared_layers": 2}
    )
    assert pinned.shared_layers == 2


@pytest.mark.parametrize("source", ["bbc-news", "brown-genres"])
def test_an_mpnet_run_builds_the_text_default_and_may_ship_its_twin(source):
    """docs/study.md, "By model size": at 12 layers the paper's merge failed its gates at two
    seeds of three on BBC News, so MPNet keeps the text default."""
    mpnet = to_raw(resolve_params(sets={"model.family": "mpnet", "data.name": source}))
    text = to_raw(resolve_params(sets={"data.name": source}))
    assert mpnet["merge"]["shared_layers"] is None and mpnet["scoring"]["method"] == "taylor"
    assert mpnet["promote"]["candidates"] == ["hydra", "naive_pruned"]
    for section in ("scoring", "members", "merge", "promote", "gates"):
        assert mpnet[section] == text[section], section
