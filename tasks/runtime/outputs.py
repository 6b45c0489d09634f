"""A stage's outputs written atomically, an upstream's read back with one-line errors.

Every write goes to a temp file or folder beside its target and replaces it in one rename
(:mod:`hydra_ops.atomic`), so a killed stage never leaves a half-written output DVC would cache.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra_ops.atomic import atomic_write_bytes, atomic_write_dir, remove_leftovers
from tasks.runtime.layout import METRICS


def write_json(path: Path, obj: Any) -> Path:
    """Write JSON atomically (temp file in the same folder + ``os.replace``)."""
    return write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=json_default) + "\n")


def write_text(path: Path, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, text.encode("utf-8"), keep_suffix=False)
    return path


def json_default(obj: Any) -> Any:
    """What :func:`json.dumps` writes for an array (``tolist``) or a path; TypeError otherwise."""
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


# ---- the evaluation (read by gate, bundle, promote, the flow) ----
#: evaluate writes latency beside the evaluation, not in it: a fact of one run on one machine
LATENCY_FILE = "latency.json"
#: ``metrics/cost.json``: every candidate timed side by side (:mod:`tasks.evaluation.cost`).
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
