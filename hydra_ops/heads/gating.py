"""Per-head gates: multiply each attention head's context by a scalar before the output projection.

``gates[l][i] = 1`` leaves head ``i`` of layer ``l`` unchanged, ``0`` removes its contribution
exactly as physical pruning would (the output projection's bias is untouched). Gates may require
grad: that is how Taylor importance ``|dL/dxi|`` is computed.

Gates are shared by the whole batch (``[H_l]`` per layer) or per example (``[B, H_l]`` per layer,
row ``b`` scaling example ``b``): with per-example gates one backward pass of the summed
per-example losses gives every example's own gradient ``dL_b/dxi_{b,l,h}`` (examples do not
interact in an eval-mode forward).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from torch import Tensor, nn

from hydra_ops.adapters import get_adapter


def _as_layer_gates(gates: Tensor | Sequence[Tensor], heads_per_layer: list[int]) -> list[Tensor]:
    """One gate tensor per layer: all ``[H_l]`` (shared) or all ``[B, H_l]`` (per example)."""
    num_layers = len(heads_per_layer)
    if isinstance(gates, Tensor):
        if gates.dim() not in (2, 3) or gates.shape[-2] != num_layers:
            raise ValueError(
                f"gates must be [layers={num_layers}, heads], [batch, layers={num_layers}, heads] "
                f"or a list of per-layer tensors, got shape {tuple(gates.shape)}"
            )
        if any(gates.shape[-1] < n for n in heads_per_layer):
            raise ValueError(f"gates has {gates.shape[-1]} columns, layers have {heads_per_layer}")
        layer_gates = [gates[..., layer, : heads_per_layer[layer]] for layer in range(num_layers)]
    else:
        layer_gates = list(gates)
        if len(layer_gates) != num_layers:
            raise ValueError(f"gates lists {len(layer_gates)} layers, the model has {num_layers}")
    batch = layer_gates[0].shape[0] if layer_gates and layer_gates[0].dim() == 2 else None
    for layer, (g, n) in enumerate(zip(layer_gates, heads_per_layer, strict=True)):
        allowed = (n,) if batch is None else (batch, n)
        if tuple(g.shape) != allowed:
            raise ValueError(
                f"gates for layer {layer} must have shape {allowed} ([heads] shared by the batch "
                f"or [batch, heads] per example, the same kind in every layer), "
                f"got {tuple(g.shape)}"
            )
    return layer_gates


@contextmanager
def head_gates(model: nn.Module, gates: Tensor | Sequence[Tensor]) -> Iterator[None]:
    """Within the block, every forward of ``model`` applies ``gates``.

    Args:
        model: a supported model (see :func:`hydra_ops.adapters.get_adapter`).
        gates: shared by the batch: an ``[L, H]`` tensor (columns past a pruned layer's head count
            are ignored) or a list of ``[H_l]`` tensors, one per layer. Per example: a
            ``[B, L, H]`` tensor or a list of ``[B, H_l]`` tensors; every forward inside the block
            must then get a batch of exactly ``B`` examples (else ValueError).
    """
    adapter = get_adapter(model)
    heads = adapter.heads_per_layer()
    layer_gates = _as_layer_gates(gates, heads)
    dh = adapter.head_dim
    handles = []

    def make_hook(gate: Tensor):
        def hook(_module: nn.Module, args: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
            context = args[0]
            if gate.dim() == 1:
                scale = gate.to(context.dtype).repeat_interleave(dh)
                return (context * scale, *args[1:])
            if context.dim() < 2 or context.shape[0] != gate.shape[0]:
                raise ValueError(
                    f"gates are per example for a batch of {gate.shape[0]}, but the model ran on "
                    f"a batch of {context.shape[0] if context.dim() else 0}"
                )
            # [B, H * dh] broadcast over every middle (token) dimension of [B, ..., H * dh]
            scale = gate.to(context.dtype).repeat_interleave(dh, dim=1)
            scale = scale.reshape(scale.shape[0], *([1] * (context.dim() - 2)), scale.shape[1])
            return (context * scale, *args[1:])

        return hook

    try:
        for layer, gate in enumerate(layer_gates):
            handles.append(adapter.out_proj(layer).register_forward_pre_hook(make_hook(gate)))
        yield
    finally:
        for handle in handles:
            handle.remove()
