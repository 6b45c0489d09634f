"""One copy of each artifact (real DVC, git): ensure_project links outputs to the cache where the
disk allows, a stage that rewrites its persisted output still works and leaves the cached old
version intact, and the project's local remote shares the cache's bytes after a push."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from flows import dvclinks, dvcops

REPO = Path(__file__).resolve().parents[2]

#: A stage that rewrites its persisted output atomically (as every stage does, hydra_ops.atomic).
WRITE = (
    "import sys; from hydra_ops.atomic import atomic_write_bytes; "
    "atomic_write_bytes('out/blob.bin', open('dep.txt', 'rb').read() * 50000)"
)


def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "out").mkdir(parents=True)
    (root / "dep.txt").write_text("v1\n")
    (root / "dvc.yaml").write_text(
        "stages:\n  write:\n"
        f'    cmd: {sys.executable} -c "{WRITE}"\n'
        "    deps: [dep.txt]\n"
        "    outs:\n      - out: {persist: true}\n"
    )
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    dvcops.dvc(root, "init", "-q")
    return root


def cached(root: Path, data: bytes) -> Path:
    md5 = hashlib.md5(data).hexdigest()
    return dvcops.cache_dir(root) / "files" / "md5" / md5[:2] / md5[2:]


def test_outputs_and_local_remote_share_one_copy(tmp_path, monkeypatch):
    root = project(tmp_path)
    link = dvclinks.supported_link(root / ".dvc" / "tmp")
    if link != "hardlink":
        pytest.skip(f"this disk's first link is {link}, not hardlink")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    done = dvcops.ensure_project(root)
    assert any("cache.type hardlink,symlink,copy" in d for d in done)
    assert "hardlink,symlink,copy" in (root / ".dvc" / "config.local").read_text()
    assert dvcops.ensure_project(root) == []  # already set: nothing to do

    dvcops.dvc(root, "repro", "-q")
    out = root / "out" / "blob.bin"
    v1 = out.read_bytes()
    assert out.stat().st_nlink == 2 and out.stat().st_ino == cached(root, v1).stat().st_ino
    assert not out.stat().st_mode & 0o222  # protected: read-only link

    # the stage reruns over its linked (read-only) persisted output: a new file, linked again,
    # and the cached old version is untouched
    (root / "dep.txt").write_text("v2\n")
    dvcops.dvc(root, "repro", "-q")
    v2 = out.read_bytes()
    assert v2 == b"v2\n" * 50000 and out.stat().st_ino == cached(root, v2).stat().st_ino
    assert cached(root, v1).read_bytes() == v1

    assert dvcops.push(root) == "pushed"
    remote = root / dvcops.REMOTE_DIR / "files" / "md5"
    for data in (v2,):
        md5 = hashlib.md5(data).hexdigest()
        assert (remote / md5[:2] / md5[2:]).stat().st_ino == cached(root, data).stat().st_ino
    assert dvcops.dvc(root, "status", "-c", "-q", check=False).returncode == 0


def test_a_cache_type_the_user_set_stays(tmp_path):
    root = project(tmp_path)
    dvcops.dvc(root, "config", "cache.type", "copy")
    assert dvcops.ensure_cache_links(root) == []
    assert dvcops.dvc(root, "config", "cache.type").stdout.strip() == "copy"


def test_link_remote_to_cache_links_only_what_the_cache_holds(tmp_path):
    cache, remote = tmp_path / "cache", tmp_path / "remote"
    for base in (cache, remote):
        (base / "files" / "md5" / "ab").mkdir(parents=True)
    (cache / "files" / "md5" / "ab" / "cd").write_bytes(b"x" * 100)
    (remote / "files" / "md5" / "ab" / "cd").write_bytes(b"x" * 100)
    (remote / "files" / "md5" / "ab" / "ef").write_bytes(b"only in the remote")
    assert dvclinks.link_remote_to_cache(remote, cache) == 100
    same = (remote / "files" / "md5" / "ab" / "cd").stat().st_ino
    assert same == (cache / "files" / "md5" / "ab" / "cd").stat().st_ino
    assert (remote / "files" / "md5" / "ab" / "ef").read_bytes() == b"only in the remote"
    assert dvclinks.link_remote_to_cache(remote, cache) == 0  # already linked
    assert not list(remote.rglob(".*.tmp"))
