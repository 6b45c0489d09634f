"""Shared test set-up: offline environment, a session-wide ephemeral Prefect server, temp projects.

The environment is fixed at import time (before anything imports Prefect): analytics off, a
per-run ``PREFECT_HOME``, a 120 s server start-up timeout, DVC analytics off, no model hub.

Under pytest-xdist (``addopts``: ``-n 2 --dist loadfile``) every worker imports this file on its
own, so each gets its own ``PREFECT_HOME`` and, on first use, its own Prefect server; a module
never leaves its worker, so module-scoped projects are built once. Each worker gets its share of
the cores (``HYDRA_ENS_THREADS`` / ``OMP_NUM_THREADS``, inherited by every stage subprocess):
oversubscribed OpenMP threads spin and slow every torch op down many times over. The end-to-end
modules are collected first, so that the longest ones start at once on different workers.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="hydra-ens-prefect-")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HYDRA_ENS_PROGRESS", "0")

XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
if XDIST_WORKERS > 1:
    _share = str(max(1, len(os.sched_getaffinity(0)) // XDIST_WORKERS))
    os.environ.setdefault("HYDRA_ENS_THREADS", _share)
    os.environ.setdefault("OMP_NUM_THREADS", _share)
    if "torch" in sys.modules:  # imported before this file (a plugin): OMP_NUM_THREADS came late
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

REPO = Path(__file__).resolve().parents[1]
PROJECT_FILES = ("dvc.yaml", ".dvcignore")
PROJECT_DIRS = ("hydra_ops", "tasks")
#: The longest modules, longest first (each runs whole pipelines); under xdist they are handed out
#: first, the many short modules fill in behind them.
SLOWEST_MODULES = (
    "test_pipeline_text.py",
    "test_pipeline_image.py",
    "test_own_classifier.py",
    "test_study_flow.py",
)


def pytest_collection_modifyitems(config, items):
    """Under xdist, collect :data:`SLOWEST_MODULES` first (a stable sort: the order of the tests
    inside a module, which module fixtures rely on, is kept)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        rank = {name: i for i, name in enumerate(SLOWEST_MODULES)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session")
def prefect_server():
    """One real ephemeral Prefect server (127.0.0.1) for the whole session; yields its API URL."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, check=True, capture_output=True, text=True
    ).stdout


def kill_group(proc: subprocess.Popen) -> None:
    """Whatever is left of ``proc`` (started with ``start_new_session=True``) and its process
    group: SIGKILL if it still runs, then its output collected. For a test's ``finally``."""
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def commit_project(root: Path, message: str) -> None:
    """``git init`` in ``root`` with a test identity, and everything in it as the first commit."""
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "tests@hydra-ens.invalid")
    git(root, "config", "user.name", "hydra-ens tests")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", message)


def make_project(dest: Path, params: dict | None = None) -> Path:
    """A temp copy of the project: dvc.yaml, the code its stages depend on, a resolved params.yaml,
    ``git init`` with an identity and a first commit (GTO tags commits)."""
    import yaml

    from tasks.params import resolve_params, write_params

    dest.mkdir(parents=True, exist_ok=True)
    for name in PROJECT_FILES:
        shutil.copy2(REPO / name, dest / name)
    for name in PROJECT_DIRS:
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    params = dict(params or {})
    profile = params.pop("profile", "quick")
    write_params(resolve_params(profile, params), dest / "params.yaml")
    (dest / ".gitignore").write_text(".hydra-ens/\n.prefect/\n.dvc-remote/\n__pycache__/\n")
    commit_project(dest, "project")
    assert yaml.safe_load((dest / "params.yaml").read_text())["profile"] == profile
    return dest
