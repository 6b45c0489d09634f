"""Inverted dropout drawn from a given generator, by one of two samplers of the same distribution.

``y = x * m / (1 - p)`` with ``m`` i.i.d. Bernoulli(1 - p), exactly what ``nn.Dropout`` computes
in train mode (the scale ``1 / (1 - p)`` rounded to ``x``'s dtype, as ``nn.Dropout`` rounds it).
Two implementations, chosen by ``implementation=``:

- ``dense``: one Bernoulli draw per element (``Tensor.bernoulli_``, ``nn.Dropout``'s sampler).
  On a CPU that is a serial Mersenne-Twister draw per element, which at the dropout rates of
  transformers can cost more than the bf16 matrix products around it (docs/benchmarks.md,
  "Cheaper dropout masks").
- ``gaps``: only the positions of the rarer outcome are drawn, as a Bernoulli process: the gaps
  between successive successes of Bernoulli(q) trials are i.i.d. Geometric(q) on {1, 2, ...}, so
  the cumulative sums of Geometric(q) draws are the successes' positions
  (:func:`bernoulli_positions`). At ``p = 0.1`` that is one draw per ten elements, then an index
  fill. Same distribution as ``dense``, different draws: the two give different masks from one
  generator state.
- ``auto``: ``gaps`` on a CPU, ``dense`` elsewhere (a GPU's ``bernoulli_`` is a parallel
  counter-based draw, and one kernel).

Training reaches the sampler through :class:`DropoutSampler`, a torch-function mode that reroutes
every training ``torch.nn.functional.dropout`` (so every ``nn.Dropout`` module) to
:func:`inverted_dropout`, and every ``scaled_dot_product_attention`` with ``dropout_p > 0`` (the
attention probabilities' dropout of Hugging Face BERT / ViT in training) to
:func:`sampled_attention`: the computation torch's math kernel does there (in float32, as it
does for reduced-precision inputs), with the probabilities' dropout drawn by the sampler.
:func:`training_sampler` is what a fine-tune uses under ``auto``: ``gaps`` only where a CPU
trains in reduced precision, whose weights differ from an fp32 fine-tune's anyway, so an fp32
fine-tune stays bit-identical to one with torch's own sampler.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

__all__ = [
    "DropoutImplementation",
    "DropoutSampler",
    "bernoulli_positions",
    "inverted_dropout",
    "resolve_implementation",
    "sampled_attention",
    "sampled_dropout",
    "training_sampler",
]

DropoutImplementation = Literal["auto", "dense", "gaps"]

#: A block of gaps holds the expected count plus ``SPARE_SDS`` standard deviations plus ``SPARE``.
SPARE_SDS: float = 6.0
SPARE: int = 16


def resolve_implementation(implementation: str, device: torch.device) -> str:
    """``dense`` or ``gaps`` for ``implementation`` on ``device`` (``auto``: ``gaps`` on a CPU);
    ValueError naming the choices for anything else."""
    if implementation not in get_args(DropoutImplementation):
        raise ValueError(
            f"implementation must be one of {list(get_args(DropoutImplementation))}, "
            f"got {implementation!r}"
        )
    if implementation == "auto":
        return "gaps" if device.type == "cpu" else "dense"
    return implementation


def bernoulli_positions(n: int, q: float, generator: torch.Generator | None = None) -> Tensor:
    """The indices of the successes among ``n`` i.i.d. Bernoulli(``q``) trials, drawn as the
    cumulative sums of Geometric(``q``) gaps.

    Args:
        n: trials, >= 0.
        q: success probability in (0, 1].
        generator: the draws' source (its device is where the result lives); None: the default
            CPU generator.

    Returns:
        int64 ``[K]``, strictly increasing, each in ``[0, n)``; ``K ~ Binomial(n, q)``. Gaps are
        drawn in blocks of the expected count plus :data:`SPARE_SDS` standard deviations, so one
        block almost always suffices; a block that ends before ``n`` is followed by another.
    """
    if not 0.0 < q <= 1.0:
        raise ValueError(f"q must be in (0, 1], got {q!r}")
    device = generator.device if generator is not None else torch.device("cpu")
    if q == 1.0:
        return torch.arange(n, device=device)
    blocks: list[Tensor] = []
    last = -1.0  # position of the latest success; the first success is at gap - 1
    while last < n - 1:
        expected = (n - 1 - last) * q
        size = int(expected + SPARE_SDS * math.sqrt(expected) + SPARE) or 1
        gaps = torch.empty(size, dtype=torch.float64, device=device)
        positions = gaps.geometric_(q, generator=generator).cumsum_(0).add_(last)
        inside = int(torch.searchsorted(positions, float(n)))
        blocks.append(positions[:inside])
        if inside < size:
            break
        last = float(positions[-1])
    if len(blocks) == 1:
        return blocks[0].to(torch.int64)
    return torch.cat(blocks or [torch.empty(0, dtype=torch.float64, device=device)]).to(torch.int64)


def inverted_dropout(
    x: Tensor,
    p: float,
    generators: torch.Generator | Sequence[torch.Generator] | None = None,
    implementation: DropoutImplementation = "auto",
) -> Tensor:
    """``x`` with each element zeroed with probability ``p`` and the rest scaled by
    ``1 / (1 - p)``, drawn from ``generators``.

    Args:
        x: the input, batch first.
        p: the drop probability in ``[0, 1)``.
        generators: one generator (or None: the default one) for all of ``x``, or a list of
            ``G`` generators: ``x``'s dim 0 is then ``G`` equal blocks (stacked MC Dropout
            passes) and block ``i`` is drawn from generator ``i`` alone, so a block's draws do
            not depend on what is stacked beside it.
        implementation: ``auto``, ``dense`` or ``gaps`` (module docstring).

    Shape:
        - x: ``[G * B, ...]``.
        - output: the shape and dtype of ``x``, a new tensor (``x`` is not modified).

    The kept elements equal ``nn.Dropout``'s in train mode to the bit; a dropped element is
    ``+0`` under ``gaps`` (``nn.Dropout`` gives ``x * 0``: ``-0`` for negative ``x``, NaN for
    infinite ``x``). ``p = 0`` (or an empty ``x``) returns ``x`` itself. ValueError (one line)
    for ``p`` outside ``[0, 1)``, an unknown ``implementation``, or a dim 0 that is not ``G``
    equal blocks.
    """
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p < 1.0:
        raise ValueError(f"p must be a float in [0, 1), got {p!r}")
    kind = resolve_implementation(implementation, x.device)
    gens = list(generators) if isinstance(generators, Sequence) else [generators]
    if not gens or x.shape[0] % len(gens):
        raise ValueError(
            f"dropout input of batch {x.shape[0]} is not {len(gens)} stacked blocks (one per "
            "generator; dim 0 must be the batch)"
        )
    if p == 0.0 or x.numel() == 0:
        return x
    keep = 1.0 - p
    if kind == "dense":
        blocks = x.chunk(len(gens), dim=0)
        masks = [
            torch.empty_like(b).bernoulli_(keep, generator=g)
            for b, g in zip(blocks, gens, strict=True)
        ]
        mask = masks[0] if len(masks) == 1 else torch.cat(masks)
        return x * mask.div_(keep)
    scale = torch.ones((), dtype=x.dtype, device=x.device).div_(keep)
    flat = x.reshape(-1)
    per_block = flat.numel() // len(gens)
    rare = min(p, keep)  # draw the positions of the rarer outcome
    positions = torch.cat(
        [
            bernoulli_positions(per_block, rare, g).to(x.device) + i * per_block
            for i, g in enumerate(gens)
        ]
    )
    if p <= 0.5:
        return (flat * scale).index_fill_(0, positions, 0).view(x.shape)
    kept = torch.zeros_like(flat).index_put_((positions,), flat[positions] * scale)
    return kept.view(x.shape)


def sampled_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    generator: torch.Generator | None = None,
    implementation: DropoutImplementation = "gaps",
) -> Tensor:
    """``scaled_dot_product_attention`` as torch's math kernel computes it, with the attention
    probabilities' dropout drawn by :func:`inverted_dropout`.

    Shape:
        - query: ``[..., Hq, L, E]``; key: ``[..., H, S, E]``; value: ``[..., H, S, Ev]``
          (``Hq`` a multiple of ``H`` when ``enable_gqa``).
        - attn_mask: broadcastable to ``[..., Hq, L, S]``; bool (True attends) or additive.
        - output: ``[..., Hq, L, Ev]`` in ``query``'s dtype.

    Computed in float32 with autocast off whatever the inputs' dtype (torch's math kernel upcasts
    bf16 / fp16 inputs the same way); a query row that attends to nothing gets zeros, as torch's
    safe softmax gives.
    """
    dtype = query.dtype
    with torch.autocast(query.device.type, enabled=False):
        q, k, v = query.float(), key.float(), value.float()
        if enable_gqa:
            k = k.repeat_interleave(q.size(-3) // k.size(-3), dim=-3)
            v = v.repeat_interleave(q.size(-3) // v.size(-3), dim=-3)
        factor = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
        scores = (q @ k.transpose(-2, -1)) * factor
        masked = is_causal or attn_mask is not None
        if is_causal:
            causal = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                scores = scores.masked_fill(~attn_mask, float("-inf"))
            else:
                scores = scores + attn_mask.float()
        weights = torch.softmax(scores, dim=-1)
        if masked:
            weights = weights.nan_to_num(0.0)
        weights = inverted_dropout(weights, dropout_p, generator, implementation)
        return (weights @ v).to(dtype)


def training_sampler(device: torch.device, precision: str) -> str:
    """The sampler a fine-tune uses under ``auto``: ``gaps`` where a CPU trains in ``bf16`` or
    ``fp16``, ``dense`` otherwise (fp32 fine-tunes draw ``nn.Dropout``'s own masks)."""
    return "gaps" if device.type == "cpu" and precision != "fp32" else "dense"


class DropoutSampler(TorchFunctionMode):
    """Within the mode, ``torch.nn.functional.dropout(x, p, training=True)`` with ``p > 0`` (and
    not in place) is :func:`inverted_dropout` with ``implementation``, drawn from ``generator``
    (None: the default generator of ``x``'s device, as ``nn.Dropout`` draws), and
    ``scaled_dot_product_attention`` with ``dropout_p > 0`` is :func:`sampled_attention`.
    Gradients flow as through torch's own: ``dx = dy * mask / (1 - p)``. Every other call runs
    unchanged."""

    def __init__(
        self,
        implementation: DropoutImplementation = "gaps",
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        resolve_implementation(implementation, torch.device("cpu"))  # a bad name fails here
        self.implementation = implementation
        self.generator = generator

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
            bound = dict(zip(names, args, strict=False)) | kwargs
            if bound.get("dropout_p", 0.0) > 0.0 and not bound["query"].is_nested:
                return sampled_attention(
                    **bound, generator=self.generator, implementation=self.implementation
                )
        if func is F.dropout:
            bound = dict(zip(("input", "p", "training", "inplace"), args, strict=False))
            bound |= kwargs
            p, training = float(bound.get("p", 0.5)), bool(bound.get("training", True))
            if training and 0.0 < p < 1.0 and not bound.get("inplace", False):
                return inverted_dropout(bound["input"], p, self.generator, self.implementation)
        return func(*args, **kwargs)


def sampled_dropout(
    implementation: DropoutImplementation, device: torch.device | None = None
) -> contextlib.AbstractContextManager:
    """A block in which training dropout on ``device`` (None: a CPU) draws by ``implementation``:
    :class:`DropoutSampler`, or nothing at all where that is ``dense`` (torch's own sampler, with
    no per-call dispatch)."""
    kind = resolve_implementation(implementation, device or torch.device("cpu"))
    return contextlib.nullcontext() if kind == "dense" else DropoutSampler(kind)
