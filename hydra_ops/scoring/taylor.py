"""``taylor``: Michel et al. (2019) head importance, per-example ``|dL_i/dxi|`` of head gates."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from hydra_ops.adapters import get_adapter
from hydra_ops.heads.gating import head_gates
from hydra_ops.heads.scores import HeadScores

from .base import HeadImportance
from .inputs import Batch, batch_size, eval_mode, materialise, model_device, uniform_heads


def taylor_scores(
    model: nn.Module,
    train_batches: Iterable[Batch],
    *,
    normalize: bool = True,
    max_batches: int | None = None,
    progress: bool = False,
) -> HeadScores:
    """Michel et al. (2019) head importance: mean over examples of ``|dL_i/dxi_{l,h}|``.

    ``xi`` is a per-example gate of ones, ``[B, L, H]``, on every head's context
    (``hydra_ops.heads.gating``) and ``L_i`` the cross-entropy of example ``i`` on its label. One
    backward pass of ``sum_i L_i`` gives each example's own gradient ``dL_i/dxi_{i,l,h}`` (the
    examples do not interact in eval mode); the absolute value is taken per example, so opposite
    signs of different examples never cancel, and the mean runs over all examples of all batches.
    With ``normalize`` each layer's row is divided by its L2 norm (Michel et al., section 4.2), so
    every row has unit norm. Only gradients w.r.t. the gates are computed; parameter ``.grad`` is
    left untouched.
    """
    adapter = get_adapter(model)
    num_layers, num_heads = uniform_heads(adapter)
    device = model_device(model)
    batches = materialise(
        train_batches, "train_batches", device, need_labels=True, max_batches=max_batches
    )
    dtype = adapter.out_proj(0).weight.dtype
    total = torch.zeros(num_layers, num_heads, dtype=torch.float64)
    num_examples = 0
    with eval_mode(model):
        for batch in tqdm(batches, desc="taylor", disable=not progress):
            size = batch_size(batch)
            gates = torch.ones(
                size, num_layers, num_heads, device=device, dtype=dtype, requires_grad=True
            )
            with torch.enable_grad(), head_gates(model, gates):
                logits = adapter.logits(batch)
                loss = F.cross_entropy(logits.float(), batch["labels"].long(), reduction="sum")
                (grad,) = torch.autograd.grad(loss, gates)
            total += grad.detach().abs().sum(dim=0).to("cpu", torch.float64)
            num_examples += size
    scores = total / num_examples
    if normalize:
        norms = scores.norm(dim=1, keepdim=True)
        scores = torch.where(norms > 0, scores / norms.clamp_min(1e-300), scores)
    return HeadScores(
        scores.float(),
        "taylor",
        meta={
            "normalize": normalize,
            "num_batches": len(batches),
            "num_examples": num_examples,
            "loss": "cross_entropy",
            "abs": "per_example",
        },
    )


@dataclass(frozen=True)
class TaylorImportance(HeadImportance):
    """``taylor`` as a criterion: ``TaylorImportance(normalize=True)(model, train_batches=...)``.

    Options as :func:`taylor_scores` (``progress`` defaults to on here, as in ``score_heads``);
    data: ``train_batches`` with ``labels`` (training data only).
    """

    name = "taylor"

    normalize: bool = True
    max_batches: int | None = None
    progress: bool = True

    def __call__(
        self, model: nn.Module, *, train_batches: Iterable[Batch] | None = None
    ) -> HeadScores:
        return taylor_scores(model, train_batches, **self.options())
