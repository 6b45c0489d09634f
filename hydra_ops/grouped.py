"""Grouped (block-diagonal) layers over M member streams.

Every tensor of streams is laid out member-major, ``[M, B, T, D]``: member, batch, token, feature
(contiguous). Member ``m``'s stream only ever meets member ``m``'s weights; nothing here mixes
members. Member-major is what a batched matmul over members reads and writes directly:
``[M, B, T, D]`` is ``[M, B*T, D]`` without a copy, so per-member projections, MLPs and norms go
from one to the next without materialising a transposed copy of the activations.

Attention implementations (``ATTENTION_IMPLEMENTATIONS``, selected by name), all exact:

* ``padded_bmm``: every member's heads are zero-padded to ``H = max_m h_m`` heads; q/k/v of all
  members is ONE batched matmul ``[M, B*T, D] x [M, D, 3*H*dh]``, attention runs on strided views
  ``[M*B, H, T, dh]`` of its output and the output projection is one more batched matmul that reads
  the attention output in place. A padded head has zero q/k/v weights and bias, so its context is
  exactly 0, and its output-projection columns are 0: padding changes nothing but wastes
  ``(M*H - sum h_m)`` heads of work when counts differ. No layout copy at all.
* ``member_gemm``: per-member weights, no padding; each projection is M plain GEMMs on the
  contiguous slices ``x[m]``; one stack of the M outputs per layer.
* ``block_diagonal``: the streams are concatenated along features (``[B, T, M*D]``: one permuting
  copy in, one out) and the heads of all members are packed without padding (``sum h_m`` heads);
  q/k/v is ONE dense matmul with a block-diagonal ``[3*sum(h_m)*dh, M*D]`` weight and the output
  projection one with a block-diagonal ``[M*D, sum(h_m)*dh]`` weight. No padding, but the zero
  blocks are multiplied.

All read and write the same per-member :class:`~hydra_ops.adapters.AttentionWeights`, so a model
can switch implementation (``to_implementation``) without changing what it computes.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .adapters.base import ACTIVATIONS, AttentionWeights


def _zeros_like_bias(weight: Tensor) -> Tensor:
    return torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device)


def _bias_or_zeros(bias: Tensor | None, weight: Tensor) -> Tensor:
    return _zeros_like_bias(weight) if bias is None else bias


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


class GroupedAttention(nn.Module, abc.ABC):
    """Self-attention of M members over ``[M, B, T, D]`` streams, one grouped op per projection.

    ``forward(x [M, B, T, D], key_padding_mask [B, T] bool or None) -> [M, B, T, D]`` (True in the
    mask = a real token; the same mask for every member). The output includes the output
    projection's bias and is contiguous.
    """

    name: ClassVar[str]

    def __init__(self, head_counts: Sequence[int], head_dim: int, hidden_size: int) -> None:
        super().__init__()
        if not head_counts or min(head_counts) < 1:
            raise ValueError(f"head_counts must be >= 1 for every member, got {list(head_counts)}")
        self.head_counts = [int(h) for h in head_counts]
        self.head_dim = int(head_dim)
        self.hidden_size = int(hidden_size)

    @property
    def num_members(self) -> int:
        return len(self.head_counts)

    @classmethod
    def from_members(cls, members: Sequence[AttentionWeights]) -> GroupedAttention:
        first = members[0]
        hidden = first.q_weight.shape[1]
        for m, w in enumerate(members):
            if w.head_dim != first.head_dim or w.q_weight.shape[1] != hidden:
                raise ValueError(
                    f"member {m} attention has head_dim={w.head_dim}, "
                    f"hidden={w.q_weight.shape[1]}; "
                    f"member 0 has head_dim={first.head_dim}, hidden={hidden}"
                )
        module = cls([w.num_heads for w in members], first.head_dim, hidden)
        module.to(dtype=first.q_weight.dtype, device=first.q_weight.device)
        module.load_members(members)
        return module

    @abc.abstractmethod
    def load_members(self, members: Sequence[AttentionWeights]) -> None:
        """Copy per-member weights in (head counts must match ``head_counts``)."""

    @abc.abstractmethod
    def member_weights(self) -> list[AttentionWeights]:
        """Per-member weights (copies), inverse of :meth:`load_members`."""

    def num_effective_parameters(self) -> int:
        """Parameters the members really hold (padding and zero blocks not counted)."""
        d, dh = self.hidden_size, self.head_dim
        per_head = 3 * dh * (d + 1) + dh * d
        return sum(h * per_head for h in self.head_counts) + self.num_members * d

    def to_implementation(self, name: str) -> GroupedAttention:
        """The same attention in implementation ``name`` (self if already so)."""
        impl = attention_implementation(name)
        if isinstance(self, impl):
            return self
        return impl.from_members(self.member_weights())

    @staticmethod
    def _attend(
        q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, members: int = 1
    ) -> Tensor:
        """q, k, v ``[members*B, heads, T, dh]`` (member-major batch; any strides with a unit last
        stride) -> context ``[members*B, heads, T, dh]``.

        On CPU, ``scaled_dot_product_attention`` reads strided q/k/v as they are and returns a
        context whose memory is ``[members*B, T, heads, dh]``, so ``context.transpose(1, 2)`` is
        contiguous and flattening its heads is a view.
        """
        mask = None
        if key_padding_mask is not None:
            b, t = key_padding_mask.shape
            mask = key_padding_mask[:, None, None, :]
            if members > 1:  # [B, T] -> [M*B, 1, 1, T]: tiny (bools), the kernel needs 4-D
                mask = mask.expand(members, b, 1, 1, t).reshape(members * b, 1, 1, t)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


class PaddedBmmAttention(GroupedAttention):
    """Heads zero-padded to ``H = max(head_counts)``; q/k/v and output are batched matmuls."""

    name = "padded_bmm"

    def __init__(self, head_counts: Sequence[int], head_dim: int, hidden_size: int) -> None:
        super().__init__(head_counts, head_dim, hidden_size)
        m, h, dh, d = self.num_members, max(self.head_counts), self.head_dim, self.hidden_size
        self.max_heads = h
        # qkv_weight[m] rows: [q heads 0..H-1 | k heads | v heads], each head dh rows.
        self.qkv_weight = nn.Parameter(torch.zeros(m, 3 * h * dh, d))
        self.qkv_bias = nn.Parameter(torch.zeros(m, 3 * h * dh))
        self.out_weight = nn.Parameter(torch.zeros(m, d, h * dh))
        self.out_bias = nn.Parameter(torch.zeros(m, d))

    def load_members(self, members: Sequence[AttentionWeights]) -> None:
        h, dh = self.max_heads, self.head_dim
        with torch.no_grad():
            self.qkv_weight.zero_()
            self.qkv_bias.zero_()
            self.out_weight.zero_()
            for m, w in enumerate(members):
                n = w.num_heads * dh
                if w.num_heads != self.head_counts[m]:
                    raise ValueError(
                        f"member {m} has {w.num_heads} heads, expected {self.head_counts[m]}"
                    )
                for part, (weight, bias) in enumerate(
                    ((w.q_weight, w.q_bias), (w.k_weight, w.k_bias), (w.v_weight, w.v_bias))
                ):
                    start = part * h * dh
                    self.qkv_weight[m, start : start + n] = weight
                    self.qkv_bias[m, start : start + n] = _bias_or_zeros(bias, weight)
                self.out_weight[m, :, :n] = w.o_weight
                self.out_bias[m] = _bias_or_zeros(w.o_bias, w.o_weight)

    def member_weights(self) -> list[AttentionWeights]:
        h, dh = self.max_heads, self.head_dim
        result = []
        for m, count in enumerate(self.head_counts):
            n = count * dh
            parts = [
                (
                    self.qkv_weight[m, p * h * dh : p * h * dh + n].detach().clone(),
                    self.qkv_bias[m, p * h * dh : p * h * dh + n].detach().clone(),
                )
                for p in range(3)
            ]
            result.append(
                AttentionWeights(
                    q_weight=parts[0][0],
                    q_bias=parts[0][1],
                    k_weight=parts[1][0],
                    k_bias=parts[1][1],
                    v_weight=parts[2][0],
                    v_bias=parts[2][1],
                    o_weight=self.out_weight[m, :, :n].detach().clone(),
                    o_bias=self.out_bias[m].detach().clone(),
                    num_heads=count,
                    head_dim=dh,
                )
            )
        return result

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        m, b, t, d = x.shape
        h, dh = self.max_heads, self.head_dim
        streams = x.reshape(m, b * t, d)  # a view (also of the expanded trunk output)
        qkv = torch.baddbmm(self.qkv_bias.unsqueeze(1), streams, self.qkv_weight.transpose(1, 2))
        # [M, B*T, 3*H*dh] is [M*B, T, 3, H, dh]: q, k, v are strided [M*B, H, T, dh] views
        q, k, v = qkv.view(m * b, t, 3, h, dh).permute(2, 0, 3, 1, 4).unbind(0)
        context = self._attend(q, k, v, key_padding_mask, m)
        context = context.transpose(1, 2).reshape(m, b * t, h * dh)
        out = torch.baddbmm(self.out_bias.unsqueeze(1), context, self.out_weight.transpose(1, 2))
        return out.view(m, b, t, d)


class BlockDiagonalAttention(GroupedAttention):
    """Packed heads (no padding); q/k/v and output are dense matmuls with block-diagonal weights."""

    name = "block_diagonal"

    def __init__(self, head_counts: Sequence[int], head_dim: int, hidden_size: int) -> None:
        super().__init__(head_counts, head_dim, hidden_size)
        m, dh, d = self.num_members, self.head_dim, self.hidden_size
        self.total_heads = sum(self.head_counts)
        n = self.total_heads * dh
        # qkv_weight rows: [q of all packed heads | k | v]; head offsets follow member order.
        self.qkv_weight = nn.Parameter(torch.zeros(3 * n, m * d))
        self.qkv_bias = nn.Parameter(torch.zeros(3 * n))
        self.out_weight = nn.Parameter(torch.zeros(m * d, n))
        self.out_bias = nn.Parameter(torch.zeros(m * d))

    def _offsets(self) -> list[int]:
        offsets = [0]
        for count in self.head_counts:
            offsets.append(offsets[-1] + count * self.head_dim)
        return offsets

    def load_members(self, members: Sequence[AttentionWeights]) -> None:
        d, n = self.hidden_size, self.total_heads * self.head_dim
        offsets = self._offsets()
        with torch.no_grad():
            self.qkv_weight.zero_()
            self.qkv_bias.zero_()
            self.out_weight.zero_()
            for m, w in enumerate(members):
                if w.num_heads != self.head_counts[m]:
                    raise ValueError(
                        f"member {m} has {w.num_heads} heads, expected {self.head_counts[m]}"
                    )
                lo, hi = offsets[m], offsets[m + 1]
                cols = slice(m * d, (m + 1) * d)
                for part, (weight, bias) in enumerate(
                    ((w.q_weight, w.q_bias), (w.k_weight, w.k_bias), (w.v_weight, w.v_bias))
                ):
                    self.qkv_weight[part * n + lo : part * n + hi, cols] = weight
                    self.qkv_bias[part * n + lo : part * n + hi] = _bias_or_zeros(bias, weight)
                self.out_weight[cols, lo:hi] = w.o_weight
                self.out_bias[cols] = _bias_or_zeros(w.o_bias, w.o_weight)

    def member_weights(self) -> list[AttentionWeights]:
        d, n, dh = self.hidden_size, self.total_heads * self.head_dim, self.head_dim
        offsets = self._offsets()
        result = []
        for m, count in enumerate(self.head_counts):
            lo, hi = offsets[m], offsets[m + 1]
            cols = slice(m * d, (m + 1) * d)
            parts = [
                (
                    self.qkv_weight[p * n + lo : p * n + hi, cols].detach().clone(),
                    self.qkv_bias[p * n + lo : p * n + hi].detach().clone(),
                )
                for p in range(3)
            ]
            result.append(
                AttentionWeights(
                    q_weight=parts[0][0],
                    q_bias=parts[0][1],
                    k_weight=parts[1][0],
                    k_bias=parts[1][1],
                    v_weight=parts[2][0],
                    v_bias=parts[2][1],
                    o_weight=self.out_weight[cols, lo:hi].detach().clone(),
                    o_bias=self.out_bias[cols].detach().clone(),
                    num_heads=count,
                    head_dim=dh,
                )
            )
        return result

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        m, b, t, d = x.shape
        heads, dh = self.total_heads, self.head_dim
        streams = x.permute(1, 2, 0, 3).reshape(b, t, m * d)  # the copy in
        qkv = F.linear(streams, self.qkv_weight, self.qkv_bias)
        q, k, v = qkv.view(b, t, 3, heads, dh).permute(2, 0, 3, 1, 4).unbind(0)
        context = self._attend(q, k, v, key_padding_mask)
        context = context.transpose(1, 2).reshape(b, t, heads * dh)
        out = F.linear(context, self.out_weight, self.out_bias)
        return out.view(b, t, m, d).permute(2, 0, 1, 3).contiguous()  # the copy out


ATTENTION_IMPLEMENTATIONS: dict[str, type[GroupedAttention]] = {
    PaddedBmmAttention.name: PaddedBmmAttention,
    BlockDiagonalAttention.name: BlockDiagonalAttention,
}


def attention_implementation(name: str) -> type[GroupedAttention]:
    if name not in ATTENTION_IMPLEMENTATIONS:
        raise ValueError(
            f"attention must be one of {sorted(ATTENTION_IMPLEMENTATIONS)}, got {name!r}"
        )
    return ATTENTION_IMPLEMENTATIONS[name]


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


class MemberGemmAttention(GroupedAttention):
    """Per-member weights with no padding; each projection is M plain GEMMs (``F.linear``).

    On small-core CPUs M separate GEMMs can beat one ``bmm`` over ``[M, B*T, D]`` (see
    docs/benchmarks.md). Member ``m`` holds ``qkv_weight_{m} [3*h_m*dh, D]`` (rows: q heads,
    then k, then v), ``qkv_bias_{m}``, ``out_weight_{m} [D, h_m*dh]`` and ``out_bias_{m} [D]``.
    Exactly the same computation as the other implementations; attention is one
    ``scaled_dot_product_attention`` per member.
    """

    name = "member_gemm"

    def __init__(self, head_counts: Sequence[int], head_dim: int, hidden_size: int) -> None:
        super().__init__(head_counts, head_dim, hidden_size)
        d, dh = self.hidden_size, self.head_dim
        # Plain attributes (not ParameterList) so parameter counting sees them on this module.
        for m, h in enumerate(self.head_counts):
            self.register_parameter(f"qkv_weight_{m}", nn.Parameter(torch.zeros(3 * h * dh, d)))
            self.register_parameter(f"qkv_bias_{m}", nn.Parameter(torch.zeros(3 * h * dh)))
            self.register_parameter(f"out_weight_{m}", nn.Parameter(torch.zeros(d, h * dh)))
            self.register_parameter(f"out_bias_{m}", nn.Parameter(torch.zeros(d)))

    def _member(self, m: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(qkv_weight, qkv_bias, out_weight, out_bias)`` of member ``m``."""
        return (
            getattr(self, f"qkv_weight_{m}"),
            getattr(self, f"qkv_bias_{m}"),
            getattr(self, f"out_weight_{m}"),
            getattr(self, f"out_bias_{m}"),
        )

    def load_members(self, members: Sequence[AttentionWeights]) -> None:
        with torch.no_grad():
            for m, w in enumerate(members):
                if w.num_heads != self.head_counts[m]:
                    raise ValueError(
                        f"member {m} has {w.num_heads} heads, expected {self.head_counts[m]}"
                    )
                qkv_weight, qkv_bias, out_weight, out_bias = self._member(m)
                qkv_weight.copy_(torch.cat([w.q_weight, w.k_weight, w.v_weight]))
                qkv_bias.copy_(
                    torch.cat(
                        [
                            _bias_or_zeros(w.q_bias, w.q_weight),
                            _bias_or_zeros(w.k_bias, w.k_weight),
                            _bias_or_zeros(w.v_bias, w.v_weight),
                        ]
                    )
                )
                out_weight.copy_(w.o_weight)
                out_bias.copy_(_bias_or_zeros(w.o_bias, w.o_weight))

    def member_weights(self) -> list[AttentionWeights]:
        result = []
        for m, count in enumerate(self.head_counts):
            n = count * self.head_dim
            qkv, bias, out_weight, out_bias = (p.detach() for p in self._member(m))
            result.append(
                AttentionWeights(
                    q_weight=qkv[:n].clone(),
                    q_bias=bias[:n].clone(),
                    k_weight=qkv[n : 2 * n].clone(),
                    k_bias=bias[n : 2 * n].clone(),
                    v_weight=qkv[2 * n :].clone(),
                    v_bias=bias[2 * n :].clone(),
                    o_weight=out_weight.clone(),
                    o_bias=out_bias.clone(),
                    num_heads=count,
                    head_dim=self.head_dim,
                )
            )
        return result

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        _, b, t, _ = x.shape
        dh = self.head_dim
        outs = []
        for member, h in enumerate(self.head_counts):
            qkv_weight, qkv_bias, out_weight, out_bias = self._member(member)
            qkv = F.linear(x[member], qkv_weight, qkv_bias)
            q, k, v = qkv.view(b, t, 3, h, dh).permute(2, 0, 3, 1, 4).unbind(0)
            context = self._attend(q, k, v, key_padding_mask).transpose(1, 2).reshape(b, t, h * dh)
            outs.append(F.linear(context, out_weight, out_bias))
        return torch.stack(outs)


ATTENTION_IMPLEMENTATIONS[MemberGemmAttention.name] = MemberGemmAttention


class MemberGemmMLP(nn.Module):
    """A per-member MLP run as M plain GEMM pairs (alternative to :class:`GroupedMLP`'s ``bmm``).

    Built from a :class:`GroupedMLP` (``MemberGemmMLP.from_grouped``); ``forward(x [M, B, T, D])``
    computes exactly what that module computes. Shared (non-per-member) layers stay one GEMM over
    all streams. Not wired into the merge: the benchmark swaps it in to measure it.
    """

    def __init__(self, grouped: GroupedMLP) -> None:
        super().__init__()
        self.activation = grouped.activation
        self.fc1 = grouped.fc1
        self.fc2 = grouped.fc2

    @classmethod
    def from_grouped(cls, grouped: GroupedMLP) -> MemberGemmMLP:
        return cls(grouped)

    @staticmethod
    def _apply(layer: GroupedLinear, x: Tensor) -> Tensor:
        if not layer.per_member:
            return F.linear(x, layer.weight, layer.bias)
        outs = [
            F.linear(x[m], layer.weight[m], None if layer.bias is None else layer.bias[m])
            for m in range(x.shape[0])
        ]
        return torch.stack(outs)

    def forward(self, x: Tensor) -> Tensor:
        return self._apply(self.fc2, _activate(self.activation, self._apply(self.fc1, x)))
