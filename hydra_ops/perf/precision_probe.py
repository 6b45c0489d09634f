"""``precision: auto`` for a model stage, measured: bf16 only where it is native, faster and safe.

A stage that trains or runs a model asks :func:`choose_precision` which precision to use. The
answer is a :class:`PrecisionChoice`: the precision, one line saying why (for the run log and the
stage's metrics) and, when something was measured, the timings.

- An explicit precision (``fp32``, ``bf16``, ``fp16``) is used as configured.
- ``auto`` keeps **fp32 without measuring anything** when the device has no native bf16
  (:class:`Bf16Support`: ``amx_bf16`` / ``avx512_bf16`` on a CPU, compute capability >= 8.0 on
  CUDA): the stage then runs the exact fp32 code path it ran before this module.
- With native bf16, ``auto`` times both precisions on the stage's real model and batch
  (:func:`time_training_steps`: a few full training steps, forward + backward + AdamW, on a copy of
  the model; :func:`hydra_ops.perf.inference_probe.time_inference`: forward passes without grad,
  plus the agreement of the bf16 logits with the fp32 ones on the same batches,
  :func:`hydra_ops.compile.verify.compare_logits`).
  The two precisions alternate step by step (and which goes first alternates too), so load from
  elsewhere on the machine falls on both; each precision's step time is its fastest timed step
  (load only ever adds time: a busy moment cannot make a precision look faster, while a median of
  three steps was swayed by one; two runs of this code on one machine once measured 0.28x and
  1.94x for the same member shape). bf16 is chosen only when it is clearly faster
  (:func:`hydra_ops.margin.clearly_faster`: its fastest step at least ``margin`` faster,
  :data:`DEFAULT_MARGIN` 1.15x, and its slowest step faster than fp32's fastest) and, for
  inference, its logits agree with fp32's within the tolerance compile uses for a low-precision
  artifact. A measurement within noise keeps fp32.

The decision rules (:func:`decide_training_precision`, :func:`decide_inference_precision`) are pure
functions of a :class:`Bf16Support`, :class:`Timings` and the agreement check, so they are tested
with small objects. A probe never changes the caller's model, its gradients or the random state:
it trains a deep copy inside :func:`torch.random.fork_rng`.
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from math import nan
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from hydra_ops.margin import DEFAULT_MARGIN, clearly_faster
from hydra_ops.measurements import MeasurementCache, machine_key

__all__ = [
    "DEFAULT_MARGIN",
    "Bf16Support",
    "PrecisionChoice",
    "Timings",
    "batch_signature",
    "choose_precision",
    "decide_inference_precision",
    "decide_training_precision",
    "model_signature",
    "time_training_steps",
]

#: Timed steps per precision (after the warm-up steps).
DEFAULT_STEPS: int = 3

Batch = Mapping[str, torch.Tensor]
Use = Literal["training", "inference"]


@dataclass(frozen=True)
class Bf16Support:
    """Whether a device computes bf16 natively, and the one-line reason."""

    native: bool
    why: str

    @classmethod
    def of(cls, device: torch.device | str) -> Bf16Support:
        """From :func:`hydra_ops.models.runtime.bf16_supported` (cpuinfo flags / CUDA
        capability)."""
        from hydra_ops.models.runtime import bf16_supported

        native, why = bf16_supported(device)
        return cls(native, why)


@dataclass(frozen=True)
class Timings:
    """Seconds per step of each precision, measured interleaved (warm-ups excluded)."""

    fp32: tuple[float, ...]
    bf16: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.fp32 or not self.bf16:
            raise ValueError("Timings: need at least one timing per precision")

    @property
    def speedup(self) -> float:
        """Fastest fp32 step / fastest bf16 step (> 1: bf16 is faster)."""
        return min(self.fp32) / min(self.bf16)

    def bf16_clearly_faster(self, margin: float = DEFAULT_MARGIN) -> bool:
        """bf16 wins by :func:`hydra_ops.margin.clearly_faster` (fp32 is the default)."""
        return clearly_faster(self.bf16, self.fp32, margin)

    def to_dict(self) -> dict[str, Any]:
        return {
            "fp32_best_ms": round(1e3 * min(self.fp32), 2),
            "bf16_best_ms": round(1e3 * min(self.bf16), 2),
            "fp32_median_ms": round(1e3 * statistics.median(self.fp32), 2),
            "bf16_median_ms": round(1e3 * statistics.median(self.bf16), 2),
            "fp32_rounds_ms": [round(1e3 * t, 3) for t in self.fp32],
            "bf16_rounds_ms": [round(1e3 * t, 3) for t in self.bf16],
            "steps": len(self.fp32),
            "speedup": round(self.speedup, 3),
        }


@dataclass(frozen=True)
class PrecisionChoice:
    """What ``precision`` a stage runs and why.

    ``source``: ``configured`` (not ``auto``), ``rule`` (``auto`` decided without measuring:
    no native bf16), ``measured`` (timed now) or ``cached`` (timed before on this machine and
    shape, :class:`~hydra_ops.measurements.MeasurementCache`). ``timings``: the probe's numbers
    (:meth:`Timings.to_dict`), ``check``: inference only, the bf16-vs-fp32 agreement.
    """

    precision: str
    reason: str
    use: Use
    source: Literal["configured", "rule", "measured", "cached"]
    timings: dict[str, Any] | None = None
    check: dict[str, Any] | None = field(default=None)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def decision(self) -> dict[str, str]:
        """What was chosen and why, without how it was learnt (``source``, timings): the same
        whether the probe ran now or came from the cache, so a stage output that records it is
        a function of its inputs (``calibrate``'s is re-checked by ``dvc status``)."""
        return {"precision": self.precision, "use": self.use, "reason": self.reason}

    def describe(self) -> str:
        """One log line: ``precision bf16 for training (measured): ...`` and, when timed, the
        speedup (not in :attr:`reason`: two measurements of one choice give one reason)."""
        speed = f" [bf16 {self.timings['speedup']:.2f}x fp32]" if self.timings else ""
        return f"precision {self.precision} for {self.use} ({self.source}): {self.reason}{speed}"


def _rule(margin: float) -> str:
    return f"needs >= {1 + margin:.2f}x and every bf16 round faster than fp32's fastest"


def decide_training_precision(
    support: Bf16Support, timings: Timings | None, margin: float = DEFAULT_MARGIN
) -> PrecisionChoice:
    """``auto`` for training: bf16 when ``support.native`` and bf16 is clearly faster
    (:meth:`Timings.bf16_clearly_faster`), else fp32; the reason names the capability and, when
    measured, the speedup."""
    if not support.native:
        why = f"bf16 is not native here: {support.why}"
        return PrecisionChoice("fp32", why, "training", "rule")
    if timings is None:
        raise ValueError("decide_training_precision: native bf16 needs timings to decide")
    if timings.bf16_clearly_faster(margin):
        why = f"bf16 training steps clearly faster than fp32 ({_rule(margin)}); {support.why}"
        return PrecisionChoice("bf16", why, "training", "measured", timings.to_dict())
    why = f"bf16 training steps not clearly faster than fp32 ({_rule(margin)})"
    return PrecisionChoice("fp32", why, "training", "measured", timings.to_dict())


def decide_inference_precision(
    support: Bf16Support,
    timings: Timings | None,
    check: Mapping[str, Any] | None,
    margin: float = DEFAULT_MARGIN,
) -> PrecisionChoice:
    """``auto`` for inference: bf16 when native, faster by ``margin`` and its logits agree with
    fp32's (``check["passed"]``, :func:`~hydra_ops.compile.verify.compare_logits`); else fp32."""
    if not support.native:
        why = f"bf16 is not native here: {support.why}"
        return PrecisionChoice("fp32", why, "inference", "rule")
    if timings is None or check is None:
        raise ValueError("decide_inference_precision: native bf16 needs timings and a check")
    numbers, verdict = timings.to_dict(), dict(check)
    if not check.get("passed"):
        dp, agree = check.get("max_abs_diff_probs", nan), check.get("argmax_agreement", nan)
        why = f"bf16 disagrees with fp32: max |dp| {dp:.2e}, argmax agreement {agree:.4f}"
        return PrecisionChoice("fp32", why, "inference", "measured", numbers, verdict)
    if not timings.bf16_clearly_faster(margin):
        why = f"bf16 agrees but is not clearly faster than fp32 ({_rule(margin)})"
        return PrecisionChoice("fp32", why, "inference", "measured", numbers, verdict)
    why = (
        f"bf16 clearly faster than fp32 ({_rule(margin)}) and agrees with it "
        f"(max |dp| {check['max_abs_diff_probs']:.2e}); {support.why}"
    )
    return PrecisionChoice("bf16", why, "inference", "measured", numbers, verdict)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def alternating_timings(
    run: Callable[[str], None], device: torch.device, steps: int, warmup: int
) -> Timings:
    """Time ``run(precision)`` for fp32 and bf16 in turn (the first of each pair alternates)."""
    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for i in range(warmup + steps):
        order = ("fp32", "bf16") if i % 2 == 0 else ("bf16", "fp32")
        for precision in order:
            _sync(device)
            t0 = time.perf_counter()
            run(precision)
            _sync(device)
            if i >= warmup:
                times[precision].append(time.perf_counter() - t0)
    return Timings(tuple(times["fp32"]), tuple(times["bf16"]))


def _rng(device: torch.device) -> contextlib.AbstractContextManager:
    if device.type == "cuda":
        return torch.random.fork_rng(devices=[device.index or 0], device_type="cuda")
    return torch.random.fork_rng(devices=[])


def time_training_steps(
    model: nn.Module,
    batch: Batch,
    device: torch.device | str,
    *,
    steps: int = DEFAULT_STEPS,
    warmup: int = 2,
) -> Timings:
    """Seconds per training step (forward under the precision's autocast, fp32 cross-entropy on
    ``batch["labels"]``, backward, fused AdamW) of a deep copy of ``model`` on ``device``, fp32
    and bf16 alternating. Only parameters with ``requires_grad`` train (frozen layers stay frozen,
    as in the real fine-tune), and each precision draws dropout masks as the fine-tune would
    (:func:`hydra_ops.models.inverted_dropout.training_sampler`). ``model`` and the random state
    are left untouched."""
    from hydra_ops.models.inverted_dropout import sampled_dropout, training_sampler
    from hydra_ops.models.runtime import autocast, move_batch
    from hydra_ops.models.training import model_logits

    device = torch.device(device)
    if "labels" not in batch:
        raise ValueError("time_training_steps: the batch needs 'labels'")
    with _rng(device):
        probe = copy.deepcopy(model).to(device).train()
        trainable = [p for p in probe.parameters() if p.requires_grad]
        if not trainable:
            raise ValueError("time_training_steps: the model has no trainable parameters")
        fused = all(p.device.type in ("cpu", "cuda") for p in trainable)
        optimizer = torch.optim.AdamW(trainable, lr=1e-7, fused=fused or None)
        moved = move_batch(batch, device)

        def step(precision: str) -> None:
            sampler = training_sampler(device, precision)
            with autocast(device, precision), sampled_dropout(sampler, device):
                logits = model_logits(probe, moved)
            loss = F.cross_entropy(logits.float(), moved["labels"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

        return alternating_timings(step, device, steps, warmup)


def model_signature(model: nn.Module) -> dict[str, Any]:
    """What a model's step time depends on: its class, parameter counts and dtype."""
    params = list(model.parameters())
    return {
        "class": type(model).__name__,
        "parameters": sum(p.numel() for p in params),
        "trainable": sum(p.numel() for p in params if p.requires_grad),
        "dtype": str(params[0].dtype) if params else "none",
    }


def batch_signature(batch: Batch) -> dict[str, list[int]]:
    """The shapes of a batch's tensors (its labels included)."""
    return {k: list(v.shape) for k, v in sorted(batch.items()) if isinstance(v, torch.Tensor)}


def choose_precision(
    spec: str,
    device: torch.device | str,
    use: Use,
    *,
    model: nn.Module | None = None,
    batches: Sequence[Batch] = (),
    cache: MeasurementCache | None = None,
    support: Bf16Support | None = None,
    margin: float = DEFAULT_MARGIN,
    steps: int = DEFAULT_STEPS,
    tolerance: float = 2e-2,
    measure: Callable[[], tuple[Timings, dict[str, Any] | None]] | None = None,
) -> PrecisionChoice:
    """The precision a stage runs for ``spec`` (``auto``, ``fp32``, ``bf16``, ``fp16``).

    ``auto`` on a device with native bf16 (``support``, default :meth:`Bf16Support.of`) calls
    ``measure() -> (timings, check)``; without one, training times :func:`time_training_steps`
    of ``model`` on the first of ``batches`` (inference needs ``measure``: e.g.
    :func:`hydra_ops.perf.inference_probe.time_inference`, which checks bf16 against fp32 as compile
    does; kept apart so a training stage does not depend on the compile code). The result is
    kept in ``cache`` keyed by the machine, ``use``, the model's and the first batch's signature,
    the margin and the tolerance; a cached result is reused as is, so the same machine and shape
    always get the same answer.
    """
    from hydra_ops.models.runtime import resolve_precision

    device = torch.device(device)
    if spec != "auto":
        precision, why = resolve_precision(spec, device)
        return PrecisionChoice(precision, why, use, "configured")
    support = support or Bf16Support.of(device)
    if not support.native:
        if use == "training":
            return decide_training_precision(support, None, margin)
        return decide_inference_precision(support, None, None, margin)
    if measure is None:
        if model is None or not batches:
            raise ValueError("choose_precision: auto with native bf16 needs a model and a batch")

        if use != "training":
            raise ValueError("choose_precision: auto for inference needs measure=")

        def measure() -> tuple[Timings, dict[str, Any] | None]:
            return time_training_steps(model, batches[0], device, steps=steps), None

    def measured() -> dict[str, Any]:
        timings, check = measure()
        return {"fp32": list(timings.fp32), "bf16": list(timings.bf16), "check": check}

    key = {
        "use": use,
        "margin": margin,
        "model": model_signature(model) if model is not None else None,
        "batch": batch_signature(batches[0]) if batches else None,
        "tolerance": tolerance if use == "inference" else None,
    }
    value, cached = (cache or MeasurementCache(None)).get_or_measure(
        f"precision/{use}", key, machine_key(device), measured
    )
    timings = Timings(tuple(value["fp32"]), tuple(value["bf16"]))
    if use == "training":
        choice = decide_training_precision(support, timings, margin)
    else:
        choice = decide_inference_precision(support, timings, value.get("check"), margin)
    if cached:  # the same reason: an output that records it must not depend on the cache
        choice = PrecisionChoice(
            choice.precision, choice.reason, choice.use, "cached", choice.timings, choice.check
        )
    return choice
