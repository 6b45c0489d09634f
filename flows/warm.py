"""Warm stage processes: while a run (or a study point) builds its models, one process that has
already imported torch and transformers forks each model stage, so a stage starts in a fraction of
a second instead of paying those imports (4-5 s on 2 cores) in a fresh interpreter.

The stage command does not change (``python -m tasks.<stage>``, what ``dvc.yaml`` and
``dvc.lock`` record): the run puts a ``python`` first on its stages' ``PATH``
(:mod:`tasks.runtime.warm_client`) that hands the command to the server
(:mod:`tasks.runtime.warm_server`) and exits as the stage did; anything else, or a request whose
environment the server was not started with, runs in a fresh interpreter as before. A stage's
output, exit status, signals (Ctrl-C, SIGTERM reach it through its ``python``) and files are those
of a fresh process; a plain ``dvc repro`` outside a run uses no server.

``HYDRA_ENS_WARM_STAGES=0`` turns it off. Linux only (it forks and uses ``PR_SET_PDEATHSIG``);
elsewhere every stage starts fresh.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from flows import dvcops
from flows.interrupts import process_alive, process_started
from tasks.runtime.dvcfiles import read_dvc_yaml
from tasks.runtime.warm_client import SERVER_VARIABLE

ENABLE_VARIABLE = "HYDRA_ENS_WARM_STAGES"
FOLDER_PREFIX = "hydra-ens-warm-"
RUNTIME = Path(__file__).resolve().parents[1] / "tasks" / "runtime"
SERVER = RUNTIME / "warm_server.py"
CLIENT = RUNTIME / "warm_client.py"
#: What the server imports before it forks: what every model stage imports first.
PRELOAD = (
    "torch",
    "transformers.modeling_utils",
    "transformers.models.bert.modeling_bert",
    "safetensors.torch",
)
#: The stages that load a model: each imports torch and transformers before anything else. The
#: others (data, plans, reports, gate, release) import no torch, so fewer than two of these to
#: run do not pay for a warm process.
MODEL_STAGES = frozenset(
    {
        "finetune_base",
        "finetune_baselines",
        "baseline_logits",
        "score_heads",
        "finetune_members",
        "merge",
        "calibrate",
        "compile",
        "evaluate",
    }
)
#: Seconds the server may take to bind its socket.
START_SECONDS = 30.0
_SHIM = """#!{python} -IS
import importlib.util as _u
_spec = _u.spec_from_file_location("hydra_ens_warm_client", {client!r})
_client = _u.module_from_spec(_spec)
_spec.loader.exec_module(_client)
_client.main({python!r})
"""


def worth_warming(root: Path, stages: Iterable[str]) -> bool:
    """Whether two or more of ``stages`` are model stages run as ``python -m tasks.<stage>`` in
    ``root/dvc.yaml`` (:data:`MODEL_STAGES`): below two, a warm process would only add its own
    imports."""
    declared = read_dvc_yaml(root)
    warm = [
        s
        for s in stages
        if s in MODEL_STAGES and declared.get(s, {}).get("cmd") == f"python -m tasks.{s}"
    ]
    return len(warm) >= 2


def unavailable(env: dict[str, str]) -> str | None:
    """Why stages of ``env`` cannot be forked warm here (one short reason), or None."""
    if env.get(ENABLE_VARIABLE, "1").strip().lower() in ("0", "false", "no", "off"):
        return f"{ENABLE_VARIABLE}={env[ENABLE_VARIABLE]}"
    if not sys.platform.startswith("linux"):
        return "not Linux"
    if len(f"#!{sys.executable} -IS") > 250 or any(c.isspace() for c in sys.executable):
        return "the interpreter's path cannot be a script's first line (too long, or spaces)"
    return None


@contextlib.contextmanager
def warm_stages(
    env: dict[str, str],
    log: Callable[[str], None] | None = None,
    preload: tuple[str, ...] | None = None,
) -> Iterator[dict[str, str]]:
    """Serve the stage processes run with ``env`` (plus what this yields) from one warm process.

    Yields the variables to add to ``env`` for the stage processes (``{}`` when
    :func:`unavailable`); on the way out the server stops (any stage still running is killed)
    and its one-line summary goes to ``log``. ``preload``: what the server imports (None:
    :data:`PRELOAD`).
    """
    why = unavailable(env)
    if why is not None:
        if log is not None:
            log(f"warm stages: off ({why})")
        yield {}
        return
    base = Path(tempfile.gettempdir())
    if len(os.fsencode(base)) > 60:  # the socket's path must fit AF_UNIX's 107 bytes
        base = Path("/tmp")
    remove_abandoned(base)
    with tempfile.TemporaryDirectory(
        prefix=FOLDER_PREFIX, dir=base, ignore_cleanup_errors=True
    ) as tmp:
        folder = Path(tmp)
        (folder / "owner").write_text(f"{os.getpid()} {process_started()}\n")
        socket_path = folder / "stages.sock"
        shim = folder / "bin" / "python"
        shim.parent.mkdir()
        shim.write_text(_SHIM.format(python=sys.executable, client=str(CLIENT)))
        shim.chmod(0o700)
        extra = {
            SERVER_VARIABLE: str(socket_path),
            "PATH": f"{shim.parent}{os.pathsep}{env.get('PATH', '')}",
        }
        modules = PRELOAD if preload is None else preload
        args = ["--socket", str(socket_path), "--preload", ",".join(modules)]
        errors = folder / "server.err"
        with errors.open("w") as err:
            server = subprocess.Popen(
                [sys.executable, str(SERVER), *args],
                cwd=folder,
                env={**env, **extra},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        try:
            deadline = time.monotonic() + START_SECONDS
            while not socket_path.exists() and server.poll() is None:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            yield extra if socket_path.exists() else {}
        finally:
            summary = _stop(server, errors)
            if log is not None and summary:
                log(summary)


@contextlib.contextmanager
def warm_stages_of_this_process(log: Callable[[str], None] | None = None) -> Iterator[None]:
    """:func:`warm_stages` for every stage process this process starts through
    :mod:`flows.dvcops` (``dvc repro``, member processes) until the block ends."""
    with warm_stages(dvcops.subprocess_env(), log) as extra:
        dvcops.STAGE_ENV.update(extra)
        try:
            yield
        finally:
            dvcops.STAGE_ENV.clear()


def remove_abandoned(tmp: Path) -> list[Path]:
    """Remove the folders of warm processes whose run is gone (a run killed with SIGKILL leaves
    its folder: socket, ``python``, log); returns them. A folder whose run still runs, or that
    names no owner, stays."""
    removed = []
    for folder in tmp.glob(f"{FOLDER_PREFIX}*"):
        try:
            pid, started = (folder / "owner").read_text().split()
            if process_alive(int(pid), float(started)):
                continue
        except (OSError, ValueError):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _stop(server: subprocess.Popen, errors: Path) -> str:
    """Close the server's stdin (it stops, killing any stage left); its summary line, or why it
    failed (the stages then started fresh)."""
    try:
        out, _ = server.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        out, _ = server.communicate()
    lines = [ln for ln in (out or "").splitlines() if ln.strip()]
    if server.returncode != 0:
        said = [ln for ln in errors.read_text(errors="replace").splitlines() if ln.strip()]
        why = f": {said[-1]}" if said else ""
        return f"warm stages: the warm process ended with status {server.returncode}{why}"
    return lines[-1] if lines else ""
