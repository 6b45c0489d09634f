"""``finetune.from_checkpoint``: the params that start a run from the user's fine-tuned
classifier, each bad combination one line, and what the run then builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tasks.params import ConfigError, resolve_params, to_raw


def classifier_folder(root: Path, architectures: list[str], id2label: dict | None) -> Path:
    root.mkdir()
    config = {
        "model_type": "bert",
        "architectures": architectures,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
    }
    if id2label is not None:
        config["id2label"] = id2label
    (root / "config.json").write_text(json.dumps(config))
    return root


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    labels = {"0": "a", "1": "b"}
    return classifier_folder(tmp_path / "clf", ["BertForSequenceClassification"], labels)


def test_a_fine_tuned_classifier_is_the_base_and_no_deep_ensemble_is_built(checkpoint):
    cfg = resolve_params(
        "default", sets={"model.path": str(checkpoint), "finetune.from_checkpoint": True}
    )
    assert cfg.built() == ("single", "naive_pruned")
    assert {g.baseline for g in cfg.gates} - {None} == {"single", "naive_pruned"}
    assert to_raw(cfg)["finetune"]["from_checkpoint"] is True
    # off, it stays out of params.yaml (the default run's file and fingerprints are unchanged)
    assert "from_checkpoint" not in to_raw(resolve_params("default"))["finetune"]


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        (
            {"finetune.from_checkpoint": True},
            "params: finetune.from_checkpoint: needs model.path: the folder of your fine-tuned "
            "classifier",
        ),
        (
            {"finetune.from_checkpoint": True, "data.name": "digits"},
            "params: finetune.from_checkpoint: needs model.path: the folder of your fine-tuned "
            "classifier",
        ),
    ],
)
def test_bad_combinations_are_one_line(sets, expected):
    with pytest.raises(ConfigError) as err:
        resolve_params("default", sets=sets)
    assert str(err.value) == expected


def test_a_deep_ensemble_asked_for_without_a_backbone_is_refused(checkpoint):
    sets = {
        "model.path": str(checkpoint),
        "finetune.from_checkpoint": True,
        "baselines.deep_ensemble": True,
    }
    with pytest.raises(ConfigError) as err:
        resolve_params("default", sets=sets)
    message = str(err.value)
    assert "\n" not in message and message.startswith("params: baselines.deep_ensemble: ")
    assert "finetune.from_checkpoint" in message


@pytest.mark.parametrize(
    ("architectures", "id2label", "words"),
    [
        (["BertModel"], {"0": "a", "1": "b"}, "names no *ForSequenceClassification"),
        (["BertForSequenceClassification"], None, "has no id2label of at least 2 labels"),
        (["BertForSequenceClassification"], {"0": "a", "2": "b"}, "id2label keys must be 0..1"),
    ],
)
def test_a_folder_that_is_no_fine_tuned_classifier_is_one_line(
    tmp_path, architectures, id2label, words
):
    folder = classifier_folder(tmp_path / "m", architectures, id2label)
    sets = {"model.path": str(folder), "finetune.from_checkpoint": True}
    with pytest.raises(ConfigError) as err:
        resolve_params("default", sets=sets)
    message = str(err.value)
    assert "\n" not in message and message.startswith("params: model.path: ") and words in message


def test_a_checkpoint_whose_labels_are_not_the_data_classes_stops_the_base_in_one_line(
    tmp_path, monkeypatch, capsys
):
    """The data's classes are known once prepare_data ran: finetune_base refuses a checkpoint
    trained on other labels in one line naming both lists, and writes no base."""
    from transformers import BertConfig, BertForSequenceClassification

    from tasks import finetune_base, prepare_data
    from tasks.params import write_params

    config = BertConfig(
        vocab_size=40,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=32,
        id2label={0: "pos", 1: "neg"},
        label2id={"pos": 0, "neg": 1},
    )
    BertForSequenceClassification(config).save_pretrained(str(tmp_path / "clf"))
    lines = ["text,label"]
    for label, word in (("spam", "win prize now"), ("ham", "see you at lunch"), ("ood", "rain")):
        lines += [f"{word} {i},{label}" for i in range(12)]
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    sets = {
        "data.name": "csv",
        "data.path": str(tmp_path / "d.csv"),
        "data.near_ood_classes": ["ood"],
        "model.path": str(tmp_path / "clf"),
        "finetune.from_checkpoint": True,
    }
    write_params(resolve_params("quick", sets=sets), tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HYDRA_ENS_THREADS", "1")
    prepare_data.run(resolve_params("quick", sets=sets), tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        finetune_base.main()
    assert exit_info.value.code == 1
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error")]
    assert len(errors) == 1 and errors[0].startswith("error: stage finetune_base: ")
    assert "['pos', 'neg']" in errors[0] and "['ham', 'spam']" in errors[0]
    assert not (tmp_path / "models" / "base").exists()
