"""Content hashes that bind a gate verdict to what it judged: DVC md5s of outputs, a params hash.

``dvc_md5(path)`` is the md5 DVC records for an output in ``dvc.lock`` (a file: md5 of its bytes;
a folder: md5 of the sorted ``[{"md5", "relpath"}]`` listing plus ``.dir``, built with dvc-data's
own ``Tree`` so the two never drift), computed from the workspace without running DVC (the
``gate`` and ``promote`` stages run inside ``dvc repro``, which holds the repo lock).
``params_md5`` hashes the validated params except the ``promote`` section (which names the
registry entry and does not change what is judged).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

#: What a verdict is bound to: role -> workspace path. ``params`` is hashed separately.
JUDGED = {
    "model": Path("models/hydra"),
    "compiled": Path("models/compiled"),
    "evaluation": Path("metrics/evaluate.json"),
}


def _file_md5(path: Path) -> str:
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
        return _file_md5(path)
    if not path.is_dir():
        raise ValueError(f"{path} is missing")
    tree = Tree()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = f.relative_to(path)
        tree.add(rel.parts, None, HashInfo("md5", _file_md5(f)))
    tree.digest()
    return str(tree.hash_info.value)


def params_md5(cfg: Any) -> str:
    """md5 of the validated params (a pydantic model) without the ``promote`` section."""
    data = cfg.model_dump(mode="json", exclude={"promote"})
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
