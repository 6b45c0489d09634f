"""flows.interrupts: Ctrl-C or SIGTERM during a run ends it at once with one line and exit 130,
stops what it started and marks the flow run Crashed; a killed run is marked by the next one."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, kill_group

from flows.interrupts import INTERRUPTED_RUN

#: ``tasks/finetune_members.py`` of the project below: each member records its pid, then sleeps.
SLEEPING_MEMBER = """\
import os, sys, time
from pathlib import Path

with open(f"started-{sys.argv[-1]}", "a") as f:
    f.write(f"{os.getpid()}\\n")
time.sleep(300)
"""


def _sleeping_members_project(root: Path) -> Path:
    """A project whose only stage is ``finetune_members`` (Taylor variant: mapped member tasks)
    and whose members sleep: the run is in the member tasks a few seconds after it starts."""
    from conftest import commit_project

    from tasks.params import resolve_params, write_params

    (root / "tasks").mkdir(parents=True)
    (root / "tasks" / "__init__.py").write_text("")
    (root / "tasks" / "finetune_members.py").write_text(SLEEPING_MEMBER)
    (root / "dvc.yaml").write_text(
        "stages:\n  finetune_members:\n    cmd: python -m tasks.finetune_members\n"
        "    outs: [models/members]\n"
    )
    params = {"scoring": {"method": "taylor"}, "members": {"finetune": {"max_parallel": 2}}}
    write_params(resolve_params("quick", params), root / "params.yaml")
    (root / ".gitignore").write_text(".hydra-ens/\n.prefect/\n.dvc-remote/\nstarted-*\n")
    commit_project(root, "project")
    return root


def _start_run_until_members_started(root: Path, env: dict, times: int = 1) -> subprocess.Popen:
    """``hydra-ens run`` of a :func:`_sleeping_members_project`, in its own process group (as a
    shell job has), once both members have started for the ``times``-th time."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", "-C", str(root), "--no-push"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while [p.read_text().count("\n") for p in root.glob("started-*")] != [times, times]:
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"the members did not start: {proc.communicate()}")
        time.sleep(0.2)
    return proc


@pytest.mark.parametrize(
    ("sig", "group"),
    [(signal.SIGINT, True), (signal.SIGTERM, False)],
    ids=["ctrl-c-to-the-group", "sigterm-to-the-cli-only"],
)
def test_an_interrupted_run_ends_at_once_with_one_line_and_exit_130(
    prefect_server, tmp_path, sig, group
):
    """Ctrl-C (SIGINT to the whole process group) or a SIGTERM to the CLI alone while the member
    tasks run: exit 130 within seconds, one error line (also in the run log), no member retried
    (each started once) and none left running (after SIGTERM to the CLI alone, the CLI stopped
    them). Before: Prefect retried the members and the CLI hung for minutes."""
    import psutil

    root = _sleeping_members_project(tmp_path / "proj")
    env = dict(os.environ, HYDRA_ENS_THREADS="1", PREFECT_API_URL=prefect_server)
    proc = _start_run_until_members_started(root, env)
    try:
        pids = [int(p.read_text()) for p in root.glob("started-*")]
        t0 = time.monotonic()
        if group:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        kill_group(proc)
    assert proc.returncode == 130, (out + err)[-4000:]
    assert took < 20, took
    assert INTERRUPTED_RUN.startswith("interrupted; run hydra-ens run again to resume")
    line = f"error: {INTERRUPTED_RUN}"
    assert [ln for ln in err.splitlines() if ln.lower().startswith("error")] == [line], err
    assert err.rstrip().endswith(line) and "Traceback" not in out + err
    assert [p.read_text().count("\n") for p in root.glob("started-*")] == [1, 1]  # no retry

    def running(pid: int) -> bool:  # an ended member the CLI could not reap is a zombie
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    assert not [pid for pid in pids if running(pid)]
    (log,) = (root / ".hydra-ens" / "logs").glob("run-*.log")
    said = f"{INTERRUPTED_RUN} (signal {sig.name})"
    assert f"hydra_ens.cli - error: {said}" in log.read_text()
    # the Prefect server (not the CLI's: it outlives the run) shows the run crashed, and why
    recorded = re.search(r"Prefect API: flow run (\S+) and (\d+) unfinished", log.read_text())
    assert recorded, log.read_text()[-3000:]
    flow_run, tasks, logs = _flow_run_record(recorded.group(1))
    assert flow_run.state.type.value == "CRASHED" and flow_run.state.message == said
    members = [t for t in tasks if t.name.startswith("member")]
    # a member the Ctrl-C reached may have reported its own failure first: none is left running
    ended = {"CRASHED"} if sig == signal.SIGTERM else {"CRASHED", "FAILED"}
    assert members and {t.state.type.value for t in members} <= ended, tasks
    assert f"error: {said}" in [entry.message for entry in logs]


def test_a_run_whose_process_was_killed_is_marked_crashed_by_the_next_run(prefect_server, tmp_path):
    """A run killed outright (SIGKILL: no handler runs, as with the OOM killer) stays "Running" in
    the Prefect API until the next run of the project marks it Crashed (its process is gone);
    the next run's own record is removed when it ends."""
    from flows.interrupts import ACTIVE_RUNS

    root = _sleeping_members_project(tmp_path / "proj")
    env = dict(os.environ, HYDRA_ENS_THREADS="1", PREFECT_API_URL=prefect_server)
    first = _start_run_until_members_started(root, env, times=1)
    (active,) = (root / ACTIVE_RUNS).glob("*.json")
    os.killpg(first.pid, signal.SIGKILL)
    first.communicate()
    flow_run, _, _ = _flow_run_record(active.stem)
    assert flow_run.state.type.value == "RUNNING"
    second = _start_run_until_members_started(root, env, times=2)
    try:
        flow_run, tasks, _ = _flow_run_record(active.stem)
        assert flow_run.state.type.value == "CRASHED", flow_run.state
        assert flow_run.state.message.startswith("abandoned: the hydra-ens process")
        assert {t.state.type.value for t in tasks} == {"CRASHED"}, tasks
        assert not active.exists() and len(list((root / ACTIVE_RUNS).glob("*.json"))) == 1
        os.kill(second.pid, signal.SIGTERM)
        second.communicate(timeout=60)
    finally:
        kill_group(second)
    assert second.returncode == 130 and not list((root / ACTIVE_RUNS).glob("*.json"))


def _flow_run_record(flow_run_id: str) -> tuple:
    """The flow run, its task runs and its log entries as the Prefect API has them."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        LogFilter,
        LogFilterFlowRunId,
    )

    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(flow_run_id)
        runs = FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id]))
        tasks = client.read_task_runs(flow_run_filter=runs)
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run.id])))
    return flow_run, tasks, logs


def test_ctrl_c_while_the_project_is_set_up_is_the_same_one_line_and_exit_130(tmp_path):
    """Ctrl-C before the flow starts (here: while ``dvc init`` / ``dvc remote add`` run for a
    project that has no ``.dvc`` yet) ends like one during the flow: the one line and exit 130
    (before: Typer's exit 130 with nothing said)."""
    import psutil
    from conftest import commit_project

    from tasks.params import resolve_params, write_params

    root = tmp_path / "proj"
    root.mkdir()
    (root / "dvc.yaml").write_text("stages: {}\n")
    write_params(resolve_params("quick"), root / "params.yaml")
    commit_project(root, "project")
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", "-C", str(root), "--no-push"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a shell job has
    )

    def setting_up() -> bool:
        try:
            children = psutil.Process(proc.pid).children()
        except psutil.NoSuchProcess:
            return False
        for child in children:
            try:
                args = child.cmdline()
            except psutil.Error:
                continue
            if any(a.endswith("dvc") for a in args) and {"init", "remote", "config"} & set(args):
                return True
        return False

    try:
        deadline = time.monotonic() + 120
        while not setting_up():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "dvc init did not start"
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        kill_group(proc)
    assert proc.returncode == 130, (out + err)[-4000:]
    assert err.strip() == f"error: {INTERRUPTED_RUN}", (out + err)[-4000:]
    assert "Aborted" not in out + err and not (root / ".hydra-ens" / "logs").exists()


def test_after_silence_logging_no_thread_writes_another_log_line() -> None:
    import io
    import logging
    import threading

    from flows.interrupts import silence_logging

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("hydra_ens.test_silence")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    stop = threading.Event()

    def chatter() -> None:  # a study's task thread, still logging after the interrupt
        while not stop.is_set():
            logger.info("a task's line")

    worker = threading.Thread(target=chatter, daemon=True)
    worker.start()
    try:
        deadline = time.monotonic() + 5
        while "a task's line" not in stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "a task's line" in stream.getvalue()
        silence_logging(wait=1.0)
        written = len(stream.getvalue())
        time.sleep(0.3)
        assert len(stream.getvalue()) == written
    finally:
        logging.disable(logging.NOTSET)
        for each in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
            for h in getattr(each, "handlers", ()):
                while h.lock is not None and h.lock._is_owned():  # taken by silence_logging
                    h.lock.release()
        stop.set()
        worker.join(timeout=5)
        logger.removeHandler(handler)


def test_after_no_worker_restarts_a_nanny_leaves_its_killed_worker_dead() -> None:
    """A study's local cluster: once interrupted, a worker process that is stopped stays
    stopped (its nanny would otherwise start a new one, and the scheduler would rerun finished
    work in it, after the interrupt's line)."""
    import psutil
    from distributed import LocalCluster

    from flows.interrupts import no_worker_restarts

    me = psutil.Process()
    with LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
    ) as cluster:
        (nanny,) = cluster.workers.values()
        worker = psutil.Process(nanny.pid)
        before = {p.pid for p in me.children(recursive=True)}
        no_worker_restarts()
        worker.kill()
        worker.wait(timeout=10)
        time.sleep(3)  # a nanny that restarts does so within a second
        assert {p.pid for p in me.children(recursive=True) if p.is_running()} <= before
        assert nanny.process is None or not nanny.is_alive()
