"""A stage's entry point: ``python -m tasks.<stage>`` (the DVC stage command) runs
:func:`stage_main`, which validates ``params.yaml``, removes what a killed run left, and turns a
params or data problem into one ``error:`` line.

Every stage module ``tasks/<stage>.py`` has one plain function ``run(cfg, root) -> dict`` holding
the stage's logic and a ``main()`` that calls :func:`stage_main` with its params view
(:data:`SCHEMA` of the module: the sections it reads; a test holds it to the stage's ``params``
in ``dvc.yaml``). The Prefect tasks in
:mod:`flows.pipeline` never call ``run`` directly: they invoke DVC, which calls ``main``, so every
stage's logic is written exactly once.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from hydra_ops.atomic import remove_leftovers
from tasks.params.base import ConfigError
from tasks.params.core import CoreConfig
from tasks.params.files import load_as
from tasks.runtime.dvcfiles import stage_outputs

log = logging.getLogger("hydra_ens")


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


def stage_threads() -> int:
    """The threads a stage process uses: ``HYDRA_ENS_THREADS``, else the cores this process may
    run on; at least 1."""
    return max(1, int(os.environ.get("HYDRA_ENS_THREADS", "0")) or len(os.sched_getaffinity(0)))


def set_threads() -> None:
    """Use :func:`stage_threads` threads.

    Through ``OMP_NUM_THREADS``, which torch reads when it is imported, so a stage that runs no
    model (gate, bundle, promote) never imports torch; ``torch.set_num_threads`` when it already is.
    """
    n = stage_threads()
    os.environ["OMP_NUM_THREADS"] = str(n)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(n)


def remove_stage_leftovers(stage: str, root: Path) -> list[Path]:
    """Delete what a killed run of ``stage`` left next to its outputs (``.<out>.tmp-*``,
    ``.<out>.old-*``, ``.<out>.*.tmp``; :func:`hydra_ops.atomic.leftovers`). Run at stage start,
    when no other process writes the stage's outputs. Returns the removed paths."""
    removed = [p for out in stage_outputs(stage, root) for p in remove_leftovers(out)]
    for path in removed:
        log.info("stage %s: removed %s (left by an interrupted run)", stage, path)
    return removed


Config = TypeVar("Config", bound=CoreConfig)


def stage_main(
    name: str,
    fn: Callable[[Config, Path], dict[str, Any] | None],
    schema: type[Config] = CoreConfig,  # type: ignore[assignment]
) -> None:
    """Entry point of ``python -m tasks.<name>``: validate ``params.yaml`` with ``schema`` (the
    stage's params view: the sections it reads, :mod:`tasks.params`), run, errors as one line."""
    setup_logging()
    root = Path.cwd()
    t0 = time.perf_counter()
    try:
        cfg = load_as(schema, root / "params.yaml")
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
