"""``hydra-ens``: the command line (typer + rich).

Commands: ``run`` (the Prefect flow over the DVC DAG), ``status`` (stale stages, the model in
prod), ``predict`` (the prod model through the registry), ``promote`` (``--force --reason``),
``serve --cron`` (a Prefect deployment on a cron schedule), ``stage NAME`` (one stage, what
``dvc.yaml``'s commands could call), ``demo`` (the library example).

Offline defaults are set before Prefect is imported: a project-local ``PREFECT_HOME``
(``.prefect/``), analytics off, a 120 s server start-up timeout; DVC analytics off; no hub access.
Variables already set in the environment win.

Ctrl-C (SIGINT) or SIGTERM during ``run`` or ``study`` ends the command with one line, exit 130
(:mod:`flows.interrupts`): what finished is kept, and running the command again resumes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flows.interrupts import INTERRUPTED_RUN, INTERRUPTED_STUDY, interrupts_end_the_run

if TYPE_CHECKING:
    from tasks.params import PipelineConfig

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


def offline_defaults(root: Path) -> None:
    """Prefect/DVC/HF environment for an offline, project-local run (existing values win)."""
    os.environ.setdefault("PREFECT_HOME", str(root / ".prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


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

    line = Text.assemble(("error:", "bold red"), f" {msg}")
    err_console.print(line, highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _parse_sets(sets: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items as ``{dotted key: YAML value}``; bad input is one line, exit 2."""
    import yaml

    out = {}
    for item in sets:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail(f"--set {item!r}: expected KEY=VALUE (e.g. members.num_members=3)", 2)
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as err:
            context, problem = getattr(err, "context", None), getattr(err, "problem", None)
            why = ": ".join(filter(None, (context, problem))) or str(err).splitlines()[0]
            _fail(f"--set {item!r}: value is not valid YAML ({why})", 2)
    return out


def resolve_run_params(
    root: Path, profile: str | None, params: Path | None, sets: list[str]
) -> PipelineConfig | None:
    """The ``params.yaml`` that ``run`` is to write, validated; None when no option is given (the
    current file is validated as it is). ConfigError on bad input; nothing is written here.

    ``--profile``/``--params``: defaults, then the profile (given, else the file's ``profile``
    key, else ``default``), then the file. ``--set`` alone edits the current ``params.yaml``,
    keeping its hand edits (:func:`tasks.params.apply_sets`: a new ``data.name`` brings its
    source defaults). The result must also run here (:func:`check_runs_here`: the stages of
    ``run`` run on this machine).
    """
    from tasks.params import (
        ConfigError,
        apply_sets,
        deep_merge,
        load_params,
        read_yaml,
        resolve_params,
    )

    current = root / "params.yaml"
    if profile is None and params is None:
        if not sets:
            check_runs_here(load_params(current))  # validate what is there
            return None
        cfg = apply_sets(read_yaml(current), _parse_sets(sets), root)
    else:
        overrides = read_yaml(params) if params is not None else None
        if overrides is not None and not isinstance(overrides, dict):
            raise ConfigError(f"{params}: <root>: must be a mapping")
        if profile is None:
            profile = (overrides or {}).get("profile", "default")
        overrides = deep_merge(overrides or {}, {"profile": profile})
        cfg = resolve_params(profile, overrides, _parse_sets(sets), root)
    check_runs_here(cfg)
    return cfg


def check_runs_here(cfg: PipelineConfig) -> None:
    """ConfigError when ``cfg`` names what this machine cannot run: a CUDA device it lacks
    (:func:`check_device_here`) or a compile precision the compile stage would refuse here
    (:func:`check_compile_here`)."""
    check_device_here(cfg)
    check_compile_here(cfg)


def check_device_here(cfg: PipelineConfig) -> None:
    """ConfigError naming ``runtime.device`` when it is a CUDA device this machine lacks, before
    any stage starts (else the first model stage would find out after the data stage ran).
    torch is imported only for a ``cuda``/``cuda:N`` spec; ``auto`` and ``cpu`` always resolve."""
    from tasks.params import ConfigError

    spec = cfg.runtime.device.strip()
    if not spec.startswith("cuda"):
        return
    from hydra_ops.runtime import resolve_device

    try:
        resolve_device(spec)
    except ValueError as err:
        raise ConfigError(f"params: runtime.{err}") from None


def check_compile_here(cfg: PipelineConfig) -> None:
    """ConfigError naming ``compile.precision`` when the compile stage would refuse it here with
    ``compile.backend`` (else a CompileError at the end of a run, after every model is trained).

    The rule is :func:`hydra_ops.compile.compile_model`'s for :mod:`tasks.compile`, which loads
    ``models/hydra`` on the CPU, through the library's own checks: whether the precision runs on
    the device the backend compiles on (:func:`hydra_ops.compile.precision.
    precision_unavailable_reason`; ``auto``/``tensorrt``: CUDA when Torch-TensorRT is usable, else
    the CPU; ``inductor``/``export``/``onnxruntime``: the CPU, whatever ``runtime.device`` says),
    then the backend's own precision rule (onnxruntime has no bf16 on the CPU). fp16 thus needs
    Torch-TensorRT on CUDA. ``eager`` compiles nothing and precision ``auto`` picks what runs:
    neither is refused. torch is imported only for an explicit precision.
    """
    backend, precision = cfg.compile.backend, cfg.compile.precision
    if backend == "eager" or precision == "auto":
        return
    import torch

    from hydra_ops.compile.backends import get_backend
    from hydra_ops.compile.backends.tensorrt import tensorrt_unavailable_reason
    from hydra_ops.compile.precision import precision_unavailable_reason
    from tasks.params import ConfigError

    cpu = torch.device("cpu")  # tasks.compile: load_hydra(...) maps the weights to the CPU
    why = None
    if backend in ("auto", "tensorrt"):
        trt = tensorrt_unavailable_reason()
        device = torch.device("cuda") if trt is None else cpu
        if (reason := precision_unavailable_reason(precision, device)) is not None:
            why = f"precision {precision!r} cannot run on {device}: {reason}"
            why += f" (compile.backend {backend!r}: tensorrt unavailable, {trt})" if trt else ""
    elif (reason := precision_unavailable_reason(precision, cpu)) is not None:
        why = f"precision {precision!r} cannot run on cpu: {reason} (compile.backend {backend!r} "
        why += "compiles on the CPU)"
    else:
        chosen = get_backend(backend)
        device = torch.device(chosen.device) if chosen.device is not None else cpu
        if (reason := chosen.precision_reason(precision, device)) is not None:
            why = f"compile.backend {backend!r} cannot run {precision!r} here: {reason}"
    if why is not None:
        raise ConfigError(f"params: compile.precision: {why}; use auto or fp32")


def check_allocator() -> None:
    """Exit 2 with one line when ``HYDRA_ENS_MALLOC`` (the stage processes' allocator,
    :mod:`hydra_ops.allocators`) is unknown or not installed, before anything is written."""
    from hydra_ops.allocators import allocator_env

    try:
        allocator_env()
    except ValueError as err:
        _fail(str(err), 2)


@app.command()
def run(
    project: Project = None,
    params: Annotated[
        Path | None, typer.Option("--params", help="params file (merged over the profile)")
    ] = None,
    profile: Annotated[
        str | None, typer.Option("--profile", help="default | quick (rewrites params.yaml)")
    ] = None,
    set_: Annotated[
        list[str], typer.Option("--set", help="KEY=VALUE override, repeatable (dotted keys)")
    ] = [],  # noqa: B006
    push: Annotated[bool, typer.Option(help="dvc push to the local remote after the run")] = True,
) -> None:
    """Run the whole pipeline (Prefect flow over the DVC stages); ends with the gate report."""
    from flows import dvcops
    from tasks.params import ConfigError, write_params

    root = _root(project)
    check_allocator()
    with interrupts_end_the_run(None, INTERRUPTED_RUN):  # the one line, not a silent exit
        try:  # everything checked before anything is written
            cfg = resolve_run_params(root, profile, params, set_)
            dvcops.check_project_file(root)
        except (ConfigError, dvcops.StageError) as err:
            _fail(str(err), 2)
        if cfg is not None:
            write_params(cfg, root / "params.yaml")
        try:
            for action in dvcops.ensure_project(root):
                console.print(f"[dim]project:[/] {escape(action)}")
        except dvcops.StageError as err:
            _fail(str(err), 2)
    from flows import runlog
    from flows.pipeline import hydra_pipeline

    # the full log (tracebacks included) goes to a file; the console keeps progress + one error
    run_log = runlog.start_run_log(root)
    with interrupts_end_the_run(run_log, INTERRUPTED_RUN) as hook:
        flow = hydra_pipeline.with_options(on_running=[hook])
        state = flow(project_dir=str(root), push=push, return_state=True)
    if not state.is_completed():
        try:
            state.result()
        except Exception as err:  # the stage's own one-line error
            line = runlog.error_line(err, run_log)
        else:
            line = f"pipeline ended in state {state.name}"
        run_log.error(f"error: {line}")
        _fail(f"{line} (full log: {run_log.display_path()})")
    summary = state.result()
    _print_summary(summary)
    console.print(f"[dim]full log: {escape(run_log.display_path())}[/]", soft_wrap=True)
    if summary.get("gate", {}).get("verdict") == "failed":
        raise typer.Exit(3)


def _print_summary(summary: dict[str, Any]) -> None:
    table = Table(title="stages", show_lines=False)
    table.add_column("stage")
    table.add_column("result")
    table.add_column("seconds", justify="right")
    for r in summary["stages"]:
        table.add_row(r["stage"], "ran" if r["ran"] else "up to date", f"{r['seconds']:.1f}")
    console.print(table)
    if "metrics_table" in summary:
        console.print(
            "\n[bold]metrics (calibrated)[/]\n" + escape(summary["metrics_table"]), soft_wrap=True
        )
    if "report" in summary:
        console.print(f"[bold]report:[/] {escape(summary['report'])} (figures and tables)")
    gate = summary.get("gate")
    if gate:
        color = "green" if gate["verdict"] == "passed" else "red"
        console.print(
            f"\n[bold]gate:[/] [{color}]{gate['verdict'].upper()}[/]"
            + (f" (failed: {', '.join(gate['failed'])})" if gate["failed"] else "")
        )
        promo = summary.get("promotion") or {}
        if promo.get("promoted"):
            console.print(
                f"[bold]promoted:[/] {promo['model']}@{promo['version']} -> {promo['stage']}"
            )
        elif promo:
            console.print(f"[bold]not promoted:[/] {promo.get('why')}")
    console.print(f"[dim]total {summary['seconds']:.1f}s[/]")


@app.command()
def status(project: Project = None) -> None:
    """Which stages are stale (``dvc status``) and which model is in prod (GTO)."""
    from flows import dvcops
    from tasks.params import ConfigError, load_params
    from tasks.registry import prod_version

    root = _root(project)
    try:
        cfg = load_params(root / "params.yaml")
    except ConfigError as err:
        _fail(str(err), 2)
    from tasks.layout import STAGES

    try:
        stale = dvcops.stale_stages(root) if (root / ".dvc").is_dir() else set(STAGES)
    except dvcops.StageError as err:
        _fail(str(err))
    for stage in STAGES:
        mark = "[yellow]stale[/]" if stage in stale else "[green]up to date[/]"
        console.print(f"  {stage:<20} {mark}")
    from tasks.registry import RegistryError

    try:
        prod = prod_version(root, cfg.promote.model_name, cfg.promote.stage)
    except RegistryError as err:
        _fail(f"registry: {err}")
    if prod is None:
        console.print(f"{cfg.promote.model_name} {cfg.promote.stage}: [dim]none[/]")
    else:
        f = prod["fields"]
        console.print(
            f"{cfg.promote.model_name} {cfg.promote.stage}: [bold]{prod['version']}[/] "
            f"(commit {prod['commit'][:8]}, gate {f.get('gate', '?')}"
            + (f", reason: {escape(f['reason'])}" if "reason" in f else "")
            + ")",
            soft_wrap=True,
        )


def prediction_table(
    rows: list[dict[str, Any]], title: str, labels: dict[str, str] | None = None
) -> Table:
    """``predict``'s table: one row per input (its first 60 characters), the class, the
    uncertainty numbers and the verdict, in 80 columns: only the input wraps, at spaces (a word
    too long for its column is cut with an ellipsis); class, numbers and headers never wrap.
    ``ood_score`` gets a column unless it is the max-probability score (``msp`` = -prob, the
    legend says so). Inputs, class names and the title are shown as they are (plain text: a
    news text's ``[removed]`` is not console markup). ``labels``: verdict labels (default
    :data:`hydra_ops.ood_thresholds.VERDICT_LABELS`)."""
    from rich import box
    from rich.text import Text

    if labels is None:
        from hydra_ops.ood_thresholds import VERDICT_LABELS as labels
    with_score = any(r.get("ood_score_kind") != "msp" for r in rows)
    table = Table(title=Text(title), box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    table.add_column("input", overflow="ellipsis", min_width=12, ratio=1)
    cols = ["class", "prob", "entropy", "MI", "disagree"]
    cols += ["ood_score"] if with_score else []
    for col in [*cols, "verdict"]:
        table.add_column(
            col, no_wrap=True, justify="left" if col in ("class", "verdict") else "right"
        )
    for r in rows:
        cells = [
            Text(r["input"][:60]),
            Text(str(r["class"])),
            f"{r['prob']:.3f}",
            f"{r['entropy']:.3f}",
            f"{r['mutual_information']:.3f}",
            f"{r['disagreement']:.3f}",
        ]
        cells += [f"{r['ood_score']:.4f}"] if with_score else []
        table.add_row(*cells, labels.get(r["verdict"], "n/a"))
    return table


def _ask_service(root: Path, inputs: list[str]) -> dict[str, Any] | None:
    """The answer of the project's running ``serve-model`` to ``inputs`` (None: none runs or it
    does not answer; a request it refuses exits with its one line)."""
    from flows.service_client import RequestError, ServiceUnavailable, ask, find_service

    service = find_service(root)
    if service is None:
        return None
    sent = inputs
    if service.get("modality") == "image":  # files: the service's folder is not this one's
        sent = [str(Path(x).resolve()) for x in inputs]
    try:
        answer = ask(service["url"], sent)
    except ServiceUnavailable as err:
        err_console.print(
            f"note: the registered service did not answer ({err}); loading the model here",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        return None
    except RequestError as err:
        _fail(str(err), 2 if str(err).startswith("inputs") else 1)
    for row, given in zip(answer["rows"], inputs, strict=True):
        row["input"] = given  # as the user gave it, like a local predict
    return {
        **answer,
        "model": service.get("model"),
        "stage": service.get("stage"),
        "url": service["url"],
    }


@app.command()
def predict(
    inputs: Annotated[
        list[str] | None, typer.Argument(help="texts, or image files (for image models)")
    ] = None,
    project: Project = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="one JSON object per input (docs/pipeline.md, predict)")
    ] = False,
    device: Annotated[
        str | None,
        typer.Option(
            "--device",
            help="where the eager model runs: auto, cpu, cuda, cuda:N (default: params' "
            "runtime.device); loads the model here",
        ),
    ] = None,
    local: Annotated[
        bool,
        typer.Option("--local", help="load the model here even when `serve-model` is running"),
    ] = False,
) -> None:
    """Classify with the prod model: class, probability, entropy, mutual information, member
    disagreement, OOD score and a verdict (ok / uncertain / likely OOD) per input. Asks the
    project's running `hydra-ens serve-model` when there is one (milliseconds), else loads the
    model (seconds)."""
    root = _root(project)
    answer = None if (local or device or not inputs) else _ask_service(root, list(inputs))
    if answer is not None:
        rows, legend, labels = answer["rows"], answer["legend"], answer["verdict_labels"]
        title = (
            f"{answer['model']} {answer['model_version']} ({answer['stage']}), answered by "
            f"{answer['answered_by']} at {answer['url']}; preprocessing: "
            f"{rows[0]['preprocessing']}"
        )
    else:
        from tasks.params import ConfigError, load_params
        from tasks.predict import predict as do_predict
        from tasks.predict import validate_inputs

        try:
            inputs = validate_inputs(inputs)
        except ValueError as err:
            _fail(str(err), 2)
        try:
            cfg = load_params(root / "params.yaml")
            rows, info = do_predict(cfg, root, inputs, device=device)
        except (ConfigError, ValueError) as err:
            _fail(str(err))
        legend, labels = info["legend"], None
        title = (
            f"{cfg.promote.model_name} {info['version']} ({cfg.promote.stage}), answered by "
            f"{rows[0]['answered_by']}; preprocessing: {rows[0]['preprocessing']}"
        )
    if as_json:
        for r in rows:
            print(json.dumps(r))
        return
    console.print(prediction_table(rows, title, labels))
    console.print(legend, highlight=False, markup=False)  # wrapped at spaces, like the table


@app.command()
def promote(
    project: Project = None,
    force: Annotated[
        bool, typer.Option("--force", help="promote past a FAILED gate (never a stale one)")
    ] = False,
    reason: Annotated[
        str | None, typer.Option("--reason", help="required with --force and --version")
    ] = None,
    version: Annotated[
        str | None,
        typer.Option("--version", help="move the stage back to this registered version (vX.Y.Z)"),
    ] = None,
) -> None:
    """Promote models/bundle if its gate verdict passed and still matches the workspace; or,
    with --version, move the stage back to an earlier version (rollback)."""
    from tasks.params import ConfigError, load_params
    from tasks.promote import promote as do_promote
    from tasks.promote import rollback

    root = _root(project)
    if force and version:
        _fail("give --force or --version, not both", 2)
    if (force or version) and not (reason and reason.strip()):
        _fail(
            f"{'--force' if force else '--version'} needs --reason TEXT (recorded in the registry)",
            2,
        )
    try:
        cfg = load_params(root / "params.yaml")
        if version:
            result = rollback(cfg, root, version, reason)
        else:
            result = do_promote(cfg, root, force=force, reason=reason)
    except (ConfigError, ValueError) as err:
        _fail(str(err))
    if result["promoted"]:
        how = (
            f" (rollback from {result['rollback_from']}: {reason})"
            if version
            else (f" (forced: {reason})" if result.get("forced") else "")
        )
        console.print(
            f"promoted {result['model']}@{result['version']} -> {result['stage']}{escape(how)}"
        )
        if not version:
            from flows import dvcops

            console.print(f"[dim]dvc push: {dvcops.push(root)}[/]")
    elif result.get("why") == "already in stage":
        console.print(
            f"not promoted: {result['model']}@{result['version']} is already in stage "
            f"{result['stage']}",
            markup=False,
        )
    else:
        failed = result.get("failed_checks") if result.get("why") == "gate failed" else None
        console.print(
            f"not promoted: {result['why']}"
            + (f" (failed: {', '.join(failed)})" if failed else ""),
            markup=False,
        )
        if result.get("why") == "gate failed":
            raise typer.Exit(3)


@app.command()
def registry(project: Project = None) -> None:
    """List the registered versions: stage, gate verdict, key metrics, reason (forced ones)."""
    from tasks.params import ConfigError, load_params
    from tasks.registry import RegistryError, assignments, prod_version, versions

    root = _root(project)
    try:
        cfg = load_params(root / "params.yaml")
        name, stage = cfg.promote.model_name, cfg.promote.stage
        rows = versions(root, name)
        history = assignments(root, name, stage)
        current = prod_version(root, name, stage)
    except (ConfigError, RegistryError) as err:
        _fail(str(err))
    if not rows:
        console.print(f"no {name} version registered yet; run the pipeline (hydra-ens run)")
        return
    by_commit: dict[str, list[str]] = {}
    for a in history:
        by_commit.setdefault(a["commit"], []).append(f"#{a['n']}")
    table = Table(title=f"{name} versions ({stage}: {current['version'] if current else 'none'})")
    for col in (
        "version",
        stage,
        "gate",
        "id acc",
        "id NLL",
        "id ECE",
        "near-OOD AUROC",
        "registered",
        "reason",
    ):
        table.add_column(col, overflow="fold")
    for v in reversed(rows):
        f = v["fields"]
        try:
            m = json.loads(f.get("metrics", "{}")).get("calibrated", {})
        except json.JSONDecodeError:
            m = {}

        def cell(split: str, metric: str, m=m) -> str:
            value = m.get(split, {}).get(metric)
            return "-" if value is None else f"{value:.4f}"

        held = by_commit.get(v["commit"], [])
        mark = (
            "[bold green]current[/] " if current and current["version"] == v["version"] else ""
        ) + (f"[dim]assigned {' '.join(held)}[/]" if held else "")
        table.add_row(
            v["version"],
            mark or "-",
            f.get("gate", "?"),
            cell("id_test", "accuracy"),
            cell("id_test", "nll"),
            cell("id_test", "ece"),
            cell("near_ood", "auroc"),
            v["created"][:19].replace("T", " "),
            escape(f.get("reason", "")),
        )
    console.print(table)
    for a in history:
        if "rollback" in a["message"] or "forced" in a["message"]:
            console.print(f"[dim]{escape(a['tag'])}: {escape(a['message'])}[/]", soft_wrap=True)


@app.command()
def serve(
    cron: Annotated[str, typer.Option("--cron", help="cron schedule, e.g. '0 3 * * *'")],
    project: Project = None,
    name: Annotated[str, typer.Option(help="deployment name")] = "scheduled",
    smoke: Annotated[
        bool, typer.Option("--smoke", help="serve the tiny health-check flow instead")
    ] = False,
) -> None:
    """Serve a Prefect deployment of the pipeline on a cron schedule (needs PREFECT_API_URL).

    Start the server first: ``prefect server start --host 127.0.0.1`` and
    ``export PREFECT_API_URL=http://127.0.0.1:4200/api``. On another port N, start it with
    ``PREFECT_UI_API_URL=http://127.0.0.1:N/api`` set too: its UI otherwise looks for the API on
    port 4200 ("Can't connect to Server API").
    """
    root = _root(project)
    if "PREFECT_API_URL" not in os.environ:
        _fail(
            "serve needs a Prefect server: run `prefect server start --host 127.0.0.1` and "
            "export PREFECT_API_URL=http://127.0.0.1:4200/api (on another port N: start it with "
            "--port N and PREFECT_UI_API_URL=http://127.0.0.1:N/api, and export "
            "PREFECT_API_URL=http://127.0.0.1:N/api)",
            2,
        )
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=cron)
    except ValueError:
        _fail(f"--cron {cron!r} is not a valid cron expression (e.g. '0 3 * * *')", 2)
    from flows.pipeline import hydra_pipeline
    from flows.smoke import hydra_smoke

    target = hydra_smoke if smoke else hydra_pipeline
    console.print(f"serving {target.name}/{name} on cron {cron!r} for {root}", markup=False)
    target.serve(
        name=name, cron=cron, parameters={"project_dir": str(root)}, print_starting_message=True
    )


@app.command("serve-model")
def serve_model(
    project: Project = None,
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="port on 127.0.0.1 (0: any free one)")
    ] = 8350,
    max_batch: Annotated[
        int, typer.Option("--max-batch", min=1, help="inputs per forward pass, at most")
    ] = 16,
    max_wait_ms: Annotated[
        float,
        typer.Option("--max-wait-ms", min=0, help="how long a request waits for others to join"),
    ] = 5.0,
    poll: Annotated[
        float,
        typer.Option("--poll", min=0.05, help="seconds between two looks for a new prod version"),
    ] = 1.0,
    single: Annotated[
        bool,
        typer.Option(
            "--single",
            help="serve the project's single model (models/base) instead, for comparisons: "
            "not registered for predict, never reloaded",
        ),
    ] = False,
) -> None:
    """Serve the prod model over HTTP on 127.0.0.1 until Ctrl-C: POST /predict {"inputs":
    [...]} answers with the rows of `predict --json`; GET /health, /version. A promotion or
    rollback is picked up without a restart; `hydra-ens predict` asks this service while it runs.
    """
    import signal

    from flows.serve_model import PredictionService, register, unregister
    from tasks.params import ConfigError
    from tasks.prod_model import (
        ModelHolder,
        load_prod_snapshot,
        load_single_snapshot,
        stage_fingerprint,
    )
    from tasks.stage import set_threads, setup_logging

    root = _root(project)
    setup_logging()
    set_threads()
    try:
        if single:
            holder = ModelHolder(lambda: load_single_snapshot(root))
        else:
            holder = ModelHolder(
                lambda: load_prod_snapshot(root), lambda: stage_fingerprint(root), poll
            )
    except (ConfigError, ValueError, OSError) as err:
        _fail(str(err))
    cfg = holder.current.cfg
    info = {"model": cfg.promote.model_name, "stage": cfg.promote.stage, "project": str(root)}
    info["modality"] = cfg.modality  # image inputs are files: predict sends absolute paths
    try:
        service = PredictionService(holder, port, max_batch, max_wait_ms, info)
    except OSError as err:
        holder.close()
        _fail(f"--port {port}: cannot listen on 127.0.0.1:{port} ({err.strerror or err})", 2)
    if not single:
        register(root, service.url, info)

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    snap = holder.current
    what = "the single model" if single else f"{info['model']}@{snap.version} ({info['stage']})"
    console.print(
        f"serving {what}, answered by {snap.answered_by}, at {service.url} (Ctrl-C stops)\n"
        f'  curl -s {service.url}/predict -d \'{{"inputs": ["some text"]}}\'',
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    try:
        service.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        if not single:
            unregister(root)
        service.close()
    console.print("stopped", markup=False)


@app.command()
def study(
    spec: Annotated[Path, typer.Argument(help="study spec (YAML: variants x seeds)")],
    project: Project = None,
    workers: Annotated[
        int, typer.Option("--workers", min=1, help="local Dask workers (ignored with --cluster)")
    ] = 2,
    cluster: Annotated[
        str | None,
        typer.Option("--cluster", help="an existing Dask scheduler, e.g. tcp://host:8786"),
    ] = None,
    threads: Annotated[
        int | None,
        typer.Option("--threads", min=1, help="torch threads per point (default: cores/workers)"),
    ] = None,
    git_url: Annotated[
        str | None,
        typer.Option("--git-url", help="where workers clone the project (default: its folder)"),
    ] = None,
    dvc_remote: Annotated[
        str | None,
        typer.Option("--dvc-remote", help="DVC remote URL for workers (default: the project's)"),
    ] = None,
    resource: Annotated[
        list[str],
        typer.Option("--resource", help="Dask resource each point needs, e.g. GPU=1; repeatable"),
    ] = [],  # noqa: B006
    report_dir: Annotated[
        Path | None,
        typer.Option("--report-dir", help="default: reports/studies/<name>/"),
    ] = None,
    report_only: Annotated[
        bool,
        typer.Option(
            "--report-only", help="run nothing: report the points already done, list the rest"
        ),
    ] = False,
    gates_from: Annotated[
        Path | None,
        typer.Option(
            "--gates-from",
            help="judge every point and baseline with the `gates` of this YAML (a params.yaml)",
        ),
    ] = None,
) -> None:
    """Run a study: every (variant, seed) point a full pipeline run and a DVC experiment, as
    Prefect tasks on a Dask cluster; then the study report (Markdown + PNG)."""
    from flows import dvcops
    from tasks.params import ConfigError
    from tasks.study_spec import load_study, study_points

    root = _root(project)
    try:
        dvcops.check_project_file(root)
    except dvcops.StageError as err:
        _fail(str(err), 2)
    check_allocator()
    with interrupts_end_the_run(None, INTERRUPTED_STUDY):  # the one line, not a silent exit
        try:  # every point validated before anything starts
            study_points(load_study(spec), spec.resolve().parent, root / "dvc.yaml")
        except ConfigError as err:
            _fail(str(err), 2)
    gates = _gates_from(gates_from) if gates_from else None
    resources: dict[str, float] = {}
    for item in resource:
        key, sep, value = item.partition("=")
        try:
            resources[key.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep or not key.strip():
            _fail(f"--resource {item!r}: expected NAME=AMOUNT (e.g. GPU=1)", 2)
    if threads is None:
        threads = max(1, len(os.sched_getaffinity(0)) // (1 if cluster else workers))
    from flows import runlog
    from flows.study import StudyError, hydra_study, task_runner

    run_log = runlog.start_run_log(root)
    import logging

    logging.getLogger("distributed").setLevel(logging.WARNING)  # cluster chatter; the log has it
    if report_only:  # nothing to distribute: no cluster
        flow = hydra_study
    else:
        flow = hydra_study.with_options(task_runner=task_runner(workers, cluster))
    with interrupts_end_the_run(run_log, INTERRUPTED_STUDY) as hook, _prefect_api(cluster) as api:
        flow = flow.with_options(on_running=[hook])
        if api:
            console.print(f"[dim]Prefect API for the workers: {api}[/]")
        state = flow(
            project_dir=str(root),
            spec_path=str(spec.resolve()),
            git_url=git_url,
            dvc_remote=dvc_remote,
            threads=threads,
            report_dir=str(report_dir.resolve()) if report_dir else None,
            resources=resources or None,
            report_only=report_only,
            gates=gates,
            return_state=True,
        )
    if not state.is_completed():
        try:
            state.result()
        except (StudyError, ConfigError) as err:
            _fail(str(err), 2)
        except Exception as err:
            line = runlog.error_line(err, run_log)
            _fail(f"{line} (full log: {run_log.display_path()})")
        _fail(f"study ended in state {state.name}")
    summary = state.result()
    table = Table(title=f"study {summary['study']} at {summary['commit'][:8]}")
    for col in ("point", "result", "seconds"):
        table.add_column(col)
    for name in summary["up_to_date"]:
        table.add_row(name, "up to date", "-")
    for name, info in summary["points"].items():
        table.add_row(name, "ran", f"{info['seconds']:.0f}")
    for name, why in summary["failed"].items():
        table.add_row(name, f"[red]failed[/]: {escape(why)}", "-")
    for name in summary["missing"]:
        table.add_row(name, "[yellow]missing[/] (not run: --report-only)", "-")
    console.print(table)
    reuse = summary["reuse"]
    if report_only:
        console.print(
            f"report only: {len(summary['up_to_date'])} points done, "
            f"{len(summary['missing'])} missing (run without --report-only to compute them)"
        )
    else:
        console.print(
            f"{reuse['points']} points shared {reuse['upstreams']} upstream(s); reuse saved "
            f"{reuse['saved_seconds'] / 60:.1f} min of compute; "
            f"wall {summary['seconds'] / 60:.1f} min"
        )
    if summary.get("report"):
        console.print(f"report: {summary['report']}", markup=False, soft_wrap=True)
    if summary["failed"]:
        raise typer.Exit(1)


def _gates_from(path: Path) -> list[dict]:
    """The ``gates`` list of a YAML file, every check validated; bad input is one line, exit 2."""
    import yaml
    from pydantic import ValidationError

    from tasks.params import GateCheck

    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        _fail(f"--gates-from {path}: cannot read it ({str(err).splitlines()[0]})", 2)
    gates = raw.get("gates") if isinstance(raw, dict) else None
    if not isinstance(gates, list) or not gates:
        _fail(f"--gates-from {path}: no `gates:` list in it", 2)
    for i, g in enumerate(gates):
        try:
            GateCheck.model_validate(g)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            _fail(f"--gates-from {path}: gates[{i}].{where}: {first['msg']}", 2)
    return gates


class _prefect_api:
    """A local Prefect server for a study whose workers are local processes (they inherit its
    URL); nothing when ``PREFECT_API_URL`` is set (remote workers need it set too)."""

    def __init__(self, cluster: str | None):
        self.cluster, self.server = cluster, None

    def __enter__(self) -> str | None:
        if os.environ.get("PREFECT_API_URL"):
            return None
        if self.cluster:
            err_console.print(
                "note: PREFECT_API_URL is not set; remote workers will report to their own "
                "Prefect API (docs/study.md: running on a cluster)",
                soft_wrap=True,
            )
        from prefect.server.api.server import SubprocessASGIServer
        from prefect.settings import PREFECT_API_URL, temporary_settings

        self.server = SubprocessASGIServer()
        self.server.start(timeout=120)
        os.environ["PREFECT_API_URL"] = self.server.api_url  # for the worker processes
        self.settings = temporary_settings(updates={PREFECT_API_URL: self.server.api_url})
        self.settings.__enter__()
        return self.server.api_url

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            from prefect.logging.handlers import APILogWorker

            APILogWorker.drain_all(timeout=5)  # the run's last log lines, while it still listens
            self.settings.__exit__(*exc)
            self.server.stop()
            os.environ.pop("PREFECT_API_URL", None)


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

    from tasks.layout import STAGES
    from tasks.params import ConfigError, load_params

    if name not in STAGES:
        _fail(f"unknown stage {name!r}; allowed: {', '.join(STAGES)}", 2)
    root = _root(project)
    check_allocator()
    try:
        check_runs_here(load_params(root / "params.yaml"))
    except ConfigError as err:
        _fail(str(err), 2)
    os.chdir(root)
    sys.argv = [f"tasks.{name}"]
    importlib.import_module(f"tasks.{name}").main()


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
