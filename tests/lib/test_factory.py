"""hydra_ops.models.factory: models built offline (MiniLM, timm ViT, a user's BERT folder), the
batches they read, and a library import that leaves the process environment alone."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    BertConfig,
    BertModel,
    BertTokenizer,
    GPT2Config,
    GPT2Model,
)

from hydra_ops.models.factory import (
    build_timm_vit,
    default_text_model_path,
    load_text_classifier,
    make_image_batches,
    make_text_batches,
)


def _same_state(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def tiny_vit():
    return build_timm_vit(
        image_size=8,
        in_chans=1,
        num_classes=3,
        depth=2,
        embed_dim=16,
        num_heads=4,
        patch_size=2,
        seed=0,
    ).eval()


def test_minilm_loads_offline_with_class_names():
    model, tok = load_text_classifier(4, class_names=["w", "x", "y", "z"])
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.hidden_size) == (6, 12, 384)
    assert cfg.id2label == {0: "w", 1: "x", 2: "y", 3: "z"}
    batches = list(
        make_text_batches(
            ["a short text", "another " * 100], [1, 3], tok, max_length=16, batch_size=2
        )
    )
    assert len(batches) == 1
    b = batches[0]
    assert b["input_ids"].shape == b["attention_mask"].shape == (2, 16)
    assert b["labels"].tolist() == [1, 3] and b["attention_mask"][0].sum() < 16
    with torch.no_grad():
        logits = model(**{k: v for k, v in b.items() if k != "labels"}).logits
    assert logits.shape == (2, 4)
    assert default_text_model_path().is_dir()


def test_load_text_classifier_bad_input(tmp_path):
    with pytest.raises(ValueError, match="num_labels"):
        load_text_classifier(1)
    with pytest.raises(ValueError, match="not a local model folder"):
        load_text_classifier(3, model_path=tmp_path)
    with pytest.raises(ValueError, match="class_names"):
        load_text_classifier(3, class_names=["a"])


def test_text_batches_shuffle_is_seeded():
    class Tok:
        def __call__(self, texts, **kw):
            ids = torch.tensor([[len(t), 1] for t in texts])
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    texts = [str(i) * (i + 1) for i in range(10)]
    order = lambda seed: torch.cat(  # noqa: E731
        [b["labels"] for b in make_text_batches(texts, list(range(10)), Tok(), 8, 3, True, seed)]
    ).tolist()
    assert order(1) == order(1) and order(1) != order(2) and sorted(order(1)) == list(range(10))


def test_image_batches_shapes_and_normalisation():
    imgs = np.full((5, 8, 8), 255, dtype=np.uint8)
    batches = list(make_image_batches(imgs, [0, 1, 2, 0, 1], batch_size=2, image_size=16))
    assert [b["pixel_values"].shape for b in batches] == [(2, 1, 16, 16)] * 2 + [(1, 1, 16, 16)]
    assert torch.allclose(batches[0]["pixel_values"], torch.ones(2, 1, 16, 16))
    rgb = np.zeros((3, 8, 8, 3), dtype=np.uint8)
    assert next(make_image_batches(rgb, None, 4))["pixel_values"].shape == (3, 3, 8, 8)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        next(make_image_batches(np.full((2, 8, 8), 16.0), None))
    with pytest.raises(ValueError, match="labels has 2 entries"):
        next(make_image_batches(imgs, [0, 1]))


def test_build_timm_vit_validates_and_is_seeded():
    a, b = tiny_vit(), tiny_vit()
    assert _same_state(a, b)
    assert a(torch.rand(3, 1, 8, 8)).shape == (3, 3)
    with pytest.raises(ValueError, match="patch_size 3 must divide image_size 8"):
        build_timm_vit(8, 1, 3, patch_size=3)
    with pytest.raises(ValueError, match="num_heads"):
        build_timm_vit(8, 1, 3, embed_dim=10, num_heads=4, patch_size=2)


def test_importing_the_library_leaves_the_process_environment_alone():
    # a library import must not switch a user's process offline (the loaders pass
    # local_files_only=True themselves)
    import subprocess
    import sys

    code = (
        "import os; os.environ.pop('HF_HUB_OFFLINE', None); "
        "os.environ.pop('TRANSFORMERS_OFFLINE', None); import hydra_ops.models.factory; "
        "print(os.environ.get('HF_HUB_OFFLINE'), os.environ.get('TRANSFORMERS_OFFLINE'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None", "None"]


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
    assert str(tmp_path) in msg and "model_type 'gpt2'" in msg
    assert "not a supported one: bert (bert), roberta (roberta), xlm-roberta (roberta)" in msg


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


# ---- every family loaded from a folder: model.path's config.json picks the class ----
FOLDER_FAMILIES = ("roberta", "distilbert", "electra")


@pytest.mark.parametrize("family", FOLDER_FAMILIES)
def test_a_tiny_folder_of_each_family_loads_as_its_own_class(tmp_path, family):
    from tiny_models import save_text_folder, tiny_model

    from hydra_ops.adapters import get_adapter
    from hydra_ops.models.factory import build_base

    source = tiny_model(family)
    save_text_folder(source, tmp_path, ["the cat sat", "a dog ran"])
    model = build_base(family, ["x", "y"], seed=3, model_path=tmp_path)
    assert type(model) is type(source) and get_adapter(model).family == family
    assert model.config.id2label == {0: "x", 1: "y"}
    head = get_adapter(model).new_weight_prefixes
    encoder = {k: v for k, v in source.state_dict().items() if not k.startswith(head)}
    loaded = model.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in encoder.items())
    again = build_base(family, ["x", "y"], seed=3, model_path=tmp_path)
    assert _same_state(model, again)  # the new head is seeded
    _, tokenizer = load_text_classifier(2, model_path=tmp_path)
    batch = tokenizer(["the cat", "a dog ran far"], padding=True, return_tensors="pt")
    with torch.no_grad():
        assert get_adapter(model).logits(dict(batch)).shape == (2, 2)


def test_a_folder_of_another_family_is_refused_in_one_line(tmp_path):
    from tiny_models import save_text_folder, tiny_model

    from hydra_ops.models.factory import build_base

    save_text_folder(tiny_model("roberta"), tmp_path)
    with pytest.raises(ValueError) as info:
        build_base("distilbert", ["x", "y"], seed=0, model_path=tmp_path)
    assert str(info.value) == f"model.path {str(tmp_path)!r} holds a roberta model, not distilbert"
    with pytest.raises(ValueError, match=r"model\.family='roberta' needs model\.path"):
        build_base("roberta", ["x", "y"], seed=0)
    with pytest.raises(ValueError, match="'hf_vit' cannot be a pipeline base"):
        build_base("hf_vit", ["x", "y"], seed=0)
