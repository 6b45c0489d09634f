"""What a study worker does: one point (or one upstream) in its own clone, results back via git
and the DVC remote. No shared filesystem is assumed between the study's driver and its workers.

* :func:`run_upstream`: clone the study's commit, ``dvc repro`` the shared stages
  (``flows.study.spec.SHARED_STAGES``) for one seed, ``dvc push`` them; returns their lock entries
  and their small uncached files (metrics), which is all a point needs to reuse them. Started from
  an earlier commit's upstream (:func:`earlier_upstream`), it recomputes only what changed.
* :func:`run_point`: clone, write the point's ``params.yaml``, lay down the upstream's lock and
  ``dvc pull`` its outputs (the shared stages are then up to date), ``dvc exp run -n NAME gate``,
  ``dvc exp push origin NAME``: the point becomes the experiment ref
  ``refs/exps/<commit>/<NAME>`` in the project and its outputs land in the DVC remote. The ref is
  created only by the final push, so a point killed halfway records nothing.
* :func:`fresh_points` / :func:`read_point`: which points the project already holds, from git.

Every clone lives under :func:`scratch_dir` and is removed when the job ends. A clone left by a
killed worker is taken over by the next run of the same job on that machine when it is at the
job's commit (:func:`checkout`): DVC's lock and the stages' persisted units say what finished, so
the job resumes where it was killed; any other leftover clone is removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from flows.dvcops import (
    StageError,
    bin_path,
    dvc_error_line,
    failure,
    relay,
    subprocess_env,
)
from flows.interrupts import process_alive, process_started
from flows.study.report.results import OPTIONAL_FILES, POINT_FILES
from flows.study.spec import POINT_TARGET, SHARED_STAGES, reusable_stages
from flows.warm import warm_stages, worth_warming
from tasks.params import validate_params, write_params
from tasks.runtime.dvcfiles import read_dvc_yaml

Log = Callable[[str], None]
#: The clone's default DVC remote: the study's.
_REMOTE = "study"
_IDENTITY = {"user.name": "hydra-ens study", "user.email": "study@hydra-ens.invalid"}


@dataclass(frozen=True)
class PointJob:
    """Everything a worker needs, all plain values (it travels to the worker)."""

    study: str
    name: str
    params: dict[str, Any]
    git_url: str
    commit: str
    dvc_remote: str
    threads: int = 1
    upstream: dict[str, Any] | None = field(default=None)


def scratch_dir() -> Path:
    """Where clones go on this machine: ``HYDRA_ENS_STUDY_SCRATCH``, else the temp folder."""
    base = os.environ.get("HYDRA_ENS_STUDY_SCRATCH") or Path(tempfile.gettempdir()) / "hydra-study"
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _env(threads: int) -> dict[str, str]:
    env = subprocess_env()
    env["HYDRA_ENS_THREADS"] = str(threads)
    env["OMP_NUM_THREADS"] = str(threads)
    return env


def _run(args: list[str], cwd: Path, env: dict[str, str], log: Log | None = None) -> list[str]:
    """Run a command (:func:`flows.dvcops.relay`: its lines to ``log``); raise with its error
    line when it fails."""
    rc, lines = relay(args, cwd, log, env)
    if rc != 0:
        own = [ln.strip() for ln in lines if ln.strip().startswith("error:")]
        why = own[-1] if own else (dvc_error_line(lines) or " | ".join(lines[-2:]))
        raise failure(f"{Path(args[0]).name} {args[1]} failed (exit {rc}): {why}", rc, lines)
    return lines


@dataclass(frozen=True)
class Clone:
    """A job's working clone; ``resumed`` when it was taken over from a killed run of the job."""

    path: Path
    resumed: bool = False


def _working_dirs() -> set[Path]:
    """The working folders of this machine's processes (those this user may read)."""
    cwds = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cwds.add(Path(os.readlink(proc / "cwd")))
        except OSError:  # gone meanwhile, or another user's
            continue
    return cwds


#: In a clone's ``.git`` (never part of a commit): the start time of the process that made it.
_OWNER = "hydra-study-owner"


def _owner_alive(clone: Path, pid: int) -> bool:
    """Whether the process that made ``clone`` runs: ``pid`` (from its name) and, where the clone
    records it, the same start time (after a restart the system may give that pid to another)."""
    try:
        started: float | None = float((clone / ".git" / _OWNER).read_text())
    except (OSError, ValueError):
        started = None
    return process_alive(pid, started)


def _dead_clones(scratch: Path, prefix: str) -> list[Path]:
    """Clones of ``prefix`` whose worker is gone (killed, on this machine) and in which no
    process still works (a stage or ``dvc`` that outlived it), newest first."""
    cwds = _working_dirs()
    dead = []
    for old in scratch.glob(f"{prefix}-*"):
        pid = old.name.removeprefix(prefix + "-").split("-")[0]
        real = old.resolve()
        in_use = any(c == real or real in c.parents for c in cwds)
        if pid.isdigit() and not _owner_alive(old, int(pid)) and not in_use:
            try:
                dead.append((old.stat().st_mtime, old))
            except OSError:  # removed meanwhile by another worker on this machine
                continue
    return [path for _, path in sorted(dead, reverse=True)]


def _git_line(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else ""


def _resumable(clone: Path, commit: str) -> bool:
    """Whether ``clone`` was set up whole (its branch at ``commit``, DVC configured) and its
    HEAD is that commit (on the branch, or detached there by a killed ``dvc exp run``): a clone
    killed while it was being made is not."""
    return (
        (clone / ".dvc" / "config.local").is_file()
        and _git_line(clone, "rev-parse", "-q", "--verify", "refs/heads/hydra-study") == commit
        and _git_line(clone, "rev-parse", "HEAD") == commit
    )


def _forget_killed_run(wd: Path) -> None:
    """Put a taken-over clone's git and DVC state back as a fresh clone has it, outputs and
    ``dvc.lock`` kept: HEAD on its branch, nothing staged, no experiment in flight (the killed
    run's exec refs and run records), no read/write lock naming its dead process."""
    subprocess.run(["git", "symbolic-ref", "HEAD", "refs/heads/hydra-study"], cwd=wd, check=True)
    subprocess.run(["git", "reset", "-q"], cwd=wd, check=True)
    refs = _git_line(wd, "for-each-ref", "--format=%(refname)", "refs/exps/exec")
    for ref in refs.split():
        subprocess.run(["git", "update-ref", "-d", ref], cwd=wd, check=True)
    shutil.rmtree(wd / ".dvc" / "tmp" / "exps", ignore_errors=True)
    (wd / ".dvc" / "tmp" / "rwlock").unlink(missing_ok=True)


def _take_over_dead_clone(scratch: Path, prefix: str, commit: str, wd: Path) -> Path | None:
    """Move the newest killed clone of ``prefix`` at ``commit`` to ``wd`` and return where it was;
    remove every other killed clone of ``prefix``."""
    taken = None
    for old in _dead_clones(scratch, prefix):
        if taken is None and _resumable(old, commit):
            try:
                old.rename(wd)
            except OSError:  # another worker on this machine took it first
                continue
            try:
                _forget_killed_run(wd)
            except subprocess.CalledProcessError:
                shutil.rmtree(wd, ignore_errors=True)
                continue
            taken = old
            continue
        shutil.rmtree(old, ignore_errors=True)
    return taken


@contextmanager
def checkout(job: PointJob, log: Log) -> Iterator[Clone]:
    """A clone of ``job.git_url`` at ``job.commit`` with the point's params, the hardware choices
    of this machine kind and the study's DVC remote as default; removed on exit.

    A clone a killed run of this job left on this machine at the same commit is taken over
    instead of cloning afresh (``Clone.resumed``): its finished stages (``dvc.lock``) and
    finished units (members, Deep Ensemble seeds) are kept, and DVC reruns only what is not up
    to date."""
    scratch = scratch_dir()
    prefix = f"{job.study}-{job.name}"
    wd = scratch / f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    env = _env(job.threads)
    try:
        taken = _take_over_dead_clone(scratch, prefix, job.commit, wd)
        if taken is not None:
            log(f"resuming the clone a killed run of {job.name} left ({taken.name})")
        else:
            _run(["git", "clone", "-q", "--no-checkout", job.git_url, str(wd)], scratch, env)
            _run(["git", "checkout", "-q", "-B", "hydra-study", job.commit], wd, env)
        (wd / ".git" / _OWNER).write_text(repr(process_started()))
        for key, value in _IDENTITY.items():
            if subprocess.run(["git", "config", key], cwd=wd, capture_output=True).returncode:
                _run(["git", "config", key, value], wd, env)
        if not (wd / ".dvc").is_dir():
            _run([bin_path("dvc"), "init", "-q"], wd, env)
        _set_local_config(wd, job.dvc_remote)
        # validated here too: a worker with other package versions fails early and clearly
        cfg = validate_params(job.params, source=f"{job.name} params", root=wd)
        write_params(cfg, wd / "params.yaml")
        from tasks.runtime import hardware  # imports torch: not at module level

        # the choices of this machine kind's record as the commit holds it (the stages' DVC
        # dependency): every point of one kind reads one record
        hardware.sync_choices(wd)
        log(f"clone at {job.commit[:8]} in {wd}")
        yield Clone(wd, resumed=taken is not None)
    finally:
        shutil.rmtree(wd, ignore_errors=True)


def _set_local_config(wd: Path, remote_url: str) -> None:
    """Make ``remote_url`` the clone's default DVC remote (``study``), analytics off, in its
    ``.dvc/config.local``.

    Written with configobj (DVC's own config library) in UTF-8 rather than by ``dvc remote add``:
    DVC writes its config as ASCII, so a remote under a non-ASCII path (a project in
    ``données/``) could not be added; it reads UTF-8."""
    from configobj import ConfigObj

    config = ConfigObj(str(wd / ".dvc" / "config.local"), encoding="utf-8")
    config.setdefault("core", {}).update({"remote": _REMOTE, "analytics": "false"})
    config[f'remote "{_REMOTE}"'] = {"url": remote_url}
    config.write()


def _uncached_files(wd: Path, stages: tuple[str, ...]) -> list[str]:
    """Outputs of ``stages`` declared ``cache: false`` (metrics): git-tracked, not in the remote."""
    declared = (yaml.safe_load((wd / "dvc.yaml").read_text()) or {}).get("stages") or {}
    files = []
    for stage in stages:
        for key in ("outs", "metrics", "plots"):
            for entry in declared.get(stage, {}).get(key) or []:
                if isinstance(entry, dict):
                    files += [p for p, o in entry.items() if (o or {}).get("cache") is False]
    return files


def run_upstream(job: PointJob, log: Log) -> dict[str, Any]:
    """Compute the shared stages for ``job.params`` once; returns ``{"lock", "files",
    "seconds", "ran", "seeded_from", "resumed"}`` (``dvc.lock`` entries of the shared stages,
    their uncached files, the stages that ran, whether it resumed a killed run's clone).
    ``job.upstream``, when given, is an earlier upstream's lock (see :func:`earlier_upstream`):
    laid down first, so DVC reruns only the stages it does not cover or whose code, data or
    params changed since."""
    t0 = time.perf_counter()
    env = _env(job.threads)
    dvc = bin_path("dvc")
    with checkout(job, log) as clone:
        wd = clone.path
        seeded = bool(job.upstream) and _lay_down_upstream(clone, job.upstream, env, log)
        with _warm(wd, SHARED_STAGES, env, log) as stage_env:
            ran = _stages_ran(_run([dvc, "repro", *SHARED_STAGES], wd, env | stage_env, log))
        _run([dvc, "push", "-q", *SHARED_STAGES], wd, env)
        stages = yaml.safe_load((wd / "dvc.lock").read_text())["stages"]
        lock = {s: stages[s] for s in SHARED_STAGES}
        files = {p: (wd / p).read_text() for p in _uncached_files(wd, SHARED_STAGES)}
    return {
        "lock": lock,
        "files": files,
        "seconds": round(time.perf_counter() - t0, 1),
        "ran": ran,
        "seeded_from": job.upstream.get("from") if seeded and job.upstream else None,
        "resumed": clone.resumed,
    }


def earlier_upstream(stored: list[Path], params: dict[str, Any]) -> dict[str, Any] | None:
    """The stored upstream (``run_upstream`` results, newest first) that covers the most shared
    stages of ``params`` (:func:`flows.study.spec.reusable_stages`), cut to those stages; None
    when none covers any. A study at a new commit starts its upstreams from it, so a change that
    leaves the shared stages' inputs alone recomputes none of them."""
    best: dict[str, Any] | None = None
    for path in stored:
        try:
            result = json.loads(path.read_text())
            stages = reusable_stages(result["lock"], params)
        except (OSError, ValueError, KeyError, AttributeError):
            continue  # unreadable: computing afresh is always correct
        if stages and (best is None or len(stages) > len(best["lock"])):
            lock = {s: result["lock"][s] for s in stages}
            best = {"lock": lock, "files": result.get("files") or {}, "from": path.stem}
    return best


def _lay_down_upstream(
    clone: Clone, upstream: dict[str, Any], env: dict[str, str], log: Log
) -> bool:
    """Write the upstream's lock entries (beside what a resumed clone's lock already records) and
    files, pull its outputs; False if the remote lacks them (the job then computes the shared
    stages itself)."""
    wd = clone.path
    stages: dict[str, Any] = {}
    if clone.resumed and (wd / "dvc.lock").is_file():
        stages = (yaml.safe_load((wd / "dvc.lock").read_text()) or {}).get("stages") or {}
    before = dict(stages)
    stages.update(upstream["lock"])
    (wd / "dvc.lock").write_text(
        yaml.safe_dump({"schema": "2.0", "stages": stages}, sort_keys=False)
    )
    for rel, text in upstream["files"].items():
        (wd / rel).parent.mkdir(parents=True, exist_ok=True)
        (wd / rel).write_text(text)
    try:
        _run([bin_path("dvc"), "pull", "-q", *upstream["lock"]], wd, env)
        return True
    except StageError as err:
        log(f"upstream not reusable ({err}); this job computes it")
        if before:
            (wd / "dvc.lock").write_text(
                yaml.safe_dump({"schema": "2.0", "stages": before}, sort_keys=False)
            )
        else:
            (wd / "dvc.lock").unlink()
        return False


def run_point(job: PointJob, log: Log) -> dict[str, Any]:
    """Run one point as the DVC experiment ``job.name`` and push it; returns what ran."""
    t0 = time.perf_counter()
    env = _env(job.threads)
    dvc = bin_path("dvc")
    with checkout(job, log) as clone:
        wd = clone.path
        reused = bool(job.upstream) and _lay_down_upstream(clone, job.upstream, env, log)
        with _warm(wd, read_dvc_yaml(wd), env, log) as stage_env:
            exp_run = [dvc, "exp", "run", "-n", job.name, POINT_TARGET]
            ran = _stages_ran(_run(exp_run, wd, env | stage_env, log))
        sha = subprocess.run(
            ["git", "rev-parse", f"refs/exps/{job.commit[:2]}/{job.commit[2:]}/{job.name}"],
            cwd=wd,
            capture_output=True,
            text=True,
        ).stdout.strip()
        if not sha:
            raise StageError(f"{job.name}: dvc exp run made no experiment ref")
        missing = [p for p in POINT_FILES.values() if not _in_commit(wd, sha, p)]
        if missing:
            raise StageError(f"{job.name}: the experiment lacks {', '.join(missing)}")
        for attempt in range(3):  # two workers pushing at once may race on the origin's lock
            try:
                _run([dvc, "exp", "push", "-f", "origin", job.name], wd, env)
                break
            except StageError:
                if attempt == 2:
                    raise
                time.sleep(2 + 3 * attempt)
    return {
        "name": job.name,
        "ref": sha,
        "ran": ran,
        "reused_upstream": reused,
        "resumed": clone.resumed,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def _warm(
    wd: Path, stages: Iterable[str], env: dict[str, str], log: Log
) -> contextlib.AbstractContextManager[dict[str, str]]:
    """A warm stage process for the model stages among ``stages`` (:mod:`flows.warm`), when two
    or more of them are ``python -m tasks.<stage>`` commands."""
    if worth_warming(wd, stages):
        return warm_stages(env, log)
    return contextlib.nullcontext({})


def _stages_ran(lines: list[str]) -> list[str]:
    return [ln.split("'")[1] for ln in lines if ln.startswith("Running stage '")]


def _in_commit(repo: Path, rev: str, path: str) -> bool:
    args = ["git", "cat-file", "-e", f"{rev}:{path}"]
    return subprocess.run(args, cwd=repo, capture_output=True).returncode == 0


def fetch_experiments(root: Path, git_url: str) -> None:
    """Bring the experiment refs workers pushed to ``git_url`` into the project (a no-op when
    ``git_url`` is the project itself)."""
    if Path(git_url).resolve() == root.resolve():
        return
    subprocess.run(
        ["git", "fetch", "-q", "--force", git_url, "refs/exps/*:refs/exps/*"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )


def experiment_refs(root: Path, commit: str) -> dict[str, str]:
    """``{name: sha}`` of the experiments of baseline ``commit`` in the project ``root``."""
    prefix = f"refs/exps/{commit[:2]}/{commit[2:]}/"
    out = subprocess.run(
        ["git", "for-each-ref", "--format=%(objectname) %(refname)", prefix],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {ref.removeprefix(prefix): sha for sha, ref in (ln.split() for ln in out.splitlines())}


def fresh_points(root: Path, commit: str, expected: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The points of ``expected`` (name -> resolved params) the project already holds as
    complete experiments of ``commit`` with exactly those params: ``{name: sha}``."""
    refs = experiment_refs(root, commit)
    fresh = {}
    for name, params in expected.items():
        sha = refs.get(name)
        if sha is None or not all(_in_commit(root, sha, p) for p in POINT_FILES.values()):
            continue
        if yaml.safe_load(_show(root, sha, "params.yaml")) == params:
            fresh[name] = sha
    return fresh


def _show(root: Path, rev: str, path: str) -> str:
    return subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=root, capture_output=True, text=True, check=True
    ).stdout


def read_point(root: Path, sha: str, dest: Path) -> Path:
    """Copy a point's files (:data:`~flows.study.report.results.POINT_FILES`, and those of
    :data:`~flows.study.report.results.OPTIONAL_FILES` it has) out of its experiment commit
    into ``dest``, in the layout :func:`~flows.study.report.results.load_point` reads."""
    for rel in [*POINT_FILES.values(), *OPTIONAL_FILES.values()]:
        if rel in OPTIONAL_FILES.values() and not _in_commit(root, sha, rel):
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(_show(root, sha, rel))
    return dest
