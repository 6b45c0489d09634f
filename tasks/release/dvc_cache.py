"""A DVC-tracked folder got back from the project's DVC cache or a local remote, verified object by
object and as a folder: how a registered bundle is rebuilt when the workspace holds another one.
Every md5 read from a record or a listing is checked before it is joined into a path."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

from tasks.release.lineage import dvc_md5, file_md5
from tasks.runtime.dvcfiles import REMOTE_DIR
from tasks.runtime.layout import BUNDLE
from tasks.runtime.outputs import publish_dir

#: A DVC md5 (a folder's ends with ``.dir``).
MD5 = r"[0-9a-f]{32}"


def check_md5(value: str, what: str, folder: bool = False) -> str:
    """``value`` if it is a hex md5 (``folder``: plus ``.dir``), else ValueError naming ``what``;
    what may be joined into a cache path."""
    if not re.fullmatch(MD5 + (r"\.dir" if folder else ""), str(value)):
        raise ValueError(f"{what}: {str(value)[:60]!r} is not a DVC md5")
    return value


def local_remote_dirs(root: Path) -> list[Path]:
    """The folders of the project's DVC remotes that are local paths (``.dvc/config`` and
    ``.dvc/config.local``; a relative URL is relative to ``.dvc/``), then :data:`REMOTE_DIR`.
    Read from the files, not with ``dvc config``: promote runs inside ``dvc repro``."""
    from configobj import ConfigObj, ConfigObjError

    found: list[Path] = []
    for name in ("config", "config.local"):
        path = root / ".dvc" / name
        if not path.is_file():
            continue
        try:
            conf = ConfigObj(str(path), encoding="utf-8")
        except ConfigObjError:
            continue
        for section, values in conf.items():
            url = values.get("url") if section.startswith("remote ") else None
            if isinstance(url, str) and url and "://" not in url:
                found.append((root / ".dvc" / url).resolve())
    found.append((root / REMOTE_DIR).resolve())
    return list(dict.fromkeys(found))


def _cache_object(root: Path, md5: str) -> Path | None:
    """The file of DVC object ``md5`` (``xxx`` or ``xxx.dir``, checked before it is joined into
    a path) in the project's cache or a local remote; None when none holds it."""
    check_md5(md5.removesuffix(".dir"), "DVC object")
    rel = Path("files") / "md5" / md5[:2] / md5[2:]
    for base in (root / ".dvc" / "cache", *local_remote_dirs(root)):
        if (base / rel).is_file():
            return base / rel
    return None


def bundle_available(root: Path, md5: str) -> bool:
    """Whether bundle ``md5`` is in the workspace, the DVC cache or a local remote."""

    check_md5(md5, "bundle_md5", folder=True)
    ws = root / BUNDLE
    return (ws.is_dir() and dvc_md5(ws) == md5) or _cache_object(root, md5) is not None


def _listing(root: Path, md5: str) -> list[tuple[str, str]]:
    """``[(relpath, md5)]`` of DVC folder object ``md5``, after checking the listing's own md5
    and every entry (a hex md5; a relative POSIX path without ``..``, unique)."""
    listing = _cache_object(root, md5)
    if listing is None:
        raise ValueError(
            f"bundle {md5} is in neither the DVC cache nor a local DVC remote; run `dvc pull`"
        )
    raw = listing.read_bytes()
    if hashlib.md5(raw).hexdigest() != md5.removesuffix(".dir"):
        raise ValueError(f"the DVC cache's listing of bundle {md5} is corrupt (md5 mismatch)")
    try:
        entries = json.loads(raw)
        rows = [(str(e["relpath"]), str(e["md5"])) for e in entries]
    except (ValueError, TypeError, KeyError) as err:
        raise ValueError(f"the DVC cache's listing of bundle {md5} is unreadable: {err}") from None
    for relpath, digest in rows:
        check_md5(digest, f"bundle {md5}: {relpath[:60]!r}")
        pure = PurePosixPath(relpath)
        if pure.is_absolute() or ".." in pure.parts or "\\" in relpath or not pure.parts:
            raise ValueError(f"bundle {md5}: unsafe path {relpath[:60]!r} in its listing")
    if len({r for r, _ in rows}) != len(rows):
        raise ValueError(f"bundle {md5}: a path appears twice in its listing")
    return rows


def materialise_from_cache(root: Path, md5: str, target: Path) -> Path:
    """Rebuild DVC-tracked folder ``md5`` (``xxx.dir``) from the cache or a local remote into
    ``target``, verified: the listing's md5, every object's md5, and the folder's DVC md5 at the
    end (ValueError naming the first mismatch; nothing is published then)."""

    check_md5(md5, "bundle_md5", folder=True)
    rows = _listing(root, md5)
    with publish_dir(target) as tmp:
        for relpath, digest in rows:
            obj = _cache_object(root, digest)
            if obj is None:
                raise ValueError(f"file {relpath} of bundle {md5} missing from the cache")
            dst = tmp / relpath
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(obj, dst)
            if file_md5(dst) != digest:
                raise ValueError(
                    f"file {relpath} of bundle {md5} is corrupt in the DVC cache (md5 mismatch)"
                )
        if dvc_md5(tmp) != md5:
            raise ValueError(f"bundle {md5} rebuilt from the DVC cache has another folder md5")
    return target


def resolve_bundle_dir(root: Path, record: dict[str, Any]) -> Path:
    """The folder holding the bundle a version record names (workspace copy or rebuilt)."""

    md5 = record["fields"].get("bundle_md5")
    if not md5:
        raise ValueError(
            f"{record['tag']} was registered before bundles (no bundle_md5 in its record); "
            "promote a newer version"
        )
    check_md5(md5, f"{record['tag']}: bundle_md5", folder=True)
    ws = root / BUNDLE
    if ws.is_dir() and dvc_md5(ws) == md5:
        return ws
    target = root / ".hydra-ens" / "registry" / md5.removesuffix(".dir")
    if not (target.is_dir() and dvc_md5(target) == md5):
        materialise_from_cache(root, md5, target)
    return target
