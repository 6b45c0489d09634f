"""Prefix replay for the circuit search: record blocks' outputs once, then return them, not rerun.

While layer ``l`` is searched, the gates of layers ``< l`` do not change, so neither do the outputs
of blocks ``0..l-1``: :func:`recording` captures them on the layer's reference run and
:func:`replaying` makes the head trials reuse them (docs/scoring.md, "Prefix replay").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from torch import nn


@contextmanager
def recording(blocks: Sequence[nn.Module]) -> Iterator[list[list[Any]]]:
    """Record every output of each block in ``blocks``, in call order (one list per block)."""
    records: list[list[Any]] = [[] for _ in blocks]
    handles = [
        block.register_forward_hook(lambda _m, _a, out, rec=rec: rec.append(out))
        for block, rec in zip(blocks, records, strict=True)
    ]
    try:
        yield records
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def replaying(blocks: Sequence[nn.Module], records: Sequence[Sequence[Any]]) -> Iterator[None]:
    """Within the block, each of ``blocks`` skips its computation and returns its recorded outputs.

    The ``n``-th call of block ``j`` returns ``records[j][n % len(records[j])]``: valid while
    every model run inside the block feeds the same batches in the same order as the recorded
    run(s), and the blocks' inputs and gates are unchanged (the circuit search only varies the gates
    of later layers). Raises RuntimeError if a block was called a number of times that is not a
    multiple of what was recorded (the batch order changed).
    """
    calls = [0] * len(blocks)

    def replay(j: int) -> Callable[..., Any]:
        def forward(*_args: Any, **_kwargs: Any) -> Any:
            out = records[j][calls[j] % len(records[j])]
            calls[j] += 1
            return out

        return forward

    if any(not rec for rec in records):
        raise RuntimeError("a block recorded no output; cannot replay it")
    shadowed = [vars(block).get("forward") for block in blocks]
    for j, block in enumerate(blocks):
        block.forward = replay(j)  # an instance attribute shadows the class's forward
    try:
        yield
    finally:
        for block, previous in zip(blocks, shadowed, strict=True):
            if previous is None:
                del block.forward
            else:
                block.forward = previous
    for j, count in enumerate(calls):
        if count % len(records[j]):
            raise RuntimeError(
                f"replayed block {j} was called {count} times, not a multiple of the "
                f"{len(records[j])} recorded calls: the batches changed during the search"
            )
