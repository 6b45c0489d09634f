"""A failing stage ends ``hydra-ens run`` with its one error line; the full log is in a file.

The end-to-end test runs the real CLI on a project whose data cannot train a classifier (a
one-class CSV), so it fails in ``prepare_data`` within seconds; the unit tests drive
:mod:`flows.runlog` with hand-made log records (no Prefect server).
"""

from __future__ import annotations

import io
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, kill_group, make_project

from flows import runlog
from flows.dvcops import StageError
from flows.interrupts import INTERRUPTED_RUN

LOG_NAME = re.compile(r"\(full log: (\S*\.hydra-ens/logs/run-\d{8}T\d{6}Z(?:-\d+)?\.log)\)$")


def cli(*args: str) -> subprocess.CompletedProcess:
    """``hydra-ens ARGS`` as a real process against the session's Prefect server."""
    from prefect.settings import PREFECT_API_URL

    env = dict(os.environ, HYDRA_ENS_THREADS="1")
    if PREFECT_API_URL.value():
        env["PREFECT_API_URL"] = PREFECT_API_URL.value()
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_bad_data_ends_the_run_with_one_error_line_and_a_full_log(prefect_server, tmp_path):
    data = tmp_path / "one_class.csv"
    rows = [f"message number {i},{'ham' if i >= 12 else 'spam'}\n" for i in range(15)]
    data.write_text("text,label\n" + "".join(rows))  # one ID class once 'ham' is near-OOD
    root = make_project(tmp_path / "proj")
    sets = ["--set", "data.name=csv", "--set", f"data.path={data}"]
    r = cli("run", "-C", str(root), *sets, "--set", "data.near_ood_classes=[ham]")
    output = r.stdout + r.stderr
    assert r.returncode == 1, output[-4000:]
    assert "Traceback" not in output
    assert "| ERROR" not in output  # Prefect's failure reports stay in the file
    mentions = [ln for ln in output.splitlines() if "in-distribution class" in ln]
    errors = [ln for ln in r.stderr.splitlines() if ln.lower().startswith("error")]
    assert len(mentions) == 1 and errors == mentions, output[-4000:]
    line = errors[0]
    assert line.startswith("error: stage prepare_data: data source 'csv'")
    assert "only 1 in-distribution class ['spam']" in line and str(data) in line
    match = LOG_NAME.search(line)
    assert match, line
    log_file = Path(match.group(1))
    log_file = log_file if log_file.is_absolute() else REPO / log_file
    assert log_file.parent == root / ".hydra-ens" / "logs" and log_file.is_file()
    text = log_file.read_text()
    assert "Traceback (most recent call last)" in text  # Prefect's, kept in full
    assert "StageError" in text
    assert "Task run 'prepare_data' - [prepare_data] error: stage prepare_data" in text
    assert "hydra_ens.cli - " + line[: match.start()].rstrip() in text  # the CLI's last word


# ---- flows.runlog without a server ----

STAGE_ERROR = StageError.from_output(
    [
        "error: stage prepare_data: data source 'csv' ('d.csv'): only 1 in-distribution class "
        "['spam']; a classifier needs at least 2",
        "ERROR: failed to reproduce 'prepare_data': failed to run: python -m tasks.prepare_data, "
        "exited with 1",
    ],
    255,
    stage="prepare_data",
)


def _record(name: str, msg: str, level: int = logging.INFO, exc: bool = False, **extra):
    exc_info = None
    if exc:
        try:
            raise STAGE_ERROR
        except StageError:
            exc_info = sys.exc_info()
    record = logging.LogRecord(name, level, __file__, 1, msg, None, exc_info)
    record.__dict__.update(extra)
    return record


def test_error_line_is_the_stage_own_message():
    assert runlog.error_line(STAGE_ERROR) == (
        "stage prepare_data: data source 'csv' ('d.csv'): only 1 in-distribution class "
        "['spam']; a classifier needs at least 2"
    )
    assert runlog.error_line(RuntimeError("server\nwent away")) == (
        "pipeline failed: server went away"
    )
    dvc_only = StageError.from_output(["ERROR: failed to reproduce 'merge'"], 1, stage="merge")
    assert runlog.error_line(dvc_only) == "stage merge failed: ERROR: failed to reproduce 'merge'"


def test_console_filter_hides_tracebacks_and_failure_reports_and_remembers_the_crash():
    f = runlog.ConsoleFilter()
    shown = [
        r.getMessage()
        for r in [
            _record("prefect.task_runs", "[finetune_base] > python -m tasks.finetune_base"),
            _record("prefect.task_runs", "[finetune_base] Traceback (most recent call last):"),
            _record("prefect.task_runs", '[finetune_base]   File "tasks/finetune_base.py"'),
            _record("prefect.task_runs", "[finetune_base]     boom()"),
            _record("prefect.task_runs", "[finetune_base] RuntimeError: boom"),
            _record(
                "prefect.task_runs", "[finetune_base] \x1b[31mERROR\x1b[39m: failed to reproduce"
            ),
            _record("prefect.task_runs", "[member 1] error: stage finetune_members: bad lr"),
            _record("prefect.task_runs", "Finished in state Failed('x')", logging.ERROR),
            _record("prefect.task_runs", "Finished in state Completed()"),
            _record("prefect.task_runs", "Task run failed - Retry 1/2 will start 3 second(s)"),
            _record("prefect.flow_runs", "Encountered exception", logging.ERROR, exc=True),
            _record("prefect.flow_runs", "Finished in state Failed('x')"),
            _record("prefect", "Starting temporary server"),
        ]
        if f.filter(r)
    ]
    assert shown == [
        "[finetune_base] > python -m tasks.finetune_base",
        "[finetune_base] RuntimeError: boom",
        "Finished in state Completed()",
        "Task run failed - Retry 1/2 will start 3 second(s)",
        "Starting temporary server",
    ]
    log = runlog.RunLog(Path("x.log"), logging.NullHandler(), f)  # type: ignore[arg-type]
    crash = StageError.from_output(["ERROR: failed to reproduce 'x'"], 1, stage="finetune_base")
    assert runlog.error_line(crash, log) == "stage finetune_base failed: RuntimeError: boom"
    member = StageError.from_output([], 1, member=1)
    assert runlog.error_line(member, log) == (
        "member 1 failed (exit 1): stage finetune_members: bad lr"
    )


@pytest.fixture
def console():
    """A stream handler on the root logger, standing in for Prefect's console handler."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s - %(message)s"))
    logging.getLogger().addHandler(handler)
    yield handler, stream
    logging.getLogger().removeHandler(handler)


def test_run_log_keeps_everything_in_the_file_and_the_console_quiet(tmp_path, console):
    handler, stream = console
    old_formatter = handler.formatter
    log = runlog.start_run_log(tmp_path)
    try:
        assert log.path.parent == tmp_path / ".hydra-ens" / "logs"
        assert re.fullmatch(r"run-\d{8}T\d{6}Z\.log", log.path.name)
        root = logging.getLogger()
        root.handle(_record("prefect", "server is up"))
        root.handle(_record("prefect", "client hiccup", logging.WARNING, exc=True))
        root.handle(
            _record(
                "prefect.flow_runs",
                "Encountered exception during execution",
                logging.ERROR,
                exc=True,
                flow_run_name="brave-fox",
            )
        )
        root.handle(
            _record("prefect.task_runs", "[prepare_data] start", task_run_name="prepare_data")
        )
        logging.getLogger("hydra_ens").info("stage prepare_data: start")
        log.error("error: stage prepare_data: bad data")
        again = runlog.start_run_log(tmp_path)  # same second: a new file, not the same one
        again.close()
        assert again.path != log.path and again.path.is_file()
    finally:
        log.close()
    shown = stream.getvalue()
    assert "Traceback" not in shown and "Encountered exception" not in shown
    assert "server is up" in shown and "client hiccup" in shown
    assert "[prepare_data] start" in shown
    text = log.path.read_text()
    assert text.count("Traceback (most recent call last)") == 2
    assert "Flow run 'brave-fox' - Encountered exception during execution" in text
    assert "Task run 'prepare_data' - [prepare_data] start" in text
    assert "hydra_ens - stage prepare_data: start" in text
    assert text.rstrip().endswith("hydra_ens.cli - error: stage prepare_data: bad data")
    # close() undid everything: the console shows tracebacks again, the file gets nothing more
    assert handler.formatter is old_formatter and not handler.filters
    logging.getLogger().handle(_record("prefect", "after close", logging.WARNING, exc=True))
    assert "Traceback" in stream.getvalue() and "after close" not in log.path.read_text()


def test_console_filter_drops_the_interrupt_hook_notices_and_everything_once_silenced():
    """Prefect's two lines about the CLI's ``on_running`` hook are for the file; the hook pickles
    by reference (a study's flow goes to its Dask workers with each task)."""
    import pickle

    from flows import interrupts

    assert interrupts.hydra_ens_interrupt_handler.__name__ == runlog.INTERRUPT_HOOK
    assert pickle.loads(pickle.dumps(interrupts.hydra_ens_interrupt_handler)) is (
        interrupts.hydra_ens_interrupt_handler
    )
    f = runlog.ConsoleFilter()
    hook = runlog.INTERRUPT_HOOK
    records = [
        _record("prefect.engine", f"Running hook {hook!r} in response to entering state 'Running'"),
        _record("prefect.flow_runs", f"Hook {hook!r} finished running successfully"),
        _record("prefect.engine", "Running hook 'notify' in response to entering state 'Running'"),
        _record("prefect.task_runs", "[prepare_data] start"),
    ]
    assert [r.getMessage() for r in records if f.filter(r)] == [
        "Running hook 'notify' in response to entering state 'Running'",
        "[prepare_data] start",
    ]
    f.silence()
    assert not any(f.filter(r) for r in records)
    assert not f.filter(_record("prefect._internal", "Service 'APILogWorker' failed"))


# ---- an interrupted run (Ctrl-C, SIGTERM) ----

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
