"""Atomic writes: an output is either absent, the old version, or complete; never half-written.

Everything that writes an artifact DVC may cache goes through these three helpers.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path


def atomic_write_file(path: str | os.PathLike[str], write: Callable[[Path], None]) -> None:
    """Run ``write(tmp)`` for a temp file next to ``path`` (same suffix), fsync it, rename it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    atomic_write_file(path, lambda tmp: tmp.write_bytes(data))


def replace_dir(tmp: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Move the finished folder ``tmp`` to ``target``: one rename when ``target`` is absent,
    otherwise the old folder is renamed aside first, so ``target`` is never half-written."""
    tmp, target = Path(tmp), Path(target)
    if target.exists():
        old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
        os.replace(target, old)
        os.replace(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, target)
