"""Atomic writes: an output is either absent, the old version, or complete; never half-written.

Everything that writes an artifact DVC may cache goes through the write helpers here: a file
(:func:`atomic_write_file`, :func:`atomic_write_bytes`) or a whole folder (:func:`atomic_write_dir`,
:func:`replace_dir`). A process killed mid-write leaves at most hidden siblings of the target
(:data:`LEFTOVER_GLOBS`), never a half-written target; :func:`remove_leftovers` deletes them, and
``.gitignore`` and ``.dvcignore`` ignore the same shapes.

What they publish gets the permissions a plain ``open()`` / ``mkdir()`` would give under the
process umask (``0o644`` / ``0o755`` under the usual ``022``), not ``tempfile``'s private
``0o600`` / ``0o700``: a model bundle written by the pipeline must be readable by the service
or teammate that serves it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from glob import escape
from pathlib import Path

#: What an interrupted write of ``<name>`` leaves next to it: ``.<name>.tmp-*`` (the temp folder of
#: a publish, ``tempfile.mkdtemp``), ``.<name>.old-*`` (:func:`replace_dir`'s old folder, renamed
#: aside) and ``.<name>.*.tmp`` (the ``tempfile.mkstemp`` file of a text/JSON write).
LEFTOVER_GLOBS = (".{name}.tmp-*", ".{name}.old-*", ".{name}.*.tmp")


def current_umask() -> int:
    """The process umask, read without changing it (``/proc/self/status`` on Linux; elsewhere
    the ``os.umask`` set-and-restore, which other threads could observe for an instant)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def publish_modes(root: str | os.PathLike[str]) -> None:
    """Give ``root`` and everything under it the modes ``mkdir`` / ``open`` give under the umask:
    folders and executable files ``0o777 & ~umask``, other files ``0o666 & ~umask`` (symlinks and
    hard-linked files are left alone: their mode is their target's, e.g. a read-only DVC cache
    object)."""
    umask = current_umask()
    root = Path(root)
    for path in [root, *root.rglob("*")]:
        if path.is_symlink() or (path.is_file() and path.stat().st_nlink > 1):
            continue  # a link (:func:`link_or_copy`) keeps its target's mode
        executable = path.is_dir() or path.stat().st_mode & 0o111
        os.chmod(path, (0o777 if executable else 0o666) & ~umask)


def link_or_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Put ``src``'s bytes at ``dst``: a hard link where ``src`` is read-only (a DVC cache link,
    whose bytes never change in place) on the same filesystem, else a copy with metadata.

    A linked ``dst`` is one more name of the same read-only file, so a folder assembled from
    workspace outputs (the bundle) costs no second copy on disk."""
    if not os.stat(src).st_mode & 0o222:
        try:
            os.link(src, dst)
            return
        except OSError:
            pass
    shutil.copy2(src, dst)


def copy_tree_linked(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """``shutil.copytree`` whose files are placed by :func:`link_or_copy`."""
    shutil.copytree(src, dst, copy_function=link_or_copy)


def atomic_write_file(
    path: str | os.PathLike[str], write: Callable[[Path], None], *, keep_suffix: bool = True
) -> None:
    """Run ``write(tmp)`` for a temp file next to ``path``, fsync it, rename it to ``path``.

    The temp file is ``.<stem>.XXXXXXXX<suffix>`` with ``keep_suffix`` (for writers that pick the
    format from the suffix), else ``.<name>.XXXXXXXX.tmp`` (a :data:`LEFTOVER_GLOBS` shape, which
    git and DVC ignore: use it for text and JSON).
    """
    path = Path(path)
    if keep_suffix:
        prefix, suffix = f".{path.stem}.", path.suffix
    else:
        prefix, suffix = f".{path.name}.", ".tmp"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        os.chmod(tmp, 0o666 & ~current_umask())  # after: a writer may have replaced the file
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(
    path: str | os.PathLike[str], data: bytes, *, keep_suffix: bool = True
) -> None:
    """Write ``data`` to ``path`` atomically (temp file as in :func:`atomic_write_file`)."""
    atomic_write_file(path, lambda tmp: tmp.write_bytes(data), keep_suffix=keep_suffix)


@contextmanager
def atomic_write_dir(target: str | os.PathLike[str], *, mode: int | None = None) -> Iterator[Path]:
    """Yield a fresh temp folder ``.<name>.tmp-*`` next to ``target`` (parents created); when the
    block succeeds the folder replaces ``target`` through :func:`replace_dir`, when it raises the
    folder is deleted and ``target`` is left as it was.

    Before it is published the folder's content gets the umask's modes (:func:`publish_modes`:
    writers such as ``tempfile`` and safetensors' ``save_file`` create private ``0o600`` files)
    and the folder itself ``mode``, default ``0o777 & ~umask``."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
        publish_modes(tmp)
        if mode is not None:
            os.chmod(tmp, mode)
        replace_dir(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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
