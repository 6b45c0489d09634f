"""The model registry: GTO git tags in the project's repo, model content in DVC's cache/remote.

A promotion creates two annotated tags through GTO: ``<name>@vX.Y.Z`` (registers a version) and
``<name>#<stage>#N`` (assigns the stage). Each version is registered on its own *version commit*
(:func:`commit_run`): a commit on the branch ``hydra-ens/versions`` whose tree is the project's
``HEAD`` plus that run's ``params.yaml``, ``dvc.lock``, DVC config and modified tracked files,
built with a temporary git index so the user's working tree, index and branch are untouched. So
``git checkout <name>@vX.Y.Z && dvc pull`` gives back the promoted bundle byte for byte, and every
promoted run gets its own version however many runs share the code commit.

The registration's tag message records what was promoted, one ``key: value`` per line::

    hydra-ens promotion of models/bundle
    bundle_md5: <DVC md5 of the models/bundle folder>
    model_md5: <DVC md5 of models/hydra, the calibrated model in the bundle>
    params_md5: <hash of the params the gate judged>
    gate: passed | FAILED (forced)
    reason: <the --reason of a forced promotion>
    failed_checks: <the checks a forced promotion overrode>
    metrics: <JSON of the Hydra model's metrics, for gates that compare with prod>

The model in a stage is the version of the stage's *latest* assignment tag (highest ``N``): a
rollback (``hydra-ens promote --version``) is a new assignment of an earlier version. (GTO's own
``gto which`` ranks the versions holding a stage by SemVer instead; ``hydra-ens registry`` shows
the assignment history.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tasks.common import BUNDLE, publish_dir

DVC_REMOTE_DIR = ".dvc-remote"
VERSIONS_BRANCH = "hydra-ens/versions"
#: Project files a version commit takes from the working tree (when present).
RUN_FILES = (
    "params.yaml",
    "dvc.lock",
    "dvc.yaml",
    ".dvcignore",
    ".gitignore",
    ".dvc/config",
    ".dvc/.gitignore",
)
#: Who tags a promotion when git has no identity configured (a fresh machine or CI runner).
FALLBACK_IDENTITY = ("hydra-ens", "hydra-ens@localhost")


class RegistryError(ValueError):
    """The registry (git tags) could not be read or written."""


def _git(root: Path, *args: str, env: dict[str, str] | None = None) -> str:
    r = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        msg = (r.stderr.strip() or r.stdout.strip()).splitlines()
        raise RegistryError(f"git {' '.join(args[:2])} failed: {msg[-1] if msg else r.returncode}")
    return r.stdout


def has_commit(root: Path) -> bool:
    r = subprocess.run(
        ["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=root, capture_output=True, text=True
    )
    return r.returncode == 0


def ensure_git_identity(root: Path) -> str | None:
    """Make sure git can write commits and annotated tags in ``root``.

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
        f"git has no user.name/user.email here; registry commits and tags are signed {name} "
        f"<{email}> (set git config user.name and user.email to sign them yourself)"
    )


def locked_md5(root: Path, path: Path) -> str | None:
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


# ---- reading the registry ----
def tag_message(root: Path, tag: str) -> str:
    return _git(root, "for-each-ref", f"refs/tags/{tag}", "--format=%(contents)")


def parse_message(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(": ")
        if sep and key.isidentifier():
            fields[key] = value.strip()
    return fields


def _tags(root: Path, pattern: str) -> list[tuple[str, str, str]]:
    """``(tag, commit it points at, creation time)`` of the tags matching a glob."""
    out = _git(
        root,
        "for-each-ref",
        f"refs/tags/{pattern}",
        "--format=%(refname:strip=2)%00%(*objectname)%(objectname)%00%(creatordate:iso-strict)",
    )
    rows = []
    for line in out.splitlines():
        tag, target, created = line.split("\0")
        # annotated tags print the peeled commit first, then the tag object: keep the commit
        rows.append((tag, target[:40], created))
    return rows


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version))


def versions(root: Path, name: str) -> list[dict[str, Any]]:
    """Every registered version of ``name``, oldest first: version, tag, commit, created, fields."""
    if not has_commit(root):
        return []
    rows = []
    for tag, commit, created in _tags(root, f"{name}@*"):
        version = tag.split("@", 1)[1]
        if not re.fullmatch(r"v\d+\.\d+\.\d+", version):
            continue
        fields = parse_message(tag_message(root, tag))
        rows.append(
            {"version": version, "tag": tag, "commit": commit, "created": created, "fields": fields}
        )
    return sorted(rows, key=lambda r: _version_key(r["version"]))


def assignments(root: Path, name: str, stage: str) -> list[dict[str, Any]]:
    """The ``<name>#<stage>#N`` tags, oldest first: n, tag, commit, created, message."""
    if not has_commit(root):
        return []
    rows = []
    for tag, commit, created in _tags(root, f"{name}#{stage}#*"):
        number = tag.rsplit("#", 1)[1]
        if not number.isdigit():
            continue
        rows.append(
            {
                "n": int(number),
                "tag": tag,
                "commit": commit,
                "created": created,
                "message": tag_message(root, tag).strip(),
            }
        )
    return sorted(rows, key=lambda r: r["n"])


def prod_version(root: Path, name: str, stage: str) -> dict[str, Any] | None:
    """The version in ``stage`` (its latest assignment), or None when nothing was assigned.

    Raises:
        RegistryError: the tags cannot be read, or the stage points at no registered version.
    """
    history = assignments(root, name, stage)
    if not history:
        return None
    latest = history[-1]
    by_commit = {v["commit"]: v for v in versions(root, name)}
    found = by_commit.get(latest["commit"])
    if found is None:
        raise RegistryError(
            f"{latest['tag']} points at commit {latest['commit'][:8]}, which holds no registered "
            f"{name} version"
        )
    return {**found, "stage_tag": latest["tag"], "assigned": latest["created"]}


def prod_metrics(root: Path, name: str, stage: str) -> dict[str, Any] | None:
    """The metrics recorded with the version in ``stage`` (None when no version is there).

    Raises:
        RegistryError: the registry cannot be read or the version's record has no metrics.
    """
    prod = prod_version(root, name, stage)
    if prod is None:
        return None
    raw = prod["fields"].get("metrics")
    if raw is None:
        raise RegistryError(f"{prod['tag']}: its tag message records no metrics")
    try:
        return json.loads(raw)
    except json.JSONDecodeError as err:
        raise RegistryError(
            f"{prod['tag']}: unreadable metrics in its tag message ({err})"
        ) from None


# ---- writing the registry ----
def commit_run(root: Path, message: str) -> str:
    """A version commit of this run on :data:`VERSIONS_BRANCH`; returns its sha.

    The tree is ``HEAD``'s plus the working tree's modified tracked files, :data:`RUN_FILES` and
    the ``.gitignore`` files DVC writes next to outputs. Parents: the branch's previous tip (so
    ``git log --first-parent hydra-ens/versions`` lists the versions), then ``HEAD``. A temporary
    index is used: the user's index, working tree and current branch are not touched.
    """
    if not has_commit(root):
        raise RegistryError(
            "the git repo has no commit to build a version on; commit the project first "
            "(git add -A && git commit -m ...)"
        )
    with tempfile.TemporaryDirectory(prefix="hydra-ens-index-") as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _git(root, "read-tree", "HEAD", env=env)
        _git(root, "add", "-u", env=env)
        dvc_gitignores = _git(
            root, "ls-files", "--others", "--exclude-standard", "--", ":(glob)**/.gitignore"
        ).split()
        paths = [p for p in RUN_FILES if (root / p).is_file()] + dvc_gitignores
        if paths:
            _git(root, "add", "-f", "--", *paths, env=env)
        tree = _git(root, "write-tree", env=env).strip()
    head = _git(root, "rev-parse", "HEAD").strip()
    parents = []
    tip = subprocess.run(
        ["git", "rev-parse", "--verify", "-q", f"refs/heads/{VERSIONS_BRANCH}"],
        cwd=root,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if tip and tip != head:
        parents += ["-p", tip]
    parents += ["-p", head]
    sha = _git(root, "commit-tree", tree, *parents, "-m", message).strip()
    _git(root, "update-ref", f"refs/heads/{VERSIONS_BRANCH}", sha)
    return sha


def register(root: Path, name: str, message: str) -> tuple[str, str]:
    """Register a new version on a fresh version commit; returns ``(version, commit)``."""
    import gto.api
    import gto.exceptions

    subject = message.splitlines()[0]
    sha = commit_run(root, f"{subject} (hydra-ens version commit)\n\n{message}")
    try:
        reg = gto.api.register(str(root), name, ref=sha, message=message)
    except gto.exceptions.GTOException as err:
        raise RegistryError(f"the registry (GTO) refused the registration: {err}") from None
    return str(getattr(reg, "version", reg)), sha


def assign(root: Path, name: str, stage: str, version: str, message: str) -> str:
    """Make ``version`` the latest assignment of ``stage``; returns the new stage tag."""
    import gto.api
    import gto.exceptions

    try:
        # force: GTO refuses to re-assign a stage that an earlier assignment left on this
        # version (a rollback); the new tag is what makes it the latest
        tag = gto.api.assign(str(root), name, stage, version=version, message=message, force=True)
    except gto.exceptions.GTOException as err:
        raise RegistryError(f"the registry (GTO) refused the assignment: {err}") from None
    return str(getattr(tag, "tag", tag))


# ---- getting a registered bundle back ----
def _cache_object(root: Path, md5: str) -> Path | None:
    rel = Path("files") / "md5" / md5[:2] / md5[2:]
    for base in (root / ".dvc" / "cache", root / DVC_REMOTE_DIR):
        if (base / rel).is_file():
            return base / rel
    return None


def bundle_available(root: Path, md5: str) -> bool:
    """Whether bundle ``md5`` is in the workspace, the DVC cache or the local remote."""
    from tasks.lineage import dvc_md5

    ws = root / BUNDLE
    return (ws.is_dir() and dvc_md5(ws) == md5) or _cache_object(root, md5) is not None


def materialise_from_cache(root: Path, md5: str, target: Path) -> Path:
    """Rebuild a DVC-tracked folder with md5 ``md5`` (``xxx.dir``) from the cache or local
    remote."""
    listing = _cache_object(root, md5)
    if listing is None:
        raise ValueError(
            f"bundle {md5} is in neither the DVC cache nor {DVC_REMOTE_DIR}/; run `dvc pull`"
        )
    with publish_dir(target) as tmp:
        for entry in json.loads(listing.read_text()):
            obj = _cache_object(root, entry["md5"])
            if obj is None:
                raise ValueError(f"file {entry['relpath']} of bundle {md5} missing from the cache")
            dst = tmp / entry["relpath"]
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(obj, dst)
    return target


def resolve_bundle_dir(root: Path, record: dict[str, Any]) -> Path:
    """The folder holding the bundle a version record names (workspace copy or rebuilt)."""
    from tasks.lineage import dvc_md5

    md5 = record["fields"].get("bundle_md5")
    if not md5:
        raise ValueError(
            f"{record['tag']} was registered before bundles (no bundle_md5 in its record); "
            "promote a newer version"
        )
    ws = root / BUNDLE
    if ws.is_dir() and dvc_md5(ws) == md5:
        return ws
    target = root / ".hydra-ens" / "registry" / md5.removesuffix(".dir")
    if not (target.is_dir() and dvc_md5(target) == md5):
        materialise_from_cache(root, md5, target)
    return target


def resolve_prod_dir(root: Path, name: str, stage: str) -> tuple[Path, dict[str, Any]]:
    """The bundle folder of the model in ``stage`` and its registry record (ValueError if none)."""
    prod = prod_version(root, name, stage)
    if prod is None:
        raise ValueError(f"no model {name!r} in stage {stage!r}; run the pipeline / promote first")
    return resolve_bundle_dir(root, prod), prod
