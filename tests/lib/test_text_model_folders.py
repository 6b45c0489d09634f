"""hydra_ops.models.factory.load_text_classifier on user folders: BERT only, every encoder weight
loaded."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import BertConfig, BertModel, BertTokenizer, GPT2Config, GPT2Model

from hydra_ops.models.factory import load_text_classifier

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world"]


def save_tiny_bert(path: Path, layers: int = 2, heads: int = 4) -> BertModel:
    """A random tiny BERT encoder and its tokenizer, saved as a Hugging Face folder."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(VOCAB),
        hidden_size=4 * heads,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    model = BertModel(config)
    model.save_pretrained(path)
    BertTokenizer(vocab_file=str(path / "vocab.txt")).save_pretrained(path)
    return model


def _load_error(path) -> str:
    """The one-line ValueError ``load_text_classifier`` raises for ``path``."""
    with pytest.raises(ValueError) as info:
        load_text_classifier(3, model_path=path)
    msg = str(info.value)
    assert len(msg.splitlines()) == 1, msg
    return msg


def test_a_gpt2_folder_is_refused_in_one_line(tmp_path):
    GPT2Model(GPT2Config(n_embd=16, n_layer=2, n_head=4, vocab_size=len(VOCAB))).save_pretrained(
        tmp_path
    )
    msg = _load_error(tmp_path)
    assert str(tmp_path) in msg and "model_type 'gpt2'" in msg and "supported: 'bert'" in msg


def test_a_tiny_bert_folder_loads_every_encoder_weight(tmp_path):
    encoder = save_tiny_bert(tmp_path, layers=2, heads=4)
    model, tokenizer = load_text_classifier(3, model_path=tmp_path, class_names=["a", "b", "c"])
    assert (model.config.num_hidden_layers, model.config.num_attention_heads) == (2, 4)
    loaded = model.bert.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in encoder.state_dict().items())
    batch = tokenizer(["hello world"], return_tensors="pt")
    with torch.no_grad():
        assert model(**batch).logits.shape == (1, 3)


def test_a_bert_folder_without_its_encoder_weights_is_refused(tmp_path):
    save_tiny_bert(tmp_path)
    weights = tmp_path / "model.safetensors"
    kept = {k: v for k, v in load_file(weights).items() if "encoder.layer" not in k}
    save_file(kept, weights, metadata={"format": "pt"})
    msg = _load_error(tmp_path)
    assert str(tmp_path) in msg and "encoder weight(s) missing" in msg and "encoder.layer" in msg


def test_a_bert_folder_without_its_pooler_still_loads(tmp_path):
    save_tiny_bert(tmp_path)
    weights = tmp_path / "model.safetensors"
    kept = {k: v for k, v in load_file(weights).items() if "pooler" not in k}
    save_file(kept, weights, metadata={"format": "pt"})
    model, _ = load_text_classifier(2, model_path=tmp_path)
    assert model.config.num_labels == 2
