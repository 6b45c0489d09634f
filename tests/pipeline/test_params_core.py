"""tasks.params.core: the checks across the data and model sections, each one line naming its key,
before any stage runs (no near-OOD set; a model.path that is not a BERT, or whose shape differs
from MiniLM's); relative paths read from the project folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hydra_ops.adapters import FAMILIES
from tasks.params import ConfigError, resolve_params, to_raw, validate_params


def one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert len(msg.splitlines()) == 1, msg
    return msg


def write_csv(path: Path, labels: str = "abc") -> Path:
    path.write_text(
        "text,label\n" + "".join(f"text {i},{labels[i % len(labels)]}\n" for i in range(30))
    )
    return path


def bert_folder(path: Path, **config: object) -> Path:
    """A folder holding only a BERT ``config.json`` (all the params checks read)."""
    path.mkdir(parents=True, exist_ok=True)
    base = {"model_type": "bert", "num_hidden_layers": 2, "num_attention_heads": 4}
    (path / "config.json").write_text(json.dumps(base | config))
    return path


# ---- B1: the pipeline needs a near-OOD split ----


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_a_table_source_without_near_ood_is_refused(tmp_path, kind):
    data = write_csv(tmp_path / f"d.{kind}")  # the check reads no rows: any file will do
    with pytest.raises(ConfigError) as info:
        validate_params({"data": {"name": kind, "path": str(data)}})
    msg = one_line(info)
    assert msg.startswith(f"params.yaml: data.near_ood_classes: source '{kind}' needs a near-OOD")
    assert "data.near_ood" in msg.split("needs a near-OOD", 1)[1]


def test_a_table_source_with_a_near_ood_set_passes(tmp_path):
    data = str(write_csv(tmp_path / "d.csv"))
    cfg = validate_params({"data": {"name": "csv", "path": data, "near_ood_classes": ["c"]}})
    assert cfg.data.near_ood_classes == ["c"]
    ood = write_csv(tmp_path / "ood.csv")
    user = {"name": "csv", "path": data, "near_ood": {"kind": "csv", "path": str(ood)}}
    assert validate_params({"data": user}).data.near_ood is not None
    # held out by id_classes: unknown labels until the file is read, so it passes here
    assert validate_params({"data": {"name": "csv", "path": data, "id_classes": ["a", "b"]}})
    held = {"name": "csv", "path": data, "classes": ["a", "b", "c"], "id_classes": ["a", "b"]}
    assert validate_params({"data": held})


def test_numeric_class_names_are_read_as_strings(tmp_path):
    data = str(write_csv(tmp_path / "d.csv", labels="012"))
    # what `--set 'data.near_ood_classes=[2]'` parses to: YAML integers
    cfg = resolve_params(
        "quick", sets={"data.name": "csv", "data.path": data, "data.near_ood_classes": [2]}
    )
    assert cfg.data.near_ood_classes == ["2"] and to_raw(cfg)["data"]["near_ood_classes"] == ["2"]
    digits = validate_params({"data": {"name": "digits", "id_classes": [0, 1, 2]}})
    assert digits.data.id_classes == ["0", "1", "2"]


def test_folder_sources_and_explicit_empty_lists(tmp_path):
    root = tmp_path / "corpus"
    for cls in ("x", "y", "z"):
        (root / cls).mkdir(parents=True)
        (root / cls / "0.txt").write_text(f"a {cls} text")
    folder = {"name": "folder", "path": str(root)}
    with pytest.raises(
        ConfigError, match=r"^params\.yaml: data\.near_ood_classes: source 'folder'"
    ):
        validate_params({"data": folder})
    assert validate_params({"data": folder | {"id_classes": ["x", "y"]}})
    with pytest.raises(ConfigError) as info:
        validate_params({"data": folder | {"id_classes": ["x", "y", "z"]}})
    assert one_line(info).startswith("params.yaml: data.id_classes: ['x', 'y', 'z'] cover every")
    with pytest.raises(ConfigError) as info:
        validate_params({"data": {"name": "bbc-news", "near_ood_classes": []}})
    assert one_line(info).startswith("params.yaml: data.near_ood_classes: is empty")


def test_built_in_sources_keep_their_near_ood_classes():
    for name in ("bbc-news", "mnist5k", "digits"):
        assert validate_params({"data": {"name": name}}).data.near_ood is None
    with pytest.raises(ConfigError, match=r"data\.id_classes: .* cover every class"):
        validate_params({"data": {"name": "digits", "id_classes": [str(i) for i in range(10)]}})


def test_a_missing_data_path_is_the_only_data_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        validate_params({"data": {"name": "csv", "path": str(tmp_path / "nope.csv")}})
    assert one_line(info).startswith("params.yaml: data.path: ")


# ---- B2/B3: model.path is read for its type and shape ----


def test_model_shape_follows_model_path(tmp_path):
    folder = bert_folder(tmp_path / "bert", num_hidden_layers=2, num_attention_heads=4)
    cfg = validate_params({"model": {"path": str(folder)}})
    assert (cfg.model_layers, cfg.model_heads) == (2, 4)
    assert cfg.shared_layers == 1 and cfg.heads_per_member == 1  # L // 2, heads // M
    with pytest.raises(ConfigError) as info:
        validate_params({"model": {"path": str(folder)}, "members": {"heads_per_layer": 5}})
    assert one_line(info) == (
        "params.yaml: members.heads_per_layer: 5 > the model's 4 heads per layer"
    )
    with pytest.raises(ConfigError) as info:
        validate_params({"model": {"path": str(folder)}, "merge": {"shared_layers": 2}})
    assert one_line(info) == "params.yaml: merge.shared_layers: must be < the model's 2 layers"
    # the packaged MiniLM and the image family keep their shapes
    assert (validate_params({}).model_layers, validate_params({}).model_heads) == (6, 12)
    image = validate_params({"data": {"name": "digits"}})
    assert (image.model_layers, image.model_heads) == (image.model.vit.depth, 6)
    with pytest.raises(ConfigError) as info:  # the folder's family picks the model: text only
        validate_params({"data": {"name": "digits"}, "model": {"path": str(folder)}})
    assert one_line(info) == "params.yaml: model.path: holds a bert model, which needs text data"


def test_a_real_tiny_bert_folder_gives_its_shape(tmp_path):
    from transformers import BertConfig

    BertConfig(
        vocab_size=10, hidden_size=16, num_hidden_layers=2, num_attention_heads=4
    ).save_pretrained(tmp_path)
    cfg = resolve_params("quick", sets={"model.path": str(tmp_path)})
    assert (cfg.model_layers, cfg.model_heads, cfg.shared_layers) == (2, 4, 1)


@pytest.mark.parametrize(
    ("write", "words"),
    [
        (None, "is not a local model folder (no config.json)"),
        ("{not json", "is not readable JSON"),
        (
            '{"model_type": "gpt2", "n_layer": 2}',
            "has model_type 'gpt2', not a supported one: bert (bert), roberta (roberta), ",
        ),
        ('{"model_type": "bert", "num_hidden_layers": 0}', "num_hidden_layers must be a positive"),
    ],
)
def test_a_bad_model_folder_is_one_line_naming_model_path(tmp_path, write, words):
    if write is not None:
        (tmp_path / "config.json").write_text(write)
    with pytest.raises(ConfigError) as info:
        validate_params({"model": {"path": str(tmp_path)}})
    msg = one_line(info)
    assert msg.startswith("params.yaml: model.path: ") and words in msg, msg


def test_relative_paths_are_read_from_the_project_folder(tmp_path, monkeypatch):
    """A relative ``data.path``, OOD set path and ``model.path`` name files in the project, where
    ``dvc repro`` runs the stages, also for a process elsewhere (``hydra-ens status -C PROJECT``,
    ``run -C PROJECT --set``, a study worker): they were checked in the current folder and
    refused. The params keep them as written."""
    from tasks.params import load_params, write_params
    from tasks.runtime.preflight import resolve_run_params

    project = tmp_path / "proj"
    (project / "data").mkdir(parents=True)
    write_csv(project / "data" / "train.csv")
    write_csv(project / "data" / "near.csv", labels="n")
    bert_folder(project / "bert", num_hidden_layers=2, num_attention_heads=4)
    near = {"kind": "csv", "path": "data/near.csv"}
    data = {"name": "csv", "path": "data/train.csv", "near_ood": near}
    monkeypatch.chdir(project)
    write_params(resolve_params("quick", {"data": data, "model": {"path": "bert"}}), "params.yaml")
    monkeypatch.chdir(tmp_path)
    cfg = load_params(project / "params.yaml")
    assert (cfg.data.path, cfg.model.path, cfg.model_layers) == ("data/train.csv", "bert", 2)
    assert cfg.model_dir == str(project / "bert")  # what predict loads its tokenizer from
    cfg = resolve_run_params(project, None, None, ["data.text_column=text"])
    assert (cfg.data.near_ood.path, cfg.model_heads) == ("data/near.csv", 4)
    with pytest.raises(ConfigError, match=r"data\.path: 'nope\.csv' does not exist"):
        resolve_run_params(project, None, None, ["data.path=nope.csv"])


# ---- the efficient-ensemble baselines' sections ----


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("baselines.lora_ensemble.rank", 0, "baselines.lora_ensemble.rank: "),
        ("baselines.lora_ensemble.dropout", 1.0, "baselines.lora_ensemble.dropout: "),
        ("baselines.batch_ensemble.init_std", -0.1, "baselines.batch_ensemble.init_std: "),
        ("baselines.batch_ensemble.members", 0, "baselines.batch_ensemble.members: "),
        ("baselines.lora_ensemble.rnak", 4, "(did you mean 'rank'?)"),
    ],
)
def test_efficient_baseline_params_are_refused_in_one_line_naming_the_key(key, value, expected):
    section, method, leaf = key.split(".")
    with pytest.raises(ConfigError) as info:
        validate_params({section: {method: {"enabled": True, leaf: value}}})
    msg = one_line(info)
    assert msg.startswith("params.yaml: baselines.") and expected in msg


def test_efficient_baselines_are_off_by_default_and_dumped_with_their_settings():
    cfg = resolve_params("default")
    assert not cfg.baselines.lora_ensemble.enabled and not cfg.baselines.batch_ensemble.enabled
    raw = to_raw(resolve_params("default", sets={"baselines.lora_ensemble.enabled": True}))
    assert raw["baselines"]["lora_ensemble"]["enabled"] is True
    assert set(raw["baselines"]["batch_ensemble"]) >= {"enabled", "members", "init_std", "lr"}


# ---- the family follows model.path's config.json ----


@pytest.mark.parametrize(
    ("config", "family", "shape"),
    [
        ({"model_type": "roberta", "num_hidden_layers": 3, "num_attention_heads": 4}, "roberta", 3),
        (
            {"model_type": "xlm-roberta", "num_hidden_layers": 2, "num_attention_heads": 4},
            "roberta",
            2,
        ),
        ({"model_type": "distilbert", "n_layers": 2, "n_heads": 4}, "distilbert", 2),
        ({"model_type": "electra", "num_hidden_layers": 4, "num_attention_heads": 4}, "electra", 4),
    ],
)
def test_model_path_picks_the_family_and_its_shape(tmp_path, config, family, shape):
    (tmp_path / "config.json").write_text(json.dumps(config))
    cfg = validate_params({"model": {"path": str(tmp_path)}})
    assert (cfg.family, cfg.model_layers, cfg.model_heads, cfg.base_lr) == (family, shape, 4, 5e-5)
    assert validate_params({"model": {"path": str(tmp_path), "family": family}}).family == family


def test_a_family_that_does_not_fit_model_path_is_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "distilbert"}))
    with pytest.raises(ConfigError) as info:
        validate_params({"model": {"path": str(tmp_path), "family": "roberta"}})
    assert one_line(info) == (
        "params.yaml: model.path: holds a distilbert model but model.family is 'roberta'"
    )
    with pytest.raises(ConfigError) as info:
        validate_params({"model": {"family": "electra"}})
    assert one_line(info) == "params.yaml: model.path: model.family 'electra' needs a model folder"
    with pytest.raises(ConfigError) as info:
        validate_params({"model": {"family": "hf_vit"}, "data": {"name": "digits"}})
    assert one_line(info) == "params.yaml: model.family: 'hf_vit' cannot be a pipeline base"


@pytest.mark.parametrize("family", ["bert", "mpnet"])
def test_text_is_tokenized_by_the_model_the_family_loads(family):
    """Without ``model.path`` the base is the family's default folder, and so is the tokenizer:
    MPNet's ids are not BERT's (``<s>`` = 0, not ``[CLS]`` = 101; every word shifted)."""
    from hydra_ops.data import Split, text_tokenizer
    from tasks.runtime.data import batches

    cfg = validate_params({"model": {"family": family}})
    folder = cfg.model_folder
    assert folder == FAMILIES[family].default_path()
    split = Split("test", "text", ["a", "b"], np.array([0, 1]), texts=["hello world", "a b c"])
    ids = batches(cfg, split, 2)[0]["input_ids"]
    own = text_tokenizer(folder)("hello world")["input_ids"]
    assert ids[0, : len(own)].tolist() == own
    minilm = text_tokenizer(FAMILIES["bert"].default_path())("hello world")["input_ids"]
    assert (own == minilm) == (family == "bert")
