"""Member-major batches: the M copies of one batch stacked along the batch dimension.

Rows ``m * B : (m + 1) * B`` of a member-major batch are member ``m``'s copy of the ``B`` inputs
(torch-uncertainty's ``repeat(x, "b ... -> (m b) ...")`` layout). Logits computed on it come back
as ``[M * B, C]`` and :func:`member_logits` turns them into the ``[B, M, C]`` of every ensemble in
this project.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

Batch = Mapping[str, Any]


def repeat_batch(batch: Batch, num_members: int) -> dict[str, Any]:
    """Every tensor of ``batch`` repeated ``num_members`` times along dim 0, member-major.

    Shape: a ``[B, ...]`` tensor becomes ``[M * B, ...]`` (``labels`` too, so a loss over the
    repeated batch is the mean of the members' losses); non-tensors are kept as they are.
    """
    if num_members < 1:
        raise ValueError(f"num_members must be >= 1, got {num_members}")
    return {
        k: v.repeat(num_members, *([1] * (v.ndim - 1))) if isinstance(v, Tensor) else v
        for k, v in batch.items()
    }


def member_logits(logits: Tensor, num_members: int) -> Tensor:
    """``[M * B, C]`` logits of a member-major batch as ``[B, M, C]``."""
    if logits.ndim != 2 or logits.shape[0] % num_members:
        raise ValueError(
            f"expected member-major logits [M * B, C] with M = {num_members}, got "
            f"{tuple(logits.shape)}"
        )
    return logits.view(num_members, -1, logits.shape[-1]).transpose(0, 1)


def member_major_batches(
    batches_fn: Callable[[int], Iterable[Batch]], num_members: int
) -> Callable[[int], Iterator[dict[str, Any]]]:
    """``epoch -> batches`` with every batch of ``batches_fn(epoch)`` repeated member-major: what
    a BatchEnsemble trains on (each member sees every example, in the same order)."""

    def fn(epoch: int) -> Iterator[dict[str, Any]]:
        for batch in batches_fn(epoch):
            yield repeat_batch(batch, num_members)

    return fn


def count_parameters(tensors: Iterable[torch.nn.Parameter]) -> int:
    """Elements over ``tensors``, each counted once (shared tensors are not counted twice)."""
    seen: dict[int, int] = {}
    for t in tensors:
        seen[id(t)] = t.numel()
    return sum(seen.values())
