"""git commands in a project's repo: one command with its failure as one line of a given class,
whether the repo has a commit, and a committer identity where git has none (registry commits and
tags are written on fresh machines and CI runners too)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

#: Who tags a promotion when git has no identity configured (a fresh machine or CI runner).
FALLBACK_IDENTITY = ("hydra-ens", "hydra-ens@localhost")


class GitError(ValueError):
    """A git command failed (its last line, as one line)."""


def git(
    root: Path,
    *args: str,
    env: dict[str, str] | None = None,
    error: type[Exception] = GitError,
) -> str:
    """``git ARGS`` in ``root``; its stdout, or ``error`` with git's last line when it fails."""
    r = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        msg = (r.stderr.strip() or r.stdout.strip()).splitlines()
        raise error(f"git {' '.join(args[:2])} failed: {msg[-1] if msg else r.returncode}")
    return r.stdout


def has_commit(root: Path) -> bool:
    r = subprocess.run(
        ["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=root, capture_output=True, text=True
    )
    return r.returncode == 0


def ensure_git_identity(root: Path) -> str | None:
    """Make sure git can write commits and annotated tags in ``root``.

    When git has no committer identity (``git var GIT_COMMITTER_IDENT`` fails), sets the
    ``GIT_{AUTHOR,COMMITTER}_{NAME,EMAIL}`` variables of this process to :data:`FALLBACK_IDENTITY`
    and returns a line saying so; returns None when an identity is configured.
    """
    r = subprocess.run(
        ["git", "var", "GIT_COMMITTER_IDENT"], cwd=root, capture_output=True, text=True
    )
    if r.returncode == 0:
        return None
    name, email = FALLBACK_IDENTITY
    for role in ("AUTHOR", "COMMITTER"):
        os.environ[f"GIT_{role}_NAME"] = name
        os.environ[f"GIT_{role}_EMAIL"] = email
    return (
        f"git has no user.name/user.email here; registry commits and tags are signed {name} "
        f"<{email}> (set git config user.name and user.email to sign them yourself)"
    )
