"""A study point: the files one (variant, seed) pipeline run leaves, read and checked."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

#: The calibrated splits of evaluate.json, in report order.
SPLITS = ("id_test", "shift", "near_ood", "far_ood")
OOD_SPLITS = ("near_ood", "far_ood")
#: A point's files (as the pipeline lays them out) per :class:`PointResult` field: what a
#: worker checks its experiment commit holds before it counts as done, and copies out
#: (:mod:`flows.study.points`).
POINT_FILES = {
    "evaluation": "metrics/evaluate.json",
    "latency": "metrics/latency.json",
    "gate": "reports/gate.json",
    "params": "params.yaml",
}
#: Files a point may lack (written by a newer pipeline): field -> path. ``metrics/cost.json``:
#: evaluate's side-by-side timing of every model (:mod:`tasks.evaluation.cost`).
OPTIONAL_FILES = {"cost": "metrics/cost.json"}


@dataclass(frozen=True)
class PointResult:
    """One (variant, seed) point of a study: what its pipeline run left.

    ``evaluation``: ``metrics/evaluate.json``; ``latency``: ``metrics/latency.json`` (model name ->
    median ms per batch); ``gate``: ``reports/gate.json``; ``params``: the resolved
    ``params.yaml`` as a plain dict; ``cost``: ``metrics/cost.json`` (every model timed side by
    side in the run's process, :mod:`tasks.evaluation.cost`), None for a point written before it
    existed.
    """

    variant: str
    seed: int
    evaluation: dict[str, Any]
    latency: dict[str, Any]
    gate: dict[str, Any]
    params: dict[str, Any]
    cost: dict[str, Any] | None = None


def load_point(folder: str | os.PathLike[str], variant: str, seed: int) -> PointResult:
    """Read a point's files from ``folder`` (the pipeline's layout, :data:`POINT_FILES`).

    A missing or unreadable file raises a one-line ValueError naming the point and the path.
    """
    folder = Path(folder)
    where = f"study point {variant!r} seed {seed}"
    loaded: dict[str, Any] = {}
    for field, rel in {**POINT_FILES, **OPTIONAL_FILES}.items():
        path = folder / rel
        if field in OPTIONAL_FILES and not path.is_file():
            continue
        if not path.is_file():
            raise ValueError(f"{where}: {path} is missing; did that pipeline run finish?")
        text = path.read_text()
        try:
            value = yaml.safe_load(text) if path.suffix == ".yaml" else json.loads(text)
        except (json.JSONDecodeError, yaml.YAMLError) as err:
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ValueError(f"{where}: {path} is corrupted ({first})") from None
        if not isinstance(value, dict):
            raise ValueError(f"{where}: {path} must hold a mapping, got {type(value).__name__}")
        loaded[field] = value
    return PointResult(variant=variant, seed=int(seed), **loaded)


def validate_points(points: Sequence[PointResult], title: str) -> None:
    """One-line ValueError unless ``title`` is a non-empty string and ``points`` a non-empty list of
    distinct (variant, seed) points, each evaluation with ``models.hydra``."""
    if not isinstance(title, str) or not title.strip():
        raise ValueError(f"title must be a non-empty string, got {title!r}")
    if not isinstance(points, Sequence) or isinstance(points, str) or not points:
        raise ValueError("points must be a non-empty list of PointResult")
    seen: set[tuple[str, int]] = set()
    for i, p in enumerate(points):
        if not isinstance(p, PointResult):
            raise ValueError(f"points[{i}] must be a PointResult, got {type(p).__name__}")
        key = (p.variant, p.seed)
        if key in seen:
            raise ValueError(f"points: duplicate point variant {p.variant!r} seed {p.seed}")
        seen.add(key)
        models = p.evaluation.get("models")
        if not isinstance(models, Mapping) or "hydra" not in models:
            raise ValueError(
                f"points[{i}] (variant {p.variant!r} seed {p.seed}): evaluation has no "
                "models.hydra; is it a metrics/evaluate.json?"
            )
