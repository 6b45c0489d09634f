"""Atomic writes: an output is either absent, the old version, or complete; never half-written.

Everything that writes an artifact DVC may cache goes through the three write helpers here. A
process killed mid-write leaves at most hidden siblings of the target (:data:`LEFTOVER_GLOBS`),
never a half-written target; :func:`remove_leftovers` deletes them, and ``.gitignore`` and
``.dvcignore`` ignore the same shapes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from glob import escape
from pathlib import Path

#: What an interrupted write of ``<name>`` leaves next to it: ``.<name>.tmp-*`` (the temp folder of
#: a publish, ``tempfile.mkdtemp``), ``.<name>.old-*`` (:func:`replace_dir`'s old folder, renamed
#: aside) and ``.<name>.*.tmp`` (the ``tempfile.mkstemp`` file of a text/JSON write).
LEFTOVER_GLOBS = (".{name}.tmp-*", ".{name}.old-*", ".{name}.*.tmp")


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


def leftovers(target: str | os.PathLike[str]) -> list[Path]:
    """The leftovers of interrupted writes of ``target`` next to it (sorted): the
    :data:`LEFTOVER_GLOBS` shapes, plus :func:`atomic_write_file`'s ``.<stem>.XXXXXXXX<suffix>``
    when ``target`` has a suffix. ``target`` itself is never one of them."""
    target = Path(target)
    if not target.parent.is_dir():
        return []
    globs = [g.format(name=escape(target.name)) for g in LEFTOVER_GLOBS]
    if target.suffix:  # mkstemp's random part is 8 characters
        globs.append(f".{escape(target.stem)}.{'?' * 8}{escape(target.suffix)}")
    found = {p for g in globs for p in target.parent.glob(g)}
    return sorted(found - {target})


def remove_leftovers(target: str | os.PathLike[str]) -> list[Path]:
    """Delete :func:`leftovers` of ``target`` (folders and files); returns what was removed.

    Only for a target no other process is writing right now (e.g. at the start of the stage that
    owns it): a leftover cannot be told apart from a write in progress."""
    removed = leftovers(target)
    for path in removed:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return removed
