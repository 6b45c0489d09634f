"""hydra_ops.models.diversity_loss: the anchored negative-correlation term of a fine-tune."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_models import tiny_inputs, tiny_model, train_one_epoch

from hydra_ops.models.diversity_loss import anchored_ncl_penalty, anchored_ncl_term


# ----- the anchored NCL objective ---------------------------------------------------------------
def test_ncl_penalty_value_bounds_and_gradient_sign():
    anchor = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    same = anchor.log().clone().requires_grad_(True)
    assert anchored_ncl_penalty(same, anchor).item() == pytest.approx(0.0, abs=1e-7)
    logits = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, -1.0]], requires_grad=True)
    p = logits.softmax(-1)
    want = -((p - anchor) ** 2).sum(-1).mean()
    pen = anchored_ncl_penalty(logits, anchor)
    assert pen.item() == pytest.approx(want.item(), abs=1e-7)
    assert -2.0 <= pen.item() <= 0.0
    # d penalty / d p = -(2 / B)(p - q): chain it through the softmax Jacobian
    (grad,) = torch.autograd.grad(pen, logits)
    dp = -(2 / 2) * (p - anchor).detach()
    jac = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    torch.testing.assert_close(grad, (jac.detach() @ dp[:, :, None]).squeeze(-1))
    # a gradient-descent step on the penalty moves the prediction away from the anchor
    with torch.no_grad():
        stepped = logits - 0.5 * grad
    before = ((logits.softmax(-1) - anchor) ** 2).sum()
    after = ((stepped.softmax(-1) - anchor) ** 2).sum()
    assert after > before


def _labelled(seed: int) -> dict[str, torch.Tensor]:
    batch = tiny_inputs("bert", 6, seed=seed)
    batch["labels"] = torch.randint(3, (6,), generator=torch.Generator().manual_seed(seed))
    return batch


def test_ncl_objective_changes_the_member_weights_and_strength_zero_does_not():
    base = tiny_model("bert")
    batches = [_labelled(s) for s in (1, 2)]

    def train(loss_term):
        model = copy.deepcopy(base)
        train_one_epoch(model, batches, loss_term=loss_term)
        return model.state_dict()

    plain = train(None)
    ncl = train(anchored_ncl_term(copy.deepcopy(base), 0.5))
    zero = train(anchored_ncl_term(copy.deepcopy(base), 0.0))
    assert any(not torch.equal(plain[k], ncl[k]) for k in plain)
    assert all(torch.equal(plain[k], zero[k]) for k in plain)
    with pytest.raises(ValueError, match="strength must be a number >= 0"):
        anchored_ncl_term(base, -1.0)


def test_ncl_anchor_runs_in_the_fine_tunes_precision():
    base = tiny_model("bert")
    seen: list[torch.dtype] = []
    anchor = copy.deepcopy(base)
    query = anchor.bert.encoder.layer[0].attention.self.query
    query.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    batch = _labelled(1)
    logits = base(**{k: v for k, v in batch.items() if k != "labels"}).logits
    for precision, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        value = anchored_ncl_term(anchor, 0.5, precision)(logits.float(), batch)
        assert seen[-1] == dtype and value.dtype == torch.float32
        assert -1.0 <= value.item() <= 0.0  # strength 0.5 times a penalty in [-2, 0]
