"""The gate's verdict: every candidate of an evaluation judged by ``cfg.gates``, with the
prod model's metrics when a check compares with ``prod`` and the cost record; what the ``gate``
stage writes and ``promote`` computes again.

A verdict passes only when no check failed and at least one check applied: ``gates: []``, or
every check skipped or not applicable, fails as ``no applicable check``. When a check compares
with ``prod``, the verdict records the version it compared with (``prod_compared``); ``promote``
refuses it once another version holds the stage.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tasks.gates.candidates import judge_all
from tasks.params.schema import PipelineConfig
from tasks.runtime.layout import METRICS
from tasks.runtime.outputs import COST_FILE, read_json


def prod_seen(cfg: PipelineConfig, root: Path) -> tuple[dict[str, Any] | str | None, dict]:
    """``(prod, seen)``: the metrics of the version in the stage (None when no version holds it,
    the one-line reason when the registry cannot be read;
    :func:`~tasks.gates.checks.evaluate_check`'s ``prod``) and ``{"version": ...}``, the version
    they belong to (None for none; absent when unreadable)."""
    from tasks.release.model_registry import RegistryError, prod_version

    try:
        record = prod_version(root, cfg.promote.model_name, cfg.promote.stage)
        if record is None:
            return None, {"version": None}
        raw = record["fields"].get("metrics")
        if raw is None:
            raise RegistryError(f"{record['tag']}: its tag message records no metrics")
        return json.loads(raw), {"version": record["version"], "stage_tag": record["stage_tag"]}
    except RegistryError as err:
        return str(err), {"unreadable": str(err)}


def compares_with_prod(cfg: PipelineConfig) -> bool:
    return any(c.baseline == "prod" for c in cfg.gates)


def decide(
    cfg: PipelineConfig,
    ev: dict[str, Any],
    prod: dict[str, Any] | str | None,
    cost: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The verdict of ``cfg.gates`` on evaluation ``ev`` (``prod``:
    :func:`~tasks.gates.checks.evaluate_check`'s; ``cost``: ``metrics/cost.json``, None when not
    measured): every candidate of ``ev`` judged, the one that ships, and at top level the checks,
    failed ones and counts of the candidate that ships (else of the first allowed;
    :func:`tasks.gates.candidates.judge_all`). A candidate passes only when no check failed and at
    least one applied (passed): no check at all (``gates: []``), or only skipped and not applicable
    ones, fails as :data:`~tasks.gates.checks.NO_CHECK`. ``promote`` calls this again on the same
    inputs; it never trusts a stored ``passed``."""
    return judge_all(cfg, ev, prod, cost)


def load_cost(root: Path) -> dict[str, Any] | None:
    """``metrics/cost.json`` (:mod:`tasks.evaluation.cost`), None when this run measured no cost."""
    path = root / METRICS / COST_FILE
    return read_json(path, "evaluate output") if path.is_file() else None
