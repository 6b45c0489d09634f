"""MC Dropout: only nn.Dropout modules sample, seeded passes, rate override and fallback."""

from __future__ import annotations

import pytest
import torch
from tiny_models import NUM_CLASSES, tiny_inputs, tiny_model
from torch import nn

from hydra_ops.models.inference import logits as eval_logits
from hydra_ops.models.mc_dropout import DEFAULT_RATE, dropout_setting, mc_dropout, mc_dropout_logits


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
