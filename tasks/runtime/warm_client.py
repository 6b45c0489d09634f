"""The ``python`` a stage runs while a warm stage process serves the run
(:mod:`tasks.runtime.warm_server`, started by :func:`flows.warm.warm_stages`).

``python -m tasks.<stage> ARGS`` with ``HYDRA_ENS_STAGE_SERVER`` set asks the server to fork the
stage, passes it this process's standard streams, then waits: signals it gets (Ctrl-C, SIGTERM,
...) go on to the stage, and it exits as the stage did (its exit code, or the same signal). Any
other command, no server, or a server that answers ``cold`` (its environment differs) becomes
the real interpreter in this same process (``exec``), exactly as without a server.

Standard library only, loaded by path by the shim (``python -I -S``): it must start in
milliseconds.
"""

import contextlib
import json
import os
import signal
import socket
import struct
import sys
from typing import NoReturn

SERVER_VARIABLE = "HYDRA_ENS_STAGE_SERVER"
FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
HEADER = struct.Struct("!I")


def _std_fds() -> list[int]:
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:  # a closed stream: the stage gets /dev/null, as a child would
            fds.append(os.open(os.devnull, os.O_RDWR))
    return fds


def _read_line(conn: socket.socket) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(256)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


def run_warm(path: str, argv: list[str]) -> str | None:
    """Ask the server at ``path`` to run ``argv``; the stage's end (``exit N`` / ``signal N`` /
    ``""`` when the server went away), or None when the stage must run here instead."""
    pending: list[int] = []
    child: list[int] = []

    def forward(signum: int, frame: object) -> None:
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child[0], signum)
        else:
            pending.append(signum)

    request = {
        "argv": argv,
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "umask": _umask(),
        "cpus": sorted(os.sched_getaffinity(0)),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
    }
    payload = json.dumps(request).encode()
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        for signum in FORWARDED:
            signal.signal(signum, forward)
        socket.send_fds(conn, [HEADER.pack(len(payload)) + payload], _std_fds())
        kind, _, value = _read_line(conn).partition(" ")
    except OSError:
        kind = value = ""
    if kind != "warm":
        _restore(pending)
        return None
    child.append(int(value))
    for signum in pending:
        forward(signum, None)
    try:
        return _read_line(conn)
    except OSError:
        return ""


def _restore(pending: list[int]) -> None:
    """Default handlers back, and a signal that came meanwhile acts now (as on a fresh process)."""
    for signum in FORWARDED:
        signal.signal(signum, signal.SIG_DFL)
    for signum in pending:
        os.kill(os.getpid(), signum)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def exit_like(end: str) -> NoReturn:
    """Exit as the stage ended: ``exit N``, ``signal N``; ``""``: the server went away."""
    kind, _, value = end.partition(" ")
    if kind == "exit":
        os._exit(int(value))
    if kind == "signal":
        signum = int(value)
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)
    sys.stderr.write("error: the warm stage process ended before the stage did\n")
    sys.stderr.flush()
    os._exit(1)


def main(real_python: str) -> NoReturn:
    argv = sys.argv[1:]
    path = os.environ.get(SERVER_VARIABLE, "")
    if path and len(argv) >= 2 and argv[0] == "-m" and argv[1].split(".")[0] == "tasks":
        end = run_warm(path, argv)
        if end is not None:
            exit_like(end)
    os.execv(real_python, [real_python, *argv])
