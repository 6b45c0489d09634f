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
    verdict_md5: <md5 of reports/gate.json, the verdict promoted on>
    gate: passed | FAILED (forced)
    reason: <the --reason of a forced promotion>
    failed_checks: <the checks a forced promotion overrode>
    metrics: <JSON of the Hydra model's metrics, for gates that compare with prod>

The registry fails closed. The model in a stage is read with GTO's own state (so
``gto deprecate``, ``gto unassign`` and ``gto deregister`` tags count exactly as ``gto show``
counts them); every move of a stage (a promotion, a rollback) first unassigns the version that
held it, so the stage holds one version and GTO's SemVer and timestamp orders agree, and
consecutive stage tags of a model are at least a second apart (GTO orders them by their tag
time). Between a move's two tags the stage is empty; a reader tells that from a stage left for
good by :func:`stage_move_under_way` (the unassignment names the incoming version, and counts for
at most :data:`MOVE_GRACE_S` seconds). A stage held by two versions (tags written by hand or by
an older release) is refused with a line saying how to settle it. Every field read back from a
tag message is validated (:func:`parse_record`: known keys, no repeats, formats and lengths)
before it is used, and nothing from a tag is joined into a path unchecked. A bundle rebuilt from
the DVC cache or a local remote is verified object by object and as a folder
(:func:`tasks.release.dvc_cache.materialise_from_cache`). A clone that lacks the registry's tags
says so instead of reading as an empty registry.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
import unicodedata
from pathlib import Path
from typing import Any

from tasks.release import git_repo
from tasks.release.dvc_cache import MD5, resolve_bundle_dir
from tasks.release.git_repo import has_commit
from tasks.runtime.layout import BUNDLE

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
#: The hardware records and choices a version commit takes too (:mod:`tasks.runtime.hardware`; named
#: here so that the registry does not import torch).
HARDWARE_GLOBS = ("hardware/*.json", "hardware/choices.yaml")


#: The first line of every registration message hydra-ens writes.
RECORD_HEADER = f"hydra-ens promotion of {BUNDLE}"
#: Every key a registration message may hold: value pattern and longest length.
RECORD_FIELDS: dict[str, tuple[str, int]] = {
    "bundle_md5": (MD5 + r"\.dir", 36),
    "model_md5": (MD5 + r"\.dir", 36),
    "params_md5": (MD5, 32),
    "verdict_md5": (MD5, 32),
    "gate": (r"passed|FAILED \(forced\)", 16),
    "candidate": (r"[a-z][a-z0-9_]*", 40),
    "reason": (r".+", 500),
    "failed_checks": (r".+", 4000),
    "metrics": (r"\{.*\}", 200_000),
}
#: Longest ``--reason`` accepted.
MAX_REASON = RECORD_FIELDS["reason"][1]
#: Unicode categories refused in a reason: control, format, surrogate, private use, unassigned,
#: line and paragraph separators (``str.splitlines`` splits on several of them).
_REFUSED_CATEGORIES = ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")


class RegistryError(ValueError):
    """The registry (git tags) could not be read or written."""


def git(root: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """:func:`tasks.release.git_repo.git`, failing with :class:`RegistryError`."""
    return git_repo.git(root, *args, env=env, error=RegistryError)


class NoVersionInStage(ValueError):
    """No version of the model holds the stage, as ``gto show`` reads it. ``move``: the move of
    the stage that hydra-ens has begun and not finished (:func:`stage_move_under_way`), if any."""

    def __init__(self, message: str, move: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.move = move


#: The message of the unassignment with which :func:`assign` starts moving a stage to another
#: version; :func:`stage_move_under_way` reads it back.
MOVE_MESSAGE = "hydra-ens: {name} {old} leaves {stage} for {new}"
#: Seconds a move begun by :func:`assign` counts as under way: its unassignment and assignment
#: are written about a second apart (:func:`_after_last_tag`), so a stage empty for longer was
#: left for good (a promotion killed between its two tags).
MOVE_GRACE_S = 10.0


def check_reason(reason: str | None, option: str = "--reason", longest: int = MAX_REASON) -> str:
    """The stripped ``reason``, after refusing an empty one, one longer than ``longest`` or one
    holding a line break or another control character (it is written into a tag message whose
    lines are the record's fields). ValueError with one line otherwise."""
    text = (reason or "").strip()
    if not text:
        raise ValueError(f"{option} TEXT is required (it is recorded in the registry)")
    if len(text) > longest:
        raise ValueError(f"{option}: {len(text)} characters; at most {longest}")
    bad = next((c for c in text if unicodedata.category(c) in _REFUSED_CATEGORIES), None)
    if bad is not None:
        raise ValueError(
            f"{option}: line breaks and control characters are not allowed (found {bad!r}); "
            "give the reason on one line"
        )
    return text


# ---- reading the registry ----
def tag_message(root: Path, tag: str) -> str:
    return git(root, "for-each-ref", f"refs/tags/{tag}", "--format=%(contents)")


def parse_message(text: str) -> dict[str, str]:
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(": ")
        if sep and key.isidentifier():
            fields[key] = value.strip()
    return fields


def parse_record(tag: str, text: str) -> dict[str, str]:
    """The fields of registration ``tag``'s message, validated (RegistryError naming the tag and
    the first problem): the :data:`RECORD_HEADER` line, then ``key: value`` lines with keys from
    :data:`RECORD_FIELDS`, none repeated, each value matching its format and length and free of
    control characters (``reason`` by :func:`check_reason`'s rules), ``metrics`` a JSON object."""
    lines = text.strip("\n").split("\n")
    fix = f"not a record hydra-ens wrote; inspect it: git show {tag}"
    if not lines or lines[0] != RECORD_HEADER:
        raise RegistryError(f"{tag}: its message does not start with {RECORD_HEADER!r}; {fix}")
    fields: dict[str, str] = {}
    for line in lines[1:]:
        key, sep, value = line.partition(": ")
        if not sep or key not in RECORD_FIELDS:
            raise RegistryError(f"{tag}: unexpected line {line[:60]!r} in its message; {fix}")
        if key in fields:
            raise RegistryError(f"{tag}: {key} appears twice in its message; {fix}")
        pattern, longest = RECORD_FIELDS[key]
        if len(value) > longest or not re.fullmatch(pattern, value):
            raise RegistryError(f"{tag}: {key} {value[:60]!r} is not a valid {key}; {fix}")
        if any(unicodedata.category(c) in _REFUSED_CATEGORIES for c in value):
            raise RegistryError(f"{tag}: {key} holds control characters; {fix}")
        fields[key] = value
    if "metrics" in fields:
        try:
            if not isinstance(json.loads(fields["metrics"]), dict):
                raise ValueError("not an object")
        except ValueError as err:
            raise RegistryError(f"{tag}: unreadable metrics in its message ({err})") from None
    return fields


def _tags(root: Path, pattern: str) -> list[tuple[str, str, str]]:
    """``(tag, commit it points at, creation time)`` of the tags matching a glob."""
    out = git(
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
        fields = parse_record(tag, tag_message(root, tag))
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


def _active_in_stage(root: Path, name: str, stage: str) -> list[str]:
    """The registered versions of ``name`` whose ``stage`` is active, as GTO's own state has it
    (what ``gto show`` lists: assignment, unassignment, deregistration and deprecation tags all
    count; a deprecated artifact holds no stage)."""
    import gto.exceptions
    from gto.base import VersionSort
    from gto.registry import GitRegistry

    try:
        with GitRegistry.from_url(str(root)) as reg:
            artifact = reg.get_state().find_artifact(name, create_new=True)
            if not artifact.is_registered or not artifact.is_active:
                return []
            held = artifact.get_vstages(
                registered_only=False, versions_per_stage=-1, sort=VersionSort.Timestamp
            ).get(stage, [])
    except gto.exceptions.GTOException as err:
        raise RegistryError(f"the registry (GTO) could not be read: {err}") from None
    for v in held:
        if not re.fullmatch(r"v\d+\.\d+\.\d+", v.version):
            raise RegistryError(
                f"{name} {stage} is assigned to commit {v.commit_hexsha[:8]}, which holds no "
                f"registered {name} version"
            )
    return [v.version for v in held]


def missing_tags_evidence(root: Path, name: str) -> str | None:
    """Why this repo should hold registry tags of ``name`` it lacks (a clone made with
    ``--no-tags`` or ``--single-branch``), or None: a :data:`VERSIONS_BRANCH` ref (local or a
    remote's), a remote set to fetch no tags, or a ``registry/promotion.json`` that records a
    promotion."""
    if _tags(root, f"{name}@*"):
        return None
    refs = git(
        root,
        "for-each-ref",
        "--format=%(refname)",
        f"refs/heads/{VERSIONS_BRANCH}",
        f"refs/remotes/*/{VERSIONS_BRANCH}",
    ).split()
    if refs:
        return f"the branch {refs[0].removeprefix('refs/')} holds version commits"
    no_tags = subprocess.run(
        ["git", "config", "--get-regexp", r"^remote\..*\.tagopt$"],
        cwd=root,
        capture_output=True,
        text=True,
    ).stdout
    if "--no-tags" in no_tags:
        return "a remote of this clone is set to fetch no tags (git clone --no-tags)"
    promotion = root / "registry" / "promotion.json"
    try:
        promoted = json.loads(promotion.read_text()).get("version")
    except (OSError, ValueError, AttributeError):
        promoted = None
    if isinstance(promoted, str):
        return f"registry/promotion.json records {name}@{promoted[:20]}"
    return None


def prod_version(root: Path, name: str, stage: str) -> dict[str, Any] | None:
    """The version in ``stage`` as GTO reads it, with ``stage_tag`` (its latest assignment tag)
    and ``assigned``; None when no version holds the stage.

    Raises:
        RegistryError: the tags cannot be read, a tag record is invalid, two versions hold the
            stage, or this clone lacks the registry's tags (:func:`missing_tags_evidence`).
    """
    if not has_commit(root):
        return None
    active = _active_in_stage(root, name, stage)
    if not active:
        if evidence := missing_tags_evidence(root, name):
            raise RegistryError(
                f"this clone has no {name} registry tags, but {evidence}; fetch them: "
                "git fetch origin 'refs/tags/*:refs/tags/*'"
            )
        return None
    if len(active) > 1:
        raise RegistryError(
            f"{name} {stage} is held by {', '.join(active)} at once (tags written by hand or by "
            f"an older release); settle it: hydra-ens promote --version vX.Y.Z --reason TEXT"
        )
    (version,) = active
    found = {v["version"]: v for v in versions(root, name)}.get(version)
    if found is None:
        raise RegistryError(f"{name} {stage} points at {version}, which has no registration tag")
    held = [a for a in assignments(root, name, stage) if a["commit"] == found["commit"]]
    latest = held[-1] if held else {"tag": None, "created": None}
    return {**found, "stage_tag": latest["tag"], "assigned": latest["created"]}


def stage_move_under_way(
    root: Path, name: str, stage: str, now: float | None = None
) -> dict[str, Any] | None:
    """The move of ``stage`` that :func:`assign` has begun and not finished, else None.

    A move unassigns the version that held the stage, then, a second later, assigns the new one;
    in between GTO holds no version in the stage. The move counts as under way while the newest
    of ``name``'s tags for ``stage``, deregistrations and deprecation is that unassignment, alone
    in its second, with :data:`MOVE_MESSAGE`, written less than :data:`MOVE_GRACE_S` seconds from
    ``now`` (default: the clock). So a ``gto deprecate`` or ``gto unassign`` of a person, or a
    move that never finished, is never taken for one.

    Returns:
        ``{"from": version, "to": version, "tag": the unassignment tag, "age_s": seconds}``.
    """
    out = git(
        root,
        "for-each-ref",
        "--format=%(refname:strip=2)%00%(creatordate:unix)%00%(contents:subject)",
        f"refs/tags/{name}#{stage}#*",
        f"refs/tags/{name}#{stage}!#*",
        f"refs/tags/{name}@*!*",
        f"refs/tags/{name}@deprecated*",
    )
    rows = [line.split("\0", 2) for line in out.splitlines()]
    if not rows:
        return None
    newest = max(int(created) for _, created, _ in rows)
    latest = [row for row in rows if int(row[1]) == newest]
    if len(latest) != 1 or not latest[0][0].startswith(f"{name}#{stage}!#"):
        return None
    tag, _, subject = latest[0]
    v = r"v\d+\.\d+\.\d+"  # MOVE_MESSAGE, read back
    moved = rf"hydra-ens: {re.escape(name)} (?P<old>{v}) leaves {re.escape(stage)} for (?P<new>{v})"
    found = re.fullmatch(moved, subject)
    age = (time.time() if now is None else now) - newest
    if found is None or not -MOVE_GRACE_S < age < MOVE_GRACE_S:
        return None
    return {"from": found["old"], "to": found["new"], "tag": tag, "age_s": age}


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

    The tree is ``HEAD``'s plus the working tree's modified tracked files, :data:`RUN_FILES`, the
    hardware records (:data:`HARDWARE_GLOBS`) and the ``.gitignore`` files DVC writes next to
    outputs. Parents: the branch's previous tip (so
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
        git(root, "read-tree", "HEAD", env=env)
        git(root, "add", "-u", env=env)
        dvc_gitignores = git(
            root, "ls-files", "--others", "--exclude-standard", "--", ":(glob)**/.gitignore"
        ).split()
        hardware = sorted(
            str(p.relative_to(root)) for g in HARDWARE_GLOBS for p in root.glob(g) if p.is_file()
        )
        paths = [p for p in RUN_FILES if (root / p).is_file()] + dvc_gitignores + hardware
        if paths:
            git(root, "add", "-f", "--", *paths, env=env)
        tree = git(root, "write-tree", env=env).strip()
    head = git(root, "rev-parse", "HEAD").strip()
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
    sha = git(root, "commit-tree", tree, *parents, "-m", message).strip()
    git(root, "update-ref", f"refs/heads/{VERSIONS_BRANCH}", sha)
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
    """Make ``version`` the one version in ``stage``: unassign any other version that holds it
    (``gto unassign``), then assign it; returns the new stage tag."""
    import gto.api
    import gto.exceptions

    try:
        for other in _active_in_stage(root, name, stage):
            if other != version:
                _after_last_tag(root, name)
                gto.api.unassign(
                    str(root),
                    name,
                    stage=stage,
                    version=other,
                    message=MOVE_MESSAGE.format(name=name, old=other, stage=stage, new=version),
                )
        _after_last_tag(root, name)
        # force: GTO refuses to re-assign a stage that an earlier assignment left on this
        # version (a rollback); the new tag is what makes it the latest
        tag = gto.api.assign(str(root), name, stage, version=version, message=message, force=True)
    except gto.exceptions.GTOException as err:
        raise RegistryError(f"the registry (GTO) refused the assignment: {err}") from None
    return str(getattr(tag, "tag", tag))


def _after_last_tag(root: Path, name: str) -> None:
    """Wait (at most a second) until the clock is past the second of ``name``'s newest stage or
    deprecation tag: GTO orders a stage's assignments and unassignments by their tag time (whole
    seconds), so two of them in one second would be read in either order."""
    newest = git(
        root,
        "for-each-ref",
        "--sort=-creatordate",
        "--count=1",
        "--format=%(creatordate:unix)",
        f"refs/tags/{name}#*",
        f"refs/tags/{name}@deprecated*",
    ).strip()
    if newest and (wait := int(newest) + 1 - time.time()) > 0:
        time.sleep(min(wait, 1.0))


def resolve_prod_dir(root: Path, name: str, stage: str) -> tuple[Path, dict[str, Any]]:
    """The bundle folder of the model in ``stage`` and its registry record (ValueError if none)."""
    prod = prod_version(root, name, stage)
    if prod is None:
        move = stage_move_under_way(root, name, stage)
        why = f"no model {name!r} in stage {stage!r}"
        if move is None:
            raise NoVersionInStage(f"{why}; run the pipeline / promote first")
        raise NoVersionInStage(
            f"{why}: hydra-ens is moving it from {move['from']} to {move['to']}; "
            "try again in a moment",
            move,
        )
    return resolve_bundle_dir(root, prod), prod
