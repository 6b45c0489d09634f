"""The warm stage process: forks ``python -m tasks.<stage>`` from a process that has already
imported torch and transformers, so a model stage starts in a fraction of a second instead of the
4-5 s those imports take.

Run as a script by :func:`flows.warm.warm_stages`, never imported by a stage: it holds no project
module (each project, and each study point's clone, has its own copy of ``tasks`` and
``hydra_ops``), only the third-party modules named by ``--preload``. It listens on a Unix socket in
a private folder. A stage's ``python`` there is the client (:mod:`tasks.runtime.warm_client`),
which sends its arguments, folder, environment, cores, priority and standard streams; the server
forks a child that becomes that stage process (those streams, folder, environment, cores; its own
session; the signal handlers of a fresh interpreter) and runs the module as ``__main__``. The
child's exit status goes back to the client, which exits the same way. A request whose
environment differs from the server's in a variable a library may read when imported (any but
:data:`RUN_TIME_PREFIXES` / :data:`RUN_TIME_NAMES`) is answered ``cold``: the client then runs
the stage in a fresh interpreter, as without a server.

Nothing outlives what started it: the server ends when its parent closes its stdin (the run ended
or died) and after SIGINT once its stages ended, killing any stage still running; a child gets
SIGKILL when the server dies (``PR_SET_PDEATHSIG``) and when its client's connection closes (the
client was killed). On its way out the server prints one line: how many stages it forked.
"""

import sys

if sys.path and sys.path[0] == __import__("os").path.dirname(__file__):
    del sys.path[0]  # run as a script: tasks/runtime itself must not shadow top-level modules

import argparse
import atexit
import contextlib
import ctypes
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import struct
import threading
import traceback
from typing import NoReturn

#: Variables that may differ between the server and a request: the stage's own settings
#: (``HYDRA_ENS_THREADS``, ...), the tools' run-time ones and the shell's; none is read by a
#: library at import.
RUN_TIME_PREFIXES = ("HYDRA_ENS_", "DVC_", "PREFECT_", "PYTEST_", "GIT_")
RUN_TIME_NAMES = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "COLUMNS", "LINES"})
#: A request's header: the length of the JSON that follows.
HEADER = struct.Struct("!I")
MAX_REQUEST = 16 * 1024 * 1024
_PR_SET_PDEATHSIG = 1


def import_time_env(env: dict[str, str]) -> dict[str, str]:
    """The variables of ``env`` a library may have read when the server imported it."""
    return {
        k: v
        for k, v in env.items()
        if k not in RUN_TIME_NAMES and not k.startswith(RUN_TIME_PREFIXES)
    }


def refusal(request: dict, server_env: dict[str, str]) -> str | None:
    """Why ``request`` must run in a fresh interpreter (one short reason), or None."""
    argv = request.get("argv")
    if not (isinstance(argv, list) and len(argv) >= 2 and argv[0] == "-m"):
        return "not a python -m command"
    ours, theirs = import_time_env(server_env), import_time_env(request.get("env") or {})
    if ours != theirs:
        differ = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
        return "environment differs: " + ", ".join(differ[:5])
    if threading.active_count() != 1:
        return "the server runs threads (a fork would copy their locks)"
    return None


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 65536, 3)
    if len(data) < HEADER.size:
        raise ValueError("short request")
    (size,) = HEADER.unpack_from(data)
    if size > MAX_REQUEST:
        raise ValueError("request too large")
    body = bytearray(data[HEADER.size :])
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ValueError("truncated request")
        body += chunk
    if len(fds) != 3:
        raise ValueError("the request did not pass the three standard streams")
    return json.loads(body), fds


def _reply(conn: socket.socket, line: str) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(f"{line}\n".encode())


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _run_as_main(module: str) -> int:
    """Run ``module`` as ``python -m`` does; its exit status (Python's rules for SystemExit and
    uncaught exceptions; a KeyboardInterrupt ends the process by SIGINT, as Python does)."""
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    with contextlib.suppress(Exception):
        threading._shutdown()  # type: ignore[attr-defined]  # as at interpreter exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    return code


def _become_stage(request: dict, fds: list[int], parent: int, close: list) -> NoReturn:
    """In the forked child: become the stage process the request describes, run it, exit."""
    code = 70
    try:
        _die_with_parent()
        if os.getppid() != parent:
            os._exit(code)
        os.setsid()
        for obj in close:
            with contextlib.suppress(OSError):
                obj.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.umask(int(request["umask"]))
        if request.get("cpus"):
            os.sched_setaffinity(0, request["cpus"])
        nice = int(request.get("nice", 0))
        if nice > os.getpriority(os.PRIO_PROCESS, 0):
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[0:1] = [request["cwd"]]
        argv = request["argv"]
        sys.argv = [argv[1], *argv[2:]]
        code = _run_as_main(argv[1])
    except BaseException:
        with contextlib.suppress(Exception):
            traceback.print_exc()
            sys.stderr.flush()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 1)


class Server:
    """The accept / fork / reap loop (single-threaded: it forks)."""

    def __init__(self, listener: socket.socket, env: dict[str, str]) -> None:
        self.listener = listener
        self.env = env  # as the preloaded libraries saw it (importing may add to os.environ)
        self.selector = selectors.DefaultSelector()
        self.running: dict[int, socket.socket] = {}
        self.forked = 0
        self.cold: dict[str, int] = {}
        self.draining = False

    def serve(self) -> None:
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(0, selectors.EVENT_READ, "parent")
        while not (self.draining and not self.running):
            for key, _ in self.selector.select(timeout=0.05):
                if key.data == "accept":
                    self._accept()
                elif key.data == "parent":
                    if not os.read(0, 4096):
                        return self._stop_all()
                else:  # the client hung up: it was killed, its stage goes with it
                    self.selector.unregister(key.fileobj)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(key.data, signal.SIGKILL)
            self._reap()

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            conn.settimeout(10.0)  # a client that connects and sends nothing does not stall us
            request, fds = _receive(conn)
            conn.settimeout(None)
        except (OSError, ValueError) as err:
            _reply(conn, f"cold bad request ({err})")
            conn.close()
            return
        reason = "the server is stopping" if self.draining else refusal(request, self.env)
        if reason is not None:
            self.cold[reason] = self.cold.get(reason, 0) + 1
            _reply(conn, f"cold {reason}")
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        others = [self.listener, self.selector, conn, *self.running.values()]
        pid = os.fork()
        if pid == 0:
            _become_stage(request, fds, os.getppid(), others)
        for fd in fds:
            os.close(fd)
        self.forked += 1
        self.running[pid] = conn
        _reply(conn, f"warm {pid}")
        self.selector.register(conn, selectors.EVENT_READ, pid)

    def _reap(self) -> None:
        while self.running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.running.pop(pid, None)
            if conn is None:
                continue
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(conn)
            if os.WIFSIGNALED(status):
                _reply(conn, f"signal {os.WTERMSIG(status)}")
            else:
                _reply(conn, f"exit {os.waitstatus_to_exitcode(status)}")
            conn.close()

    def _stop_all(self) -> None:
        for pid in list(self.running):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid, conn in list(self.running.items()):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            _reply(conn, f"signal {int(signal.SIGKILL)}")
            conn.close()
        self.running.clear()

    def summary(self) -> str:
        cold = "; ".join(f"{n} cold: {why}" for why, n in self.cold.items())
        return f"warm stages: {self.forked} forked" + (f"; {cold}" if cold else "")


def preload(modules: list[str]) -> list[str]:
    """Import ``modules``; the ones that failed, each with its error (the stages import them
    themselves)."""
    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as err:  # a missing optional module only costs its stage the import
            failed.append(f"{name} ({type(err).__name__}: {err})")
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, help="the Unix socket to listen on")
    parser.add_argument("--preload", default="", help="comma-separated modules to import first")
    args = parser.parse_args(argv)
    server: Server | None = None

    def on_sigint(signum: int, frame: object) -> None:
        if server is not None:  # the terminal's Ctrl-C reached the stages too: let them end
            server.draining = True

    signal.signal(signal.SIGINT, on_sigint)
    env = dict(os.environ)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(args.socket)
    listener.listen(64)  # clients queue here while the imports run
    failed = preload([m for m in args.preload.split(",") if m])
    server = Server(listener, env)
    try:
        server.serve()
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(args.socket)
        line = server.summary()
        if failed:
            line += "; not preloaded: " + ", ".join(failed)
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
