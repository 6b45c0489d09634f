"""Warm stage processes (``flows/warm.py``, ``tasks/runtime/warm_server.py``,
``tasks/runtime/warm_client.py``): a stage forked from the warm process behaves as the same
command in a fresh interpreter (output, streams, folder, exit status, signals), dies with what
started it, and anything the server was not started for runs fresh.

The stage is a toy module, ``probe``, in the ``tasks`` package of a temp project; the server
preloads nothing heavy (``preload=("json",)``), so each test takes a fraction of a second.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from flows.warm import ENABLE_VARIABLE, warm_stages, worth_warming

pytestmark = pytest.mark.timeout(120)  # a probe that never answers fails the test, not the suite

PROBE = textwrap.dedent(
    """
    import json, os, signal, sys, time
    mode = sys.argv[1] if len(sys.argv) > 1 else "report"
    if mode == "report":
        print(json.dumps({
            "pid": os.getpid(), "argv": sys.argv[1:], "cwd": os.getcwd(),
            "path0": sys.path[0], "name": __name__, "probe": os.environ.get("PROBE"),
            "stdin": sys.stdin.read(), "umask": os.umask(0o22),
        }), flush=True)
        print("to stderr", file=sys.stderr)
    elif mode == "exit":
        sys.exit(int(sys.argv[2]))
    elif mode == "raise":
        raise RuntimeError("boom in the stage")
    elif mode == "interrupt":
        raise KeyboardInterrupt
    elif mode == "trap":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
        print(os.getpid(), flush=True)
        time.sleep(60)
    elif mode == "sleep":
        print(os.getpid(), flush=True)
        time.sleep(60)
    """
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "__init__.py").write_text("")
    (tmp_path / "tasks" / "probe.py").write_text(PROBE)
    return tmp_path


@pytest.fixture
def served():
    """The environment of a run whose stages a warm process serves, and its summary lines."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    lines: list[str] = []
    with warm_stages(env, log=lines.append, preload=("json",)) as extra:
        assert extra, lines
        yield {**env, **extra}, lines


def probe(env: dict, cwd: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["python", "-m", "tasks.probe", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        **kw,
    )


def spawn(env: dict, cwd: Path, *args: str) -> tuple[subprocess.Popen, int]:
    """A probe that keeps running; with the pid it reports (the process doing the stage's work)."""
    proc = subprocess.Popen(
        ["python", "-m", "tasks.probe", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    return proc, int(proc.stdout.readline())


def gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split()[2]
        except FileNotFoundError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_a_forked_stage_sees_what_a_fresh_process_would(project, served):
    env, _ = served
    fresh_env = {k: v for k, v in env.items() if k != "HYDRA_ENS_STAGE_SERVER"}
    fresh = probe({**fresh_env, "PROBE": "x"}, project, "report", input="in put")
    warm = probe({**env, "PROBE": "x"}, project, "report", input="in put")
    assert fresh.returncode == warm.returncode == 0, warm.stderr
    a, b = yaml.safe_load(fresh.stdout), yaml.safe_load(warm.stdout)
    assert a.pop("pid") != b.pop("pid")
    assert a == b
    assert b["name"] == "__main__" and b["cwd"] == b["path0"] == str(project)
    assert b["stdin"] == "in put" and b["probe"] == "x"
    assert warm.stderr == fresh.stderr == "to stderr\n"


@pytest.mark.parametrize(
    ("args", "code", "said"),
    [
        (("exit", "3"), 3, ""),
        (("exit", "0"), 0, ""),
        (("raise",), 1, "RuntimeError: boom in the stage"),
        (("interrupt",), -signal.SIGINT, "KeyboardInterrupt"),
    ],
)
def test_exit_status_and_errors_are_the_stages(project, served, args, code, said):
    env, _ = served
    result = probe(env, project, *args)
    assert result.returncode == code
    assert said in result.stderr


def test_a_signal_to_the_stage_process_reaches_the_stage(project, served):
    env, _ = served
    proc, pid = spawn(env, project, "trap")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 7  # the stage's own SIGTERM handler chose the status
    assert gone(pid)


def test_an_unhandled_signal_ends_the_stage_process_by_that_signal(project, served):
    env, _ = served
    proc, pid = spawn(env, project, "sleep")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == -signal.SIGINT
    assert gone(pid)


def test_a_killed_stage_process_takes_the_stage_with_it(project, served):
    env, _ = served
    proc, pid = spawn(env, project, "sleep")
    proc.kill()
    proc.wait(timeout=30)
    assert gone(pid)


def test_the_end_of_the_run_stops_the_server_and_its_stages(project):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    lines: list[str] = []
    with warm_stages(env, log=lines.append, preload=("json",)) as extra:
        proc, pid = spawn({**env, **extra}, project, "sleep")
        assert probe({**env, **extra}, project, "exit", "0").returncode == 0
        socket_path = Path(extra["HYDRA_ENS_STAGE_SERVER"])
    assert proc.wait(timeout=30) == -signal.SIGKILL
    assert gone(pid)
    assert not socket_path.exists()
    assert lines == ["warm stages: 2 forked"]


def forked(env: dict, cwd: Path) -> bool:
    """Whether the probe ran in a forked child (else the client became the interpreter)."""
    proc, pid = spawn(env, cwd, "sleep")
    proc.kill()
    proc.wait()
    return pid != proc.pid


def test_an_environment_the_server_was_not_started_with_runs_fresh(project, served):
    env, _ = served
    assert forked(env, project)  # the client only relays; the stage runs in the forked child
    assert not forked({**env, "OMP_NUM_THREADS": "3"}, project)  # torch reads it when imported
    assert not forked({**env, "PYTHONPATH": str(project)}, project)
    assert forked({**env, "HYDRA_ENS_THREADS": "1", "DVC_STAGE": "x"}, project)  # run time only


def test_other_commands_run_in_a_fresh_interpreter(project, served):
    env, _ = served
    code = "import os, sys; print(os.getpid(), sys.argv[1:])"
    proc = subprocess.Popen(
        ["python", "-c", code, "a b"], cwd=project, env=env, stdout=subprocess.PIPE, text=True
    )
    out, _ = proc.communicate(timeout=60)
    assert out.split(" ", 1) == [str(proc.pid), "['a b']\n"]


def test_the_summary_counts_forked_and_fresh_stages(project):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    lines: list[str] = []
    with warm_stages(env, log=lines.append, preload=("json",)) as extra:
        assert probe({**env, **extra}, project, "exit", "0").returncode == 0
        assert probe({**env, **extra, "LD_BIND_NOW": "1"}, project, "exit", "0").returncode == 0
    assert lines == ["warm stages: 1 forked; 1 cold: environment differs: LD_BIND_NOW"]


@pytest.mark.parametrize("value", ["0", "off"])
def test_it_can_be_switched_off(value):
    lines: list[str] = []
    with warm_stages({**os.environ, ENABLE_VARIABLE: value}, log=lines.append) as extra:
        assert extra == {}
    assert lines == [f"warm stages: off ({ENABLE_VARIABLE}={value})"]


def test_only_two_or_more_model_stages_run_as_modules_are_worth_a_server(tmp_path):
    stages = {
        "merge": {"cmd": "python -m tasks.merge"},
        "evaluate": {"cmd": "python -m tasks.evaluate"},
        "gate": {"cmd": "python -m tasks.gate"},
        "calibrate": {"cmd": "python stub.py calibrate"},
    }
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    assert worth_warming(tmp_path, ["merge", "evaluate"])
    assert not worth_warming(tmp_path, ["merge", "gate"])  # gate imports no torch
    assert not worth_warming(tmp_path, ["merge", "calibrate"])  # not `python -m tasks.calibrate`


def test_a_warm_process_that_fails_to_start_leaves_the_stages_fresh(project, tmp_path, monkeypatch):
    from flows import warm

    broken = tmp_path / "broken_server.py"
    broken.write_text("import sys\nsys.exit('cannot listen here')\n")
    monkeypatch.setattr(warm, "SERVER", broken)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    lines: list[str] = []
    with warm_stages(env, log=lines.append, preload=("json",)) as extra:
        assert extra == {}
        assert probe({**env, **extra}, project, "exit", "0").returncode == 0
    assert lines == ["warm stages: the warm process ended with status 1: cannot listen here"]


def test_the_folder_of_a_killed_run_is_removed_by_the_next_one(tmp_path):
    from flows.warm import remove_abandoned

    gone_run, live_run, unowned = (tmp_path / f"hydra-ens-warm-{n}" for n in ("a", "b", "c"))
    for folder in (gone_run, live_run, unowned):
        (folder / "bin").mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import psutil

    (gone_run / "owner").write_text(f"{dead.pid} {time.time() - 5}\n")
    (live_run / "owner").write_text(f"{os.getpid()} {psutil.Process().create_time()}\n")
    assert remove_abandoned(tmp_path) == [gone_run]
    assert not gone_run.exists() and live_run.is_dir() and unowned.is_dir()
