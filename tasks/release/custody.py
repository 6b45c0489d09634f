"""The model side's chain of custody: compiled <- calibrated model; evaluation <- what it scored.

``models/compiled/compiled.json`` records ``source``: the sha256 of every file of the calibrated
model it was compiled from (``models/hydra``, :func:`source_record`). ``metrics/evaluate.json``
records ``scored`` (:func:`scored_record`): the sha256 of every file of the compiled artifact it
scored and of the calibrated model, of the prepared data's manifest, and the md5 of the params the
evaluate stage reads (:data:`SCORED_PARAMS`, the ``params`` of ``evaluate`` in ``dvc.yaml``).

Every consumer reads those records back and checks them against the files there now: evaluate the
compiled artifact's source, gate and bundle the whole chain (:func:`check_chain`), a served bundle
its own copy of it (:func:`check_bundle`). A broken link is one ``ValueError`` line naming it and
the stage to rerun, so a model calibrated after the artifact was compiled, or an evaluation of an
older model, is never judged, bundled or served.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from hydra_ops.hashing import sha256_file
from tasks.runtime.layout import COMPILED, DATA, HYDRA, METRICS
from tasks.runtime.outputs import read_json

#: The params ``evaluate`` reads (its ``params`` in ``dvc.yaml``; a test keeps the two equal).
#: Only these: a gate-only edit must not make the evaluation stale, as DVC does not rerun it.
SCORED_PARAMS = (
    "seed",
    "evaluate",
    "baselines.mc_dropout",
    "baselines.lora_ensemble",
    "baselines.batch_ensemble",
    "scoring.method",
    "runtime",
)
#: What ``scored`` records, in the order a broken link is looked for (upstream first).
SCORED_ROLES = ("model", "compiled", "data", "params")
RERUN = "hydra-ens run (or dvc repro evaluate)"


def folder_sha256(path: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``path`` (ValueError if it is missing)."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{path} is missing; run the upstream stage first")
    return {
        f.relative_to(path).as_posix(): sha256_file(f)
        for f in sorted(p for p in path.rglob("*") if p.is_file())
    }


def source_record(root: Path) -> dict[str, Any]:
    """``compiled.json``'s ``source``: the calibrated model's path and the sha256 of its files."""
    return {"path": HYDRA.as_posix(), "sha256": folder_sha256(Path(root) / HYDRA)}


def scored_params_md5(cfg: Any) -> str:
    """md5 of the :data:`SCORED_PARAMS` values of validated params (a pydantic model)."""
    data = cfg.model_dump(mode="json")
    picked = {}
    for dotted in SCORED_PARAMS:
        node = data
        for part in dotted.split("."):
            node = node[part]
        picked[dotted] = node
    return hashlib.md5(json.dumps(picked, sort_keys=True).encode()).hexdigest()


def scored_record(cfg: Any, root: Path) -> dict[str, Any]:
    """``evaluate.json``'s ``scored``: what the evaluation was computed from (module docstring)."""
    root = Path(root)
    manifest = DATA / "manifest.json"
    if not (root / manifest).is_file():
        raise ValueError(f"{manifest} is missing; run the upstream stage first")
    return {
        "model": {"path": HYDRA.as_posix(), "sha256": folder_sha256(root / HYDRA)},
        "compiled": {"path": COMPILED.as_posix(), "sha256": folder_sha256(root / COMPILED)},
        "data": {"path": manifest.as_posix(), "sha256": sha256_file(root / manifest)},
        "params": {"keys": list(SCORED_PARAMS), "md5": scored_params_md5(cfg)},
    }


def _first_change(recorded: Any, current: Any) -> str:
    """``name old8 -> new8`` for the first file (or value) that differs."""
    if isinstance(recorded, dict) and isinstance(current, dict):
        for name in sorted(set(recorded) | set(current)):
            if recorded.get(name) != current.get(name):
                return f"{name} {str(recorded.get(name))[:8]} -> {str(current.get(name))[:8]}"
    return f"{str(recorded)[:8]} -> {str(current)[:8]}"


def check_compiled_source(
    compiled: dict[str, Any], model_files: dict[str, str], where: str
) -> None:
    """Refuse a compiled artifact (its ``compiled.json`` as ``compiled``) whose recorded source
    is not the calibrated model whose files hash to ``model_files``. ``where``: how to name the
    two folders, e.g. ``"models/compiled <- models/hydra"``."""
    source = compiled.get("source")
    recorded = source.get("sha256") if isinstance(source, dict) else None
    if not isinstance(recorded, dict) or not recorded:
        raise ValueError(
            f"{where}: compiled.json records no source model (the sha256 of the calibrated "
            f"model it was compiled from); rerun compile and evaluate: {RERUN}"
        )
    if recorded != model_files:
        raise ValueError(
            f"{where}: the compiled artifact was compiled from another calibrated model "
            f"({_first_change(recorded, model_files)}); rerun compile and evaluate: {RERUN}"
        )


def check_scored(
    scored: Any, current: dict[str, Any], where: str = "metrics/evaluate.json"
) -> None:
    """Refuse an evaluation whose ``scored`` record is missing or differs from ``current``
    (:func:`scored_record` of what is there now), naming the first broken link."""
    if not isinstance(scored, dict) or not scored:
        raise ValueError(
            f"{where} records nothing it scored (no 'scored': the artifact, model, data and "
            f"params it was computed from); rerun evaluate: {RERUN}"
        )
    for role in SCORED_ROLES:
        if role not in current:
            continue
        was = scored.get(role) if isinstance(scored.get(role), dict) else {}
        now = current[role]
        key = "md5" if role == "params" else "sha256"
        if was.get(key) != now[key]:
            what = (
                f"the params it reads ({', '.join(SCORED_PARAMS)})"
                if role == "params"
                else now["path"]
            )
            raise ValueError(
                f"{where} scored another {what} than the one there now "
                f"({_first_change(was.get(key), now[key])}); rerun evaluate: {RERUN}"
            )


def check_chain(cfg: Any, root: Path, ev: dict[str, Any]) -> None:
    """The whole model-side chain of a workspace, upstream first: ``models/compiled`` was compiled
    from ``models/hydra`` as it is now, and ``ev`` (``metrics/evaluate.json``) scored exactly the
    compiled artifact, model, data and params there now. One-line ValueError naming the link."""
    root = Path(root)
    compiled = read_json(root / COMPILED / "compiled.json", "compile output")
    check_compiled_source(
        compiled, folder_sha256(root / HYDRA), f"{COMPILED.as_posix()} <- {HYDRA.as_posix()}"
    )
    check_scored(ev.get("scored"), scored_record(cfg, root), (METRICS / "evaluate.json").as_posix())


def check_bundle(directory: Path) -> None:
    """The same chain inside a bundle: ``compiled/`` was compiled from ``model/``, and the
    bundled ``evaluate.json`` scored that ``compiled/`` and that ``model/``."""
    directory = Path(directory)
    model = folder_sha256(directory / "model")
    compiled = read_json(directory / "compiled" / "compiled.json", "bundled compiled artifact")
    check_compiled_source(compiled, model, f"bundle {directory}: compiled/ <- model/")
    ev = read_json(directory / "evaluate.json", "bundled evaluation")
    current = {
        "model": {"path": "model/", "sha256": model},
        "compiled": {"path": "compiled/", "sha256": folder_sha256(directory / "compiled")},
    }
    check_scored(ev.get("scored"), current, f"bundle {directory}: evaluate.json")
