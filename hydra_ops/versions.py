"""Versions of the libraries that decide what a saved or compiled model computes."""

from __future__ import annotations

import importlib
import importlib.util
import platform
from collections.abc import Sequence
from typing import Literal

import torch

#: Modules that are imported only when CUDA is present (importing them without it is slow or fails).
CUDA_ONLY_MODULES = ("torch_tensorrt", "tensorrt")


def library_versions(
    required: Sequence[str] = (),
    optional: Sequence[str] = (),
    *,
    missing: Literal["none", "omit"] = "none",
) -> dict[str, str | None]:
    """``{"python", "torch", *required, *optional}`` -> version string.

    ``required`` modules are imported (an ImportError propagates). An ``optional`` module that is
    not installed maps to ``None`` (``missing="none"``) or is left out (``missing="omit"``); one of
    :data:`CUDA_ONLY_MODULES` is not imported without CUDA (``"installed (not imported: no
    CUDA)"``); one whose import fails maps to ``"import failed: <error type>"``. A module without
    ``__version__`` maps to ``"unknown"``.
    """
    if missing not in ("none", "omit"):
        raise ValueError(f"missing must be one of ['none', 'omit'], got {missing!r}")
    versions: dict[str, str | None] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    for module in required:
        versions[module] = getattr(importlib.import_module(module), "__version__", "unknown")
    for module in optional:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            if missing == "none":
                versions[module] = None
            continue
        if module in CUDA_ONLY_MODULES and not torch.cuda.is_available():
            versions[module] = "installed (not imported: no CUDA)"
            continue
        try:
            versions[module] = getattr(importlib.import_module(module), "__version__", "unknown")
        except Exception as error:  # a broken optional install must not break a save or compile
            versions[module] = f"import failed: {type(error).__name__}"
    return versions
