"""The Prefect flow ``hydra_pipeline``: one Prefect task per DVC stage, in the DAG's order.

Design (see docs/pipeline.md):

* ``dvc.yaml`` is the single declaration of the DAG; every Prefect task runs its stage through
  ``dvc repro --single-item <stage>``, so DVC's lock file decides what recomputes and a plain
  ``dvc repro`` does exactly the same work. One ``dvc status`` at the start finds the first stale
  stage; the stages before it are reported up to date without starting dvc at all (a no-op run
  costs one ``dvc status``).
* Tasks pass paths and hashes, never tensors. Transient failures (DVC lock busy, a killed stage
  process) are retried; a bad parameter, a bug or the user's Ctrl-C / SIGTERM is not.
* ``finetune_members`` (Taylor variant) with ``members.finetune.max_parallel`` > 1: the members
  are mapped Prefect tasks, that many at a time, each running ``python -m tasks.finetune_members
  --member m``; each member is a resumable, hash-verified unit, so the stage's own ``dvc repro``
  that follows only verifies them and records the lock; each gets its share of the threads
  (:func:`member_threads`). One at a time (the default), the stage's own process trains them
  all: a process per member would only add its start-up (torch, transformers, data, the base
  model) and a verification pass (:func:`member_waves`).
* Hardware choices (:mod:`tasks.runtime.hardware`): before the first ``dvc status`` the flow
  writes ``hardware/choices.yaml`` from this machine kind's record (a DVC params dependency of
  the stages that resolve an ``auto`` setting by measuring), so a rerun reuses what was measured
  once; ``remeasure`` drops the record's measurements first and the run ends with one line per
  changed choice.
* Prefect artifacts: the metrics table (Markdown + table artifact), the run report's figures
  (``hydra-report``, inlined; the page itself is ``reports/evaluate.html``) and the gate verdict.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task, unmapped
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.task_runners import ThreadPoolTaskRunner

from flows import dvcops
from flows.warm import warm_stages_of_this_process, worth_warming
from hydra_ops.perf.allocators import allocator_env
from tasks.params.schema import PipelineConfig, load_params
from tasks.runtime import hardware
from tasks.runtime.dvcfiles import locked_outs
from tasks.runtime.layout import METRICS, REGISTRY, REPORTS, STAGES
from tasks.runtime.outputs import write_json
from tasks.runtime.stage import stage_threads


@task(
    name="stage",
    task_run_name="{stage}",
    retries=2,
    retry_delay_seconds=3,
    retry_condition_fn=dvcops.retry_if_transient,
)
def run_stage(project_dir: str, stage: str) -> dict[str, Any]:
    """Run one DVC stage (DVC skips it if nothing changed); returns what ran and the out hashes."""
    logger = get_run_logger()
    root = Path(project_dir)
    result = dvcops.repro_stage(root, stage, log=logger.info)
    logger.info(
        "stage %s: %s in %.1fs", stage, "ran" if result.ran else "up to date", result.seconds
    )
    return {
        "stage": stage,
        "ran": result.ran,
        "seconds": round(result.seconds, 2),
        "outs": {p: md5 or "" for p, md5 in locked_outs(root, stage).items()},
    }


@task(
    name="finetune-member",
    task_run_name="member-{member}",
    retries=1,
    retry_delay_seconds=3,
    retry_condition_fn=dvcops.retry_if_transient,
)
def finetune_member(project_dir: str, member: int, threads: int) -> dict[str, Any]:
    """Build (or verify) member ``member`` and its control when built (resumable units,
    tasks.runtime.resumable), in a process of ``threads`` threads."""
    logger = get_run_logger()
    t0 = time.perf_counter()
    proc = dvcops.run_member(
        Path(project_dir),
        member,
        log=lambda line: logger.info("[member %d] %s", member, line),
        threads=threads,
    )
    if proc.returncode != 0:
        dvcops.wait_out_interrupt()
        # killed (say by the OOM killer): retried; Ctrl-C or a user's SIGTERM, or an error: not
        transient = dvcops.is_transient_exit(proc.returncode)
        kind = dvcops.TransientStageError if transient else dvcops.StageError
        output = (proc.stdout + proc.stderr).splitlines()
        raise kind.from_output(output, proc.returncode, member=member)
    return {"member": member, "seconds": round(time.perf_counter() - t0, 2)}


def member_waves(num_members: int, max_parallel: int) -> list[list[int]]:
    """The member tasks the flow maps before stage ``finetune_members``, in waves of at most
    ``max_parallel``; none when ``max_parallel`` is 1 (the stage's own process trains them)."""
    if max_parallel <= 1:
        return []
    ids = list(range(num_members))
    return [ids[start : start + max_parallel] for start in range(0, num_members, max_parallel)]


def member_threads(side_by_side: int, available: int | None = None) -> int:
    """Threads for each of ``side_by_side`` member processes running at once: ``available``
    (None: a stage's, :func:`tasks.runtime.stage.stage_threads`) split between them, at least 1, so
    that they do not oversubscribe the cores."""
    if available is None:
        available = stage_threads()
    return max(1, available // max(1, side_by_side))


def _publish_artifacts(root: Path) -> dict[str, Any]:
    from flows.render import deciding_rows
    from tasks.gates.candidates import gate_summary
    from tasks.run_report import HTML, artifact_markdown
    from tasks.runtime.outputs import load_evaluation

    summary: dict[str, Any] = {}
    ev_path, gate_path = root / METRICS / "evaluate.json", root / REPORTS / "gate.json"
    if ev_path.is_file():
        ev = load_evaluation(root)
        create_markdown_artifact(
            key="hydra-metrics",
            markdown=(root / REPORTS / "evaluate.md").read_text(),
            description="Hydra vs baselines (calibrated and raw) with bootstrap intervals",
        )
        rows = [
            {
                "model": name,
                **{
                    f"{s}.{k}": round(v, 4)
                    for s in ("id_test", "near_ood", "far_ood", "shift")
                    for k, v in e["calibrated"][s].items()
                },
            }
            for name, e in ev["models"].items()
        ]
        create_table_artifact(
            key="hydra-metrics-table", table=rows, description="calibrated metrics per model"
        )
    report = artifact_markdown(root)
    if report is not None:
        create_markdown_artifact(
            key="hydra-report",
            markdown=report,
            description="the run report's figures (reliability, ROC, histograms, cost vs quality)",
        )
        summary["report"] = str(root / HTML)
    if gate_path.is_file():
        gate = json.loads(gate_path.read_text())
        promo_path = root / REGISTRY / "promotion.json"
        promo = json.loads(promo_path.read_text()) if promo_path.is_file() else {}
        create_markdown_artifact(
            key="hydra-gate",
            markdown=(root / REPORTS / "gate.md").read_text()
            + f"\n\nPromotion: {json.dumps(promo)}\n",
            description=f"gate verdict: {gate['verdict']}",
        )
        summary["gate"] = gate_summary(gate)
        summary["promotion"] = promo
    if ev_path.is_file():
        verdict = json.loads(gate_path.read_text()) if gate_path.is_file() else None
        summary["models"] = deciding_rows(ev, verdict)
    return summary


def _run_stages(
    root: Path, cfg: PipelineConfig, order: list[str], to_run: list[str]
) -> list[dict[str, Any]]:
    """Each stage of ``order`` in turn: those in ``to_run`` through DVC (the members first as
    mapped tasks when they run side by side), the others reported up to date."""
    results: list[dict[str, Any]] = []
    for stage in order:
        if stage not in to_run:
            results.append({"stage": stage, "ran": False, "seconds": 0.0, "checked": "dvc status"})
            continue
        if stage == "finetune_members" and cfg.finetune_members:
            parallel = cfg.members.finetune.max_parallel
            for wave in member_waves(cfg.members.num_members, parallel):
                threads = unmapped(member_threads(len(wave)))
                futures = finetune_member.map(str(root), wave, threads=threads)
                futures.wait()
                for f in futures:
                    f.result()
        results.append(run_stage(str(root), stage))
    return results


@flow(name="hydra-pipeline", log_prints=True, task_runner=ThreadPoolTaskRunner(max_workers=4))
def hydra_pipeline(
    project_dir: str = ".", push: bool = True, remeasure: bool = False
) -> dict[str, Any]:
    """Run the DVC DAG of ``project_dir`` stage by stage; returns the per-stage summary.

    ``params.yaml`` is validated first (one line per problem). The flow completes even when the
    gate fails (the verdict is in the result and the ``hydra-gate`` artifact); stages that fail
    fail the flow. ``remeasure``: measure this machine kind's hardware choices again (the
    summary's ``hardware.changed`` says which changed).
    """
    logger = get_run_logger()
    root = Path(project_dir).resolve()
    t0 = time.perf_counter()
    cfg = load_params(root / "params.yaml")
    for action in dvcops.ensure_project(root):
        logger.info("project: %s", action)
    before = hardware.forget(root) if remeasure else None
    choices = hardware.sync_choices(root)
    logger.info(
        "hardware: machine kind %s (%s); %s",
        choices["kind"],
        hardware.record_path(root).relative_to(root),
        "measuring again (--remeasure)"
        if remeasure
        else f"{sum(v != hardware.UNMEASURED for k, v in choices.items() if k != 'kind')} of "
        f"{len(hardware.STAGES)} stages' choices recorded",
    )
    logger.info("%s (the stage processes')", allocator_env()[1])
    stale = dvcops.stale_stages(root)
    order = list(STAGES)
    first = min((order.index(s) for s in stale if s in order), default=None)
    logger.info(
        "profile %s, variant %s, M = %d; stale stages: %s",
        cfg.profile,
        cfg.scoring.method,
        cfg.members.num_members,
        ", ".join(s for s in order if s in stale) or "none (nothing to do)",
    )
    to_run = [] if first is None else order[first:]
    warm_notes: list[str] = []

    def note_warm(line: str) -> None:
        logger.info(line)
        warm_notes.append(line)

    warm = (
        warm_stages_of_this_process(log=note_warm)
        if worth_warming(root, to_run)
        else contextlib.nullcontext()
    )
    with warm:
        results = _run_stages(root, cfg, order, to_run)
    summary: dict[str, Any] = {
        "project": str(root),
        "stages": results,
        "ran": [r["stage"] for r in results if r["ran"]],
        "warm_stages": warm_notes[-1] if warm_notes else "not used (fewer than 2 model stages)",
        **_publish_artifacts(root),
        "hardware": {"kind": choices["kind"], "record": str(hardware.record_path(root))},
    }
    if before is not None:
        changed = hardware.changed_choices(before, hardware.current_choices(root))
        summary["hardware"]["changed"] = changed
        for line in changed:
            logger.info("hardware choice changed: %s", line)
    if push:
        summary["push"] = dvcops.push(root)
    summary["seconds"] = round(time.perf_counter() - t0, 1)
    write_json(root / ".hydra-ens" / "last_run.json", summary)
    logger.info(
        "pipeline done in %.1fs; ran: %s; gate: %s%s",
        summary["seconds"],
        ", ".join(summary["ran"]) or "nothing",
        summary.get("gate", {}).get("verdict", "n/a"),
        f"; {note}" if (note := summary.get("gate", {}).get("note")) else "",
    )
    return summary
