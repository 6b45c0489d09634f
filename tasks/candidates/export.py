"""How a candidate other than the Hydra ships: its files, a recipe that rebuilds it, and its hashes.

``evaluate`` records, for every candidate it scored that can ship, ``scored.candidates[name]`` in
``metrics/evaluate.json``::

    {"recipe": {...}, "sources": {bundle name: workspace path}, "sha256": {file: sha256},
     "class_names": [...]}

``sources`` are the files the candidate was loaded from (``models/base``, a plan file, Deep
Ensemble or control checkpoints), ``sha256`` every file under them as the bundle will hold it
(``<bundle name>/<relative path>``), and ``recipe`` how to rebuild the model from them:

- ``{"kind": "models", "models": [{"checkpoint": name, "plan": name?, "plan_index": i?,
  "base": name?}]}``: independent classifiers, one member each (a plan prunes the checkpoint's
  heads; ``base`` names the checkpoint a member was cut from, checked on load);
- ``{"kind": "mc_dropout", "checkpoint": name, "samples": S, "seed": s, "rate": r,
  "sampler": "dense" | "gaps"}`` (the mask sampler, :mod:`hydra_ops.models.inverted_dropout`;
  a recipe without it was written before the choice existed and drew ``dense`` masks).

The verdict is bound to ``metrics/evaluate.json`` (its DVC md5), so these hashes bind the shipped
files to what was scored: ``bundle`` copies the sources into ``candidate/`` and checks them,
``promote`` and :func:`tasks.serving.served.load_served` check the bundle's copy against the bundled
evaluation. A candidate without a record (a kind with no recipe yet) is judged but cannot ship.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra_ops.hashing import sha256_file
from tasks.runtime.layout import BASE, BASELINES, MEMBERS, PLANS

#: The bundle's folder for a candidate other than the Hydra, and its description file.
FOLDER = "candidate"
DESCRIPTION = "candidate.json"


def checkpoints(names: list[str]) -> dict[str, Any]:
    """A ``models`` recipe of plain checkpoints."""
    return {"kind": "models", "models": [{"checkpoint": n} for n in names]}


def single_export() -> dict[str, Any]:
    return {"recipe": checkpoints(["base"]), "sources": {"base": BASE.as_posix()}}


def deep_ensemble_export(units: list[str]) -> dict[str, Any]:
    sources = {"base": BASE.as_posix()}
    sources |= {f"baseline_{u}": (BASELINES / u).as_posix() for u in units}
    return {"recipe": checkpoints(list(sources)), "sources": sources}


def mc_dropout_export(samples: int, seed: int, rate: float | None, sampler: str) -> dict[str, Any]:
    recipe = {"kind": "mc_dropout", "checkpoint": "base", "samples": samples, "seed": seed}
    recipe |= {"rate": rate, "sampler": sampler}
    return {"recipe": recipe, "sources": {"base": BASE.as_posix()}}


def naive_pruned_export() -> dict[str, Any]:
    plan = {"checkpoint": "base", "plan": "naive_plan.json", "plan_index": 0}
    sources = {"base": BASE.as_posix(), "naive_plan.json": (PLANS / "naive_plan.json").as_posix()}
    return {"recipe": {"kind": "models", "models": [plan]}, "sources": sources}


def control_export(num: int) -> dict[str, Any]:
    sources = {"base": BASE.as_posix()}
    sources |= {f"control_{m}": (MEMBERS / f"control_{m}").as_posix() for m in range(num)}
    models = [{"checkpoint": f"control_{m}", "base": "base"} for m in range(num)]
    return {"recipe": {"kind": "models", "models": models}, "sources": sources}


def source_hashes(root: Path, sources: Mapping[str, str]) -> dict[str, str]:
    """``{<bundle name>/<relative path> (or the bundle name of a file): sha256}`` of every file
    of ``sources`` under ``root`` (ValueError naming a missing one)."""
    out: dict[str, str] = {}
    for name, rel in sources.items():
        path = Path(root) / rel
        if path.is_file():
            out[name] = sha256_file(path)
        elif path.is_dir():
            for f in sorted(p for p in path.rglob("*") if p.is_file()):
                out[f"{name}/{f.relative_to(path).as_posix()}"] = sha256_file(f)
        else:
            raise ValueError(f"{rel} is missing; run the upstream stage first")
    return out


def export_record(root: Path, export: Mapping[str, Any], class_names: list[str]) -> dict[str, Any]:
    """``scored.candidates[name]`` of one candidate (module docstring)."""
    return {
        "recipe": dict(export["recipe"]),
        "sources": dict(export["sources"]),
        "sha256": source_hashes(root, export["sources"]),
        "class_names": list(class_names),
    }
