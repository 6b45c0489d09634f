"""SHA-256 digests: of bytes, of a file's bytes, of a module's state dict (the one home of all).

Importing this module does not import torch (``hydra_ops.data`` hashes files without it).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn


def sha256_bytes(*chunks: bytes) -> str:
    """Hex SHA-256 of the chunks' concatenation (``sha256_bytes(a, b) == sha256_bytes(a + b)``)."""
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()


def sha256_file(path: str | os.PathLike[str], chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes, read ``chunk_size`` bytes at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def state_dict_sha256(module_or_state: nn.Module | Mapping[str, torch.Tensor]) -> str:
    """Hex SHA-256 over a state dict's names, dtypes, shapes and bytes, in name order.

    Every tensor (0-dim ones included) contributes ``"<name>|<dtype>|<shape>|"`` then its
    contiguous CPU bytes, so the digest does not depend on device, strides or dict order.
    """
    import torch
    from torch import nn

    state = (
        module_or_state.state_dict() if isinstance(module_or_state, nn.Module) else module_or_state
    )
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        if tensor.numel():
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
