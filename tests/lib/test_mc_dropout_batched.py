"""Batched MC Dropout: passes stacked along the batch give each pass the masks it gets alone, and
the masks are ``nn.Dropout``'s in train mode in distribution."""

from __future__ import annotations

import pytest
import torch
from tiny_models import NUM_CLASSES, tiny_inputs, tiny_model
from torch import nn

from hydra_ops.models.mc_dropout import (
    dropout_setting,
    mc_dropout_logits,
    pass_generators,
    pass_masks,
    passes_per_forward_for,
)


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
