"""hydra_ops.atomic: folders published whole, and assembled from read-only files by links."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hydra_ops.atomic import atomic_write_dir, copy_tree_linked


def _tree(root: Path, mode: int) -> Path:
    (root / "sub").mkdir(parents=True)
    for name in ("a.bin", "sub/b.json"):
        (root / name).write_bytes(name.encode())
        os.chmod(root / name, mode)
    return root


def test_read_only_files_are_linked_and_keep_their_mode_when_published(tmp_path: Path) -> None:
    src = _tree(tmp_path / "cache_links", 0o444)
    with atomic_write_dir(tmp_path / "bundle") as tmp:
        copy_tree_linked(src, tmp / "model")
    for name in ("a.bin", "sub/b.json"):
        got, want = (tmp_path / "bundle/model" / name).stat(), (src / name).stat()
        assert got.st_ino == want.st_ino and got.st_nlink == 2
        assert stat.S_IMODE(want.st_mode) == 0o444  # publishing did not chmod the shared file


def test_writable_files_are_copied_not_linked(tmp_path: Path) -> None:
    src = _tree(tmp_path / "workspace", 0o644)
    copy_tree_linked(src, tmp_path / "copy")
    got = tmp_path / "copy/a.bin"
    assert got.stat().st_ino != (src / "a.bin").stat().st_ino
    assert got.read_bytes() == b"a.bin"
    got.write_bytes(b"edited")
    assert (src / "a.bin").read_bytes() == b"a.bin"


def test_a_failed_publish_leaves_the_linked_source_untouched(tmp_path: Path) -> None:
    src = _tree(tmp_path / "cache_links", 0o444)
    with pytest.raises(RuntimeError), atomic_write_dir(tmp_path / "bundle") as tmp:
        copy_tree_linked(src, tmp / "model")
        raise RuntimeError("stage failed")
    assert not (tmp_path / "bundle").exists()
    assert (src / "a.bin").read_bytes() == b"a.bin" and (src / "a.bin").stat().st_nlink == 1
