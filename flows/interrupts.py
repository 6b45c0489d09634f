"""Ctrl-C (SIGINT) and SIGTERM during ``hydra-ens run`` / ``study``: one line, exit 130.

:func:`interrupts_end_the_run` wraps the command; its signal handler ends the process from the
handler itself (:func:`end_interrupted`), before Prefect sees the signal: Prefect would otherwise
retry the interrupted stage and report the crash to its temporary server, which the same Ctrl-C
stopped, and wait minutes on it. What finished is kept (DVC's cache, finished member and point
units), so running the command again resumes.

The Prefect API is told when it can be: the flow run and its unfinished task runs become
``Crashed`` with the line as their message, and the line reaches the run's logs
(:func:`record_interrupt`, bounded by :data:`RECORD_SECONDS`). That works with a Prefect server
of its own (``PREFECT_API_URL``) and after a SIGTERM to the CLI alone; after a Ctrl-C the
temporary server the CLI started got the signal too and is gone, and the run log file is the
record. So that such a run (or one whose process was killed outright, by the OOM killer say)
does not show as running for ever, each run in progress has a file in :data:`ACTIVE_RUNS`; the
next run of the project marks the runs whose process is gone ``Crashed``
(:func:`mark_abandoned_runs`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from rich.console import Console

if TYPE_CHECKING:
    from flows.runlog import RunLog

#: The one line of an interrupted ``run`` / ``study`` (exit 130).
INTERRUPTED_RUN = (
    "interrupted; run hydra-ens run again to resume (finished stages and members are kept)"
)
INTERRUPTED_STUDY = "interrupted; run hydra-ens study again to resume (finished points are kept)"
#: At most this long is spent telling the Prefect API about an interrupted run.
RECORD_SECONDS = 3.0
#: ``<flow run id>.json`` per run in progress in the project (the pid and start time of the
#: process running it); removed when the command ends, left behind when it was killed.
ACTIVE_RUNS = Path(".hydra-ens/active_runs")
ABANDONED = (
    "abandoned: the hydra-ens process that ran it (pid {pid}) ended without reporting "
    "(killed, or interrupted with its Prefect server); its run log in .hydra-ens/logs has the end"
)

log = logging.getLogger("hydra_ens.cli")

#: The SIGINT/SIGTERM handler of the run in progress (:func:`interrupts_end_the_run`), or None.
_interrupt_handler: Callable[[int, object], None] | None = None
#: The flow run in progress in this process (set by the ``on_running`` hook), or None.
_flow_run: Any = None
#: Its file in :data:`ACTIVE_RUNS`, or None.
_active_file: Path | None = None


def hydra_ens_interrupt_handler(flow: object = None, flow_run: Any = None, *_: object) -> None:
    """The flow's ``on_running`` hook: installs the run's SIGINT/SIGTERM handler, if any, over
    Prefect's own SIGTERM handler (main thread only), and notes the flow run for
    :func:`record_interrupt`, and in :data:`ACTIVE_RUNS` after marking the project's abandoned
    runs (:func:`track_run`). A module-level function, not a closure: the flow (hooks included)
    is pickled to Dask workers with each task of a study, and there it does nothing. Its name is
    :data:`flows.runlog.INTERRUPT_HOOK` (the console hides Prefect's lines about it)."""
    global _flow_run, _active_file
    handler = _interrupt_handler
    if handler is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)
        project = getattr(flow_run, "parameters", {}).get("project_dir")
        if flow_run is not None and project:
            _flow_run = flow_run
            _active_file = track_run(Path(project).resolve(), flow_run.id)


@contextmanager
def interrupts_end_the_run(run_log: RunLog | None, line: str) -> Iterator[Callable[..., None]]:
    """While the command runs, SIGINT and SIGTERM end it at once (:func:`end_interrupted`).

    Before the flow (``run_log`` None: checks, params, ``dvc init``) it is the same line and exit
    130, not Typer's silent exit 130 with the ``dvc`` children left to the terminal's signal.
    Prefect's flow engine puts its own SIGTERM handler in place while a flow runs
    (``capture_sigterm``); the yielded ``on_running`` hook (:func:`hydra_ens_interrupt_handler`)
    puts this one back over it. The handlers before are restored on the way out.
    """
    global _interrupt_handler, _flow_run, _active_file
    from prefect.exceptions import TerminationSignal

    def handler(signum: int, frame: object) -> None:
        end_interrupted(run_log, line, signum)

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    _interrupt_handler = handler
    hydra_ens_interrupt_handler()
    try:
        yield hydra_ens_interrupt_handler
    except (KeyboardInterrupt, TerminationSignal) as err:  # one that came some other way
        end_interrupted(run_log, line, getattr(err, "signal", signal.SIGINT))
    finally:
        if _active_file is not None:
            _active_file.unlink(missing_ok=True)
        _interrupt_handler = _flow_run = _active_file = None
        for signum, old in saved.items():
            signal.signal(signum, old)


def end_interrupted(run_log: RunLog | None, line: str, signum: int) -> NoReturn:
    """End an interrupted run: no new stage starts and nothing is retried
    (:data:`flows.dvcops.INTERRUPTED`), the Prefect API is told (:func:`record_interrupt`), the
    processes the run started are stopped (:func:`flows.dvcops.stop_descendants`; after Ctrl-C
    they got the signal too and are given a few seconds; Dask nannies first stop restarting
    workers, :func:`no_worker_restarts`), logging is silenced
    (:func:`silence_logging`: a study's task threads still log), ``line`` goes to the console (the
    last line it shows) and the run log, and the process exits 130.

    ``os._exit``, not ``sys.exit``: a normal exit runs Prefect's at-exit work (draining its log
    and event workers to the API, joining the task threads), which waits minutes on a temporary
    server just stopped and prints pages of tracebacks. The run log's file and the standard
    streams are flushed first. From the signal on, what Prefect's background workers write to
    ``sys.stderr`` (``--- Error logging to API ---`` once its server is gone) is dropped.
    """
    from rich.markup import escape

    from flows import dvcops

    for s in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C changes nothing
        signal.signal(s, signal.SIG_IGN)
    dvcops.INTERRUPTED.set()
    stderr, sys.stderr = sys.stderr, open(os.devnull, "w")  # noqa: SIM115 (until os._exit)
    said = f"{line} (signal {signal.Signals(signum).name})"
    if run_log is not None:
        run_log.console_filter.silence()  # the task threads' failure reports: the file only
        run_log.error(f"error: {said}")
        run_log.handler.flush()
    recorded = None
    if _flow_run is not None:
        ok, recorded = record_interrupt(_flow_run, said)
        if ok and _active_file is not None:  # else the next run marks it (mark_abandoned_runs)
            _active_file.unlink(missing_ok=True)
    no_worker_restarts()
    stopped = dvcops.stop_descendants(forward=signum != signal.SIGINT)
    if run_log is not None:
        if recorded is not None:
            run_log.note(f"Prefect API: {recorded}")
        run_log.note(f"child processes at the interrupt, stopped: {stopped or 'none'}")
        run_log.handler.flush()
    silence_logging()
    sys.stdout.flush()
    Console(file=stderr).print(
        f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True
    )
    stderr.flush()
    os._exit(130)


def no_worker_restarts() -> None:
    """Tell every Dask nanny of this process (a study's local cluster) not to restart its
    worker: stopping the workers would otherwise have each one restarted, and the scheduler
    would rerun a finished upstream whose result died with the old worker, in a process started
    after the interrupt. A process without ``distributed`` loaded has no nanny."""
    nanny = sys.modules.get("distributed.nanny")
    if nanny is None:
        return
    for each in list(nanny.Nanny._instances):
        each.close_gracefully(reason="hydra-ens interrupted")


def silence_logging(wait: float = 1.0) -> None:
    """No log line after the interrupt's own: logging is disabled, then every handler's lock is
    taken and kept until the process ends (a line another thread is writing finishes first; none
    starts after). A lock held longer than ``wait`` s (a thread stuck writing) is skipped."""
    logging.disable(logging.CRITICAL)
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            if handler.lock is not None:
                handler.lock.acquire(timeout=wait)


def record_interrupt(
    flow_run: Any, message: str, timeout: float = RECORD_SECONDS
) -> tuple[bool, str]:
    """Tell the Prefect API that ``flow_run`` was interrupted: ``message`` as an error line of
    its logs, the flow run and its unfinished task runs ``Crashed`` with ``message``. Gives up
    after ``timeout`` s (a server that went down with the same Ctrl-C). Returns whether it was
    recorded, and what happened in a few words, for the run log."""
    if not _api_listening():
        return False, "not recorded (its server is gone)"
    done: dict[str, tuple[bool, str]] = {}

    def tell() -> None:
        # any failure, expected (the server went away) or not, must still let the process end
        # with its one line: it is reported in the run log, with its traceback, not raised
        try:
            done["result"] = True, _mark_crashed(flow_run, message)
        except Exception as err:
            log.warning("telling the Prefect API about the interrupt failed", exc_info=True)
            done["result"] = False, f"not recorded ({type(err).__name__}: {str(err)[:200]})"

    worker = threading.Thread(target=tell, name="record-interrupt", daemon=True)
    worker.start()
    worker.join(timeout)
    return done.get("result", (False, f"not recorded (no answer within {timeout:g} s)"))


def _api_listening(timeout: float = 0.5) -> bool:
    """Whether the Prefect API's server accepts a connection within ``timeout`` s (the client
    itself retries a refused connection for several seconds)."""
    import socket

    from prefect.client.orchestration import get_client

    url = get_client(sync_client=True).api_url  # not entered: that would call the API
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.host, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def _mark_crashed(flow_run: Any, message: str) -> str:
    from prefect.client.orchestration import get_client
    from prefect.logging.handlers import APILogWorker
    from prefect.logging.loggers import flow_run_logger

    flow_run_logger(flow_run).error(f"error: {message}")
    with get_client(sync_client=True) as client:
        if (unreachable := client.api_healthcheck()) is not None:
            raise unreachable
        tasks = _crash(client, flow_run.id, message)
    APILogWorker.drain_all(timeout=1.0)
    return f"flow run {flow_run.id} and {tasks} unfinished task run(s) marked Crashed"


def track_run(root: Path, flow_run_id: Any) -> Path | None:
    """Mark the project's abandoned runs (:func:`mark_abandoned_runs`), then note this process's
    run ``flow_run_id`` in ``root / ACTIVE_RUNS``; returns its file. The run goes on without
    this bookkeeping when the file cannot be written or the API does not answer (a warning in
    the run log, and None)."""
    import httpx
    import psutil
    from prefect.exceptions import PrefectException

    from tasks.runtime.outputs import write_json

    try:
        marked = mark_abandoned_runs(root)
        if marked:
            log.warning("earlier runs marked Crashed (abandoned): %s", ", ".join(marked))
        record = {"flow_run": str(flow_run_id), "pid": os.getpid(), "started": process_started()}
        return write_json(root / ACTIVE_RUNS / f"{flow_run_id}.json", record)
    except (OSError, psutil.Error, httpx.HTTPError, PrefectException) as err:
        log.warning("could not track the run in %s: %s", ACTIVE_RUNS, err)
        return None


def mark_abandoned_runs(root: Path) -> list[str]:
    """The runs of :data:`ACTIVE_RUNS` whose process is gone: each one still running in the
    Prefect API becomes ``Crashed`` (message :data:`ABANDONED`), and its file is removed.
    Returns the flow run ids marked. A run of another live process is left alone; a file that
    cannot be read, or names a run the API does not know (another server), is removed."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    marked = []
    for path in sorted((root / ACTIVE_RUNS).glob("*.json")):
        try:
            record = json.loads(path.read_text())
            flow_run_id, pid = record["flow_run"], int(record["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)
            continue
        if process_alive(pid, record.get("started")):
            continue
        with get_client(sync_client=True) as client, contextlib.suppress(ObjectNotFound):
            state = client.read_flow_run(flow_run_id).state
            if state is None or not state.is_final():
                _crash(client, flow_run_id, ABANDONED.format(pid=pid))
                marked.append(flow_run_id)
        path.unlink(missing_ok=True)
    return marked


def process_started() -> float:
    """This process's start time, as :func:`process_alive` compares it."""
    import psutil

    return psutil.Process().create_time()


def process_alive(pid: int, started: float | None) -> bool:
    """Whether process ``pid`` runs and is the one that started at ``started`` (a pid the
    system gave to a new process since is not)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        alive = proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        return alive and (started is None or abs(proc.create_time() - float(started)) < 1.0)
    except psutil.Error:
        return False


def _crash(client: Any, flow_run_id: Any, message: str) -> int:
    """Set the flow run and its running or pending task runs ``Crashed`` with ``message``
    (forced: the engine that ran them is gone); returns how many task runs."""
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    unfinished = TaskRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING])
    tasks = client.read_task_runs(
        flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
        task_run_filter=TaskRunFilter(state=TaskRunFilterState(type=unfinished)),
    )
    for task in tasks:
        client.set_task_run_state(task.id, Crashed(message=message), force=True)
    client.set_flow_run_state(flow_run_id, Crashed(message=message), force=True)
    return len(tasks)
