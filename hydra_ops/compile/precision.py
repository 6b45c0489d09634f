"""The precision an artifact computes in: ``fp32``, ``bf16`` or ``fp16``.

A low-precision candidate is the model cast to that dtype inside :class:`CastModel`, which takes
and returns what the fp32 model does (fp32 pixel values are cast on the way in, member logits come
out as fp32), so every artifact has the same call convention whatever its precision.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
from torch import Tensor, nn

from hydra_ops.models.runtime import bf16_supported

PRECISIONS = ("fp32", "bf16", "fp16")
DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
#: Max abs difference of ensemble probabilities vs the fp32 eager model, per precision.
DEFAULT_TOLERANCES: dict[str, float] = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 2e-2}


def precision_name(dtype_or_name: torch.dtype | str) -> str:
    """``fp32`` / ``bf16`` / ``fp16`` for a dtype, its name (``"bfloat16"``) or a precision.

    Raises:
        ValueError: anything else (names the allowed values).
    """
    if isinstance(dtype_or_name, str) and dtype_or_name in DTYPES:
        return dtype_or_name
    if isinstance(dtype_or_name, str):
        dtype_or_name = getattr(torch, dtype_or_name.removeprefix("torch."), dtype_or_name)
    if dtype_or_name == torch.float64:
        return "fp32"  # checked as fp32 (the tightest tolerance)
    for name, dtype in DTYPES.items():
        if dtype_or_name == dtype:
            return name
    raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {dtype_or_name!r}")


def fast_bf16_unavailable_reason(device: torch.device | str = "cpu") -> str | None:
    """``None`` when ``device`` computes bf16 natively, else why not (one line):
    :func:`hydra_ops.models.runtime.bf16_supported`, the one check every stage uses."""
    native, why = bf16_supported(device)
    return None if native else why


def precision_unavailable_reason(precision: str, device: torch.device | str) -> str | None:
    """``None`` when ``precision`` can run on ``device`` at all (fp16 needs CUDA), else why."""
    if precision == "fp16" and torch.device(device).type != "cuda":
        return "fp16 runs only on CUDA"
    return None


class CastModel(nn.Module):
    """``model`` at ``dtype`` with the fp32 model's call convention.

    ``(inputs, attention_mask=None, token_type_ids=None) -> [B, M, C]`` fp32 member logits;
    floating ``inputs`` (pixel values) are cast to ``dtype`` first, integer ids pass unchanged.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        super().__init__()
        self.model = model
        self.dtype = dtype
        self.num_members = getattr(model, "num_members", None)
        self.attention_implementation = getattr(model, "attention_implementation", None)

    def forward(
        self,
        inputs: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> Tensor:
        if inputs.is_floating_point():
            inputs = inputs.to(self.dtype)
        return self.model(inputs, attention_mask, token_type_ids).float()


def cast_model(model: nn.Module, precision: str) -> nn.Module:
    """``model`` itself when it already is at ``precision`` (or for ``fp32``), else a
    :class:`CastModel` around a cast copy (``model`` is left untouched)."""
    dtype = DTYPES[precision_name(precision)]
    param = next(iter(model.parameters()), None)
    if precision == "fp32" or param is None or param.dtype == dtype:
        return model
    return CastModel(copy.deepcopy(model).to(dtype), dtype).eval()


def cast_batch(batch: Mapping[str, object], precision: str) -> dict[str, object]:
    """``batch`` with its floating tensors (pixel values) cast to ``precision``'s dtype."""
    dtype = DTYPES[precision_name(precision)]
    return {
        k: v.to(dtype) if isinstance(v, Tensor) and v.is_floating_point() else v
        for k, v in batch.items()
    }
