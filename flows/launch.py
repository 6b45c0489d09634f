"""Running a flow from the CLI (``run``, ``study``): the run log, the interrupt handling, and one
error line for a failed run.

:func:`run_flow` opens the run log (:func:`flows.runlog.start_run_log`: everything in a file, a
quiet console), runs the flow with the CLI's SIGINT/SIGTERM handling (:mod:`flows.interrupts`),
and returns its result (with the log); a failed run raises :class:`FlowFailed`, whose text is the
line the CLI prints (the failing stage's own message, :func:`flows.runlog.error_line`, and where the
full log is).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flows import runlog
from flows.interrupts import INTERRUPTED_STUDY, interrupts_end_the_run


def offline_defaults(root: Path) -> None:
    """Prefect/DVC/HF environment for an offline, project-local run (existing values win): a
    project-local ``PREFECT_HOME`` (``.prefect/``), analytics off, a 120 s server start-up
    timeout; DVC analytics off; no hub access. Set before Prefect is imported."""
    os.environ.setdefault("PREFECT_HOME", str(root / ".prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


class FlowFailed(RuntimeError):
    """A flow run that did not complete: ``str(err)`` is its one line, ``exit_code`` the CLI's
    exit status (2: bad input found inside the flow, 1: a failed run)."""

    def __init__(self, line: str, exit_code: int = 1) -> None:
        super().__init__(line)
        self.exit_code = exit_code


def run_flow(
    root: Path,
    flow: Any,
    what: str,
    interrupted: str,
    *,
    bad_input: tuple[type[BaseException], ...] = (),
    around: contextlib.AbstractContextManager[Any] | None = None,
    **parameters: Any,
) -> tuple[Any, runlog.RunLog]:
    """Run ``flow(**parameters)`` for the project in ``root``; its result and the run log.

    ``what``: what the flow runs (``pipeline``, ``study``) for a run that ended without an
    error; ``interrupted``: the line a Ctrl-C ends the command with; ``bad_input``: errors the flow
    raises for bad input (their own text, exit 2); ``around``: a context the run happens in (a
    study's Prefect API). The failure line is written to the run log too.
    """
    run_log = runlog.start_run_log(root)
    with interrupts_end_the_run(run_log, interrupted) as hook, around or contextlib.nullcontext():
        state = flow.with_options(on_running=[hook])(**parameters, return_state=True)
    if state.is_completed():
        return state.result(), run_log
    try:
        state.result()
    except bad_input as err:
        run_log.error(f"error: {err}")
        raise FlowFailed(str(err), 2) from None
    except Exception as err:  # the stage's own one-line error
        line = runlog.error_line(err, run_log)
    else:
        line = f"{what} ended in state {state.name}"
    run_log.error(f"error: {line}")
    raise FlowFailed(f"{line} (full log: {run_log.display_path()})")


#: What ``serve --cron`` says without a Prefect server to serve on.
NEEDS_PREFECT_SERVER = (
    "serve needs a Prefect server: run `prefect server start --host 127.0.0.1` and "
    "export PREFECT_API_URL=http://127.0.0.1:4200/api (on another port N: start it with "
    "--port N and PREFECT_UI_API_URL=http://127.0.0.1:N/api, and export "
    "PREFECT_API_URL=http://127.0.0.1:N/api)"
)


def serve_on_cron(
    root: Path, cron: str, name: str, smoke: bool, say: Callable[[str], None]
) -> None:
    """Serve a deployment ``name`` of the pipeline (``smoke``: the health-check flow) for the
    project in ``root`` on the ``cron`` schedule, until stopped; ``say`` gets the start line.
    FlowFailed (exit 2) without ``PREFECT_API_URL`` or with a bad cron expression."""
    if "PREFECT_API_URL" not in os.environ:
        raise FlowFailed(NEEDS_PREFECT_SERVER, 2)
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=cron)
    except ValueError:
        raise FlowFailed(
            f"--cron {cron!r} is not a valid cron expression (e.g. '0 3 * * *')", 2
        ) from None
    from flows.pipeline import hydra_pipeline
    from flows.smoke import hydra_smoke

    target = hydra_smoke if smoke else hydra_pipeline
    say(f"serving {target.name}/{name} on cron {cron!r} for {root}")
    target.serve(
        name=name, cron=cron, parameters={"project_dir": str(root)}, print_starting_message=True
    )


def run_study(
    root: Path,
    spec: Path,
    *,
    workers: int,
    cluster: str | None,
    threads: int | None,
    git_url: str | None,
    dvc_remote: str | None,
    resources: dict[str, float],
    report_dir: Path | None,
    report_only: bool,
    gates: list[dict] | None,
    say: Callable[[str], None],
    note: Callable[[str], None],
    only: list[str] | None = None,
    bundle: Path | None = None,
) -> dict[str, Any]:
    """Run the study ``spec`` of the project in ``root`` (:func:`flows.study.flow.hydra_study`) on
    ``workers`` local Dask workers or the scheduler ``cluster`` (``report_only``: no cluster, only
    the report of the points done), with a local Prefect API for local workers
    (:class:`flows.prefect_api.LocalPrefectApi`); its summary. ``threads``: torch threads per
    point (None: the cores over the local workers). ``only``: the points to run, by name pattern.
    ``bundle``: the git bundle of the finished points, rewritten as each finishes.
    FlowFailed as :func:`run_flow` says."""
    import logging

    from flows.prefect_api import LocalPrefectApi
    from flows.study.flow import StudyError, hydra_study, task_runner
    from tasks.params.base import ConfigError

    if threads is None:
        threads = max(1, len(os.sched_getaffinity(0)) // (1 if cluster else workers))
    logging.getLogger("distributed").setLevel(logging.WARNING)  # cluster chatter; the log has it
    flow = hydra_study  # --report-only: nothing to distribute, no cluster
    if not report_only:
        flow = hydra_study.with_options(task_runner=task_runner(workers, cluster))
    api = LocalPrefectApi(cluster, note, lambda url: say(f"Prefect API for the workers: {url}"))
    summary, _ = run_flow(
        root,
        flow,
        "study",
        INTERRUPTED_STUDY,
        bad_input=(StudyError, ConfigError),
        around=api,
        project_dir=str(root),
        spec_path=str(spec.resolve()),
        git_url=git_url,
        dvc_remote=dvc_remote,
        threads=threads,
        report_dir=str(report_dir.resolve()) if report_dir else None,
        resources=resources or None,
        report_only=report_only,
        gates=gates,
        only=only or None,
        bundle=str(bundle) if bundle else None,
        side_by_side=1 if cluster else workers,
    )
    return summary
