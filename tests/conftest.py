"""Shared test set-up: offline environment, a session-wide ephemeral Prefect server, temp projects.

The environment is fixed at import time (before anything imports Prefect): analytics off, a
per-run ``PREFECT_HOME``, a 120 s server start-up timeout, DVC analytics off, no model hub.
"""

from __future__ import annotations

import os
import shutil
import subprocess
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

REPO = Path(__file__).resolve().parents[1]
PROJECT_FILES = ("dvc.yaml", ".dvcignore")
PROJECT_DIRS = ("hydra_ops", "tasks")


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
    git(dest, "init", "-q", "-b", "main")
    git(dest, "config", "user.email", "tests@hydra-ens.invalid")
    git(dest, "config", "user.name", "hydra-ens tests")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "project")
    assert yaml.safe_load((dest / "params.yaml").read_text())["profile"] == profile
    return dest
