"""Per-head gates: multiply each attention head's context by a scalar before the output projection.

``gates[l][i] = 1`` leaves head ``i`` of layer ``l`` unchanged, ``0`` removes its contribution
exactly as physical pruning would (the output projection's bias is untouched). Gates may require
grad: that is how Taylor importance ``|dL/dxi|`` is computed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from .adapters import get_adapter
from .plans import HeadPlan


def _as_layer_gates(gates: Tensor | Sequence[Tensor], heads_per_layer: list[int]) -> list[Tensor]:
    num_layers = len(heads_per_layer)
    if isinstance(gates, Tensor):
        if gates.dim() != 2 or gates.shape[0] != num_layers:
            raise ValueError(
                f"gates must be [layers={num_layers}, heads] or a list of per-layer tensors, "
                f"got shape {tuple(gates.shape)}"
            )
        layer_gates = [gates[layer, : heads_per_layer[layer]] for layer in range(num_layers)]
        if any(gates.shape[1] < n for n in heads_per_layer):
            raise ValueError(f"gates has {gates.shape[1]} columns, layers have {heads_per_layer}")
    else:
        layer_gates = list(gates)
        if len(layer_gates) != num_layers:
            raise ValueError(f"gates lists {len(layer_gates)} layers, the model has {num_layers}")
    for layer, (g, n) in enumerate(zip(layer_gates, heads_per_layer, strict=True)):
        if g.shape != (n,):
            raise ValueError(
                f"gates for layer {layer} must have shape ({n},), got {tuple(g.shape)}"
            )
    return layer_gates


@contextmanager
def head_gates(model: nn.Module, gates: Tensor | Sequence[Tensor]) -> Iterator[None]:
    """Within the block, every forward of ``model`` applies ``gates``.

    Args:
        model: a supported model (see :func:`hydra_ops.adapters.get_adapter`).
        gates: ``[L, H]`` tensor (columns past a pruned layer's head count are ignored) or a list of
            ``[H_l]`` tensors, one per layer.
    """
    adapter = get_adapter(model)
    heads = adapter.heads_per_layer()
    layer_gates = _as_layer_gates(gates, heads)
    dh = adapter.head_dim
    handles = []

    def make_hook(gate: Tensor):
        def hook(_module: nn.Module, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
            context = args[0]
            scale = gate.to(context.dtype).repeat_interleave(dh)
            return (context * scale, *args[1:])

        return hook

    try:
        for layer, gate in enumerate(layer_gates):
            handles.append(adapter.out_proj(layer).register_forward_pre_hook(make_hook(gate)))
        yield
    finally:
        for handle in handles:
            handle.remove()


def plan_gates(plan: HeadPlan, heads_per_layer: Sequence[int]) -> list[Tensor]:
    """0/1 gates that keep exactly ``plan``'s heads: a list of ``[H_l]`` float tensors."""
    plan.validate_for(heads_per_layer)
    gates = []
    for layer, n in enumerate(heads_per_layer):
        g = torch.zeros(n)
        g[list(plan.heads(layer))] = 1.0
        gates.append(g)
    return gates
