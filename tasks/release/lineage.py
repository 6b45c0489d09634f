"""Content hashes that bind a gate verdict to what it judged: DVC md5s of outputs, a params hash.

``dvc_md5(path)`` is the md5 DVC records for an output in ``dvc.lock`` (a file: md5 of its bytes;
a folder: md5 of the sorted ``[{"md5", "relpath"}]`` listing plus ``.dir``, built with dvc-data's
own ``Tree`` so the two never drift), computed from the workspace without running DVC (the
``gate`` and ``promote`` stages run inside ``dvc repro``, which holds the repo lock).
``params_md5`` hashes the validated params except ``promote.model_name`` and ``promote.stage``
(which name the registry entry and do not change what is judged); ``promote.candidates`` is
hashed: it decides which judged candidate ships.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tasks.runtime.dvcfiles import read_lock

#: What a verdict is bound to: role -> workspace path. ``params`` is hashed separately.
JUDGED = {
    "model": Path("models/hydra"),
    "compiled": Path("models/compiled"),
    "evaluation": Path("metrics/evaluate.json"),
}


def file_md5(path: Path) -> str:
    """The md5 hex digest of the file at ``path`` (DVC's object hash), read in 1 MiB chunks."""
    h = hashlib.md5()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def dvc_md5(path: Path) -> str:
    """DVC's md5 of a workspace file or folder (ValueError if it does not exist)."""
    from dvc_data.hashfile.hash_info import HashInfo
    from dvc_data.hashfile.tree import Tree

    path = Path(path)
    if path.is_file():
        return file_md5(path)
    if not path.is_dir():
        raise ValueError(f"{path} is missing")
    tree = Tree()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = f.relative_to(path)
        tree.add(rel.parts, None, HashInfo("md5", file_md5(f)))
    tree.digest()
    return str(tree.hash_info.value)


def params_md5(cfg: Any) -> str:
    """md5 of the validated params (a pydantic model) without ``promote.model_name`` and
    ``promote.stage``."""
    data = cfg.model_dump(mode="json", exclude={"promote": {"model_name", "stage"}})
    return hashlib.md5(json.dumps(data, sort_keys=True).encode()).hexdigest()


def judged_hashes(cfg: Any, root: Path) -> dict[str, dict[str, str]]:
    """``{role: {"path", "md5"}}`` for every artifact a verdict judges, and the params."""
    record = {
        role: {"path": rel.as_posix(), "md5": dvc_md5(root / rel)} for role, rel in JUDGED.items()
    }
    record["params"] = {"path": "params.yaml", "md5": params_md5(cfg)}
    return record


def stale_roles(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """The roles whose recorded hash differs from the current one (or is missing)."""
    return [
        role for role in current if (recorded.get(role) or {}).get("md5") != current[role]["md5"]
    ]


def lock_break(root: Path, paths: list[Path], skip_stages: tuple[str, ...] = ()) -> str | None:
    """The first broken link between ``dvc.lock`` and the workspace, as one line, or None.

    Every path in ``paths`` must be an output ``dvc.lock`` records, with the md5 the workspace
    holds (a stage run outside DVC, ``hydra-ens stage`` or ``python -m tasks.<stage>``, changes the
    workspace and not the lock); and every stage's dependency on another stage's output must
    have been recorded at that output's locked md5 (stages run out of order, e.g. ``dvc repro
    --single-item``, leave an older input under a newer stage). ``skip_stages``: stages whose
    entry is being rewritten (``promote`` runs inside its own ``dvc repro``).
    """
    stages = read_lock(root)
    if not stages:
        return "there is no dvc.lock recording the run; run the pipeline: hydra-ens run"
    outs: dict[str, tuple[str, str | None]] = {}
    for name, stage in stages.items():
        for out in (stage or {}).get("outs") or []:
            outs[Path(out.get("path", "")).as_posix()] = (name, out.get("md5"))
    for rel in paths:
        key = Path(rel).as_posix()
        if key not in outs:
            return f"dvc.lock records no output {key}; run the pipeline: hydra-ens run"
        locked = outs[key][1]
        here = dvc_md5(Path(root) / rel) if (Path(root) / rel).exists() else None
        if locked != here:
            return (
                f"{key} is not what dvc.lock records ({str(locked)[:8]} locked, "
                f"{str(here)[:8]} here: a stage ran outside DVC, e.g. hydra-ens stage); run "
                "the pipeline: hydra-ens run"
            )
    for name, stage in stages.items():
        if name.split("@")[0] in skip_stages:
            continue
        for dep in (stage or {}).get("deps") or []:
            key = Path(dep.get("path", "")).as_posix()
            if key in outs and outs[key][0] != name and dep.get("md5") != outs[key][1]:
                return (
                    f"dvc.lock: stage {name} ran on another {key} than stage {outs[key][0]} "
                    "wrote (stages ran out of order); run the pipeline: hydra-ens run"
                )
    return None


def stale_verdict_message(stale: list[str], recorded: dict, current: dict) -> str:
    """One line: which judged artifacts changed since the verdict, and what to run."""
    parts = [
        f"{current[r]['path']} ({str((recorded.get(r) or {}).get('md5'))[:8]} -> "
        f"{current[r]['md5'][:8]})"
        for r in stale
    ]
    return (
        "the gate verdict (reports/gate.json) is stale: changed since it was written: "
        + ", ".join(parts)
        + "; rerun the gate on what is there now: hydra-ens run (or dvc repro gate)"
    )
