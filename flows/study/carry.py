"""Carrying a study's finished points to another machine: a git bundle of the study commit and
every point recorded at it, rewritten as points finish (``hydra-ens study --bundle PATH``).

A point is a DVC experiment: a commit whose parent is the study commit, under
``refs/exps/<commit[:2]>/<commit[2:]>/<name>`` (:mod:`flows.study.points`). The bundle holds those
refs and ``HEAD`` (while it is the study commit), less the history the project's remote-tracking
branches already hold: those commits are its prerequisites, which a clone of the same remote has
(with no remote-tracking branch it holds the whole history). Resuming elsewhere
(docs/study.md, "Across sessions")::

    git clone <the project's remote> study && cd study
    git fetch /path/to/points.bundle HEAD:refs/heads/study 'refs/exps/*:refs/exps/*'
    git checkout study
    hydra-ens study <spec> --workers 2        # runs only the points the bundle lacks

The file is replaced atomically (written beside it, then renamed), so a study stopped while
it is written leaves the previous bundle whole.
"""

from __future__ import annotations

import os
from pathlib import Path

from flows.study.points import experiment_refs
from tasks.release.git_repo import git


class BundleError(RuntimeError):
    """The points could not be bundled; one line."""


def check_bundle_path(path: Path) -> Path:
    """``path`` made absolute, or BundleError (one line) when it cannot hold a bundle: a folder,
    or a parent folder that does not exist."""
    path = Path(path).expanduser().resolve()
    if path.is_dir():
        raise BundleError(f"--bundle {path} is a folder; name the bundle file to write")
    if not path.parent.is_dir():
        raise BundleError(f"--bundle {path}: folder {path.parent} does not exist")
    return path


def write_points_bundle(root: Path, commit: str, dest: Path) -> int:
    """Write the git bundle of the points of ``commit`` in the project ``root`` to ``dest``
    (module docstring); returns how many points it holds. Nothing is written while no point is
    recorded. BundleError (one line) when git fails; ``dest`` then keeps its previous content."""
    points = experiment_refs(root, commit)
    if not points:
        return 0
    prefix = f"refs/exps/{commit[:2]}/{commit[2:]}/"
    head = git(root, "rev-parse", "HEAD", error=BundleError).strip()
    revs = (["HEAD"] if head == commit else []) + [prefix + name for name in sorted(points)]
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        git(
            root, "bundle", "create", "-q", str(tmp), *revs, "--not", "--remotes", error=BundleError
        )
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return len(points)
