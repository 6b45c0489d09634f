"""DVC and project plumbing for the flow and the CLI (subprocesses, one dvc process at a time;
config values are read in process, :func:`config_value`).

* :func:`ensure_project`: the project is a git repo with ``dvc init`` done, analytics off and a
  local default remote ``.dvc-remote/`` (``dvc push`` after each run copies the cache there),
  written as an absolute path (a relative one resolved, in a clone, to the clone's own empty
  folder), and the DVC set-up committed (:func:`commit_dvc_setup`).
* :func:`stale_stages`: stages ``dvc status`` reports as changed.
* :func:`repro_stage`: ``dvc repro --single-item <stage>``, streaming its output line by line; DVC's
  lock file decides whether the stage runs (nothing changed -> "didn't change, skipping").
* :func:`run_member`: one ``python -m tasks.finetune_members --member m`` process.
* :data:`INTERRUPTED` / :func:`stop_descendants`: a run the user interrupted (Ctrl-C, SIGTERM)
  starts no new process, retries nothing and stops what it started (``flows.cli``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from flows.dvclinks import LINK_TYPES, link_remote_to_cache, supported_link
from tasks.runtime.dvcfiles import REMOTE_DIR

REMOTE_NAME = "local"
#: Set when the user interrupted the run (the CLI's SIGINT/SIGTERM handler): no new stage or
#: member process starts and no failure is retried.
INTERRUPTED = threading.Event()
#: A terminal colour code (DVC colours its ``ERROR:``).
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour codes."""
    return ANSI.sub("", text)


class _Failure(RuntimeError):
    """A failure of the pipeline's plumbing, of one stage or of one member fine-tune.

    ``str(err)`` is the whole story in one line (``stage S failed (exit N): line | line``); the
    fields say it again for whoever reports it (:func:`flows.runlog.error_line`), so nothing is
    parsed back out of the text:

    * ``stage``: the DVC stage that failed, or None; ``member``: the member fine-tune that
      failed, or None (neither: the run's own plumbing, e.g. ``dvc status``);
    * ``returncode``: the failed process's exit status, or None;
    * ``message``: the process's own one-line error (its ``error: ...`` line, from
      :func:`tasks.runtime.stage.stage_main`, without the prefix), or None;
    * ``detail``: what else it said (DVC's ``ERROR:`` line, the last lines), colours stripped.
    """

    def __init__(
        self,
        text: str,
        *,
        stage: str | None = None,
        member: int | None = None,
        returncode: int | None = None,
        message: str | None = None,
        detail: str = "",
    ) -> None:
        super().__init__(text)
        self.stage, self.member, self.returncode = stage, member, returncode
        self.message, self.detail = message, detail

    @classmethod
    def from_output(
        cls,
        lines: Sequence[str],
        returncode: int,
        stage: str | None = None,
        member: int | None = None,
    ) -> Self:
        """The failure of a process that ended with ``returncode`` after printing ``lines`` (its
        ``error``/``ERROR`` lines, else its last three): the process's own ``error:`` line is
        the message, the rest the detail."""
        errors = [ln for ln in lines if ln.startswith(("error", "ERROR"))] or list(lines[-3:])
        what = f"stage {stage}" if stage is not None else f"member {member}"
        text = f"{what} failed (exit {returncode})"
        text += (": " + " | ".join(errors)) if stage is not None else ""
        clean = [strip_ansi(ln).strip() for ln in errors]
        own = [ln.removeprefix("error: ") for ln in clean if ln.startswith("error: ")]
        return cls(
            text,
            stage=stage,
            member=member,
            returncode=returncode,
            message=own[0] if own else None,
            detail=" | ".join(ln for ln in clean if ln),
        )

    def __reduce__(self) -> tuple:
        # the fields survive a pickle (Prefect may persist a task's exception)
        fields = {
            "stage": self.stage,
            "member": self.member,
            "returncode": self.returncode,
            "message": self.message,
            "detail": self.detail,
        }
        return (_rebuild, (type(self), str(self), fields))


def _rebuild(cls: type[_Failure], text: str, fields: dict) -> _Failure:
    return cls(text, **fields)


class StageError(_Failure):
    """A stage failed for a reason a retry will not fix (bad params, bad data, a bug)."""


class TransientStageError(_Failure):
    """A stage failed in a way worth retrying (DVC lock busy, process killed, OS error)."""


def bin_path(name: str) -> str:
    """An executable next to this Python (the venv's ``dvc``), else from PATH."""
    cand = Path(sys.executable).parent / name
    return str(cand) if cand.exists() else name


#: What the stage processes of the run in this process get on top of :func:`subprocess_env`: the
#: warm stage server's variables (:func:`flows.warm.warm_stages`) while the pipeline flow runs
#: its stages.
STAGE_ENV: dict[str, str] = {}


def subprocess_env() -> dict[str, str]:
    """The environment of dvc and the stage processes: offline, unbuffered, the memory
    allocator of ``HYDRA_ENS_MALLOC`` (:func:`hydra_ops.perf.allocators.allocator_env`; ValueError
    for an unknown one) and :data:`STAGE_ENV`."""
    from hydra_ops.perf.allocators import allocator_env

    env = dict(os.environ)
    env.update(allocator_env(environ=env)[0])
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.setdefault("DVC_NO_ANALYTICS", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("HYDRA_ENS_PROGRESS", "0")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(STAGE_ENV)
    return env


def _run(args: list[str], root: Path, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(args, cwd=root, capture_output=True, text=True, env=subprocess_env())
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def dvc(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return _run([bin_path("dvc"), *args], root, check)


def config_value(root: Path, name: str, level: str | None = None) -> str:
    """What ``dvc config [--LEVEL] NAME`` prints in ``root`` (``cache.type``,
    ``remote.local.url``): the value at ``level``, or else at the most specific level that sets
    it (local, repo, global, system), a path resolved against the file that holds it; "" when
    unset or unreadable. Read in this process (a ``dvc config`` process costs about 0.3 s)."""
    from dvc.config import Config
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    top, _, rest = name.partition(".") if name.startswith(("remote.", "db.")) else ("", "", name)
    section, _, option = rest.partition(".")
    try:
        config = Config(dvc_dir=Repo.find_dvc_dir(str(root)), validate=False)
        for one in [level] if level else reversed(config.LEVELS):
            conf = config.read(one)
            value = (conf[top] if top else conf).get(section, {}).get(option)
            if value is not None:
                return str(value)
    except DvcException:
        pass
    return ""


def cache_dir(root: Path) -> Path:
    """The project's DVC cache folder (``dvc cache dir``; default ``.dvc/cache``)."""
    out = dvc(root, "cache", "dir", check=False).stdout.strip()
    path = Path(out) if out else root / ".dvc" / "cache"
    return path if path.is_absolute() else root / path


def ensure_cache_links(root: Path) -> list[str]:
    """Set ``cache.type`` for one copy of each output (:mod:`flows.dvclinks`) unless the user set
    one at any level; returns what it did (for the log), nothing when there was nothing to do."""
    if config_value(root, "cache.type"):
        return []  # the user's choice stands
    link = supported_link(root / ".dvc" / "tmp")
    if link in ("reflink", "copy"):
        return []  # DVC's default reflink,copy already shares the bytes, or nothing links here
    types = LINK_TYPES if link == "hardlink" else "symlink,copy"
    dvc(root, "config", "--local", "cache.type", types)
    return [f"dvc cache.type {types} (no reflinks here: outputs link to the cache)"]


def check_project_file(root: Path) -> None:
    """StageError unless ``root`` has a ``dvc.yaml`` (checked before anything is written)."""
    if not (root / "dvc.yaml").is_file():
        raise StageError(f"{root}: no dvc.yaml here; run hydra-ens from the project folder")


def ensure_project(root: Path, commit_setup: bool = True) -> list[str]:
    """Make ``root`` ready for DVC (and write this machine kind's hardware choices,
    :func:`tasks.runtime.hardware.sync_choices`); returns what it did (for the log).
    ``commit_setup``: commit the DVC set-up files on the current branch (a clone is then a DVC
    repository); a study whose workers clone another git URL passes False, since they could not
    check out that commit."""
    done: list[str] = []
    check_project_file(root)
    if _run(["git", "rev-parse", "--git-dir"], root, check=False).returncode != 0:
        raise StageError(f"{root} is not a git repository; run `git init` first")
    if not (root / ".dvc").is_dir():
        dvc(root, "init", "-q")
        done.append("dvc init")
    if not config_value(root, "core.analytics", level="repo"):
        dvc(root, "config", "core.analytics", "false")
    local = str((root / REMOTE_DIR).resolve())
    relative = f"../{REMOTE_DIR}"
    if not local.isascii():
        # DVC writes its config as ASCII: a non-ASCII path there breaks every later config write.
        # The relative form works in this folder; a clone points `local` at it itself.
        local = relative
    if not has_remote(root, REMOTE_NAME):
        # the project's default remote stays the default (an S3 store added with -d, say)
        default = default_remote_name(root)
        dvc(root, "remote", "add", *([] if default else ["-d"]), REMOTE_NAME, local)
        kept = f" (the default stays {default!r})" if default else ""
        done.append(f"dvc remote {REMOTE_NAME} -> {REMOTE_DIR}/{kept}")
    elif local != relative and _project_remote_url(root, REMOTE_NAME) == relative:
        # written relative by an older release: a clone resolved it to its own empty folder
        dvc(root, "remote", "modify", REMOTE_NAME, "url", local)
        done.append(f"dvc remote {REMOTE_NAME}: url {local} (was relative)")
    config = root / ".dvc" / "config"
    if "html_template" not in (config.read_text() if config.is_file() else ""):
        # `dvc plots show` renders offline: the run_report stage's page template inlines vega
        from tasks.run_report import DVC_TEMPLATE

        dvc(root, "config", "plots.html_template", f"../{DVC_TEMPLATE.as_posix()}")
        done.append(f"dvc plots show renders offline (plots.html_template: {DVC_TEMPLATE})")
    done += ensure_cache_links(root)  # one copy of each output (flows.dvclinks)
    if commit_setup and (committed := commit_dvc_setup(root, force=bool(done))):
        done.append(committed)
    from tasks.runtime import hardware  # imports torch: only here

    if not (root / hardware.CHOICES).is_file():
        done.append(f"hardware choices of this machine kind -> {hardware.CHOICES}")
    hardware.sync_choices(root)  # the stages' params dependency, before any dvc status
    return done


#: The DVC set-up files ``dvc init`` and ``dvc remote`` write, committed so a clone is a DVC repo.
DVC_SETUP_FILES = (".dvc/config", ".dvc/.gitignore", ".dvcignore")


def _project_remote_url(root: Path, name: str) -> str:
    """Remote ``name``'s URL as written in ``.dvc/config`` (not resolved), "" if absent."""
    from configobj import ConfigObj, ConfigObjError

    try:
        conf = ConfigObj(str(root / ".dvc" / "config"), encoding="utf-8")
    except ConfigObjError:
        return ""
    return str(conf.get(f'remote "{name}"', {}).get("url", ""))


def commit_dvc_setup(root: Path, force: bool) -> str | None:
    """Commit :data:`DVC_SETUP_FILES` (only those paths) on the current branch when ``force``
    (this run changed them) or when ``.dvc/config`` was never committed; returns what it did.

    ``dvc init`` stages them and leaves them uncommitted, so a clone of the branch was no DVC
    repository (``dvc pull``: "you are not inside of a DVC repository"). Nothing is done on a
    repo without a commit or with a detached ``HEAD``; other staged changes stay staged."""
    from tasks.release.git_repo import ensure_git_identity

    def git(*args: str) -> subprocess.CompletedProcess:
        return _run(["git", *args], root, check=False)

    if git("symbolic-ref", "-q", "HEAD").returncode != 0 or (
        git("rev-parse", "--verify", "-q", "HEAD").returncode != 0
    ):
        return None
    in_head = git("cat-file", "-e", "HEAD:.dvc/config").returncode == 0
    if in_head and not force:
        return None
    paths = [p for p in DVC_SETUP_FILES if (root / p).is_file()]
    if not paths:
        return None
    ensure_git_identity(root)
    _run(["git", "add", "--", *paths], root)
    if git("diff", "--cached", "--quiet", "HEAD", "--", *paths).returncode == 0:
        return None
    _run(
        ["git", "commit", "-q", "-m", "hydra-ens: DVC set-up (dvc init, remote)", "--", *paths],
        root,
    )
    return f"committed {', '.join(paths)} (so a clone is a DVC repository)"


def remote_url(root: Path, name: str) -> str:
    """The URL of the project's DVC remote ``name`` (at any config level; a local path resolved
    against the config file that holds it), "" when there is none.

    Read as ``dvc config`` reads it, not from ``dvc remote list``: that is a table whose URL
    column wraps a long URL onto the next line and holds spaces, so a word of another remote's
    URL (``/srv/my local store``) read as a remote's name."""
    return config_value(root, f"remote.{name}.url")


def default_remote_name(root: Path) -> str:
    """The name of the project's default DVC remote (``core.remote``), "" when it has none."""
    return config_value(root, "core.remote")


def has_remote(root: Path, name: str) -> bool:
    """Whether the project has a DVC remote ``name`` (:func:`remote_url`)."""
    return bool(remote_url(root, name))


def stale_stages(root: Path) -> set[str]:
    """Stages of the project's own ``dvc.yaml`` whose lock entry is missing or whose
    deps/outs/params changed (a ``foreach`` stage by its name, ``name@key`` -> ``name``).

    ``dvc status`` also reports the stages of any other ``dvc.yaml`` under the root, as
    ``sub/dir/dvc.yaml:name``; those are not this pipeline's stages, even where the names are
    the same, and are left out."""
    r = dvc(root, "status", "--json", check=False)
    if r.returncode != 0:
        raise StageError(f"dvc status failed: {r.stderr.strip() or r.stdout.strip()}")
    text = r.stdout.strip() or "{}"
    try:
        status = json.loads(text)
    except json.JSONDecodeError:
        raise StageError(f"dvc status printed no JSON: {text[:200]}") from None
    own = set()
    for key in status:
        file, sep, name = key.rpartition(":")
        if not sep or file == "dvc.yaml":
            own.add(name.split("@")[0])
    return own


@dataclass
class StageRun:
    stage: str
    ran: bool
    seconds: float
    lines: list[str] = field(default_factory=list)


#: DVC's own lock errors, as its CLI prints them (``ERROR: `` + the exception chain joined by
#: ``": "``): the repo lock (``dvc.lock.FAILED_TO_LOCK_MESSAGE``) and a stage's read/write lock
#: on its deps/outs held by another DVC process (``dvc.rwlock``), e.g.
#: ``ERROR: failed to reproduce 'merge': 'models/hydra' is busy, it is being blocked by:``.
_DVC_LOCK_ERROR = re.compile(
    r"^ERROR: (?:.*: )?(?:Unable to acquire lock\. Most likely another DVC process is running"
    r"|'[^']*' is busy, it is being blocked by:)"
)
#: DVC's report of a stage command killed by a signal (``StageCmdFailedError``).
_DVC_STAGE_KILLED = re.compile(r"^ERROR: .*failed to run: .*, exited with (-\d+|137|143|130)\s*$")
#: Exit statuses of a killed process: 128 + SIGKILL (the OOM killer) / SIGTERM.
_KILLED_STATUSES = (137, 143)
#: Exit statuses of a process stopped by Ctrl-C (SIGINT, or 128 + SIGINT through a shell): the
#: user asked to stop, so no retry.
_INTERRUPT_STATUSES = (-signal.SIGINT, 128 + signal.SIGINT)
#: A tqdm progress line: its ``[elapsed<remaining, rate`` field, e.g. ``[00:01<00:02, 2.25it/s``,
#: ``[01:02:03, 1.21s/it``, ``[00:00<?, ?it/s``, ``[00:00<00:00, 155kB/s`` (tqdm's ``r_bar``). A
#: line merely containing "it/s" (a path like ``/tmp/audit/s2/``) is not progress.
_TQDM_RATE = re.compile(
    r"\[(?:\d+:)?\d{2}:\d{2}(?:<(?:(?:\d+:)?\d{2}:\d{2}|\?))?, *"
    r"(?:\?|\d[\d.]*\s?[kMGTPEZY]?)(?:\w+/s|s/\w+)"
)
#: DVC's after-stage advice (git add / autostage / dvc push): the flow pushes itself at the end,
#: and committing dvc.lock is the user's call (docs/pipeline.md), so these lines are not relayed.
_DVC_HINTS = (
    "To track the changes with git",
    "git add ",
    "To enable auto staging",
    "dvc config core.autostage",
    "Use `dvc push` to send your updates",
)


def dvc_error_line(lines: Sequence[str]) -> str | None:
    """DVC's final error line (the last line starting with ``ERROR: ``, colours stripped), or None.

    DVC prints it after the stage command has ended, so it comes after all of the stage's own
    output; earlier ``ERROR:`` lines may be the stage's."""
    for line in reversed(lines):
        clean = strip_ansi(line).strip()
        if clean.startswith("ERROR: "):
            return clean
    return None


def is_progress_line(line: str) -> bool:
    """Whether ``line`` (one ``\\r``-separated segment) is a tqdm progress bar, not relayed.

    Only tqdm's rate field counts (:data:`_TQDM_RATE`), never a line starting with ``error``."""
    clean = strip_ansi(line).strip()
    if clean.lower().startswith("error"):
        return False
    return _TQDM_RATE.search(clean) is not None


def is_transient_exit(returncode: int) -> bool:
    """Whether a process that ended with ``returncode`` was killed in a way worth a retry.

    Killed by a signal (negative return code) or 137/143 (128 + SIGKILL, e.g. the OOM killer, /
    SIGTERM), except Ctrl-C (SIGINT: -2 or 130) and anything once the user interrupted the run
    (:data:`INTERRUPTED`): the user asked to stop, and a retry would start the work again."""
    if INTERRUPTED.is_set() or returncode in _INTERRUPT_STATUSES:
        return False
    return returncode < 0 or returncode in _KILLED_STATUSES


def is_transient_failure(returncode: int, lines: Sequence[str]) -> bool:
    """Whether a failed ``dvc repro`` (``returncode != 0``, output ``lines``) is worth a retry.

    Never once the user interrupted the run (:data:`INTERRUPTED`). Else True only when (a) the dvc
    process was killed (:func:`is_transient_exit`: a signal, 137 or 143, not SIGINT), (b) DVC's own
    final error line is one of its lock errors (the repo lock or a stage's deps/outs lock held by
    another DVC process), or (c) that line reports the stage command killed by a signal
    (``exited with -9`` / 137 / 143; not ``-2`` / 130, Ctrl-C). Anything a stage itself prints
    (say a log line containing "is busy" or "lock") does not count: the stage failed for a reason
    a retry will not fix.
    """
    if INTERRUPTED.is_set():
        return False
    if is_transient_exit(returncode):
        return True
    error = dvc_error_line(lines)
    if error is None:
        return False
    if _DVC_LOCK_ERROR.match(error):
        return True
    killed = _DVC_STAGE_KILLED.match(error)
    return killed is not None and is_transient_exit(int(killed.group(1)))


def failure(message: str, returncode: int, lines: Sequence[str]) -> RuntimeError:
    """The error of a failed command (exit status ``returncode``, output ``lines``):
    :class:`TransientStageError` when :func:`is_transient_failure` says a retry may help, else
    :class:`StageError`; ``message`` is its one line."""
    transient = is_transient_failure(returncode, lines)
    return (TransientStageError if transient else StageError)(message)


def retry_if_transient(task: object, task_run: object, state: Any) -> bool:
    """A Prefect ``retry_condition_fn``: retry a task only when it raised
    :class:`TransientStageError` (the pipeline's stages and members, the study's points)."""
    try:
        state.result()
    except TransientStageError:
        return True
    except Exception:
        return False
    return False


def relay(
    args: Sequence[str],
    cwd: Path,
    log: Callable[[str], None] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[int, list[str]]:
    """Run ``args`` in ``cwd`` (stdout and stderr merged; ``env`` defaults to
    :func:`subprocess_env`) and return ``(exit status, lines)``: its output lines without blank
    lines and progress bars (:func:`is_progress_line`; of a ``\r``-rewritten line, the last
    segment). Each line goes to ``log`` as it comes, except DVC's after-stage advice
    (:data:`_DVC_HINTS`)."""
    proc = subprocess.Popen(
        list(args),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=subprocess_env() if env is None else env,
    )
    lines: list[str] = []
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.rstrip().split("\r")[-1]
        if not line.strip() or is_progress_line(line):
            continue
        lines.append(line)
        if log is not None and not line.strip().startswith(_DVC_HINTS):
            log(line)
    return proc.wait(), lines


#: How long a task thread waits for the interrupted process to end (:func:`wait_out_interrupt`).
INTERRUPT_WAIT_SECONDS = 60.0


def wait_out_interrupt() -> None:
    """Once the user interrupted the run, a task whose process the interrupt stopped (or that
    would start after it) reports nothing: its thread waits here until
    :func:`flows.interrupts.end_interrupted` ends the process, so the Prefect API keeps the
    ``Crashed`` state the interrupt recorded (a ``Failed`` reported after it would overwrite it).
    Bounded by :data:`INTERRUPT_WAIT_SECONDS`, after which the caller reports as it would."""
    if INTERRUPTED.is_set():
        threading.Event().wait(INTERRUPT_WAIT_SECONDS)


def _refuse_if_interrupted(what: str) -> None:
    if INTERRUPTED.is_set():
        wait_out_interrupt()
        raise StageError(f"{what} not started: the run was interrupted")


def repro_stage(root: Path, stage: str, log: Callable[[str], None] = print) -> StageRun:
    """``dvc repro --single-item stage``; raise StageError / TransientStageError on failure."""
    _refuse_if_interrupted(f"stage {stage}")
    t0 = time.perf_counter()
    rc, lines = relay(
        [bin_path("dvc"), "repro", "--single-item", stage], root, lambda ln: log(f"[{stage}] {ln}")
    )
    seconds = time.perf_counter() - t0
    if rc != 0:
        wait_out_interrupt()
        kind = TransientStageError if is_transient_failure(rc, lines) else StageError
        raise kind.from_output(lines, rc, stage=stage)
    ran = f"Running stage '{stage}'" in "\n".join(lines)
    return StageRun(stage, ran, seconds, lines)


def run_member(
    root: Path, member: int, log: Callable[[str], None] = print, threads: int | None = None
) -> subprocess.CompletedProcess:
    """``python -m tasks.finetune_members --member member`` in ``root``; its output lines (no
    progress bars) go to ``log`` once it ends. ``threads``: the process's ``HYDRA_ENS_THREADS``
    (None: the stages' own). Raises StageError when the run was interrupted."""
    _refuse_if_interrupted(f"member {member}")
    env = subprocess_env()
    if threads is not None:
        env["HYDRA_ENS_THREADS"] = str(threads)
    python = shutil.which("python", path=env.get("PATH")) or bin_path("python")
    proc = subprocess.run(
        [python, "-m", "tasks.finetune_members", "--member", str(member)],
        cwd=root,
        capture_output=True,
        text=True,
        env=env,
    )
    for line in (proc.stdout + proc.stderr).splitlines():
        line = line.split("\r")[-1]
        if line.strip() and not is_progress_line(line):
            log(line)
    return proc


def stop_descendants(
    forward: bool, grace: float = 3.0, timeout: float = 2.0, pid: int | None = None
) -> list[int]:
    """Stop every descendant of process ``pid`` (default: this one): dvc, stage and member
    processes, the temporary Prefect server, Dask workers. Returns the pids found.

    ``forward=False`` (Ctrl-C: the terminal signalled the whole process group) waits up to
    ``grace`` s for them to end on their own first; then SIGTERM to those left, and SIGKILL to
    any still there after ``timeout`` s. The tree is read once, before any of them ends (a
    grandchild whose parent ends is still found). A process that ended counts as gone even
    before its parent reaps it; none is reaped here (a ``subprocess.Popen`` still waits on it).
    """
    import psutil

    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    found = [p.pid for p in procs]
    alive = _wait_ended(procs, 0.0 if forward else grace)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    alive = _wait_ended(alive, timeout)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    _wait_ended(alive, 1.0)
    return found


def _wait_ended(procs: list, timeout: float) -> list:
    """The ``psutil.Process`` es of ``procs`` still running (not ended, not a zombie) after
    waiting up to ``timeout`` s for them to end."""
    import psutil

    def running(p: psutil.Process) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + timeout
    while True:
        procs = [p for p in procs if running(p)]
        if not procs or time.monotonic() >= deadline:
            return procs
        time.sleep(0.05)


def push(root: Path) -> str:
    r = dvc(root, "push", "-q", check=False)
    if r.returncode != 0:
        return f"push failed: {r.stderr.strip()[:200]}"
    local = remote_url(root, REMOTE_NAME)
    if local and Path(local).resolve() == (root / REMOTE_DIR).resolve():
        # the project's own remote on this disk shares the cache's bytes (flows.dvclinks)
        link_remote_to_cache(root / REMOTE_DIR, cache_dir(root))
    return "pushed"
