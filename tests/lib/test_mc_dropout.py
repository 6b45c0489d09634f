"""hydra_ops.models.mc_dropout: only nn.Dropout modules sample, seeded passes, rate override and
fallback; passes stacked along the batch get the masks they get alone."""

from __future__ import annotations

import pytest
import torch
from tiny_models import NUM_CLASSES, tiny_inputs, tiny_model
from torch import nn

from hydra_ops.models.inference import logits as eval_logits
from hydra_ops.models.mc_dropout import (
    DEFAULT_RATE,
    dropout_setting,
    mc_dropout,
    mc_dropout_logits,
    pass_generators,
    pass_masks,
    passes_per_forward_for,
)


class WithBatchNorm(nn.Module):
    """A toy classifier with a BatchNorm (must not update) and one Dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 8)
        self.norm = nn.BatchNorm1d(8)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(8, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(self.norm(self.linear(x))))


def toy_batch(n: int = 5) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(n, 6, generator=torch.Generator().manual_seed(3))}


def test_only_dropout_modules_train_inside_and_modes_and_rates_are_restored():
    model = tiny_model("bert").train()  # a model in train mode: restored to train mode
    model.bert.encoder.layer[0].output.dropout.p = 0.3
    before = {n: (m.training, getattr(m, "p", None)) for n, m in model.named_modules()}
    with mc_dropout(model, rate=0.25) as setting:
        for name, module in model.named_modules():
            assert module.training == isinstance(module, nn.Dropout), name
            if isinstance(module, nn.Dropout):
                assert module.p == 0.25
    assert setting.source == "rate" and set(setting.rates) == {0.25}
    assert len(setting.names) == sum(isinstance(m, nn.Dropout) for m in model.modules())
    after = {n: (m.training, getattr(m, "p", None)) for n, m in model.named_modules()}
    assert after == before


def test_batch_norm_statistics_do_not_move():
    model = WithBatchNorm().eval()
    stats = (model.norm.running_mean.clone(), model.norm.running_var.clone())
    out = mc_dropout_logits(model, toy_batch(), samples=4, seed=0)
    assert out.shape == (5, 4, NUM_CLASSES)
    assert torch.equal(model.norm.running_mean, stats[0])
    assert torch.equal(model.norm.running_var, stats[1])
    assert int(model.norm.num_batches_tracked) == 0
    assert not model.training and not model.drop.training


@pytest.mark.parametrize("family", ["bert", "hf_vit"])
def test_shapes_seeded_determinism_and_samples_differ(family):
    model = tiny_model(family)
    batches = [tiny_inputs(family, 4, seed=1), tiny_inputs(family, 3, seed=2)]
    state = torch.random.get_rng_state()
    a = mc_dropout_logits(model, batches, samples=3, seed=7)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's RNG is untouched
    b = mc_dropout_logits(model, batches, samples=3, seed=7)
    c = mc_dropout_logits(model, batches, samples=3, seed=8)
    assert a.shape == (7, 3, NUM_CLASSES) and a.dtype == torch.float32
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    for s in range(1, 3):
        assert not torch.allclose(a[:, 0], a[:, s])
    # outside the context the model is deterministic again: eval logits, unchanged
    assert not model.training
    assert torch.equal(eval_logits(model, batches), eval_logits(model, batches))
    # a single batch (a dict) is accepted and equals the first batch of a call over many
    one = mc_dropout_logits(model, batches[0], samples=3, seed=7)
    assert torch.equal(one, a[:4])


def test_rate_override_changes_the_spread():
    model = tiny_model("bert")
    batch = tiny_inputs("bert", 6)
    low = mc_dropout_logits(model, batch, samples=6, seed=0, rate=0.01)
    high = mc_dropout_logits(model, batch, samples=6, seed=0, rate=0.6)
    assert low.std(dim=1).mean() < high.std(dim=1).mean()
    assert dropout_setting(model).source == "model"  # BertConfig's own 0.1 rates


def test_model_with_zero_rates_gets_the_fallback_rate():
    model = tiny_model("timm_vit")  # timm's defaults: every nn.Dropout at p = 0
    assert all(m.p == 0 for m in model.modules() if isinstance(m, nn.Dropout))
    setting = dropout_setting(model)
    assert setting.source == "fallback" and set(setting.rates) == {DEFAULT_RATE}
    assert "fallback" in setting.describe()
    out = mc_dropout_logits(model, tiny_inputs("timm_vit", 3), samples=2, seed=0)
    assert out.shape == (3, 2, NUM_CLASSES) and not torch.allclose(out[:, 0], out[:, 1])
    assert all(m.p == 0 for m in model.modules() if isinstance(m, nn.Dropout))  # restored


def test_model_rates_keep_zero_modules_at_zero():
    model = WithBatchNorm()
    model.extra = nn.Dropout(0.0)
    setting = dropout_setting(model)
    assert setting.source == "model" and setting.rates == (0.5, 0.0) and setting.active == 1


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"samples": 0}, "samples"),
        ({"samples": 2.0}, "samples"),
        ({"samples": True}, "samples"),
        ({"samples": 2, "seed": -1}, "seed"),
        ({"samples": 2, "rate": 0.0}, "rate"),
        ({"samples": 2, "rate": 1.0}, "rate"),
        ({"samples": 2, "precision": "fp64"}, "precision"),
        ({"samples": 2, "device": "tpu"}, "device"),
    ],
)
def test_bad_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        mc_dropout_logits(tiny_model("bert"), tiny_inputs("bert", 2), **kwargs)


def test_model_without_dropout_and_empty_batches_are_refused():
    plain = nn.Sequential(nn.Linear(6, NUM_CLASSES))
    with pytest.raises(ValueError, match="model"):
        mc_dropout_logits(plain, toy_batch(), samples=2)
    with pytest.raises(ValueError, match="batches"):
        mc_dropout_logits(WithBatchNorm(), [], samples=2)


class MaskProbe(nn.Module):
    """``logits = dropout(ones) @ W``-free: the output *is* the dropout mask of a ones input
    (``[B, C]``; C columns of ``1 / (1 - p)`` or 0), so masks are compared directly."""

    def __init__(self, width: int = NUM_CLASSES, p: float = 0.3) -> None:
        super().__init__()
        self.width = width
        self.drop = nn.Dropout(p)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.drop(torch.ones(pixel_values.shape[0], self.width))


def batch(n: int) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.zeros(n, 2)}


@pytest.mark.parametrize("per_forward", [2, 3, 5])
def test_each_pass_gets_the_same_masks_however_passes_are_batched(per_forward):
    model = MaskProbe(width=40)
    looped = mc_dropout_logits(model, [batch(4), batch(3)], 5, seed=11, passes_per_forward=1)
    stacked = mc_dropout_logits(
        model, [batch(4), batch(3)], 5, seed=11, passes_per_forward=per_forward
    )
    assert looped.shape == (7, 5, 40)
    assert torch.equal(looped, stacked)  # bit-identical masks
    values = looped.unique()
    assert values.numel() == 2 and values[0] == 0 and values[1] == pytest.approx(1 / 0.7)
    # passes differ from one another, and a different seed gives different masks
    assert not torch.equal(looped[:, 0], looped[:, 1])
    other = mc_dropout_logits(model, [batch(4), batch(3)], 5, seed=12)
    assert not torch.equal(looped, other)


@pytest.mark.parametrize("family", ["bert", "hf_vit"])
def test_batched_equals_looped_on_real_models_up_to_rounding(family):
    model = tiny_model(family)
    batches = [tiny_inputs(family, 4, seed=1), tiny_inputs(family, 3, seed=2)]
    looped = mc_dropout_logits(model, batches, 6, seed=3, passes_per_forward=1)
    stacked = mc_dropout_logits(model, batches, 6, seed=3)  # all 6 passes in one forward
    uneven = mc_dropout_logits(model, batches, 6, seed=3, passes_per_forward=4)  # 4 + 2
    assert stacked.shape == (7, 6, NUM_CLASSES)
    torch.testing.assert_close(stacked, looped, rtol=0, atol=1e-5)
    torch.testing.assert_close(uneven, looped, rtol=0, atol=1e-5)
    # the passes really sample (not the eval model repeated)
    assert (looped.std(dim=1) > 1e-4).any()


def test_masks_match_nn_dropout_in_train_mode_in_distribution():
    """Keep rate and scale of the hook masks vs ``nn.Dropout(p).train()`` (today's sampler) on
    200k elements: both keep fractions within 4 binomial standard errors of 1 - p, one value."""
    p, n = 0.3, 200_000
    ones = torch.ones(1, n)
    model = MaskProbe(width=n, p=p)
    ours = mc_dropout_logits(model, batch(1), 1, seed=0)[0, 0]
    torch.manual_seed(0)
    theirs = nn.Dropout(p).train()(ones)[0]
    se = (p * (1 - p) / n) ** 0.5
    for out in (ours, theirs):
        kept = out != 0
        assert abs(kept.float().mean().item() - (1 - p)) < 4 * se
        assert torch.allclose(out[kept], torch.full_like(out[kept], 1 / (1 - p)))
    # per-pass statistics across passes: each pass's keep fraction is near 1 - p
    passes = mc_dropout_logits(MaskProbe(width=20_000, p=p), batch(2), 8, seed=5)
    fractions = (passes != 0).float().mean(dim=(0, 2))
    assert fractions.shape == (8,)
    assert (fractions - (1 - p)).abs().max() < 4 * (p * (1 - p) / 40_000) ** 0.5


def test_hooks_leave_modes_and_the_global_rng_alone():
    model = tiny_model("bert").train()
    state = torch.random.get_rng_state()
    before = {n: m.training for n, m in model.named_modules()}
    mc_dropout_logits(model, tiny_inputs("bert", 2), 3, seed=0)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert {n: m.training for n, m in model.named_modules()} == before
    assert not any(m._forward_hooks for m in model.modules())


def test_a_dropout_input_that_is_not_stacked_passes_is_refused():
    class Odd(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.drop = nn.Dropout(0.5)

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return self.drop(torch.ones(3, NUM_CLASSES))  # batch 3 whatever the input

    model = Odd()
    gens = pass_generators(2, 0, torch.device("cpu"))
    with pass_masks(model, dropout_setting(model), gens), pytest.raises(ValueError, match="dim 0"):
        model(torch.zeros(4, 1))
    with pytest.raises(ValueError, match="passes_per_forward"):
        mc_dropout_logits(MaskProbe(), batch(2), 3, passes_per_forward=0)


def test_default_stacking_fits_the_token_budget():
    text = {"input_ids": torch.zeros(64, 64, dtype=torch.long)}
    assert passes_per_forward_for(8, text) == 8  # the default: one forward for all 8 passes
    assert passes_per_forward_for(8, {"input_ids": torch.zeros(64, 128, dtype=torch.long)}) == 4
    assert passes_per_forward_for(8, {"input_ids": torch.zeros(64, 4096, dtype=torch.long)}) == 1
    assert passes_per_forward_for(8, {"pixel_values": torch.zeros(256, 3, 8, 8)}) == 2
    assert passes_per_forward_for(3, {"pixel_values": torch.zeros(2, 3, 8, 8)}) == 3
