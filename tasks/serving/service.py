"""The prediction service: the prod model over HTTP on 127.0.0.1 (``hydra-ens serve-model``,
started by :func:`flows.serve_model.serve_until_stopped`).

The server (stdlib :class:`http.server.ThreadingHTTPServer`, one thread per connection) loads the
bundle of the version in ``promote.stage`` once (:class:`tasks.serving.prod_model.ModelHolder`),
joins concurrent requests into forward passes (:class:`tasks.serving.microbatch.MicroBatcher`) and
swaps in a newly promoted or rolled-back version without a restart: every batch is answered by the
one snapshot it took, so no answer mixes versions. Endpoints (JSON in, JSON out)::

    POST /predict   {"inputs": ["text", ...]}  ->  {"model_version", "answered_by", "legend",
                    "verdict_labels", "rows": [one object per input, the fields of
                    `hydra-ens predict --json`]}
    GET  /health    status, the model answering, reloads, the last reload error, batch counters
                    (503 ``not serving`` once the registry holds no version in the stage)
    GET  /version   model, stage, version, commit, bundle md5, schema version

Before it answers, the service warms the model on every batch shape it will meet (each forward
pass holds 1..``max_batch`` inputs, text padded to a few lengths: :mod:`tasks.serving.warmup`),
logging its progress; until then ``/health`` answers 503 ``warming up`` (with ``warmed_shapes`` of
``shapes``) and ``/predict`` 503, so no request waits on a first call; a warm-up that fails
leaves both 503 ``not serving`` with the failure. A newly promoted version is warmed the same
way beside the one answering, before the swap.

A bad request gets one ``{"error": "..."}`` with status 400 (404 unknown path, 405 wrong method,
411/413 missing or oversized body) and the server goes on. Once the registry holds no version in
the stage (``gto deprecate``, ``gto unassign``), ``/predict`` and ``/version`` answer 503 with one
line saying why and ``/health`` 503 ``not serving``, until a version is promoted
(:class:`tasks.serving.prod_model.Withdrawn`; a promotion's own second without a version is not
that). Answers within one batch are computed on inputs padded to the batch's longest, so they equal
a lone ``predict`` to float rounding.

While it runs, the service is registered in ``.hydra-ens/service.json`` (URL, pid, model, stage);
``hydra-ens predict`` asks it first (:mod:`tasks.serving.client`) and loads the model itself when
there is none.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from hydra_ops.messages import one_line
from tasks.serving.client import SERVICE_FILE, RequestError
from tasks.serving.prod_model import ModelSnapshot, Withdrawn

log = logging.getLogger("hydra_ens")

HOST = "127.0.0.1"
DEFAULT_PORT = 8350
MAX_BODY_BYTES = 1 << 20
MAX_INPUTS = 256
ANSWER_TIMEOUT_S = 300.0


def parse_predict_body(raw: bytes) -> list[str]:
    """The ``inputs`` of a ``/predict`` body, or RequestError(400) naming what is wrong."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RequestError(400, f"body is not valid JSON ({err})") from None
    if not isinstance(body, dict):
        raise RequestError(400, 'body must be a JSON object: {"inputs": ["text", ...]}')
    if unknown := sorted(set(body) - {"inputs"}):
        raise RequestError(400, f"unknown field {unknown[0]!r}; the body has one field: inputs")
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise RequestError(400, "inputs: give a non-empty list of texts (or image files)")
    if len(inputs) > MAX_INPUTS:
        raise RequestError(400, f"inputs: {len(inputs)} inputs, at most {MAX_INPUTS} a request")
    for i, text in enumerate(inputs):
        if not isinstance(text, str):
            raise RequestError(400, f"inputs[{i}]: must be a string, got {type(text).__name__}")
    return inputs


class PredictionService:
    """The HTTP server over a :class:`tasks.serving.prod_model.ModelHolder` (see the module doc).

    Args:
        holder: the current model snapshot and its watcher.
        port: TCP port on 127.0.0.1 (0: any free one; :attr:`url` says which).
        max_batch: inputs per forward pass the batcher aims at (never above the model's own).
        max_wait_ms: how long a request waits for others to join its batch.
        info: model name and stage, shown by ``/version``.
    """

    def __init__(
        self,
        holder: Any,
        port: int = DEFAULT_PORT,
        max_batch: int = 16,
        max_wait_ms: float = 5.0,
        info: dict[str, Any] | None = None,
    ) -> None:
        from tasks.serving.microbatch import MicroBatcher

        self.holder, self.info, self.max_wait_ms = holder, dict(info or {}), max_wait_ms
        self.batcher = MicroBatcher(self._run, max_batch, max_wait_ms)
        self.started = time.monotonic()
        #: set once every batch shape was warmed (:meth:`start_warm_up`)
        self.ready = threading.Event()
        self.warmed: tuple[int, int] = (0, 0)  # (shapes done, shapes)
        #: why the warm-up failed (one line); the service then answers nothing: a model that
        #: cannot run its shapes is not served
        self.warm_error: str | None = None
        holder.warm = self._warm  # a new version is warmed on every shape before its swap
        self.httpd = ThreadingHTTPServer((HOST, port), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.service = self  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def _run(self, requests: list[list[str]]) -> list[tuple[Any, Any]]:
        snapshot = self.holder.current  # one snapshot answers the whole batch
        if isinstance(snapshot, Withdrawn):
            return [(snapshot, None) for _ in requests]
        answers = snapshot.answer(requests, self.batcher.max_batch)  # only warmed shapes
        return [(snapshot, answer) for answer in answers]

    def _warm(self, snapshot: ModelSnapshot, progress: Any = None) -> None:
        snapshot.warm_shapes(self.batcher.max_batch, progress)

    def start_warm_up(self) -> threading.Thread:
        """Warm the current model on every batch shape in a background thread (progress in the
        log and :attr:`warmed`); :attr:`ready` is set when it ends. A warm-up that fails sets
        :attr:`warm_error`: ``/health`` and ``/predict`` then answer 503 with it."""

        def progress(done: int, total: int) -> None:
            self.warmed = (done, total)

        def run() -> None:
            snapshot = self.holder.current
            try:
                if not isinstance(snapshot, Withdrawn):
                    t0 = time.perf_counter()
                    self._warm(snapshot, progress)
                    log.info(
                        "warm-up done: %d batch shapes in %.1f s; serving",
                        self.warmed[1],
                        time.perf_counter() - t0,
                    )
            except Exception as exc:  # any model error: recorded and served as 503, never ok
                self.warm_error = f"warm-up failed: {one_line(str(exc) or type(exc).__name__)}"
                log.exception("warm-up failed; the service answers 503 until restarted")
            finally:
                self.ready.set()

        thread = threading.Thread(target=run, name="warm-up", daemon=True)
        thread.start()
        return thread

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until the warm-up ended (True) or ``timeout`` seconds passed (False)."""
        return self.ready.wait(timeout)

    def _serving(self) -> ModelSnapshot:
        """The snapshot answering now; RequestError(503) with the reason when it was withdrawn."""
        snapshot = self.holder.current
        if isinstance(snapshot, Withdrawn):
            raise RequestError(503, snapshot.reason)
        return snapshot

    def predict(self, inputs: list[str]) -> dict[str, Any]:
        """The ``/predict`` answer for ``inputs`` (RequestError on a bad input, 503 when no
        version is in the stage)."""
        from hydra_ops.uq.ood_thresholds import VERDICT_LABELS

        self._serving()
        if not self.ready.is_set():
            done, total = self.warmed
            raise RequestError(
                503, f"warming up ({done} of {total} batch shapes); GET /health says when ok"
            )
        if self.warm_error is not None:
            raise RequestError(503, self.warm_error)
        try:
            snapshot, rows = self.batcher.submit(inputs).result(timeout=ANSWER_TIMEOUT_S)
        except FutureTimeout:
            raise RequestError(503, f"no answer within {ANSWER_TIMEOUT_S:.0f} s") from None
        if isinstance(snapshot, Withdrawn):  # withdrawn while the request waited for its batch
            raise RequestError(503, snapshot.reason)
        if isinstance(rows, ValueError):
            raise RequestError(400, str(rows))
        return {
            "model_version": snapshot.version,
            "answered_by": snapshot.answered_by,
            "legend": snapshot.legend(),
            "verdict_labels": VERDICT_LABELS,
            "rows": rows,
        }

    def health(self) -> dict[str, Any]:
        """``status`` ``ok``, or ``not serving`` with the ``reason`` (the handler answers 503)."""
        snap, stats = self.holder.current, self.batcher.stats
        if isinstance(snap, Withdrawn):
            state = {
                "status": "not serving",
                "reason": snap.reason,
                "model_version": None,
                "withdrawn_version": snap.version,
                "withdrawn_at": snap.since,
            }
        elif self.warm_error is not None:
            state = {
                "status": "not serving",
                "reason": self.warm_error,
                "model_version": snap.version,
            }
        else:
            state = {
                "status": "ok" if self.ready.is_set() else "warming up",
                "model_version": snap.version,
                "answered_by": snap.answered_by,
                "loaded_at": snap.loaded_at,
            }
        return {
            **state,
            "moving": self.holder.moving,
            "reloads": self.holder.reloads,
            "reload_error": self.holder.reload_error,
            "uptime_s": round(time.monotonic() - self.started, 1),
            "requests": stats.requests,
            "batches": stats.batches,
            "largest_batch": stats.largest_batch,
            "max_batch": self.batcher.max_batch,
            "max_wait_ms": self.max_wait_ms,
            "warmed_shapes": self.warmed[0],
            "shapes": self.warmed[1],
        }

    def version(self) -> dict[str, Any]:
        from tasks.serving.predict import SCHEMA_VERSION

        snap = self._serving()
        fields = snap.record.get("fields", {})
        return {
            **self.info,
            "version": snap.version,
            "tag": snap.record.get("tag"),
            "commit": snap.record.get("commit"),
            "bundle_md5": fields.get("bundle_md5"),
            "gate": fields.get("gate"),
            "answered_by": snap.answered_by,
            "loaded_at": snap.loaded_at,
            "schema_version": SCHEMA_VERSION,
        }

    def start(self) -> PredictionService:
        """Warm up and serve, each in a background thread (tests, benchmarks); ``/health`` says
        ``ok`` once warm (:meth:`wait_ready`); :meth:`close` stops it."""
        self.start_warm_up()
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="serve-model", daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop answering: the HTTP loop (when started), the batcher, the model watcher."""
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(timeout=10)
        self.httpd.server_close()
        self.batcher.close()
        self.holder.close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a client reuses its connection
    server_version = "hydra-ens"

    @property
    def service(self) -> PredictionService:
        return self.server.service  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        self._send(status, {"error": message, "status": status})

    def do_GET(self) -> None:
        if self.path == "/health":
            health = self.service.health()
            self._send(200 if health["status"] == "ok" else 503, health)
        elif self.path == "/version":
            try:
                self._send(200, self.service.version())
            except RequestError as err:
                self._error(err.status, str(err))
        elif self.path == "/predict":
            self._error(405, "POST /predict with a JSON body; GET serves /health and /version")
        else:
            self._error(404, f"no endpoint {self.path!r}; try POST /predict, GET /health, /version")

    def do_POST(self) -> None:
        if self.path != "/predict":
            self._drain()
            self._error(404, f"no endpoint {self.path!r}; POST goes to /predict")
            return
        try:
            inputs = parse_predict_body(self._body())
            self._send(200, self.service.predict(inputs))
        except RequestError as err:
            self._error(err.status, str(err))

    def _not_allowed(self) -> None:
        self._drain()
        self._error(405, f"{self.command} is not served; POST /predict, GET /health, /version")

    do_PUT = do_DELETE = do_PATCH = _not_allowed

    def _drain(self) -> None:
        """Read a body nobody asked for, so the connection stays in step."""
        length = self.headers.get("Content-Length")
        if length and length.isdigit() and int(length) <= MAX_BODY_BYTES:
            self.rfile.read(int(length))
        elif length:
            self.close_connection = True

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None:
            self.close_connection = True
            raise RequestError(411, "the request has no Content-Length")
        if not length.isdigit():
            self.close_connection = True
            raise RequestError(400, f"Content-Length {length!r} is not a byte count")
        if int(length) > MAX_BODY_BYTES:
            self.close_connection = True  # the body is not read: the connection cannot go on
            raise RequestError(413, f"body of {length} bytes; at most {MAX_BODY_BYTES}")
        return self.rfile.read(int(length))


# ---- registration: how `predict` finds the service of a project ----
def register(root: Path, url: str, info: dict[str, Any]) -> Path:
    """Write ``.hydra-ens/service.json`` (atomically) naming this process's service."""
    from hydra_ops.atomic import atomic_write_bytes

    path = root / SERVICE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"url": url, "pid": os.getpid(), **info}
    atomic_write_bytes(path, json.dumps(record, indent=2).encode())
    return path


def unregister(root: Path) -> None:
    """Remove ``.hydra-ens/service.json`` when it still names this process."""
    path = root / SERVICE_FILE
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass
