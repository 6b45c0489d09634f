"""The sections every model stage reads after the fine-tune: ``compile`` (its tolerances are the
inference probe's too, :mod:`tasks.runtime.precision`), ``calibrate``, ``evaluate`` (its batch size
is every model stage's evaluation batch)."""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import Field, model_validator

from tasks.params.base import Strict


class CompileConfig(Strict):
    backend: str = "auto"
    """A backend of ``hydra_ops.compile.backends.BACKEND_REGISTRY``, or ``auto``: tensorrt on
    CUDA, else of the CPU backends that agree with eager the first (inductor, export,
    onnxruntime) unless another is clearly faster (hydra_ops.compile.auto.pick), measured once per
    machine kind (tasks.runtime.hardware); ``eager``: no compilation (the artifact records that)."""
    precision: Literal["fp32", "bf16", "fp16", "auto"] = "auto"
    """What the artifact computes in. ``auto`` (default): every precision the device runs fast is
    measured with every backend against the fp32 eager model once per machine kind, and of those
    that agree within ``tolerance(precision)`` and ``min_agreement`` fp32 ships unless a lower
    precision is clearly faster (the margin rule, hydra_ops.margin) (bf16 only on a CPU with
    avx512_bf16/amx_bf16 or a CUDA device with bf16, fp16 only on CUDA; otherwise fp32, with one
    log line saying why). The default gate ``compile_max_abs_diff <= compile_tolerance`` follows
    the shipped precision, and evaluate judges the Hydra at it."""
    tolerance_fp32: float = Field(default=1e-4, gt=0)
    """Max |dp| of ensemble probabilities vs the fp32 eager model for an fp32 artifact."""
    tolerance_low_precision: float = Field(default=2e-2, gt=0)
    """The same for a bf16/fp16 artifact."""
    min_agreement: float = Field(default=1.0, ge=0, le=1)
    """Minimum ensemble argmax agreement with the fp32 eager model."""
    check_examples: int = Field(default=64, ge=1)
    """Held-out examples per split (ID test, shift, near-OOD, far-OOD) compile's check compares
    with the eager model, text at several lengths (tasks.compile.check_batches)."""

    def tolerance(self, precision: str) -> float:
        """The max |dp| allowed for an artifact of ``precision`` (``fp32``/``bf16``/``fp16``)."""
        return self.tolerance_fp32 if precision == "fp32" else self.tolerance_low_precision


class CalibrateConfig(Strict):
    """Quantiles of the ID validation OOD scores that become ``hydra-ens predict``'s verdict
    thresholds (``uncertain`` above the first, ``likely OOD`` above the second)."""

    uncertain_quantile: float = Field(default=0.90, gt=0, lt=1)
    likely_ood_quantile: float = Field(default=0.95, gt=0, lt=1)

    @model_validator(mode="after")
    def _ordered(self) -> CalibrateConfig:
        if not self.uncertain_quantile < self.likely_ood_quantile:
            raise ValueError(
                f"uncertain_quantile ({self.uncertain_quantile}) must be < likely_ood_quantile "
                f"({self.likely_ood_quantile})"
            )
        return self


class EvaluateConfig(Strict):
    ood_score: str = "msp"
    """The OOD score the gates, the verdict thresholds and ``predict`` read: a name registered
    in ``hydra_ops.uq.ood_criteria.OOD_CRITERIA`` (checked by :mod:`tasks.params.names`)."""
    bootstrap_samples: int = Field(default=1000, ge=10)
    bootstrap_seed: int = 0
    bootstrap_raw: bool = False
    """Also bootstrap the raw (uncalibrated) differences (the calibrated ones always are)."""
    batch_size: int = Field(default=64, ge=1)
    latency_batch: int = Field(default=32, ge=1)
    cost_rounds: int = Field(default=10, ge=1)
    """Interleaved timing rounds of every model in ``metrics/cost.json``
    (:mod:`tasks.evaluation.cost`); a model's ``latency_ms`` is the median of its rounds."""

    @model_validator(mode="before")
    @classmethod
    def _retired_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "latency_repeats" in data:
            data = {k: v for k, v in data.items() if k != "latency_repeats"}
            logging.getLogger("hydra_ens").warning(
                "params: evaluate.latency_repeats is no longer used and was dropped: latency_ms "
                "is the median of the evaluate.cost_rounds interleaved timing rounds"
            )
        return data
