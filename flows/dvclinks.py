"""One copy of each artifact on disk: the workspace and the local remote link to DVC's cache.

DVC's default ``cache.type`` is ``reflink,copy``: on a filesystem without reflinks (ext4, most
Linux disks) every output exists twice, in the workspace and in ``.dvc/cache``, and ``dvc push`` to
the project's ``local`` remote (``.dvc-remote/``, same disk) makes a third copy.

- :func:`flows.dvcops.ensure_cache_links` (called by :func:`flows.dvcops.ensure_project`): where
  the user has set no ``cache.type``, it picks by what the cache's filesystem supports
  (:func:`supported_link`): reflinks -> DVC's default stays (copy-on-write: one physical copy,
  writable files); else ``hardlink,symlink,copy`` in the project's local config
  (``.dvc/config.local``: a property of this disk, not of the project). With ``hardlink`` first,
  ``dvc repro`` moves each new output into the cache by a hard link (no copy at all) and leaves a
  read-only link in the workspace; symlinks where the cache is on another device; a copy where
  neither works. DVC 3 always makes linked outputs read-only (the old ``cache.protected`` is gone:
  protection is implied by the link type). Stages never edit an output in place (they write through
  :mod:`hydra_ops.atomic`: a new file renamed over the old link) and DVC unlinks a stage's outputs
  before it reruns, so a linked output is never written through.
- :func:`link_remote_to_cache` (after ``dvc push`` to the project's own ``local`` remote): every
  object of that remote that the cache holds too, on the same device, becomes a hard link to the
  cache's file (content-addressed and read-only, so they can share the bytes). A remote the user
  put on another disk (``dvc remote modify local url /backup/...``) is a real copy and is left
  alone: that is how to ask for one.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

#: ``cache.type`` set where the filesystem has no reflinks.
LINK_TYPES = "hardlink,symlink,copy"


def supported_link(directory: Path) -> str:
    """``reflink``, ``hardlink``, ``symlink`` or ``copy``: the first link ``directory``'s
    filesystem makes between two of its files (tried with a small temp file, then removed)."""
    from dvc_objects.fs.system import reflink

    directory.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    src, dst = directory / f".link-test-{tag}", directory / f".link-test-{tag}.dst"
    src.write_bytes(b"hydra-ens link test")
    try:
        for name, make in (("reflink", reflink), ("hardlink", os.link), ("symlink", os.symlink)):
            try:
                make(os.fspath(src), os.fspath(dst))
            except (OSError, NotImplementedError, AttributeError):
                continue
            _remove(dst)
            return name
        return "copy"
    finally:
        _remove(src)


def _remove(path: Path) -> None:
    """Remove a file or link, absent or not."""
    path.unlink(missing_ok=True)


def link_remote_to_cache(remote: Path, cache: Path) -> int:
    """Make every object file under ``remote/files`` that ``cache/files`` holds at the same path,
    on the same device, a hard link to the cache's file; returns the bytes this freed. Each
    replacement is atomic (a new link renamed over the copy). Files already linked, absent from
    the cache, or on another device are left alone."""
    freed = 0
    objects = remote / "files"
    if not objects.is_dir() or not (cache / "files").is_dir():
        return 0
    if os.stat(objects).st_dev != os.stat(cache / "files").st_dev:
        return 0
    for path in objects.rglob("*"):
        if not path.is_file() or path.is_symlink() or path.name.startswith("."):
            continue
        source = cache / "files" / path.relative_to(objects)
        try:
            ours, theirs = path.stat(), source.stat()
        except FileNotFoundError:
            continue
        if ours.st_ino == theirs.st_ino or ours.st_size != theirs.st_size:
            continue
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            os.link(source, tmp)
            os.replace(tmp, path)
        except OSError:
            _remove(tmp)
            continue
        freed += ours.st_size
    return freed
