"""The run log of ``hydra-ens run``: everything (tracebacks included) in a file, a quiet console.

:func:`start_run_log` creates ``.hydra-ens/logs/run-<UTC timestamp>.log`` in the project and

* adds a :class:`logging.FileHandler` that keeps every record, with its traceback, to the root
  logger (Prefect's flow- and task-run loggers propagate there) and to the loggers that do not
  propagate (``hydra_ens``, ``prefect._internal``);
* puts a :class:`ConsoleFilter` and a traceback-free formatter on the console handlers Prefect 3
  configured (``PrefectConsoleHandler`` on the root logger, see ``prefect/logging/logging.yml``),
  so the console keeps its progress lines but no traceback and no repeated failure reports: the
  CLI prints the stage's own error line (:func:`error_line`) once, at the end.

Nothing here changes what Prefect sends to its API (the ``api`` handlers run before the console).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from flows.dvcops import StageError, TransientStageError, strip_ansi

LOG_DIR = Path(".hydra-ens/logs")
#: Prefect's run loggers (``logging.yml``); their failure reports are for the file only.
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
#: Loggers that do not propagate to the root logger but whose records the file must keep.
NON_PROPAGATING = ("hydra_ens", "prefect._internal")
# Prefect's console formats (logging.yml, formatter "standard") with the date added
_PREFIX = "%(asctime)s.%(msecs)03d | %(levelname)-7s | "
FILE_FORMAT = _PREFIX + "%(name)s - %(message)s"
FLOW_RUN_FORMAT = _PREFIX + "Flow run %(flow_run_name)r - %(message)s"
TASK_RUN_FORMAT = _PREFIX + "Task run %(task_run_name)r - %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"

# "[stage] line" / "[member 2] line": a line a stage subprocess printed, relayed by the flow
_RELAYED = re.compile(r"^(\[[^\]]+\]) (.*)$", re.DOTALL)
_TB_START = "Traceback (most recent call last):"
_TB_CHAIN = (
    "During handling of the above exception",
    "The above exception was the direct cause",
)
# the stage's own "error: ..." line (tasks.runtime.stage.stage_main) and DVC's "ERROR: failed to
# reproduce ..." after it: the CLI ends with the first, so the console skips both
_ERROR_PREFIXES = ("error: ", "ERROR: ")
#: The name of the CLI's ``on_running`` hook that keeps its SIGINT/SIGTERM handler in place
#: (``flows.interrupts.interrupts_end_the_run``); Prefect's two lines about running it are for
#: the file.
INTERRUPT_HOOK = "hydra_ens_interrupt_handler"
_HOOK_NOTICES = (
    f"Running hook {INTERRUPT_HOOK!r} in response to entering state",
    f"Hook {INTERRUPT_HOOK!r} finished running successfully",
)


def one_line(text: object) -> str:
    """``text`` with every run of whitespace (newlines included) collapsed to one space."""
    return " ".join(str(text).split())


class ConsoleFilter(logging.Filter):
    """Drops, from the console only, what the CLI's final error line and the log file cover.

    * Prefect's failure reports on the run loggers: records with a traceback ("Encountered
      exception during execution", "Task run failed ... Retries are exhausted") and "Finished in
      state X" for any X but Completed/Cached (retry notices stay: they are progress);
    * relayed stage output: a traceback's body (the final ``SomeError: ...`` line stays) and the
      ``error:``/``ERROR:`` lines of a failing stage;
    * Prefect's notices about the CLI's interrupt hook (:data:`INTERRUPT_HOOK`);
    * everything, once :meth:`silence` is called (an interrupted run ends with its one line).

    It remembers, per relayed source (``prepare_data``, ``member 2``), the last error line and
    the last traceback's exception line (:attr:`last_error`, :attr:`last_exception`) for
    :func:`error_line`. It never changes a record (other handlers see it whole).
    """

    def __init__(self) -> None:
        super().__init__("hydra_ens.console")
        self._in_traceback: dict[str, bool] = {}
        self.last_error: dict[str, str] = {}
        self.last_exception: dict[str, str] = {}
        self.silenced = False

    def silence(self) -> None:
        """Drop every record from now on (the file keeps them)."""
        self.silenced = True

    def filter(self, record: logging.LogRecord) -> bool:
        if self.silenced:
            return False
        if record.name.startswith(("prefect.", *RUN_LOGGERS)) and _is_hook_notice(record):
            return False
        if record.name.startswith(RUN_LOGGERS):
            try:
                message = record.getMessage()
            except Exception:  # a malformed record: let the handler report it
                return True
            if record.exc_info or record.exc_text:
                return False
            if message.startswith("Finished in state ") and not message.startswith(
                ("Finished in state Completed", "Finished in state Cached")
            ):
                return False
            return self._relayed(message)
        return True

    def _relayed(self, message: str) -> bool:
        match = _RELAYED.match(message)
        if match is None:
            return True
        source, line = match.groups()
        source, line = source.strip("[]"), strip_ansi(line)
        if line.startswith(_TB_START):
            self._in_traceback[source] = True
            return False
        if self._in_traceback.get(source):
            if line.startswith(" "):
                return False
            self._in_traceback[source] = False
            if line.startswith(_TB_CHAIN):
                return False
            self.last_exception[source] = line.strip()
            return True
        if line.startswith("error: "):
            self.last_error[source] = line[len("error: ") :].strip()
        return not line.startswith(_ERROR_PREFIXES)


def _is_hook_notice(record: logging.LogRecord) -> bool:
    msg = record.msg
    return isinstance(msg, str) and msg.startswith(_HOOK_NOTICES)


class NoTracebackFormatter(logging.Formatter):
    """Formats like ``inner`` but without exception or stack text (the record is restored)."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        try:
            return self.inner.format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


@dataclass
class RunLog:
    """An open run log; :meth:`close` undoes every change :func:`start_run_log` made."""

    path: Path
    handler: logging.FileHandler
    console_filter: ConsoleFilter
    _undo: list = field(default_factory=list)

    def display_path(self) -> str:
        """The log's path relative to the current folder when below it, else absolute."""
        try:
            return str(self.path.relative_to(Path.cwd()))
        except ValueError:
            return str(self.path)

    def note(self, message: str, level: int = logging.INFO) -> None:
        """Write ``message`` to the file only (e.g. the CLI's final error line)."""
        record = logging.LogRecord("hydra_ens.cli", level, __file__, 0, message, None, None)
        self.handler.handle(record)

    def error(self, message: str) -> None:
        """Write ``message`` to the file only, at ERROR level."""
        self.note(message, logging.ERROR)

    def close(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()
        self.handler.close()


def _new_log_file(root: Path, now: datetime) -> Path:
    folder = root / LOG_DIR
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"run-{now.strftime('%Y%m%dT%H%M%SZ')}"
    for n in range(1, 1000):
        path = folder / (f"{stem}.log" if n == 1 else f"{stem}-{n}.log")
        try:
            with open(path, "x", encoding="utf-8"):
                return path
        except FileExistsError:
            continue
    raise RuntimeError(f"cannot create a run log in {folder}: 999 logs named {stem}*")


def _console_handlers() -> list[logging.Handler]:
    """The stream (not file) handlers Prefect's logging config put on the root and on the
    non-propagating loggers that print (``prefect._internal``, ``uvicorn``, ``fastapi``)."""
    found: list[logging.Handler] = []
    for name in (None, "prefect._internal", "uvicorn", "fastapi"):
        for h in logging.getLogger(name).handlers:
            if (
                isinstance(h, logging.StreamHandler)
                and not isinstance(h, logging.FileHandler)
                and h not in found
            ):
                found.append(h)
    return found


def start_run_log(root: Path, now: datetime | None = None) -> RunLog:
    """Open ``<root>/.hydra-ens/logs/run-<UTC>.log`` and route the logs as the module docstring
    says. Call it after Prefect is imported (it makes sure Prefect's logging is configured)."""
    from prefect.logging.configuration import ensure_logging_setup
    from prefect.logging.formatters import PrefectFormatter

    ensure_logging_setup()
    now = now or datetime.now(UTC)
    path = _new_log_file(Path(root), now)
    handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    handler.setLevel(logging.NOTSET)
    handler.setFormatter(
        PrefectFormatter(
            FILE_FORMAT,
            DATE_FORMAT,
            flow_run_fmt=FLOW_RUN_FORMAT,
            task_run_fmt=TASK_RUN_FORMAT,
            defaults={"flow_run_name": "?", "task_run_name": "?"},
        )
    )
    run_log = RunLog(path=path, handler=handler, console_filter=ConsoleFilter())
    undo = run_log._undo

    for logger in (logging.getLogger(), *map(logging.getLogger, NON_PROPAGATING)):
        if logger is logging.getLogger() or not logger.propagate:
            logger.addHandler(handler)
            undo.append(lambda lg=logger: lg.removeHandler(handler))
    ens = logging.getLogger("hydra_ens")
    if ens.level == logging.NOTSET:  # else the root's WARNING would drop its INFO lines
        ens.setLevel(logging.INFO)
        undo.append(lambda: ens.setLevel(logging.NOTSET))

    for h in _console_handlers():
        h.addFilter(run_log.console_filter)
        undo.append(lambda h=h: h.removeFilter(run_log.console_filter))
        old = h.formatter
        h.setFormatter(NoTracebackFormatter(old))
        undo.append(lambda h=h, old=old: h.setFormatter(old))

    run_log.note(
        f"hydra-ens run in {Path(root).resolve()} at {now.isoformat(timespec='seconds')} "
        f"(pid {os.getpid()}): {' '.join(sys.argv)}"
    )
    return run_log


def error_line(err: BaseException, run_log: RunLog | None = None) -> str:
    """One line for a failed pipeline run: the failing stage's own message when there is one.

    A stage's or member's failure (:class:`flows.dvcops.StageError`, ``TransientStageError``)
    carries its fields: the process's own ``error: ...`` line (``message``, from
    ``tasks.runtime.stage.stage_main``) is the line; else the exception line of its traceback (seen
    by the console filter); else the failure with DVC's line (``detail``). Other errors read
    ``pipeline failed: ...``.
    """
    seen = run_log.console_filter if run_log else ConsoleFilter()
    if not isinstance(err, StageError | TransientStageError) or (
        err.stage is None and err.member is None
    ):
        return f"pipeline failed: {one_line(strip_ansi(str(err))) or type(err).__name__}"
    if err.member is not None:
        source = f"member {err.member}"
        detail = err.message or seen.last_error.get(source) or seen.last_exception.get(source)
        return f"{err}: {one_line(detail)}" if detail else str(err)
    if err.message:
        return one_line(err.message)
    crash = seen.last_exception.get(err.stage)
    if crash:
        return f"stage {err.stage} failed: {one_line(crash)}"
    return f"stage {err.stage} failed: {one_line(err.detail)}"
