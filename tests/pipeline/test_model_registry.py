"""tasks.release.git_repo: registry commits and tags on a machine without a git identity."""

from __future__ import annotations

import subprocess


def test_promotion_tags_get_an_identity_on_a_machine_without_one(tmp_path, monkeypatch):
    import os

    from tasks.release.git_repo import FALLBACK_IDENTITY, ensure_git_identity

    for role in ("AUTHOR", "COMMITTER"):  # registered with monkeypatch, so restored afterwards
        for field in ("NAME", "EMAIL"):
            monkeypatch.setenv(f"GIT_{role}_{field}", "x")
            monkeypatch.delenv(f"GIT_{role}_{field}")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    tag = ["git", "tag", "-a", "t", "-m", "m", "4b825dc642cb6eb9a060e54bf8d69288fbee4904"]
    assert subprocess.run(tag, cwd=repo, capture_output=True).returncode != 0  # no identity
    note = ensure_git_identity(repo)
    assert note is not None and FALLBACK_IDENTITY[1] in note
    subprocess.run(tag, cwd=repo, check=True, capture_output=True)
    assert ensure_git_identity(repo) is None  # now there is one
