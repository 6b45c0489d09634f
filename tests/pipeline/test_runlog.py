"""flows.runlog: a failed run is one error line (the failing stage's own), the console stays
quiet, the file keeps everything. Driven with hand-made log records (no Prefect server)."""

from __future__ import annotations

import io
import logging
import re
import sys
from pathlib import Path

import pytest

from flows import runlog
from flows.dvcops import StageError

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
