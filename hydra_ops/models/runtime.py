"""Where and in which precision a model runs: the ``runtime: {device, precision}`` of params.yaml.

- :func:`resolve_device`: ``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda``, ``cuda:N``.
- :func:`autocast`: ``fp32`` = no autocast (the exact fp32 path); ``bf16`` / ``fp16`` =
  ``torch.autocast(device.type, dtype)``. torch 2.14's CPU autocast takes both bfloat16 and
  float16 (CPU fp16 is emulated on most CPUs: correct but rarely faster).
- :func:`grad_scaler`: a ``torch.amp.GradScaler`` for fp16 training (CUDA and CPU), None otherwise.
- :class:`Runtime`: a resolved (device, precision) pair with the one-line reason the log prints.

``precision: auto`` in :func:`resolve_precision` is the rule without a measurement: inference
(``training=False``) runs ``fp32``; training (``training=True``) runs ``bf16`` on a CUDA device
that supports it, else ``fp32``. The pipeline's model stages resolve ``auto`` by measuring instead
(:mod:`hydra_ops.perf.precision_probe`: fp32 without a probe where bf16 is not native, else a short
timed probe of both precisions on the stage's model and batch; compile measures the precision it
ships on its own). CPU fp32 is bit-identical to running
without this module: no autocast context, no scaler, ``.to`` of a tensor already on the device is
the tensor itself.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

DEVICE_PATTERN = r"^(auto|cpu|cuda|cuda:\d+)$"
"""Device specs :func:`resolve_device` takes."""
DEVICE_SPECS = ("auto", "cpu", "cuda", "cuda:N")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

Batch = dict[str, torch.Tensor]


def _cuda_devices() -> str:
    if not torch.cuda.is_available():
        return "no CUDA device here (torch.cuda.is_available() is False)"
    n = torch.cuda.device_count()
    return f"{n} CUDA device(s) here: cuda:0..cuda:{n - 1}"


def resolve_device(spec: str | torch.device) -> torch.device:
    """``auto`` -> ``cuda`` (device 0) when CUDA is available, else ``cpu``; ``cpu``; ``cuda``
    (= ``cuda:0``); ``cuda:N``. A ``torch.device`` passes through the same checks.

    ValueError naming ``device`` and the allowed specs for anything else, and naming what is
    present for a CUDA spec without CUDA (or an index past the last device).
    """
    if isinstance(spec, torch.device):
        spec = str(spec)
    if not isinstance(spec, str) or not re.match(DEVICE_PATTERN, spec.strip()):
        raise ValueError(f"device: unknown spec {spec!r}; allowed: {', '.join(DEVICE_SPECS)}")
    spec = spec.strip()
    if spec == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if spec == "cpu":
        return torch.device("cpu")
    index = int(spec.split(":")[1]) if ":" in spec else 0
    if not torch.cuda.is_available() or index >= torch.cuda.device_count():
        raise ValueError(f"device: {spec!r} is not available: {_cuda_devices()}; use cpu or auto")
    return torch.device("cuda", index)


#: ``/proc/cpuinfo`` flags of a CPU with native bf16 arithmetic.
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
#: torch CPU capabilities whose kernels can use those units (``ATEN_CPU_CAPABILITY`` lowers it).
BF16_CPU_CAPABILITIES = ("AVX512",)
_CPUINFO = Path("/proc/cpuinfo")


def _cpu_flags() -> set[str] | None:
    """The CPU's flags (x86 ``flags``, Arm ``Features``); None where /proc/cpuinfo is unreadable."""
    try:
        text = _CPUINFO.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def _cpu_bf16_units() -> list[str]:
    """The CPU's native bf16 units: its flags, or torch's own checks without /proc/cpuinfo."""
    flags = _cpu_flags()
    if flags is not None:
        return sorted(flags.intersection(CPU_BF16_FLAGS))
    checks = {"amx_bf16": "_is_amx_tile_supported", "avx512_bf16": "_is_avx512_bf16_supported"}
    return [flag for flag, check in checks.items() if getattr(torch.cpu, check, lambda: False)()]


def bf16_supported(device: torch.device | str) -> tuple[bool, str]:
    """Whether ``device`` has native bfloat16 math, and the one-line reason.

    CPU: an ``amx_bf16`` / ``avx512_bf16`` flag in /proc/cpuinfo (torch's own AMX / AVX512-BF16
    checks where it cannot be read), and torch dispatching at ``AVX512``: a capability lowered by
    ``ATEN_CPU_CAPABILITY`` (say ``avx2``) runs torch's bf16 kernels emulated, so such a process
    counts as one without native bf16, as on a CPU of that kind. Without native bf16 torch still
    runs bf16, emulated and slow. CUDA: ``torch.cuda.is_bf16_supported(including_emulation=False)``
    (compute capability >= 8.0).
    """
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return False, _cuda_devices()
        name = torch.cuda.get_device_name(device)
        cap = ".".join(map(str, torch.cuda.get_device_capability(device)))
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return True, f"{name} (compute capability {cap}) has native bf16"
        return False, f"{name} (compute capability {cap}) has no native bf16 (needs >= 8.0)"
    if device.type != "cpu":
        return False, f"device type {device.type!r} is not handled (cpu or cuda)"
    capability = torch.backends.cpu.get_cpu_capability()
    units = _cpu_bf16_units()
    if not units:
        return False, f"CPU has neither amx_bf16 nor avx512_bf16 (torch capability {capability})"
    if capability not in BF16_CPU_CAPABILITIES:
        return False, (
            f"CPU has {' + '.join(units)}, but torch runs at capability {capability} "
            "(ATEN_CPU_CAPABILITY), where its bf16 kernels are emulated"
        )
    return True, f"CPU has {' + '.join(units)} (torch capability {capability})"


def check_precision(precision: str, device: torch.device | str) -> None:
    """ValueError naming ``precision`` unless it is a resolved precision ``device`` can run."""
    device = torch.device(device)
    if precision not in ("fp32", "bf16", "fp16"):
        raise ValueError(
            f"precision: unknown value {precision!r}; allowed: fp32, bf16, fp16 "
            "(auto is resolved by Runtime.from_spec)"
        )
    if precision == "fp32":
        return
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"precision {precision!r}: autocast runs on cpu or cuda, not {device}")
    if not torch.amp.autocast_mode.is_autocast_available(device.type):
        raise ValueError(f"precision {precision!r}: torch has no autocast for {device.type}")
    if precision == "bf16" and device.type == "cuda":
        ok, why = bf16_supported(device)
        if not ok and not torch.cuda.is_bf16_supported():
            raise ValueError(f"precision 'bf16' does not run on {device}: {why}; use fp16 or fp32")


def autocast(device: torch.device | str, precision: str) -> contextlib.AbstractContextManager:
    """The forward's context: ``fp32`` -> a no-op context (exactly the code path without this
    module); ``bf16`` / ``fp16`` -> ``torch.autocast(device.type, dtype=bfloat16 / float16)``.
    ValueError (see :func:`check_precision`) for anything else."""
    device = torch.device(device)
    check_precision(precision, device)
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=AUTOCAST_DTYPES[precision])


def grad_scaler(device: torch.device | str, precision: str) -> torch.amp.GradScaler | None:
    """A loss scaler for fp16 training (float16 gradients underflow without one); None for
    fp32 / bf16 (bfloat16 has fp32's exponent range)."""
    device = torch.device(device)
    check_precision(precision, device)
    return torch.amp.GradScaler(device.type) if precision == "fp16" else None


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter or buffer (CPU when it has neither)."""
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        return tensor.device
    return torch.device("cpu")


def move_batch(batch: Mapping[str, Any], device: torch.device) -> dict[str, Any]:
    """``batch`` with every tensor on ``device``; copies from pinned memory are non-blocking.
    A tensor already on ``device`` is returned as is (no copy)."""
    out = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.device != device:
            value = value.to(device, non_blocking=value.is_pinned())
        out[key] = value
    return out


def describe_device(device: torch.device) -> str:
    """``cpu (AVX512, 2 threads)`` / ``cuda:0 (NVIDIA H200)``."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return (
        f"{device} ({torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads)"
    )


def resolve_precision(
    precision: str, device: torch.device, *, training: bool = False
) -> tuple[str, str]:
    """``(fp32 | bf16 | fp16, why)`` for a ``precision`` spec on ``device`` (see module doc)."""
    if precision not in PRECISIONS:
        allowed = ", ".join(PRECISIONS)
        raise ValueError(f"precision: unknown value {precision!r}; allowed: {allowed}")
    if precision != "auto":
        check_precision(precision, device)
        why = "as configured"
        if precision == "bf16":
            ok, reason = bf16_supported(device)
            why += "" if ok else f"; emulated: {reason}"
        elif precision == "fp16" and device.type == "cpu":
            why += "; float16 on the CPU is emulated"
        return precision, why
    if not training:
        return "fp32", "auto: inference runs fp32 (compile measures the precision it ships)"
    if device.type == "cuda":
        ok, reason = bf16_supported(device)
        if ok:
            return "bf16", f"auto: training on CUDA with bf16: {reason}"
        return "fp32", f"auto: fp32 ({reason})"
    return "fp32", "auto: training on the CPU runs fp32"


@dataclass(frozen=True)
class Runtime:
    """A resolved device and precision (``fp32`` / ``bf16`` / ``fp16``); ``why`` is the reason
    the precision was chosen (not part of equality)."""

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    precision: str = "fp32"
    why: str = field(default="as configured", compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", torch.device(self.device))
        check_precision(self.precision, self.device)

    @classmethod
    def from_spec(
        cls, device: str | torch.device = "cpu", precision: str = "fp32", *, training: bool = False
    ) -> Runtime:
        """Resolve params' ``runtime.device`` / ``runtime.precision`` (``auto`` as in the module
        doc; ``training`` picks the training stages' meaning of ``auto``)."""
        dev = resolve_device(device)
        resolved, why = resolve_precision(precision, dev, training=training)
        return cls(dev, resolved, why)

    @property
    def pin_memory(self) -> bool:
        """Whether batches built for this runtime should be pinned (CUDA only)."""
        return self.device.type == "cuda"

    @property
    def tag(self) -> str:
        """``cpu/fp32``, ``cuda/bf16``: what a result may depend on (not the device index)."""
        return f"{self.device.type}/{self.precision}"

    @property
    def is_default(self) -> bool:
        """CPU fp32: the numbers of a run without a runtime setting."""
        return self.tag == "cpu/fp32"

    def autocast(self) -> contextlib.AbstractContextManager:
        return autocast(self.device, self.precision)

    def describe(self) -> str:
        """``runtime: device cpu (AVX512, 2 threads), precision fp32 (why)`` — one log line."""
        return (
            f"runtime: device {describe_device(self.device)}, precision {self.precision} "
            f"({self.why})"
        )
