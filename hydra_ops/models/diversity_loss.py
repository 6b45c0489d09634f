"""A diversity-promoting term for a member's fine-tune: negative correlation learning against an
anchor's predictions.

Negative correlation learning (NCL; Liu & Yao 1999, "Ensemble learning via negative
correlation", Neural Networks 12(10)) trains member ``i`` on ``e_i + lambda * p_i`` with the
penalty ``p_i = (f_i - fbar) * sum_{j != i} (f_j - fbar)``; since the deviations from the ensemble
mean ``fbar`` sum to zero, ``p_i = -(f_i - fbar)^2`` (Brown, Wyatt & Tino 2005, "Managing
Diversity in Regression Ensembles", JMLR 6): each member is rewarded for its distance from the
ensemble's prediction. Here the members are fine-tuned as separate jobs, so ``fbar`` is not
available while one trains; the already fine-tuned base model, which every member starts from and
which the members' mean stays close to, stands in for it (the *anchor*). With ``f`` the member's
class probabilities ``p = softmax(logits)`` and ``q`` the anchor's on the same batch::

    loss = cross_entropy(logits, y) + strength * penalty
    penalty = -(1/B) sum_b ||p_b - q_b||^2          in [-2, 0]

so ``d penalty / d p_b = -(2/B) (p_b - q_b)``: gradient descent moves each member's probabilities
away from the anchor's, and the bounded penalty cannot outweigh the cross-entropy without limit.
``strength = 0`` is plain cross-entropy. Unlike joint NCL, members pushed from one anchor are
not forced apart from each other; their different head sets, seeds (and with
``members.finetune.data`` their data) choose the directions.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

Batch = dict[str, Tensor]

__all__ = ["anchored_ncl_penalty", "anchored_ncl_term"]


def anchored_ncl_penalty(logits: Tensor, anchor_probs: Tensor) -> Tensor:
    """``-(1/B) sum_b ||softmax(logits_b) - anchor_probs_b||^2`` (module docstring).

    Shape: logits [B, C] (differentiable), anchor_probs [B, C] (rows sum to 1) -> scalar in
    [-2, 0], float32 or wider.
    """
    if logits.ndim != 2 or anchor_probs.shape != logits.shape:
        raise ValueError(
            f"logits and anchor_probs must both be [B, C], got {tuple(logits.shape)} and "
            f"{tuple(anchor_probs.shape)}"
        )
    probs = logits.float().softmax(dim=-1)
    return -(probs - anchor_probs.to(probs.dtype)).square().sum(dim=-1).mean()


def anchored_ncl_term(
    anchor: nn.Module, strength: float, precision: str = "fp32"
) -> Callable[[Tensor, Batch], Tensor]:
    """The loss term ``strength * anchored_ncl_penalty(logits, softmax(anchor(batch)))`` for
    :func:`hydra_ops.models.training.fine_tune`'s ``loss_term``.

    ``anchor`` runs in eval mode without grad (no dropout, no RNG drawn), on the batch's device
    (moved there on first use), in ``precision`` (the fine-tune's: ``fp32``, or ``bf16`` /
    ``fp16`` autocast); its parameters are frozen. Shape: (logits [B, C], batch) -> scalar.
    """
    if not (isinstance(strength, int | float) and strength >= 0):
        raise ValueError(f"strength must be a number >= 0, got {strength!r}")
    from hydra_ops.models.runtime import autocast
    from hydra_ops.models.training import model_logits

    anchor.eval().requires_grad_(False)

    def term(logits: Tensor, batch: Batch) -> Tensor:
        with torch.no_grad(), autocast(logits.device, precision):
            anchor.to(logits.device)
            anchor_logits = model_logits(anchor, batch)
        anchor_probs = anchor_logits.float().softmax(dim=-1)
        return float(strength) * anchored_ncl_penalty(logits, anchor_probs)

    return term
