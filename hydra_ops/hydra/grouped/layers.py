"""The per-member layers every attention implementation shares: a dense layer, a LayerNorm and
an MLP, each either shared by all members or one per member, over member-major ``[M, ..., D]``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hydra_ops.adapters.base import ACTIVATIONS

#: In-place twins of ``ACTIVATIONS`` (the same kernels: bit-identical results).
_INPLACE_ACTIVATIONS = {
    "gelu": lambda x: torch.ops.aten.gelu_(x),
    "gelu_tanh": lambda x: torch.ops.aten.gelu_(x, approximate="tanh"),
    "relu": torch.relu_,
    "silu": lambda x: F.silu(x, inplace=True),
    "tanh": torch.tanh_,
}


def _activate(name: str, hidden: Tensor) -> Tensor:
    """``ACTIVATIONS[name](hidden)``, in place when autograd does not need ``hidden`` (inference):
    the MLP's hidden activations are its largest tensors (``[M, B*T, 4D]``), so this saves
    allocating (and page-faulting in) a second one per layer. ``hidden`` must be a fresh tensor.
    """
    if hidden.requires_grad or name not in _INPLACE_ACTIVATIONS:
        return ACTIVATIONS[name](hidden)
    return _INPLACE_ACTIVATIONS[name](hidden)


class GroupedLinear(nn.Module):
    """A dense layer that is either shared by all members or one per member.

    Shared: ``weight [out, in]``, ``bias [out]``. Per member: ``weight [M, out, in]``,
    ``bias [M, out]``. ``forward(x [M, ..., in]) -> [M, ..., out]`` (member-major); per member it
    is one batched matmul over ``[M, N, in]``, a view of ``x`` when ``x`` is contiguous past its
    member dim (or, like a pooled ``x[:, :, 0]``, only strided along one flattened dim).
    """

    def __init__(
        self, in_features: int, out_features: int, num_members: int | None, bias: bool = True
    ) -> None:
        super().__init__()
        self.per_member = num_members is not None
        shape = (
            (num_members, out_features, in_features)
            if self.per_member
            else (out_features, in_features)
        )
        self.weight = nn.Parameter(torch.zeros(shape))
        self.bias = nn.Parameter(torch.zeros(shape[:-1])) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        if not self.per_member:
            return F.linear(x, self.weight, self.bias)
        m, inner = x.shape[0], x.shape[1:-1]
        streams = x.reshape(m, -1, x.shape[-1])
        if self.bias is None:
            out = torch.bmm(streams, self.weight.transpose(1, 2))
        else:
            out = torch.baddbmm(self.bias.unsqueeze(1), streams, self.weight.transpose(1, 2))
        return out.view(m, *inner, -1)


class GroupedLayerNorm(nn.Module):
    """LayerNorm over the last dim, shared (``weight [D]``) or per member (``weight [M, D]``).

    ``forward(x [M, ..., D])``; per-member affine parameters broadcast over batch and tokens (one
    ``addcmul`` pass after the unscaled norm).
    """

    def __init__(self, dim: int, eps: float, num_members: int | None, bias: bool = True) -> None:
        super().__init__()
        self.per_member = num_members is not None
        self.eps = float(eps)
        self.dim = int(dim)
        shape = (num_members, dim) if self.per_member else (dim,)
        self.weight = nn.Parameter(torch.ones(shape))
        self.bias = nn.Parameter(torch.zeros(shape)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        if not self.per_member:
            return F.layer_norm(x, (self.dim,), self.weight, self.bias, self.eps)
        normed = F.layer_norm(x, (self.dim,), None, None, self.eps)
        view = (self.weight.shape[0],) + (1,) * (x.dim() - 2) + (self.dim,)
        if self.bias is None:
            return normed * self.weight.view(view)
        return torch.addcmul(self.bias.view(view), normed, self.weight.view(view))


class GroupedMLP(nn.Module):
    """``fc2(act(fc1(x)))`` over ``[M, ..., D]``; each dense layer shared (``None``) or per member
    (``M``)."""

    def __init__(
        self,
        dim: int,
        hidden: int,
        activation: str,
        fc1_members: int | None,
        fc2_members: int | None,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}")
        self.activation = activation
        self.fc1 = GroupedLinear(dim, hidden, fc1_members, bias)
        self.fc2 = GroupedLinear(hidden, dim, fc2_members, bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(_activate(self.activation, self.fc1(x)))
