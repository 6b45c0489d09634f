"""MC Dropout (Gal & Ghahramani, 2016): one model, dropout kept on at inference, S passes.

The ``S`` stochastic forward passes of one input are treated as an S-member ensemble: their
logits ``[B, S, C]`` go wherever member logits go (``hydra_ops.uq.calibration``,
``hydra_ops.uq.uncertainty``, ``hydra_ops.uq.ood_criteria``).

- :func:`mc_dropout` switches on *only* the model's ``nn.Dropout`` modules (subclasses included);
  every other module stays in eval mode (no batch-norm statistics move, no other train-time
  behaviour). Modules' modes and dropout rates are restored on exit. Attention-probability dropout
  that a fused attention kernel applies only when its *parent* attention module is training
  (Hugging Face BERT/ViT, timm's fused attention) therefore stays off: what is sampled is the
  dropout the model calls as an ``nn.Dropout`` module (embeddings, residual branches, MLP,
  classifier).
- Rates: ``rate`` given: every dropout module runs at ``rate``. ``rate=None``: the model's own
  rates when at least one is ``> 0`` (modules at 0 stay at 0); when all are 0 (the from-scratch
  timm ViT), every module runs at :data:`DEFAULT_RATE`. :class:`DropoutSetting` says which.
- Batched passes: :func:`mc_dropout_logits` stacks the S passes of a batch along the batch
  dimension and runs them as one forward (``passes_per_forward``; by default as many as fit
  :data:`MAX_STACKED_TOKENS`: the ratio to one forward per pass is measured by
  ``benchmarks/stage_precision.py``, docs/benchmarks.md). The masks come from forward hooks
  (:func:`pass_masks`) that draw pass ``s``'s rows from pass ``s``'s own generator, so a
  pass's masks are the same however the passes are batched, and the dropout is
  ``nn.Dropout``'s in train mode in distribution (Bernoulli(1 - p) keep mask, scaled by
  1 / (1 - p)), drawn by :func:`hydra_ops.models.inverted_dropout.inverted_dropout`
  (``implementation=``: on a CPU by default only the dropped positions are drawn, which is
  several times cheaper than ``nn.Dropout``'s per-element draw).
- Determinism: the per-pass generators (:func:`pass_generators`) restart from ``seed`` on every
  call: the same call gives bit-identical logits, and the global random state is not touched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from hydra_ops.models.inverted_dropout import (
    DropoutImplementation,
    inverted_dropout,
    resolve_implementation,
)

__all__ = [
    "DEFAULT_RATE",
    "DropoutSetting",
    "dropout_setting",
    "mc_dropout",
    "mc_dropout_logits",
    "pass_generators",
    "pass_masks",
    "passes_per_forward_for",
]

DEFAULT_RATE: float = 0.1
"""The rate every ``nn.Dropout`` runs at when ``rate=None`` and the model's own rates are all 0."""

Batch = Mapping[str, Tensor]


@dataclass(frozen=True)
class DropoutSetting:
    """The dropout rates :func:`mc_dropout` samples with.

    ``rates``: one per ``nn.Dropout`` module, in ``model.named_modules()`` order; ``names``: those
    modules' qualified names. ``source``: ``rate`` (the caller's rate, everywhere), ``model`` (the
    model's own rates) or ``fallback`` (the model's rates were all 0: :data:`DEFAULT_RATE`).
    """

    names: tuple[str, ...]
    rates: tuple[float, ...]
    source: Literal["rate", "model", "fallback"]

    @property
    def active(self) -> int:
        """How many dropout modules run with a rate > 0."""
        return sum(r > 0 for r in self.rates)

    def describe(self) -> str:
        """One line for a log: how many modules, which rates, and why."""
        distinct = ", ".join(f"{r:g}" for r in sorted(set(self.rates)))
        why = {
            "rate": "the configured rate",
            "model": "the model's own rates",
            "fallback": f"the model's rates are all 0, so the fallback {DEFAULT_RATE:g}",
        }[self.source]
        return (
            f"MC dropout: {self.active} of {len(self.rates)} nn.Dropout modules on, rate(s) "
            f"{distinct} ({why})"
        )


def _check_rate(rate: float | None) -> float | None:
    if rate is None:
        return None
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0.0 < rate < 1.0:
        raise ValueError(f"rate must be None or a float in (0, 1), got {rate!r}")
    return float(rate)


def dropout_setting(model: nn.Module, rate: float | None = None) -> DropoutSetting:
    """The rates :func:`mc_dropout` would use on ``model`` (nothing is changed).

    ValueError naming ``rate`` when it is not None or in ``(0, 1)``, naming ``model`` when it has
    no ``nn.Dropout`` module.
    """
    rate = _check_rate(rate)
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    found = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Dropout)]
    if not found:
        raise ValueError(
            f"model ({type(model).__name__}) has no nn.Dropout module: MC dropout has nothing "
            "to sample"
        )
    names = tuple(n for n, _ in found)
    own = tuple(float(m.p) for _, m in found)
    if rate is not None:
        return DropoutSetting(names, (rate,) * len(found), "rate")
    if any(p > 0 for p in own):
        return DropoutSetting(names, own, "model")
    return DropoutSetting(names, (DEFAULT_RATE,) * len(found), "fallback")


@contextlib.contextmanager
def mc_dropout(model: nn.Module, rate: float | None = None) -> Iterator[DropoutSetting]:
    """Within the block ``model`` is in eval mode except its ``nn.Dropout`` modules, which train
    (sample masks) at the rates of :func:`dropout_setting`. On exit every module's ``training``
    flag and every dropout rate are what they were before. Yields the :class:`DropoutSetting`.
    """
    setting = dropout_setting(model, rate)
    modes = [(m, m.training) for m in model.modules()]
    dropouts = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    rates = [m.p for m in dropouts]
    try:
        model.eval()
        for module, p in zip(dropouts, setting.rates, strict=True):
            module.p = p
            module.train(True)
        yield setting
    finally:
        for module, p in zip(dropouts, rates, strict=True):
            module.p = p
        for module, training in modes:
            module.training = training


def _check_int(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


#: How many input tokens (text) one stacked MC Dropout forward holds at most: the default's
#: 8 passes of a batch of 64 at length 64 (32,768) run as one forward; longer inputs stack fewer.
MAX_STACKED_TOKENS: int = 32_768
#: How many examples (images) one stacked MC Dropout forward holds at most.
MAX_STACKED_EXAMPLES: int = 512


def passes_per_forward_for(samples: int, batch: Batch) -> int:
    """How many of ``samples`` passes one forward stacks by default: as many as fit
    :data:`MAX_STACKED_TOKENS` (text: ``input_ids`` ``[B, L]``) or :data:`MAX_STACKED_EXAMPLES`
    (anything else), at least 1."""
    ids = batch.get("input_ids")
    rows = next(iter(batch.values())).shape[0]
    per_pass = rows * ids.shape[-1] if ids is not None else rows
    budget = MAX_STACKED_TOKENS if ids is not None else MAX_STACKED_EXAMPLES
    return max(1, min(samples, budget // max(per_pass, 1)))


def pass_generators(samples: int, seed: int, device: torch.device) -> list[torch.Generator]:
    """One generator per pass on ``device``, seeded from ``seed`` (pass ``s`` always gets the same
    seed, whatever else is drawn): pass ``s``'s masks do not depend on how passes are batched."""
    base = torch.Generator().manual_seed(seed)
    seeds = torch.randint(0, 2**62, (samples,), generator=base).tolist()
    return [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]


@contextlib.contextmanager
def pass_masks(
    model: nn.Module,
    setting: DropoutSetting,
    generators: list[torch.Generator],
    implementation: DropoutImplementation = "auto",
) -> Iterator[list[torch.Generator]]:
    """``model`` in eval mode with every ``nn.Dropout`` of rate ``p > 0`` replaced (by a forward
    hook) with inverted dropout drawn pass by pass: the module's input is ``[P * B, ...]``, ``P``
    passes stacked pass-major along dim 0; rows ``[i * B, (i + 1) * B)`` get a Bernoulli(1 - p)
    mask from the i-th generator of the list the block sets (``yield``ed: assign its items before
    each forward), scaled by ``1 / (1 - p)``, as ``nn.Dropout`` in train mode does, by
    :func:`~hydra_ops.models.inverted_dropout.inverted_dropout`'s ``implementation``. Modes are
    restored on exit."""
    active: list[torch.Generator] = list(generators)
    modes = [(m, m.training) for m in model.modules()]
    dropouts = [m for _, m in model.named_modules() if isinstance(m, nn.Dropout)]

    def hook(p: float):
        def apply(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
            n = len(active)
            if output.shape[0] % n:
                raise ValueError(
                    f"MC dropout: a dropout input of batch {output.shape[0]} is not {n} stacked "
                    "passes (dim 0 must be the batch)"
                )
            return inverted_dropout(output, p, active, implementation)

        return apply

    handles = []
    try:
        model.eval()
        for module, p in zip(dropouts, setting.rates, strict=True):
            if p > 0:
                handles.append(module.register_forward_hook(hook(p)))
        yield active
    finally:
        for handle in handles:
            handle.remove()
        for module, training in modes:
            module.training = training


@torch.no_grad()
def mc_dropout_logits(
    model: nn.Module,
    batches: Batch | Iterable[Batch],
    samples: int,
    *,
    seed: int = 0,
    rate: float | None = None,
    device: str | torch.device | None = None,
    precision: str = "fp32",
    passes_per_forward: int | None = None,
    implementation: DropoutImplementation = "auto",
) -> Tensor:
    """``samples`` stochastic forward passes of ``model`` over contract ``batches``, run as
    forwards over ``passes_per_forward`` passes stacked along the batch dimension.

    Args:
        model: a classifier of a supported family (or any module
            :func:`hydra_ops.models.training.model_logits` runs) with at least one ``nn.Dropout``.
        batches: one contract batch or an iterable of them (``labels`` ignored).
        samples: S >= 1 passes per batch.
        seed: pass ``s`` draws its masks from its own generator (:func:`pass_generators`, from
            ``seed`` >= 0), restarted on every call; the global random state is not used.
        rate: the dropout rate, or None (see :func:`dropout_setting`).
        device, precision: as :func:`hydra_ops.models.inference.logits` (None: where the model is;
            the model moves there in place; ``fp32`` / ``bf16`` / ``fp16``).
        passes_per_forward: how many passes one forward stacks (None: as many as
            :func:`passes_per_forward_for` allows per batch; 1: one forward per pass). Pass ``s``
            gets the same masks whatever this is (:func:`pass_masks`), so the
            results agree up to the rounding of a larger batch's matrix products.
        implementation: how masks are drawn
            (:func:`~hydra_ops.models.inverted_dropout.inverted_dropout`: ``auto``, ``dense``
            or ``gaps``); the same distribution, different draws.

    Returns:
        float32 CPU logits ``[N, S, C]``, N = examples over all batches; sample ``s`` of batch
        ``b`` is the ``s``-th pass over ``b``, the passes running batch by batch, so the result
        depends on how the examples are batched (fixed by the caller). The model's modes are
        restored afterwards.
    """
    from hydra_ops.models.runtime import autocast, model_device, move_batch, resolve_device
    from hydra_ops.models.training import model_logits

    samples = _check_int(samples, "samples", 1)
    seed = _check_int(seed, "seed", 0)
    if passes_per_forward is not None:
        passes_per_forward = min(_check_int(passes_per_forward, "passes_per_forward", 1), samples)
    if isinstance(batches, Mapping):
        batches = [batches]
    batches = list(batches)
    if not batches:
        raise ValueError("batches is empty; pass at least one batch")
    dev = model_device(model) if device is None else resolve_device(device)
    autocast(dev, precision)  # a bad precision fails before the model moves
    setting = dropout_setting(model, rate)  # a bad rate or model fails before the model moves
    resolve_implementation(implementation, dev)
    model.to(dev)
    out = []
    generators = pass_generators(samples, seed, dev)
    with pass_masks(model, setting, generators, implementation) as active:
        for batch in batches:
            moved = {k: v for k, v in move_batch(batch, dev).items() if k != "labels"}
            size = next(iter(moved.values())).shape[0]
            chunk = passes_per_forward or passes_per_forward_for(samples, moved)
            passes = []
            for start in range(0, samples, chunk):
                active[:] = generators[start : start + chunk]
                n = len(active)
                stacked = {k: v.repeat(n, *([1] * (v.ndim - 1))) for k, v in moved.items()}
                with autocast(dev, precision):
                    logits = model_logits(model, stacked).float()
                passes.append(logits.view(n, size, -1).transpose(0, 1))
            out.append(torch.cat(passes, dim=1).cpu())
    return torch.cat(out)
