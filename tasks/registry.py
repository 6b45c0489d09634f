"""The model registry: GTO git tags in the project's repo, model content in DVC's cache/remote.

A promotion creates two annotated tags through GTO: ``<name>@vX.Y.Z`` (registers a version of the
current commit) and ``<name>#<stage>#N`` (assigns the stage). The registration's tag message
records what was promoted, one ``key: value`` per line::

    hydra-ens promotion of models/hydra
    dvc_md5: <md5 of the models/hydra folder in dvc.lock / the DVC cache>
    sha256: <sha256 over the folder's files>
    gate: passed | FAILED (forced)
    reason: <the --reason of a forced promotion>
    metrics: <JSON of the Hydra model's metrics, for gates that compare with prod>

``resolve_prod_dir`` turns the stage back into a model folder: the workspace copy when its hash
matches, else the folder rebuilt from the DVC cache (or the local DVC remote) by its md5.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tasks.common import HYDRA, dir_sha256, publish_dir

DVC_REMOTE_DIR = ".dvc-remote"


def has_commit(root: Path) -> bool:
    r = subprocess.run(
        ["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=root, capture_output=True, text=True
    )
    return r.returncode == 0


#: Who tags a promotion when git has no identity configured (a fresh machine or CI runner).
FALLBACK_IDENTITY = ("hydra-ens", "hydra-ens@localhost")


def ensure_git_identity(root: Path) -> str | None:
    """Make sure git can write annotated tags in ``root``.

    When git has no committer identity (``git var GIT_COMMITTER_IDENT`` fails), sets the
    ``GIT_{AUTHOR,COMMITTER}_{NAME,EMAIL}`` variables of this process to :data:`FALLBACK_IDENTITY`
    and returns a line saying so; returns None when an identity is configured.
    """
    r = subprocess.run(
        ["git", "var", "GIT_COMMITTER_IDENT"], cwd=root, capture_output=True, text=True
    )
    if r.returncode == 0:
        return None
    name, email = FALLBACK_IDENTITY
    for role in ("AUTHOR", "COMMITTER"):
        os.environ[f"GIT_{role}_NAME"] = name
        os.environ[f"GIT_{role}_EMAIL"] = email
    return (
        f"git has no user.name/user.email here; registry tags are signed {name} <{email}> "
        "(set git config user.name and user.email to sign them yourself)"
    )


def locked_md5(root: Path, path: Path = HYDRA) -> str | None:
    """The md5 that ``dvc.lock`` records for output ``path`` (None if not locked yet)."""
    lock = root / "dvc.lock"
    if not lock.is_file():
        return None
    data = yaml.safe_load(lock.read_text()) or {}
    for stage in (data.get("stages") or {}).values():
        for out in stage.get("outs") or []:
            if Path(out.get("path", "")) == Path(path):
                return out.get("md5")
    return None


def tag_message(root: Path, tag: str) -> str:
    r = subprocess.run(
        ["git", "for-each-ref", f"refs/tags/{tag}", "--format=%(contents)"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    return r.stdout


def parse_message(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(": ")
        if sep and key.isidentifier():
            fields[key] = value.strip()
    return fields


def prod_version(root: Path, name: str, stage: str) -> dict[str, Any] | None:
    """``{"version", "tag", "commit", "fields"}`` of the version in ``stage``, or None."""
    import gto.api

    if not has_commit(root):
        return None
    try:
        found = gto.api.find_versions_in_stage(str(root), name, stage)
    except Exception:  # gto raises on unknown artifacts
        return None
    if not found:
        return None
    vstage = found[0] if isinstance(found, list) else found
    version = vstage.version
    tag = f"{name}@{version}"
    return {
        "version": version,
        "tag": tag,
        "commit": vstage.commit_hexsha,
        "stage_tag": vstage.assignments[-1].tag if vstage.assignments else None,
        "fields": parse_message(tag_message(root, tag)),
    }


def prod_metrics(root: Path, name: str, stage: str) -> dict[str, Any] | None:
    prod = prod_version(root, name, stage)
    if prod is None or "metrics" not in prod["fields"]:
        return None
    return json.loads(prod["fields"]["metrics"])


def _cache_object(root: Path, md5: str) -> Path | None:
    rel = Path("files") / "md5" / md5[:2] / md5[2:]
    for base in (root / ".dvc" / "cache", root / DVC_REMOTE_DIR):
        if (base / rel).is_file():
            return base / rel
    return None


def materialise_from_cache(root: Path, md5: str, target: Path) -> Path:
    """Rebuild a DVC-tracked folder with md5 ``md5`` (``xxx.dir``) from the cache or local
    remote."""
    listing = _cache_object(root, md5)
    if listing is None:
        raise ValueError(
            f"model {md5} is in neither the DVC cache nor {DVC_REMOTE_DIR}/; run `dvc pull`"
        )
    with publish_dir(target) as tmp:
        for entry in json.loads(listing.read_text()):
            obj = _cache_object(root, entry["md5"])
            if obj is None:
                raise ValueError(f"file {entry['relpath']} of model {md5} missing from the cache")
            dst = tmp / entry["relpath"]
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(obj, dst)
    return target


def resolve_prod_dir(root: Path, name: str, stage: str) -> tuple[Path, dict[str, Any]]:
    """The folder of the model in ``stage`` and its registry record (ValueError if none)."""
    prod = prod_version(root, name, stage)
    if prod is None:
        raise ValueError(f"no model {name!r} in stage {stage!r}; run the pipeline / promote first")
    fields = prod["fields"]
    ws = root / HYDRA
    if ws.is_dir() and fields.get("sha256") == dir_sha256(ws):
        return ws, prod
    md5 = fields.get("dvc_md5")
    if not md5:
        raise ValueError(f"{prod['tag']}: tag message has no dvc_md5; cannot locate the model")
    target = root / ".hydra-ens" / "registry" / md5.removesuffix(".dir")
    if not (target.is_dir() and fields.get("sha256") == dir_sha256(target)):
        materialise_from_cache(root, md5, target)
    return target, prod
