"""Resumable per-unit work for the stages that train several independent models.

A *unit* (a member, a Deep Ensemble seed) is a sub-folder of the stage's output. It is written to a
temp folder and renamed into place only when complete, with ``done.json`` holding the unit's
fingerprint (what it was computed from) and the sha256 of its files. On restart a unit is skipped
iff ``done.json`` exists, its fingerprint matches and every file still hashes the same, so a run
killed midway recomputes only the unfinished units. The stage's DVC output is ``persist: true`` so
DVC does not delete finished units before rerunning the stage; ``index.json`` (written last, by the
stage) lists the units that make up the output, and any other folder is removed.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra_ops.hashing import sha256_bytes, sha256_file
from tasks.runtime.outputs import json_default, publish_dir, read_json, write_json

log = logging.getLogger("hydra_ens")
DONE = "done.json"


def dir_sha256(path: Path, exclude: tuple[str, ...] = ()) -> str:
    """Hash of every file's relative path and content under ``path`` (sorted, stable)."""
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    named = [(f.relative_to(root).as_posix(), f) for f in files]
    return sha256_bytes(
        *(
            rel.encode() + b"\0" + sha256_file(f).encode() + b"\0"
            for rel, f in named
            if rel not in exclude
        )
    )


def fingerprint(obj: Any) -> str:
    """sha256 of a JSON-serialisable description (what a cached unit of work was computed from)."""
    return sha256_bytes(json.dumps(obj, sort_keys=True, default=json_default).encode())


def unit_is_done(unit_dir: Path, fp: str) -> bool:
    done = unit_dir / DONE
    if not done.is_file():
        return False
    try:
        record = read_json(done)
    except ValueError:
        return False
    return record.get("fingerprint") == fp and record.get("sha256") == dir_sha256(
        unit_dir, exclude=(DONE,)
    )


def ensure_unit(
    unit_dir: Path, fp: str, build: Callable[[Path], dict[str, Any]], label: str
) -> dict[str, Any]:
    """Build ``unit_dir`` with ``build(tmp_dir) -> info`` unless a verified copy exists.

    ``info`` goes into ``done.json``, part of the stage's cached output: it must be what the same
    inputs always give (no wall-clock timings, host names or absolute paths; log those instead),
    or a resumed run would hash differently from an uninterrupted one."""
    if unit_is_done(unit_dir, fp):
        log.info("%s: up to date (verified by hash), skipping", label)
        return read_json(unit_dir / DONE)
    log.info("%s: computing", label)
    with publish_dir(unit_dir) as tmp:
        info = build(tmp)
        record = {"fingerprint": fp, "sha256": dir_sha256(tmp), "info": info}
        write_json(tmp / DONE, record)
    log.info("%s: done", label)
    return record


def finalise(out_dir: Path, units: dict[str, dict[str, Any]], extra: dict[str, Any]) -> None:
    """Remove folders that are not listed units and write ``index.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for child in out_dir.iterdir():
        if child.is_dir() and child.name not in units:
            shutil.rmtree(child)
        elif child.is_file() and child.name != "index.json":
            child.unlink()
    write_json(
        out_dir / "index.json",
        {**extra, "units": {k: {"sha256": v["sha256"]} for k, v in units.items()}},
    )
