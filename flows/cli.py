"""``hydra-ens``: the command line (typer + rich). Each command parses its options, calls what does
the work and renders what it returns: the checks before a run in :mod:`tasks.runtime.preflight`,
running a flow in :mod:`flows.launch`, the tables in :mod:`flows.render`, the service in
:mod:`tasks.serving.service`. A failure is one ``error:`` line and an exit status: 2 for bad input
(found before anything is written), 1 for a failed run, 3 for a failed gate; Ctrl-C (SIGINT) or
SIGTERM during ``run`` or ``study`` ends it with one line, exit 130 (:mod:`flows.interrupts`):
what finished is kept, and running the command again resumes. Every command works offline and
keeps Prefect's state in the project (:func:`flows.launch.offline_defaults`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from flows.interrupts import INTERRUPTED_RUN, INTERRUPTED_STUDY, interrupts_end_the_run
from flows.launch import offline_defaults

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Hydra Ensembles: the pipeline (Prefect flow over a DVC DAG) and its model registry.",
)
console = Console()
err_console = Console(stderr=True)

Project = Annotated[
    Path, typer.Option("--project", "-C", help="project folder (with dvc.yaml)", show_default=False)
]


def _root(project: Path | None) -> Path:
    """The project folder (``-C``, else the current one); exit 2 with one line when there is no
    such folder (the commands name what they miss in a folder that exists)."""
    root = (project or Path.cwd()).resolve()
    if not root.is_dir():
        _fail(f"{root}: not a project folder (no such folder); give -C PROJECT", 2)
    offline_defaults(root)
    return root


def _fail(msg: str, code: int = 1) -> NoReturn:
    """Print ``error: msg`` and exit ``code``. ``msg`` is plain text, not rich markup: the paths
    and values it names may hold brackets (``proj [v2]/``, ``a[/b]``), which markup would drop
    or fail on. soft_wrap: one error stays one line (greppable), whatever the terminal width."""
    from rich.text import Text

    err_console.print(
        Text.assemble(("error:", "bold red"), f" {msg}"), highlight=False, soft_wrap=True
    )
    raise typer.Exit(code)


def _say(text: str) -> None:
    """Print ``text`` as it is (plain, unwrapped): it names paths and values."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def _note(text: str) -> None:
    """A ``note: ...`` line on stderr, as it is."""
    err_console.print(text, markup=False, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def _exit_on(*errors: type[BaseException], code: int = 1, prefix: str = "") -> Iterator[None]:
    """One of ``errors`` raised inside becomes the one ``error:`` line and exit ``code`` (the CLI
    status a :class:`~flows.launch.FlowFailed` or :class:`~flows.serve_model.ServeError`
    names)."""
    try:
        yield
    except errors as err:
        _fail(prefix + str(err), getattr(err, "exit_code", code))


def _check_allocator() -> None:
    from tasks.runtime.preflight import check_allocator

    with _exit_on(ValueError, code=2):
        check_allocator()


@app.command()
def run(
    project: Project = None,
    params: Annotated[Path | None, typer.Option(help="params file, over the profile")] = None,
    profile: Annotated[str | None, typer.Option(help="default | study | quick")] = None,
    set_: Annotated[list[str], typer.Option("--set", help="KEY=VALUE, repeatable")] = [],  # noqa: B006
    push: Annotated[bool, typer.Option(help="dvc push to the local remote after the run")] = True,
    remeasure: Annotated[
        bool,
        typer.Option(
            "--remeasure", help="measure this machine kind's hardware choices again (hardware/)"
        ),
    ] = False,
) -> None:
    """Run the whole pipeline (Prefect flow over the DVC stages); ends with the gate report.
    Hardware choices (``auto`` precision, compile backend) come from this machine kind's record
    in hardware/, measured once; ``--remeasure`` measures them again and prints what changed."""
    from flows import dvcops
    from flows.dvcops import StageError
    from tasks.gates.kinds import check_kinds
    from tasks.params.base import ConfigError
    from tasks.params.files import write_params
    from tasks.params.schema import load_params
    from tasks.runtime.preflight import resolve_run_params

    root = _root(project)
    _check_allocator()
    # the one line on Ctrl-C, not a silent exit; everything checked before anything is written
    with interrupts_end_the_run(None, INTERRUPTED_RUN), _exit_on(ConfigError, StageError, code=2):
        cfg = resolve_run_params(root, profile, params, set_)
        check_kinds(cfg if cfg is not None else load_params(root / "params.yaml"))
        dvcops.check_project_file(root)
        if cfg is not None:
            write_params(cfg, root / "params.yaml")
        for action in dvcops.ensure_project(root):
            console.print(f"[dim]project:[/] {escape(action)}")
    from flows import render
    from flows.launch import FlowFailed, run_flow
    from flows.pipeline import hydra_pipeline

    with _exit_on(FlowFailed):
        summary, run_log = run_flow(
            root,
            hydra_pipeline,
            "pipeline",
            INTERRUPTED_RUN,
            project_dir=str(root),
            push=push,
            remeasure=remeasure,
        )
    render.print_run_summary(console, summary, run_log.display_path())
    if remeasure:
        changed = summary.get("hardware", {}).get("changed", [])
        for line in changed:
            _say(f"hardware choice changed: {line}")
        if not changed:
            _say("hardware: measured again, no choice changed")
    if summary.get("gate", {}).get("verdict") == "failed":
        raise typer.Exit(3)


@app.command()
def status(project: Project = None) -> None:
    """Which stages are stale (``dvc status``) and which model is in prod (GTO)."""
    from flows import dvcops, render
    from tasks.params.base import ConfigError
    from tasks.params.schema import load_params
    from tasks.release.model_registry import RegistryError, prod_version
    from tasks.runtime.layout import STAGES

    root = _root(project)
    with _exit_on(ConfigError, code=2):
        cfg = load_params(root / "params.yaml")
    with _exit_on(dvcops.StageError):
        stale = dvcops.stale_stages(root) if (root / ".dvc").is_dir() else set(STAGES)
    render.print_stages(console, STAGES, stale)
    name, stage = cfg.promote.model_name, cfg.promote.stage
    with _exit_on(RegistryError, prefix="registry: "):
        prod = prod_version(root, name, stage)
    render.print_prod(console, name, stage, prod)


@app.command()
def predict(
    inputs: Annotated[list[str] | None, typer.Argument(help="texts, or image files")] = None,
    project: Project = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per input")] = False,
    device: Annotated[str | None, typer.Option(help="load the model here on this device")] = None,
    local: Annotated[bool, typer.Option("--local", help="load the model here")] = False,
) -> None:
    """Classify with the prod model: class, probability, entropy, mutual information, member
    disagreement, OOD score and a verdict (ok / uncertain / likely OOD) per input. Asks the
    project's running `hydra-ens serve-model` when there is one (milliseconds), else loads the
    model (seconds)."""
    from flows.render import prediction_table, service_title
    from tasks.serving.client import RequestError, ask_project_service

    root = _root(project)
    answer = None
    if not (local or device or not inputs):
        try:
            answer = ask_project_service(root, list(inputs), _note)
        except RequestError as err:  # a refused input is bad input
            _fail(str(err), 2 if str(err).startswith("inputs") else 1)
    if answer is not None:
        rows, legend, labels = answer["rows"], answer["legend"], answer["verdict_labels"]
        title = service_title(answer)
    else:
        from tasks.params.base import ConfigError
        from tasks.serving.predict import predict_here, validate_inputs

        with _exit_on(ValueError, code=2):
            inputs = validate_inputs(inputs)
        with _exit_on(ConfigError, ValueError):
            (rows, legend, title), labels = predict_here(root, inputs, device), None
    if as_json:
        for r in rows:
            print(json.dumps(r))
        return
    console.print(prediction_table(rows, title, labels))
    console.print(legend, highlight=False, markup=False)  # wrapped at spaces, like the table


@app.command()
def promote(
    project: Project = None,
    force: Annotated[bool, typer.Option("--force", help="promote past a FAILED gate")] = False,
    reason: Annotated[str | None, typer.Option(help="required with --force and --version")] = None,
    version: Annotated[str | None, typer.Option(help="roll the stage back to this vX.Y.Z")] = None,
) -> None:
    """Promote models/bundle if its gate verdict passed and still matches the workspace; or,
    with --version, move the stage back to an earlier version (rollback)."""
    from flows.render import promotion_line
    from tasks.params.base import ConfigError
    from tasks.params.schema import load_params
    from tasks.promote import promote as do_promote
    from tasks.promote import rollback

    root = _root(project)
    if force and version:
        _fail("give --force or --version, not both", 2)
    if (force or version) and not (reason and reason.strip()):
        option = "--force" if force else "--version"
        _fail(f"{option} needs --reason TEXT (recorded in the registry)", 2)
    with _exit_on(ConfigError, ValueError):
        cfg = load_params(root / "params.yaml")
        if version:
            result = rollback(cfg, root, version, reason)
        else:
            result = do_promote(cfg, root, force=force, reason=reason)
    _say(promotion_line(result, reason, rollback=bool(version)))
    if result["promoted"] and not version:
        from flows import dvcops

        console.print(f"[dim]dvc push: {dvcops.push(root)}[/]")
    if not result["promoted"] and result.get("why") == "gate failed":
        raise typer.Exit(3)


@app.command()
def registry(project: Project = None) -> None:
    """List the registered versions: stage, gate verdict, key metrics, reason (forced ones)."""
    from flows.render import print_registry
    from tasks.params.base import ConfigError
    from tasks.params.schema import load_params
    from tasks.release.model_registry import RegistryError, assignments, prod_version, versions

    root = _root(project)
    with _exit_on(ConfigError, RegistryError):
        cfg = load_params(root / "params.yaml")
        name, stage = cfg.promote.model_name, cfg.promote.stage
        rows = versions(root, name)
        history = assignments(root, name, stage)
        current = prod_version(root, name, stage)
    if not rows:
        console.print(f"no {name} version registered yet; run the pipeline (hydra-ens run)")
        return
    print_registry(console, name, stage, rows, history, current)


@app.command()
def serve(
    cron: Annotated[str, typer.Option("--cron", help="cron schedule, e.g. '0 3 * * *'")],
    project: Project = None,
    name: Annotated[str, typer.Option(help="deployment name")] = "scheduled",
    smoke: Annotated[bool, typer.Option("--smoke", help="serve the health-check flow")] = False,
) -> None:
    """Serve a Prefect deployment of the pipeline on a cron schedule (needs PREFECT_API_URL).

    Start the server first: ``prefect server start --host 127.0.0.1`` and
    ``export PREFECT_API_URL=http://127.0.0.1:4200/api``. On another port N, start it with
    ``PREFECT_UI_API_URL=http://127.0.0.1:N/api`` set too: its UI otherwise looks for the API on
    port 4200 ("Can't connect to Server API").
    """
    from flows.launch import FlowFailed, serve_on_cron

    root = _root(project)
    with _exit_on(FlowFailed):
        serve_on_cron(root, cron, name, smoke, _say)


@app.command("serve-model")
def serve_model(
    project: Project = None,
    port: Annotated[int, typer.Option(min=0, max=65535, help="on 127.0.0.1 (0: any free)")] = 8350,
    max_batch: Annotated[int, typer.Option(min=1, help="inputs per forward pass, at most")] = 16,
    max_wait_ms: Annotated[float, typer.Option(min=0, help="wait for others to join")] = 5.0,
    poll: Annotated[float, typer.Option(min=0.05, help="seconds between prod checks")] = 1.0,
    single: Annotated[
        bool, typer.Option("--single", help="serve models/base instead (unregistered, fixed)")
    ] = False,
) -> None:
    """Serve the prod model over HTTP on 127.0.0.1 until Ctrl-C: POST /predict {"inputs":
    [...]} answers with the rows of `predict --json`; GET /health, /version. A promotion or
    rollback is picked up without a restart; `hydra-ens predict` asks this service while it runs.
    """
    from flows.serve_model import ServeError, serve_until_stopped
    from tasks.runtime.stage import set_threads, setup_logging

    root = _root(project)
    setup_logging()
    set_threads()
    with _exit_on(ServeError):
        serve_until_stopped(root, port, max_batch, max_wait_ms, poll, single, _say)


@app.command()
def study(
    spec: Annotated[Path, typer.Argument(help="study spec (YAML: variants x seeds)")],
    project: Project = None,
    workers: Annotated[int, typer.Option(min=1, help="local Dask workers")] = 2,
    cluster: Annotated[str | None, typer.Option(help="a Dask scheduler, tcp://host:8786")] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads per point")] = None,
    git_url: Annotated[str | None, typer.Option(help="where workers clone the project")] = None,
    dvc_remote: Annotated[str | None, typer.Option(help="DVC remote URL for workers")] = None,
    resource: Annotated[
        list[str], typer.Option(help="Dask resource a point needs, e.g. GPU=1; repeatable")
    ] = [],  # noqa: B006
    report_dir: Annotated[Path | None, typer.Option(help="default: reports/studies/NAME/")] = None,
    report_only: Annotated[
        bool, typer.Option("--report-only", help="run nothing: report the points done")
    ] = False,
    gates_from: Annotated[
        Path | None, typer.Option(help="judge every point with the `gates` of this YAML")
    ] = None,
    only: Annotated[
        list[str],
        typer.Option(help="run only the points matching this pattern (v-seed[34]); repeatable"),
    ] = [],  # noqa: B006
    bundle: Annotated[
        Path | None,
        typer.Option(help="git bundle of the finished points, rewritten as each one finishes"),
    ] = None,
) -> None:
    """Run a study: every (variant, seed) point a full pipeline run and a DVC experiment, as
    Prefect tasks on a Dask cluster; then the study report (Markdown + PNG)."""
    from flows import dvcops
    from flows.study.carry import BundleError, check_bundle_path
    from flows.study.spec import check_study
    from tasks.params.base import ConfigError
    from tasks.runtime.preflight import parse_resources

    root = _root(project)
    with _exit_on(dvcops.StageError, code=2):
        dvcops.check_project_file(root)
    if bundle is not None:
        with _exit_on(BundleError, code=2):
            bundle = check_bundle_path(bundle)
    _check_allocator()
    # every point validated before anything starts; the one line on Ctrl-C, not a silent exit
    with interrupts_end_the_run(None, INTERRUPTED_STUDY), _exit_on(ConfigError, code=2):
        gates = check_study(spec, root, gates_from, only)
        resources = parse_resources(resource)
    from flows import render
    from flows.launch import FlowFailed, run_study

    with _exit_on(FlowFailed):
        summary = run_study(
            root,
            spec,
            workers=workers,
            cluster=cluster,
            threads=threads,
            git_url=git_url,
            dvc_remote=dvc_remote,
            resources=resources,
            report_dir=report_dir,
            report_only=report_only,
            gates=gates,
            say=_say,
            note=_note,
            only=only,
            bundle=bundle,
        )
    render.print_study(console, summary, report_only)
    if summary["failed"]:
        raise typer.Exit(1)


@app.command()
def stage(
    name: Annotated[str, typer.Argument(help="stage name (see dvc.yaml)")],
    project: Project = None,
) -> None:
    """Run one stage's logic in-process, as ``python -m tasks.<name>`` does, after the checks
    ``run`` makes before any stage starts (params valid and runnable here, the allocator). What
    it writes is not recorded in ``dvc.lock``, so ``promote`` refuses a bundle built this way
    until ``hydra-ens run`` has recorded it."""
    import importlib

    from tasks.gates.kinds import check_kinds
    from tasks.params.base import ConfigError
    from tasks.params.schema import load_params
    from tasks.runtime.layout import STAGES
    from tasks.runtime.preflight import check_runs_here

    if name not in STAGES:
        _fail(f"unknown stage {name!r}; allowed: {', '.join(STAGES)}", 2)
    root = _root(project)
    _check_allocator()
    with _exit_on(ConfigError, code=2):
        cfg = load_params(root / "params.yaml")
        check_runs_here(cfg)
        check_kinds(cfg)
    os.chdir(root)
    sys.argv = [f"tasks.{name}"]
    importlib.import_module(f"tasks.{name}").main()


@app.command()
def hardware(project: Project = None) -> None:
    """This machine kind's hardware record: its id and file, the decision rule and each stage's
    recorded choice (``hydra-ens run --remeasure`` measures them again)."""
    from tasks.runtime import hardware as hw

    root = _root(project)
    path = hw.record_path(root)
    data = hw.record(root).read()
    _say(f"machine kind: {path.stem}")
    _say(f"record: {path.relative_to(root)}" + ("" if path.is_file() else " (not yet measured)"))
    machine = data.get("machine") or {}
    if machine:
        _say("machine: " + ", ".join(f"{k} {v}" for k, v in machine.items()))
    if rule := (data.get("rule") or {}).get("text"):
        _say(f"rule: {rule}")
    choices = data.get("choices") or {}
    for stage_name in hw.STAGES:
        values = choices.get(stage_name)
        shown = (
            ", ".join(f"{k}: {hw.show(v)}" for k, v in sorted(values.items()))
            if values
            else (hw.UNMEASURED)
        )
        _say(f"  {stage_name}: {shown}")


@app.command()
def demo() -> None:
    """The library example (examples/demo.py): a short MiniLM fine-tune, 3 members, merged,
    single vs Hydra metrics; no Prefect, no DVC."""
    import runpy

    offline_defaults(Path.cwd())
    script = Path(__file__).resolve().parents[1] / "examples" / "demo.py"
    if not script.is_file():
        _fail(f"{script} is not here (the demo ships with the source tree, not the wheel)")
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    app()
