"""LoRA-Ensemble and BatchEnsemble (hydra_ops.baselines) on tiny models of every family: each
trains, its members differ, batched and member-by-member LoRA give the same logits, the
BatchEnsemble layer is torch-uncertainty's BatchLinear numerically, and a saved ensemble comes
back exactly (and only on the base it was trained on)."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import FAMILIES, NUM_CLASSES, NUM_LAYERS, tiny_inputs, tiny_model

from hydra_ops.baselines.batch_ensemble import (
    BatchEnsemble,
    BatchEnsembleLinear,
    load_batch_ensemble,
    save_batch_ensemble,
)
from hydra_ops.baselines.batching import member_major_batches, repeat_batch
from hydra_ops.baselines.lora_ensemble import (
    LoRAEnsemble,
    attention_targets,
    classifier_name,
    load_lora_ensemble,
    save_lora_ensemble,
)
from hydra_ops.models.training import fine_tune, model_logits

M = 3


def labelled(family: str, batch: int = 6, seed: int = 1) -> dict[str, torch.Tensor]:
    inputs = tiny_inputs(family, batch, seed=seed)
    g = torch.Generator().manual_seed(seed)
    return {**inputs, "labels": torch.randint(0, NUM_CLASSES, (batch,), generator=g)}


def train(model: torch.nn.Module, batches_fn, steps_lr: float = 5e-2) -> None:
    fine_tune(model, batches_fn, epochs=1, lr=steps_lr, progress=False, log_fn=None)


def assert_members_differ(logits: torch.Tensor) -> None:
    """``[B, M, C]``: every pair of members gives different logits."""
    for i in range(logits.shape[1]):
        for j in range(i + 1, logits.shape[1]):
            assert (logits[:, i] - logits[:, j]).abs().max() > 1e-4, (i, j)


# ---- BatchEnsemble ----


def test_batch_ensemble_linear_is_torch_uncertainty_batch_linear():
    """The same parameters give the same outputs as torch-uncertainty's BatchLinear, on [M*B, in]
    and, flattened member-major, on the [M*B, T, in] a transformer passes."""
    from torch_uncertainty.layers import BatchLinear

    g = torch.Generator().manual_seed(0)
    ref = BatchLinear(5, 7, M)
    ours = BatchEnsembleLinear(5, 7, M)
    with torch.no_grad():
        for p in (ref.linear.weight, ref.r_group, ref.s_group, ref.bias):
            p.copy_(torch.randn(p.shape, generator=g))
        ours.linear.weight.copy_(ref.linear.weight)
        ours.r_group.copy_(ref.r_group)
        ours.s_group.copy_(ref.s_group)
        ours.bias.copy_(ref.bias)
    x = torch.randn(M * 4, 5, generator=g)
    torch.testing.assert_close(ours(x), ref(x), atol=1e-6, rtol=1e-6)
    tokens = torch.randn(M * 4, 9, 5, generator=g)
    torch.testing.assert_close(
        ours(tokens), ref(tokens.reshape(-1, 5)).reshape(M * 4, 9, 7), atol=1e-6, rtol=1e-6
    )
    with pytest.raises(ValueError, match="not member-major for 3 members"):
        ours(torch.randn(4, 5))


@pytest.mark.parametrize("family", FAMILIES)
def test_batch_ensemble_at_init_std_0_is_the_base_for_every_member(family):
    base = tiny_model(family)
    batch = tiny_inputs(family, 5)
    expected = model_logits(base, batch)
    ens = BatchEnsemble(copy.deepcopy(base), M, init_std=0.0).eval()
    out = ens(batch)
    assert out.shape == (5, M, NUM_CLASSES)
    for m in range(M):
        torch.testing.assert_close(out[:, m], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["bert", "timm_vit"])
def test_batch_ensemble_trains_only_fast_weights_and_its_members_differ(family):
    base = tiny_model(family)
    ens = BatchEnsemble(copy.deepcopy(base), M, init_std=0.1, seed=3)
    shared = {n: p.detach().clone() for n, p in ens.model.named_parameters() if not p.requires_grad}
    before = {k: v.clone() for k, v in ens.fast_weights().items()}
    trainable = {n for n, p in ens.model.named_parameters() if p.requires_grad}
    assert trainable and all(
        n.rsplit(".", 1)[1] in ("r_group", "s_group", "bias") for n in trainable
    )
    batches = [labelled(family, seed=s) for s in range(3)]
    train(ens.model, member_major_batches(lambda e: batches, M))
    after = ens.fast_weights()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    for n, p in ens.model.named_parameters():
        if n in shared:
            assert torch.equal(p, shared[n]), n  # the base's weights are shared and frozen
    assert_members_differ(ens.eval()(tiny_inputs(family, 5)))
    # parameters: the base's once, plus r, s and a bias per member and linear layer
    extra = sum((lin.in_features + 2 * lin.out_features) * M for lin in ens.layers().values())
    assert ens.num_parameters() == sum(p.numel() for p in base.parameters()) + extra - sum(
        lin.out_features for lin in ens.layers().values()
    )


def test_batch_ensemble_save_and_load_give_the_same_logits_on_its_base_only(tmp_path):
    base = tiny_model("bert")
    ens = BatchEnsemble(copy.deepcopy(base), M, init_std=0.2, seed=1).eval()
    save_batch_ensemble(ens, tmp_path, {"note": "x"})
    back = load_batch_ensemble(tmp_path, copy.deepcopy(base))
    batch = tiny_inputs("bert", 4)
    assert torch.equal(back(batch), ens(batch))
    with pytest.raises(ValueError, match="retrain it on this base") as info:
        load_batch_ensemble(tmp_path, tiny_model("bert", seed=7))
    assert len(str(info.value).splitlines()) == 1


# ---- LoRA-Ensemble ----


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_targets_are_the_attention_projections_and_the_classifier(family):
    model = tiny_model(family)
    targets = attention_targets(model)
    per_layer = 2 if family == "timm_vit" else 4  # timm fuses q, k, v into qkv
    assert len(targets) == NUM_LAYERS * per_layer
    assert all(("attn" in t or "attention" in t) and "intermediate" not in t for t in targets)
    heads = {"timm_vit": "head", "roberta": "classifier.out_proj", "electra": "classifier.out_proj"}
    assert classifier_name(model) == heads.get(family, "classifier")


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_ensemble_batched_equals_member_by_member(family):
    """The batched pass (peft's mixed-adapter batch over the stacked copies) and one pass per
    member give the same logits (1e-5), with members made to differ."""
    ens = LoRAEnsemble(tiny_model(family), M, rank=2, alpha=4.0, seed=0).eval()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in ens.adapter_state().values():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    batch = tiny_inputs(family, 5)
    batched, looped = ens.batched_logits(batch), ens.looped_logits(batch)
    assert batched.shape == looped.shape == (5, M, NUM_CLASSES)
    torch.testing.assert_close(batched, looped, atol=1e-5, rtol=1e-5)
    assert_members_differ(looped)
    ens.batched = False
    assert torch.equal(ens(batch), ens.looped_logits(batch))


@pytest.mark.parametrize("family", ["bert", "timm_vit"])
def test_lora_ensemble_trains_one_member_at_a_time_and_members_differ(family):
    base = tiny_model(family)
    ens = LoRAEnsemble(copy.deepcopy(base), M, rank=2, alpha=4.0, seed=0)
    batch = tiny_inputs(family, 5)
    start = ens.eval().looped_logits(batch)
    for m in range(M):  # B starts at 0 and each classifier as the base's: members are the base
        torch.testing.assert_close(start[:, m], model_logits(base, batch), atol=1e-5, rtol=1e-5)
    base_state = {n: p.detach().clone() for n, p in base.named_parameters()}
    for m in range(M):
        others = {i: [p.clone() for p in ens.member_parameters(i)] for i in range(M) if i != m}
        batches = [labelled(family, seed=10 * m + s) for s in range(3)]
        train(ens.train_member(m), lambda e, b=batches: b)
        for i, params in others.items():  # only member m moved
            now = ens.member_parameters(i)
            assert all(torch.equal(a, b) for a, b in zip(params, now, strict=True))
    for n, p in ens.model.named_parameters():
        original = n.replace("base_layer.", "").replace("original_module.", "")
        if original in base_state and "lora_" not in n and "modules_to_save" not in n:
            assert torch.equal(p, base_state[original]), n  # the base stays frozen
    assert_members_differ(ens.eval().looped_logits(batch))
    own = sum(p.numel() for m in range(M) for p in ens.member_parameters(m))
    head = sum(p.numel() for p in base.get_submodule(ens.classifier).parameters())
    assert ens.num_parameters() == sum(p.numel() for p in base.parameters()) - head + own


def test_lora_ensemble_save_and_load_give_the_same_logits_on_its_base_only(tmp_path):
    base = tiny_model("timm_vit")
    ens = LoRAEnsemble(copy.deepcopy(base), M, rank=2, alpha=4.0, seed=2).eval()
    with torch.no_grad():
        for p in ens.adapter_state().values():
            p.add_(0.1)
    save_lora_ensemble(ens, tmp_path)
    back = load_lora_ensemble(tmp_path, copy.deepcopy(base), batched=False)
    batch = tiny_inputs("timm_vit", 4)
    assert torch.equal(back.looped_logits(batch), ens.looped_logits(batch))
    with pytest.raises(ValueError, match="retrain it on this base") as info:
        load_lora_ensemble(tmp_path, tiny_model("timm_vit", seed=7))
    assert len(str(info.value).splitlines()) == 1


def test_repeat_batch_is_member_major():
    batch = {"input_ids": torch.arange(6).view(3, 2), "labels": torch.tensor([0, 1, 2]), "x": 1}
    out = repeat_batch(batch, 2)
    assert out["input_ids"].tolist() == [[0, 1], [2, 3], [4, 5]] * 2
    assert out["labels"].tolist() == [0, 1, 2, 0, 1, 2] and out["x"] == 1


def test_a_saved_state_that_does_not_fit_is_refused_in_one_line():
    """hydra_ops.baselines.config.copy_state_into: keys and shapes checked before anything is
    copied in; a fitting state is copied exactly."""
    from hydra_ops.baselines.config import copy_state_into

    own = {"a": torch.zeros(2), "b": torch.zeros(3)}
    with pytest.raises(ValueError, match=r"missing \['b'\], unexpected \['c'\]") as err:
        copy_state_into(own, {"a": torch.ones(2), "c": torch.ones(3)}, "adapters")
    assert "\n" not in str(err.value) and torch.equal(own["a"], torch.zeros(2))
    with pytest.raises(ValueError, match=r"adapters b: shape \(4,\), the model needs \(3,\)"):
        copy_state_into(own, {"a": torch.ones(2), "b": torch.ones(4)}, "adapters")
    assert torch.equal(own["a"], torch.zeros(2))  # nothing copied before the refusal
    copy_state_into(own, {"a": torch.ones(2), "b": torch.full((3,), 2.0)}, "adapters")
    assert torch.equal(own["b"], torch.full((3,), 2.0))
