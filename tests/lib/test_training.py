"""hydra_ops.models.training: loss goes down on a separable task, determinism, freezing, reduced
precision, model_logits."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import math

import pytest
import torch
from tiny_models import FAMILIES, NUM_LAYERS, tiny_inputs, tiny_model, train_one_epoch
from transformers import BertConfig, BertForSequenceClassification

from hydra_ops.models.factory import build_timm_vit, make_image_batches
from hydra_ops.models.inference import logits as model_outputs
from hydra_ops.models.training import fine_tune, freeze_layers, model_logits


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: one thread avoids OpenMP spin contention on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=30,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=2,
    )
    return BertForSequenceClassification(cfg)


def toy_text_batches(epoch: int, n: int = 64, batch: int = 16):
    """Class 0 uses tokens 2..9, class 1 tokens 10..17: linearly separable by token identity."""
    g = torch.Generator().manual_seed(epoch)
    labels = torch.arange(n) % 2
    ids = torch.randint(2, 10, (n, 8), generator=g) + 8 * labels[:, None]
    for s in range(0, n, batch):
        yield {
            "input_ids": ids[s : s + batch],
            "attention_mask": torch.ones(min(batch, n - s), 8, dtype=torch.long),
            "labels": labels[s : s + batch],
        }


def test_fine_tune_reduces_loss_and_learns_bert():
    model = tiny_bert()
    lines: list[str] = []
    report = fine_tune(
        model,
        toy_text_batches,
        epochs=12,
        lr=5e-3,
        weight_decay=0.0,
        warmup_ratio=0.1,
        seed=0,
        progress=False,
        log_fn=lines.append,
    )
    assert report.epoch_losses[-1] < 0.5 * report.epoch_losses[0]
    assert report.steps == 12 * 4 and len(report.epoch_seconds) == 12 and len(lines) == 12
    batches = list(toy_text_batches(99))
    logits, labels = model_outputs(model, batches), torch.cat([b["labels"] for b in batches])
    assert logits.shape == (64, 2) and labels.shape == (64,)
    assert (logits.argmax(-1) == labels).float().mean() > 0.9
    assert not model.training


def test_fine_tune_timm_vit_on_separable_images():
    torch.manual_seed(0)
    labels = torch.arange(48) % 2
    imgs = torch.randint(0, 40, (48, 8, 8), dtype=torch.uint8)  # class 1: dark noise
    imgs[labels == 0, :, :4] = 255  # class 0: bright left half
    model = build_timm_vit(8, 1, 2, depth=1, embed_dim=16, num_heads=2, patch_size=4, seed=0)
    batches = lambda e: make_image_batches(imgs.numpy(), labels.tolist(), 16, shuffle=True, seed=e)  # noqa: E731
    report = fine_tune(
        model,
        batches,
        epochs=8,
        lr=3e-3,
        weight_decay=0.0,
        warmup_ratio=0.0,
        seed=0,
        progress=False,
        log_fn=None,
    )
    assert report.epoch_losses[-1] < 0.5 * report.epoch_losses[0]
    logits = model_outputs(model, make_image_batches(imgs.numpy(), labels.tolist(), 16))
    y = labels
    assert (logits.argmax(-1) == y).float().mean() == 1.0


def test_fine_tune_is_deterministic_under_seed():
    def run(seed: int) -> dict[str, torch.Tensor]:
        model = tiny_bert()
        fine_tune(
            model,
            toy_text_batches,
            epochs=1,
            lr=1e-3,
            weight_decay=0.01,
            warmup_ratio=0.2,
            seed=seed,
            progress=False,
            log_fn=None,
        )
        return model.state_dict()

    a, b, c = run(1), run(1), run(2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)  # dropout differs with the seed


def test_frozen_layers_stay_unchanged():
    model = tiny_bert()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fine_tune(
        model,
        toy_text_batches,
        epochs=1,
        lr=1e-2,
        weight_decay=0.0,
        warmup_ratio=0.0,
        seed=0,
        progress=False,
        log_fn=None,
        frozen_layers=1,
    )
    after = model.state_dict()
    frozen = [k for k in before if k.startswith(("bert.embeddings", "bert.encoder.layer.0."))]
    trained = [k for k in before if k.startswith("bert.encoder.layer.1.")]
    assert frozen and all(torch.equal(before[k], after[k]) for k in frozen)
    assert any(not torch.equal(before[k], after[k]) for k in trained)
    with pytest.raises(ValueError, match=r"frozen_layers must be in 0\.\.2"):
        fine_tune(
            tiny_bert(),
            toy_text_batches,
            epochs=1,
            lr=1e-3,
            seed=0,
            progress=False,
            log_fn=None,
            frozen_layers=5,
        )


#: Parameter-name prefixes of the embedding side of each family, written out by hand (not read
#: from the adapters) so that the test checks the adapters' lists.
EMBEDDING_PREFIXES = {
    "bert": ("bert.embeddings.",),
    "roberta": ("roberta.embeddings.",),
    "distilbert": ("distilbert.embeddings.",),
    "electra": ("electra.embeddings.", "electra.embeddings_project."),
    "hf_vit": ("vit.embeddings.",),
    "timm_vit": ("patch_embed.", "cls_token", "reg_token", "pos_embed", "norm_pre."),
}
BLOCK_PREFIX = {
    "bert": "bert.encoder.layer.{}.",
    "roberta": "roberta.encoder.layer.{}.",
    "distilbert": "distilbert.transformer.layer.{}.",
    "electra": "electra.encoder.layer.{}.",
    "hf_vit": "vit.layers.{}.",
    "timm_vit": "blocks.{}.",
}
#: timm with register tokens and a pre-norm: the embedding-side parts that used to stay trainable
TINY_OVERRIDES = {
    "bert": {},
    "roberta": {},
    "distilbert": {},
    "electra": {},
    "hf_vit": {},
    "timm_vit": {"reg_tokens": 2, "pre_norm": True},
}


def _expected_frozen(family: str, names: list[str], k: int) -> set[str]:
    if k == 0:
        return set()
    prefixes = EMBEDDING_PREFIXES[family] + tuple(BLOCK_PREFIX[family].format(i) for i in range(k))
    return {n for n in names if n.startswith(prefixes)}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("k", [0, 1, NUM_LAYERS])
def test_freeze_layers_freezes_exactly_the_embeddings_and_first_k_blocks(family, k):
    model = tiny_model(family, **TINY_OVERRIDES[family])
    names = [n for n, _ in model.named_parameters()]
    if family == "timm_vit":
        assert {"reg_token", "norm_pre.weight"} <= set(names)
    freeze_layers(model, k)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == _expected_frozen(family, names, k)
    if k:
        assert any(n.startswith(EMBEDDING_PREFIXES[family]) for n in frozen)


@pytest.mark.parametrize("family", FAMILIES)
def test_training_with_a_frozen_trunk_leaves_it_unchanged(family):
    model = tiny_model(family, **TINY_OVERRIDES[family])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    def batches(epoch: int):
        for seed in range(2):
            batch = tiny_inputs(family, 6, seed=10 * epoch + seed)
            yield {**batch, "labels": torch.arange(6) % 3}

    fine_tune(
        model,
        batches,
        epochs=1,
        lr=1e-2,
        weight_decay=0.0,
        warmup_ratio=0.0,
        seed=0,
        progress=False,
        log_fn=None,
        frozen_layers=1,
    )
    after = dict(model.named_parameters())
    frozen = _expected_frozen(family, list(before), 1)
    assert frozen and all(torch.equal(before[n], after[n]) for n in frozen)
    later = [n for n in before if n.startswith(BLOCK_PREFIX[family].format(1))]
    assert any(not torch.equal(before[n], after[n]) for n in later)


def test_freeze_layers_rejects_bad_input():
    with pytest.raises(ValueError, match=r"frozen_layers must be in 0\.\.3"):
        freeze_layers(tiny_model("hf_vit"), 4)
    with pytest.raises(ValueError, match=r"indices \[7\]"):
        freeze_layers(tiny_model("timm_vit"), [0, 7])
    with pytest.raises(ValueError, match=r"bert.*hf_vit.*timm_vit"):
        freeze_layers(torch.nn.Linear(2, 2), 1)


def test_bad_arguments_and_batches():
    model = tiny_bert()
    with pytest.raises(ValueError, match="epochs"):
        fine_tune(model, toy_text_batches, epochs=0, lr=1e-3, log_fn=None)
    with pytest.raises(ValueError, match="warmup_ratio"):
        fine_tune(model, toy_text_batches, epochs=1, lr=1e-3, warmup_ratio=1.5, log_fn=None)
    with pytest.raises(ValueError, match="yielded no batches"):
        fine_tune(model, lambda e: [], epochs=1, lr=1e-3, progress=False, log_fn=None)
    with pytest.raises(ValueError, match="input_ids' or 'pixel_values"):
        model_logits(model, {"labels": torch.zeros(2)})


def test_logits_restores_mode_and_handles_unlabelled():
    model = tiny_bert().train()
    batches = [{k: v for k, v in b.items() if k != "labels"} for b in toy_text_batches(0)]
    logits = model_outputs(model, batches)
    assert logits.shape == (64, 2) and model.training
    a = model_outputs(model, batches)
    assert torch.equal(a, logits)  # eval mode: no dropout


# ---- training ----
def _labelled(seed: int = 1) -> dict[str, torch.Tensor]:
    return {**tiny_inputs("bert", 6, seed=seed), "labels": torch.tensor([0, 1, 2, 0, 1, 2])}


def _train(precision: str | None, steps: int = 1) -> tuple[torch.nn.Module, list, list]:
    """A tiny BERT fine-tuned ``steps`` steps; returns it, the loss curve, the dtypes of the
    first encoder layer's query projection seen during training."""
    model = tiny_model("bert")
    seen: list[torch.dtype] = []
    query = model.bert.encoder.layer[0].attention.self.query
    hook = query.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    batches = [_labelled(s) for s in range(1, steps + 1)]
    kwargs = {} if precision is None else {"device": "cpu", "precision": precision}
    report = fine_tune(
        model, lambda _e: batches, epochs=1, lr=1e-3, progress=False, log_fn=None, **kwargs
    )
    hook.remove()
    return model, report.epoch_losses, seen


def test_fine_tune_fp32_with_runtime_is_bit_identical_to_without():
    plain, plain_loss, plain_dtypes = _train(None, steps=2)
    fp32, fp32_loss, fp32_dtypes = _train("fp32", steps=2)
    assert plain_loss == fp32_loss and plain_dtypes == fp32_dtypes == [torch.float32] * 2
    for (name, a), b in zip(plain.state_dict().items(), fp32.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_fine_tune_one_step_in_reduced_precision_on_cpu(precision):
    before = tiny_model("bert")
    model, losses, dtypes = _train(precision)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    assert dtypes == [dtype]  # the forward ran under autocast
    assert len(losses) == 1 and math.isfinite(losses[0])
    # master weights stay float32 and the step moved them
    assert all(p.dtype == torch.float32 for p in model.parameters())
    changed = [
        not torch.equal(a, b) for a, b in zip(before.parameters(), model.parameters(), strict=True)
    ]
    assert any(changed)
    assert not torch.is_autocast_enabled("cpu")


def test_fine_tune_refuses_bad_runtime_before_training():
    model = tiny_model("bert")
    with pytest.raises(ValueError, match="precision: unknown value 'fp64'"):
        fine_tune(model, lambda _e: [_labelled()], precision="fp64", progress=False, log_fn=None)
    with pytest.raises(ValueError, match="device: unknown spec 'gpu'"):
        fine_tune(model, lambda _e: [_labelled()], device="gpu", progress=False, log_fn=None)


def _train_with(precision: str, dropout: str) -> tuple[torch.nn.Module, object]:
    model = tiny_model("bert")
    batches = [_labelled(s) for s in range(1, 3)]
    return model, train_one_epoch(model, batches, precision=precision, dropout=dropout)


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    pairs = zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    return all(torch.equal(x, y) for x, y in pairs)


def test_dropout_sampler_auto_keeps_fp32_on_nn_dropouts_draws_and_gaps_in_bf16():
    fp32_auto, report = _train_with("fp32", "auto")
    fp32_dense, _ = _train_with("fp32", "dense")
    assert report.dropout_sampler == "dense" and report.to_dict()["dropout_sampler"] == "dense"
    assert _same_weights(fp32_auto, fp32_dense)  # an fp32 fine-tune is unchanged, bit for bit
    bf16_auto, report = _train_with("bf16", "auto")
    bf16_gaps, _ = _train_with("bf16", "gaps")
    bf16_dense, _ = _train_with("bf16", "dense")
    assert report.dropout_sampler == "gaps"
    assert _same_weights(bf16_auto, bf16_gaps)  # reproducible from the seed
    assert not _same_weights(bf16_gaps, bf16_dense)  # other draws, so other weights
    with pytest.raises(ValueError, match="implementation must be one of"):
        _train_with("fp32", "fast")
