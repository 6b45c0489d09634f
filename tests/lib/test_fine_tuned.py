"""hydra_ops.models.fine_tuned: a user's fine-tuned classifier, its labels matched to the data's
classes, its head's rows reordered exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hydra_ops.models.fine_tuned import checkpoint_labels, load_fine_tuned, match_labels


def test_match_labels_orders_the_checkpoint_outputs_by_the_data_classes():
    assert match_labels(["refund", "shipping", "account"], ["account", "refund", "shipping"]) == [
        2,
        0,
        1,
    ]


def test_a_label_mismatch_is_one_line_naming_both_lists():
    with pytest.raises(ValueError) as err:
        match_labels(["pos", "neg"], ["0", "1"])
    message = str(err.value)
    assert "\n" not in message
    assert "['pos', 'neg']" in message and "['0', '1']" in message


def _tiny_classifier(folder: Path, labels: list[str]) -> torch.nn.Module:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={n: i for i, n in enumerate(labels)},
    )
    torch.manual_seed(0)
    model = BertForSequenceClassification(config).eval()
    model.save_pretrained(str(folder))
    return model


def test_load_fine_tuned_keeps_the_trained_head_in_the_data_order(tmp_path):
    labels = ["refund", "shipping", "account"]
    original = _tiny_classifier(tmp_path / "clf", labels)
    assert checkpoint_labels(tmp_path / "clf") == labels
    classes = sorted(labels)
    model = load_fine_tuned(tmp_path / "clf", classes)
    ids = torch.randint(0, 50, (3, 7))
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0  # a padded row
    with torch.no_grad():
        ours = model(input_ids=ids, attention_mask=mask).logits
        theirs = original(input_ids=ids, attention_mask=mask).logits
    order = [labels.index(c) for c in classes]
    torch.testing.assert_close(ours, theirs[:, order], atol=1e-5, rtol=0)
    assert model.config.id2label == dict(enumerate(classes))


def test_load_fine_tuned_refuses_other_labels(tmp_path):
    _tiny_classifier(tmp_path / "clf", ["a", "b"])
    with pytest.raises(ValueError, match=r"the checkpoint's labels \['a', 'b'\] are not"):
        load_fine_tuned(tmp_path / "clf", ["a", "c"])
