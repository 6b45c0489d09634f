"""hydra_ops.models.inference.logits: one call for a classifier and a Hydra model, on any device
and precision."""

from __future__ import annotations

import pytest
import torch
from tiny_models import NUM_CLASSES, make_members, member_plans, positional, tiny_inputs, tiny_model

from hydra_ops.hydra.merge import merge_members
from hydra_ops.models.inference import logits
from hydra_ops.models.training import model_logits


@pytest.mark.parametrize("family", ["bert", "timm_vit"])
def test_logits_of_a_classifier_and_of_a_hydra_model(family):
    batches = [tiny_inputs(family, 3, seed=1), tiny_inputs(family, 2, seed=2)]
    model = tiny_model(family).train()
    single = logits(model, batches)
    assert single.shape == (5, 3) and single.dtype == torch.float32
    with torch.no_grad():
        direct = torch.cat([model_logits(model.eval(), b) for b in batches])
    model.train()
    assert torch.equal(single, direct)
    assert model.training  # mode restored
    hydra = merge_members(make_members(family, member_plans(2), fine_tuned=True))
    members = logits(hydra, batches)
    assert members.shape == (5, 2, 3)
    with torch.no_grad():
        direct = torch.cat([hydra(*positional(b)) for b in batches])
    assert torch.equal(members, direct.float())
    with pytest.raises(ValueError, match="batches is empty"):
        logits(hydra, [])


# ---- training ----
def _labelled(seed: int = 1) -> dict[str, torch.Tensor]:
    return {**tiny_inputs("bert", 6, seed=seed), "labels": torch.tensor([0, 1, 2, 0, 1, 2])}


# ---- inference ----
@pytest.mark.parametrize("kind", ["classifier", "hydra"])
def test_logits_fp32_identical_and_bf16_close(kind):
    from hydra_ops.hydra.merge import merge_members

    if kind == "classifier":
        model = tiny_model("bert")
    else:
        model = merge_members(make_members("bert", member_plans(2), fine_tuned=True)).eval()
    batches = [tiny_inputs("bert", 5, seed=s) for s in (1, 2)]
    plain = logits(model, batches)
    fp32 = logits(model, batches, device="cpu", precision="fp32")
    bf16 = logits(model, batches, device="cpu", precision="bf16")
    assert torch.equal(plain, fp32)
    assert bf16.dtype == torch.float32 and bf16.device.type == "cpu"
    assert bf16.shape == plain.shape and not torch.equal(bf16, plain)
    torch.testing.assert_close(bf16, plain, atol=5e-2, rtol=5e-2)
    assert not model.training


def test_logits_of_labelled_batches_fp32_identical_and_bf16_close():
    model = tiny_model("bert")
    batches = [_labelled(1), _labelled(2)]
    plain = logits(model, batches)
    fp32 = logits(model, batches, device="cpu", precision="fp32")
    bf16 = logits(model, batches, device="cpu", precision="bf16")
    assert torch.equal(plain, fp32)
    assert plain.shape == (12, NUM_CLASSES)
    torch.testing.assert_close(bf16, plain, atol=5e-2, rtol=5e-2)


def test_logits_refuses_bad_runtime():
    model = tiny_model("bert")
    with pytest.raises(ValueError, match="device: unknown spec"):
        logits(model, [tiny_inputs("bert", 2)], device="tpu")
    with pytest.raises(ValueError, match="precision: unknown value"):
        logits(model, [tiny_inputs("bert", 2)], precision="int8")
