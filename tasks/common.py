"""Shared plumbing for the stage modules: paths, params, atomic writes, hashing, stage entry points.

Every stage module ``tasks/<stage>.py`` has one plain function ``run(cfg, root) -> dict`` holding
the stage's logic and a ``main()`` for ``python -m tasks.<stage>`` (the DVC stage command). The
Prefect tasks in :mod:`flows.pipeline` never call ``run`` directly: they invoke DVC, which
calls ``main``, so every stage's logic is written exactly once.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra_ops.atomic import atomic_write_bytes, atomic_write_dir, remove_leftovers
from hydra_ops.hashing import sha256_file as file_sha256
from tasks.params import ConfigError, PipelineConfig, load_params

log = logging.getLogger("hydra_ens")

# ---- the DAG's artifact layout (dvc.yaml declares the same paths) ----
DATA = Path("data/prepared")
BASE = Path("models/base")
BASELINES = Path("models/baselines")
SCORES = Path("artifacts/scores")
PLANS = Path("artifacts/plans")
MEMBERS = Path("models/members")
MERGED = Path("models/merged")
COMPILED = Path("models/compiled")
HYDRA = Path("models/hydra")
BUNDLE = Path("models/bundle")
METRICS = Path("metrics")
REPORTS = Path("reports")
PLOTS = Path("plots")
REGISTRY = Path("registry")

#: Stage order; dvc.yaml declares the same stages (a test checks the two agree).
STAGES = (
    "prepare_data",
    "finetune_base",
    "finetune_baselines",
    "baseline_logits",
    "score_heads",
    "select_members",
    "finetune_members",
    "merge",
    "calibrate",
    "compile",
    "evaluate",
    "run_report",
    "gate",
    "bundle",
    "promote",
)


def setup_logging(level: int = logging.INFO) -> None:
    """Stage logs on stderr: ours (``hydra_ens``) and the library's (``hydra_ops.*``, e.g. which
    backend and precision ``compile: auto`` chose, and why)."""
    for logger in (log, logging.getLogger("hydra_ops")):
        if not logger.handlers:
            handler = logging.StreamHandler(sys.stderr)
            fmt = logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S")
            handler.setFormatter(fmt)
            logger.addHandler(handler)
        logger.setLevel(level)
    log.propagate = False


def set_threads() -> None:
    """Use the cores this process may run on (``HYDRA_ENS_THREADS`` overrides).

    Through ``OMP_NUM_THREADS``, which torch reads when it is imported, so a stage that runs no
    model (gate, bundle, promote) never imports torch; ``torch.set_num_threads`` when it already is.
    """
    n = max(1, int(os.environ.get("HYDRA_ENS_THREADS", "0")) or len(os.sched_getaffinity(0)))
    os.environ["OMP_NUM_THREADS"] = str(n)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)


# ---- atomic writes ----
def write_json(path: Path, obj: Any) -> Path:
    """Write JSON atomically (temp file in the same folder + ``os.replace``)."""
    return write_text(
        path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n"
    )


def write_text(path: Path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, text.encode("utf-8"), keep_suffix=False)
    return path


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON-serialisable: {type(obj).__name__}")


def read_json(path: Path, what: str | None = None) -> Any:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{what or path}: {path} is missing; run the upstream stage first")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{what or path}: {path} is corrupted (not valid JSON: {err})") from None


@contextmanager
def publish_dir(target: Path) -> Iterator[Path]:
    """Yield a fresh temp folder next to ``target``; on success it atomically replaces ``target``.

    A crash inside the block leaves ``target`` as it was; what a kill leaves (a ``.tmp-*`` or
    ``.old-*`` folder, see :func:`hydra_ops.atomic.leftovers`) is removed by the next call.
    """
    remove_leftovers(target)
    with atomic_write_dir(target) as tmp:
        yield tmp


def clear_dir(path: Path) -> Path:
    """Empty ``path`` (create it if missing)."""
    path = Path(path)
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


# ---- hashing ----
def dir_sha256(path: Path, exclude: tuple[str, ...] = ()) -> str:
    """Hash of every file's relative path and content under ``path`` (sorted, stable)."""
    h = hashlib.sha256()
    root = Path(path)
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = f.relative_to(root).as_posix()
        if rel in exclude:
            continue
        h.update(rel.encode() + b"\0" + file_sha256(f).encode() + b"\0")
    return h.hexdigest()


def fingerprint(obj: Any) -> str:
    """sha256 of a JSON-serialisable description (what a cached unit of work was computed from)."""
    return hashlib.sha256(
        json.dumps(obj, sort_keys=True, default=_json_default).encode()
    ).hexdigest()


# ---- leftovers of interrupted runs ----
def _declared(root: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """``{stage: {path: options}}`` of every ``outs``/``metrics``/``plots`` entry in
    ``root/dvc.yaml`` (empty when there is none)."""
    import yaml

    dvc_yaml = Path(root) / "dvc.yaml"
    if not dvc_yaml.is_file():
        return {}
    stages = (yaml.safe_load(dvc_yaml.read_text()) or {}).get("stages") or {}
    declared: dict[str, dict[str, dict[str, Any]]] = {}
    for name, stage in stages.items():
        declared[name] = {}
        for key in ("outs", "metrics", "plots"):
            for entry in stage.get(key) or []:
                items = {entry: {}} if isinstance(entry, str) else entry
                declared[name].update({path: opts or {} for path, opts in items.items()})
    return declared


def stage_outputs(stage: str, root: Path) -> list[Path]:
    """Every path ``stage`` declares in ``root/dvc.yaml`` (``outs``, ``metrics``, ``plots``);
    empty when there is no ``dvc.yaml``. ValueError naming the declared stages if unknown."""
    declared = _declared(root)
    if declared and stage not in declared:
        raise ValueError(
            f"stage {stage!r} is not in {Path(root) / 'dvc.yaml'}; declared: {', '.join(declared)}"
        )
    return [Path(root) / path for path in declared.get(stage, {})]


def cached_outputs(root: Path) -> dict[str, str]:
    """``{path: stage}`` of the outputs DVC caches (declared without ``cache: false``): what must
    hash the same for the same params and code. Uncached metrics may hold run facts (timings)."""
    return {
        path: stage
        for stage, outs in _declared(root).items()
        for path, opts in outs.items()
        if opts.get("cache", True)
    }


def remove_stage_leftovers(stage: str, root: Path) -> list[Path]:
    """Delete what a killed run of ``stage`` left next to its outputs (``.<out>.tmp-*``,
    ``.<out>.old-*``, ``.<out>.*.tmp``; :func:`hydra_ops.atomic.leftovers`). Run at stage start,
    when no other process writes the stage's outputs. Returns the removed paths."""
    removed = [p for out in stage_outputs(stage, root) for p in remove_leftovers(out)]
    for path in removed:
        log.info("stage %s: removed %s (left by an interrupted run)", stage, path)
    return removed


# ---- the evaluation (read by gate, bundle, promote, the flow) ----
#: evaluate writes latency beside the evaluation, not in it: a fact of one run on one machine
LATENCY_FILE = "latency.json"
#: ``metrics/cost.json``: every candidate timed side by side (:mod:`tasks.cost`).
COST_FILE = "cost.json"


def load_evaluation(root: Path) -> dict[str, Any]:
    """``metrics/evaluate.json`` with each model's ``latency_ms`` merged back in (when measured)."""
    ev = read_json(root / METRICS / "evaluate.json", "evaluate output")
    latency_path = root / METRICS / LATENCY_FILE
    latency = read_json(latency_path, "evaluate output") if latency_path.is_file() else {}
    return with_latency(ev, latency)


def with_latency(evaluation: dict[str, Any], latency: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``evaluation`` (``evaluate.json``) whose model entries carry their
    ``latency_ms`` from ``latency`` (``latency.json``: model -> ms), where it has one: what the
    gates' latency checks read."""
    models = {
        name: {**entry, **({"latency_ms": latency[name]} if name in latency else {})}
        for name, entry in evaluation["models"].items()
    }
    return {**evaluation, "models": models}


# ---- params ----
def load_config(root: Path | None = None) -> PipelineConfig:
    return load_params(Path(root or Path.cwd()) / "params.yaml")


def stage_main(name: str, fn: Callable[[PipelineConfig, Path], dict[str, Any] | None]) -> None:
    """Entry point of ``python -m tasks.<name>``: validate params, run, errors as one line."""
    setup_logging()
    root = Path.cwd()
    t0 = time.perf_counter()
    try:
        cfg = load_config(root)
        remove_stage_leftovers(name, root)
        set_threads()
        log.info("stage %s: start (profile %s)", name, cfg.profile)
        fn(cfg, root)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except ValueError as err:
        print(f"error: stage {name}: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    log.info("stage %s: done in %.1fs", name, time.perf_counter() - t0)
    # Everything is written. Tearing down torch's and transformers' objects one by one at exit
    # takes ~1.5 s per stage (of ~5 s of overhead); frozen objects are left to the OS.
    gc.freeze()
