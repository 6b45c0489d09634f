"""hydra_ops.models.factory and hydra_ops.models.checkpoints: offline loading, batches, bit-exact
round trips."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from hydra_ops.models.checkpoints import (
    CheckpointError,
    load_model,
    read_checkpoint_metadata,
    save_model,
)
from hydra_ops.models.factory import (
    build_timm_vit,
    default_text_model_path,
    load_text_classifier,
    make_image_batches,
    make_text_batches,
)


def tiny_bert(num_labels: int = 3) -> BertForSequenceClassification:
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=32,
        max_position_embeddings=32,
        num_labels=num_labels,
    )
    return BertForSequenceClassification(cfg).eval()


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


def _same_state(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_bert_round_trip_is_bit_exact(tmp_path):
    model = tiny_bert()
    save_model(model, tmp_path / "ckpt", {"classes": ["a", "b", "c"]})
    loaded = load_model(tmp_path / "ckpt")
    assert type(loaded) is BertForSequenceClassification
    assert _same_state(model, loaded)
    ids = torch.randint(0, 50, (2, 7))
    mask = torch.ones_like(ids)
    assert torch.equal(
        model(input_ids=ids, attention_mask=mask).logits,
        loaded(input_ids=ids, attention_mask=mask).logits,
    )
    meta = read_checkpoint_metadata(tmp_path / "ckpt")
    assert meta["family"] == "bert" and meta["metadata"] == {"classes": ["a", "b", "c"]}
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no temp folder left


def test_timm_vit_round_trip_is_bit_exact(tmp_path):
    model = tiny_vit()
    save_model(model, tmp_path / "vit")
    loaded = load_model(tmp_path / "vit")
    assert _same_state(model, loaded)
    x = torch.rand(2, 1, 8, 8)
    assert torch.equal(model(x), loaded(x))
    assert read_checkpoint_metadata(tmp_path / "vit")["config"]["img_size"] == 8


def test_tampered_truncated_and_missing_files(tmp_path):
    save_model(tiny_bert(), tmp_path / "c")
    weights = tmp_path / "c" / "model.safetensors"
    good = weights.read_bytes()
    data = bytearray(good)
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(
        CheckpointError, match=r"model\.safetensors.*truncated, corrupt or was modified"
    ):
        load_model(tmp_path / "c")
    weights.write_bytes(good[:200])
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        load_model(tmp_path / "c")
    with pytest.raises(CheckpointError, match="cannot be read"):  # hash skipped, parse fails
        load_model(tmp_path / "c", verify=False)
    weights.write_bytes(good)
    meta = tmp_path / "c" / "checkpoint.json"
    meta.write_text("{not json")
    with pytest.raises(CheckpointError, match=r"checkpoint\.json"):
        load_model(tmp_path / "c")
    meta.unlink()
    with pytest.raises(CheckpointError, match="missing"):
        load_model(tmp_path / "c")
    assert issubclass(CheckpointError, ValueError)


def test_config_that_does_not_fit_weights(tmp_path):
    save_model(tiny_bert(), tmp_path / "c")
    meta_path = tmp_path / "c" / "checkpoint.json"
    meta = json.loads(meta_path.read_text())
    meta["config"]["hidden_size"] = 32
    meta["config"]["intermediate_size"] = 64
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="does not match its config"):
        load_model(tmp_path / "c")


def test_save_rejects_unknown_model(tmp_path):
    with pytest.raises(ValueError, match="supported families: bert, hf_vit, timm_vit"):
        save_model(torch.nn.Linear(2, 2), tmp_path / "x")


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
