"""The Prefect flow ``hydra-study``: every (variant, seed) point of a study as a Prefect task on a
Dask cluster (prefect-dask), each a DVC experiment; then the study report.

* The cluster is a ``distributed.LocalCluster`` of ``workers`` processes by default, or an
  existing scheduler (``cluster="tcp://host:8786"``) whose workers may sit on other machines: one
  code path, the only difference is who started the cluster.
* Shared work (a seed's data, base fine-tune, Deep Ensemble and the baselines' logits) is one
  upstream task per :func:`flows.study.spec.upstream_key`; the points of that key wait for it, so
  two workers never compute it at once, and reuse its outputs through the DVC remote. At a new
  commit an upstream starts from the stored one of an earlier commit: only the shared stages whose
  code, data or params changed are recomputed.
* A worker that dies mid-point: Dask reruns the point on another worker (a fresh clone; the dead
  one's clone never pushed, so nothing half-written is recorded). A point that fails for a real
  reason is reported with its one error line; the others go on.
* A rerun recomputes only missing or stale points (:func:`flows.study.points.fresh_points`).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.futures import PrefectFuture

from flows import dvcops
from flows.study.carry import BundleError, write_points_bundle
from flows.study.estimate import estimate_left, whole_runs
from flows.study.points import (
    PointJob,
    earlier_upstream,
    fetch_experiments,
    fresh_points,
    read_point,
    run_point,
    run_upstream,
)
from flows.study.report import load_point, write_study_report
from flows.study.spec import (
    SHARED_STAGES,
    StudyPoint,
    load_study,
    select_points,
    study_points,
)
from tasks.params import GateCheck
from tasks.release.git_repo import git
from tasks.runtime.outputs import write_json

#: Project files a point does not take from the commit: it writes its own params, lock and
#: hardware choices (from the committed hardware record, :mod:`tasks.runtime.hardware`), and sets
#: up DVC itself (its remote comes from the study).
_POINT_OWNED = ("params.yaml", "dvc.lock", ".dvcignore", ".dvc/", "hardware/choices.yaml")


class StudyError(RuntimeError):
    """A study cannot start (dirty tree, no remote, bad spec); one line."""


@task(
    name="study-upstream",
    task_run_name="upstream-{key}",
    retries=1,
    retry_condition_fn=dvcops.retry_if_transient,
)
def upstream_task(job: PointJob, key: str) -> dict[str, Any]:
    """The shared stages of one upstream key; a failure is returned (``{"error": line}``), so
    its points can report it instead of never starting."""
    logger = get_run_logger()
    try:
        result = run_upstream(job, lambda line: logger.info("[upstream %s] %s", key, line))
    except dvcops.TransientStageError:
        raise
    except Exception as err:
        logger.error("upstream %s failed: %s", key, _one_line(err))
        return {"error": _one_line(err)}
    logger.info("upstream %s done in %.1fs", key, result["seconds"])
    return result


@task(
    name="study-point",
    task_run_name="{job.name}",
    retries=1,
    retry_condition_fn=dvcops.retry_if_transient,
)
def point_task(job: PointJob, upstream: dict[str, Any] | None) -> dict[str, Any]:
    from dataclasses import replace

    logger = get_run_logger()
    if upstream is not None and "error" in upstream:
        raise dvcops.StageError(f"its upstream failed: {upstream['error']}")
    result = run_point(
        replace(job, upstream=upstream), lambda line: logger.info("[%s] %s", job.name, line)
    )
    logger.info("point %s done in %.1fs; ran %s", job.name, result["seconds"], result["ran"])
    return result


def task_runner(workers: int = 2, cluster: str | None = None):
    """The Dask task runner: an existing scheduler at ``cluster``, else a local cluster of
    ``workers`` single-threaded worker processes on 127.0.0.1."""
    from prefect_dask import DaskTaskRunner

    if cluster:
        return DaskTaskRunner(address=cluster)
    return DaskTaskRunner(
        cluster_class="distributed.LocalCluster",
        cluster_kwargs={
            "n_workers": workers,
            "threads_per_worker": 1,
            "processes": True,
            "host": "127.0.0.1",
            "dashboard_address": None,
            "preload": ["flows.study.worker_preload"],  # Ctrl-C reaches the CLI, not the workers
        },
    )


def study_commit(root: Path) -> str:
    """HEAD, refusing a worktree whose tracked files differ from it (points clone the commit)."""
    commit = git(root, "rev-parse", "HEAD", error=StudyError).strip()
    status = git(root, "status", "--porcelain", "--untracked-files=no", error=StudyError)
    dirty = [line[3:] for line in status.splitlines() if not line[3:].startswith(_POINT_OWNED)]
    if dirty:
        raise StudyError(
            f"uncommitted changes in {', '.join(dirty[:5])}: a study runs at a commit "
            "(its points clone it); commit them first"
        )
    return commit


def default_remote(root: Path) -> str:
    """The project's default DVC remote, as a URL every worker can use."""
    name = dvcops.default_remote_name(root)
    url = name and dvcops.remote_url(root, name)
    if not url:
        raise StudyError("the project has no default DVC remote (`dvc remote add -d NAME URL`)")
    return url


def worker_location(location: str) -> str:
    """A ``--git-url`` / ``--dvc-remote`` as workers can use it: a local path made absolute
    (a worker runs git and DVC in its own clone, where a relative path names nothing, or a
    folder inside the clone), a URL (``scheme://...``, git's ``host:path``) as it is."""
    scp_like = ":" in location.split("/", 1)[0]
    if "://" in location or scp_like:
        return location
    return str(Path(location).resolve())


def _state_dir(root: Path, study: str) -> Path:
    return root / ".hydra-ens" / "studies" / study


@flow(name="hydra-study", log_prints=True)
def hydra_study(
    project_dir: str,
    spec_path: str,
    git_url: str | None = None,
    dvc_remote: str | None = None,
    threads: int = 1,
    report_dir: str | None = None,
    resources: dict[str, float] | None = None,
    report_only: bool = False,
    gates: list[dict[str, Any]] | None = None,
    only: list[str] | None = None,
    bundle: str | None = None,
    side_by_side: int = 1,
) -> dict[str, Any]:
    """Run the study ``spec_path`` in the project ``project_dir``; returns the summary.
    ``report_only``: run nothing, write the report of the points already done (the others are
    listed as ``missing``). ``only``: run only the points whose names match one of these shell
    patterns (:func:`~flows.study.spec.select_points`); the others not done are ``missing``, and
    the report covers every point done. ``gates``: gate checks (``params.gates`` entries) the
    report judges every point and baseline with, instead of each point's own. ``bundle``: a file
    rewritten with the study commit and its finished points as each point finishes, and at the
    end (:mod:`flows.study.carry`), so a study stopped midway loses only running points.
    ``side_by_side``: how many points run at once, for the estimate of what is left logged as
    each point finishes (:mod:`flows.study.estimate`)."""
    logger = get_run_logger()
    t0 = time.perf_counter()
    root = Path(project_dir).resolve()
    spec_file = Path(spec_path).resolve()
    spec = load_study(spec_file)
    # workers that clone --git-url could not check out a set-up commit made here
    for action in dvcops.ensure_project(root, commit_setup=git_url is None):
        logger.info("project: %s", action)
    points = study_points(spec, spec_file.parent, root / "dvc.yaml")
    commit = study_commit(root)
    job_base = {
        "study": spec.name,
        "git_url": worker_location(git_url) if git_url else str(root),
        "commit": commit,
        "dvc_remote": worker_location(dvc_remote) if dvc_remote else default_remote(root),
        "threads": threads,
    }
    fetch_experiments(root, job_base["git_url"])
    fresh = fresh_points(root, commit, {p.name: p.params for p in points})
    todo = [p for p in points if p.name not in fresh]
    selected = {p.name for p in select_points(points, only or [])}
    missing = [p.name for p in todo if report_only or p.name not in selected]
    todo = [] if report_only else [p for p in todo if p.name in selected]
    logger.info(
        "study %s at %s: %d points (%d variants x %d seeds), %d up to date, %d to run",
        spec.name,
        commit[:8],
        len(points),
        len(spec.variants),
        len(spec.all_seeds),
        len(fresh),
        len(todo),
    )
    state = _state_dir(root, spec.name)
    upstream_futures: dict[str, PrefectFuture | dict[str, Any]] = {}
    for p in todo:
        if p.upstream in upstream_futures:
            continue
        stored = state / "upstream" / f"{commit[:12]}-{p.upstream}.json"
        if stored.is_file():
            upstream_futures[p.upstream] = json.loads(stored.read_text())
            logger.info("upstream %s: reused from an earlier invocation", p.upstream)
        else:
            earlier = sorted(
                (state / "upstream").glob("*.json"), key=lambda f: f.stat().st_mtime, reverse=True
            )
            seed = earlier_upstream(earlier, p.params)
            if seed is not None:
                logger.info(
                    "upstream %s: starts from %s (%s)",
                    p.upstream,
                    seed["from"],
                    ", ".join(seed["lock"]),
                )
            job = PointJob(
                name=f"upstream-{p.upstream}", params=p.params, upstream=seed, **job_base
            )
            upstream_futures[p.upstream] = _submit(upstream_task, resources, job, p.upstream)
    point_futures = {
        p.name: _submit(
            point_task,
            resources,
            PointJob(name=p.name, params=p.params, **job_base),
            upstream_futures[p.upstream],
        )
        for p in todo
    }
    upstream_results = {
        key: {"seconds": fut["seconds"], "reused_from_earlier": True}
        for key, fut in upstream_futures.items()
        if isinstance(fut, dict)
    }
    running = {k: f for k, f in upstream_futures.items() if not isinstance(f, dict)}
    outcomes, failures = {}, {}
    for kind, name, fut in _as_finished(running, point_futures):
        if kind == "upstream":
            upstream_results[name] = _record_upstream(name, fut, state, commit, logger)
            continue
        try:
            outcomes[name] = fut.result()
        except Exception as err:  # reported, and the other points go on
            failures[name] = _one_line(err)
            logger.error("point %s failed: %s", name, failures[name])
        left = estimate_left(
            whole_runs(
                (upstream_results[k] for k in running if k in upstream_results), SHARED_STAGES
            ),
            whole_runs(outcomes.values()),
            upstreams_left=sum(1 for key in running if key not in upstream_results),
            points_left=len(todo) - len(outcomes) - len(failures),
            workers=side_by_side,
        )
        if left is not None and left.points_left:
            logger.info("study %s: %s", spec.name, left.line())
        if bundle and name in outcomes:
            _carry(root, commit, Path(bundle), logger, fetch_from=job_base["git_url"])
    fetch_experiments(root, job_base["git_url"])
    if bundle:
        _carry(root, commit, Path(bundle), logger)
    done = fresh_points(root, commit, {p.name: p.params for p in points})
    wall = time.perf_counter() - t0
    # a report-only invocation computed nothing: its seconds are not the study's wall time
    wall_or_none = None if report_only else wall
    summary = _report(spec, spec_file, root, points, done, report_dir, wall_or_none, logger, gates)
    summary.update(
        study=spec.name,
        commit=commit,
        ran=sorted(outcomes),
        up_to_date=sorted(fresh),
        missing=missing,
        only=list(only or []),
        failed=failures,
        points={n: o for n, o in sorted(outcomes.items())},
        upstreams=dict(sorted(upstream_results.items())),
        reuse=_reuse(points, todo, upstream_results),
        seconds=round(time.perf_counter() - t0, 1),
    )
    write_json(state / "last_study.json", summary)
    logger.info(
        "study %s done in %.1fs: %d ran, %d up to date, %d failed",
        spec.name,
        summary["seconds"],
        len(outcomes),
        len(fresh),
        len(failures),
    )
    return summary


def _as_finished(
    upstreams: dict[str, PrefectFuture], points: dict[str, PrefectFuture]
) -> Iterator[tuple[str, str, PrefectFuture]]:
    """``("upstream" | "point", name, future)`` as each finishes: a point is handed on (and
    bundled) as soon as it is done, while another seed's upstream may still be running."""
    running = {("upstream", k): f for k, f in upstreams.items()}
    running.update({("point", k): f for k, f in points.items()})
    for (kind, name), fut in _in_completion_order(running):
        yield kind, name, fut


def _in_completion_order(
    futures: dict[Hashable, PrefectFuture],
) -> Iterator[tuple[Hashable, PrefectFuture]]:
    """``(key, future)`` pairs as the futures finish (polled once a second where the task runner's
    futures wrap one that says whether it is done; the order they were submitted in otherwise)."""
    pending = dict(futures)
    wrapped = {name: getattr(f, "wrapped_future", None) for name, f in pending.items()}
    if not all(hasattr(w, "done") for w in wrapped.values()):
        yield from pending.items()
        return
    while pending:
        done = [name for name in pending if wrapped[name].done()]
        if not done:
            time.sleep(1.0)
        for name in done:
            yield name, pending.pop(name)


def _carry(root: Path, commit: str, dest: Path, logger, fetch_from: str | None = None) -> None:
    """Rewrite the points bundle ``dest`` (after fetching the points pushed to ``fetch_from``, if
    given); a failure is one warning line (the study goes on)."""
    try:
        if fetch_from is not None:
            fetch_experiments(root, fetch_from)
        count = write_points_bundle(root, commit, dest)
    except (BundleError, subprocess.CalledProcessError, OSError) as err:
        logger.warning("bundle %s not written: %s", dest, _one_line(err))
        return
    if count:
        logger.info("bundle: %d points of %s in %s", count, commit[:8], dest)


def _submit(fn, resources: dict[str, float] | None, *args: Any) -> PrefectFuture:
    if not resources:
        return fn.submit(*args)
    import dask

    with dask.annotate(resources=resources):
        return fn.submit(*args)


def _record_upstream(
    key: str, fut: PrefectFuture, state: Path, commit: str, logger
) -> dict[str, Any]:
    """The finished upstream ``key``'s entry of the summary; stored (for a later run to reuse)
    as soon as it finishes, whatever else is still running. A failed upstream is logged and
    recorded as ``{"error": ...}``, never stored: its points fail with it."""
    try:
        result = fut.result()
    except Exception as err:  # one line in the log and the summary; the other seeds go on
        result = {"error": _one_line(err)}
    if "error" in result:
        logger.error("upstream %s failed: %s", key, result["error"])
        return {"error": result["error"]}
    write_json(state / "upstream" / f"{commit[:12]}-{key}.json", result)
    return {
        "seconds": result["seconds"],
        "reused_from_earlier": False,
        "ran": result.get("ran"),
        "seeded_from": result.get("seeded_from"),
        "resumed": bool(result.get("resumed")),
    }


def _reuse(points: list[StudyPoint], todo: list[StudyPoint], upstreams: dict) -> dict[str, Any]:
    """What sharing the upstream saved: its time for every point after the first that used it."""
    saved = 0.0
    for key, info in upstreams.items():
        users = sum(1 for p in todo if p.upstream == key)
        if "seconds" in info:
            saved += info["seconds"] * (users - (0 if info.get("reused_from_earlier") else 1))
    return {
        "upstreams": len({p.upstream for p in points}),
        "points": len(points),
        "saved_seconds": round(saved, 1),
    }


def _report(
    spec, spec_file, root, points, done, report_dir, wall, logger, gates=None
) -> dict[str, Any]:
    out_dir = Path(report_dir) if report_dir else root / "reports" / "studies" / spec.name
    choosing = spec.confirm_seeds if spec.registered else spec.seeds
    if not any(p.name in done and p.seed in choosing for p in points):
        logger.warning(
            "no point of a %s seed finished: no report", "study" if spec.registered else "choosing"
        )
        return {"report": None}
    with tempfile.TemporaryDirectory(prefix="hydra-study-") as tmp:
        results = [
            load_point(read_point(root, done[p.name], Path(tmp) / p.name), p.variant, p.seed)
            for p in points
            if p.name in done
        ]
        summary = write_study_report(
            results,
            out_dir,
            title=f"Study {spec.name}",
            command=f"hydra-ens study {os.path.relpath(spec_file, root)}",
            wall_seconds=wall,
            variants=spec.variants,
            gates=None if gates is None else [GateCheck.model_validate(g) for g in gates],
            confirm_seeds=spec.confirm_seeds,
        )
    create_markdown_artifact(
        key=f"study-{spec.name}",
        markdown=(out_dir / "study.md").read_text(),
        description=f"study {spec.name}: {len(done)} of {len(points)} points",
    )
    logger.info("report: %s", out_dir / "study.md")
    return {"report": str(out_dir / "study.md"), "recommendation": summary.get("recommendation")}


def _one_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
