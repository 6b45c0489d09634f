"""``hydra-ens serve-model``: the prod model (or ``--single``, the base) loaded, served by
:class:`tasks.serving.service.PredictionService` on 127.0.0.1 until Ctrl-C or SIGTERM, and
registered meanwhile in ``.hydra-ens/service.json`` so ``hydra-ens predict`` asks it first."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tasks.serving.service import HOST, PredictionService, register, unregister


class ServeError(RuntimeError):
    """``serve-model`` cannot start: one line, and the CLI's exit status (2: a bad option)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def serve_until_stopped(
    root: Path,
    port: int,
    max_batch: int,
    max_wait_ms: float,
    poll: float,
    single: bool,
    say: Callable[[str], None],
) -> None:
    """Load the prod model (``single``: ``models/base``, never reloaded nor registered), serve it
    on ``127.0.0.1:port`` until Ctrl-C or SIGTERM, registered for ``predict`` meanwhile; ``say``
    gets the start and stop lines. ServeError when the model cannot load or the port is taken."""
    import signal

    from tasks.params.base import ConfigError
    from tasks.serving.prod_model import (
        ModelHolder,
        load_prod_snapshot,
        load_single_snapshot,
        stage_fingerprint,
    )

    try:
        if single:
            holder = ModelHolder(lambda: load_single_snapshot(root))
        else:
            holder = ModelHolder(
                lambda: load_prod_snapshot(root), lambda: stage_fingerprint(root), poll
            )
    except (ConfigError, ValueError, OSError) as err:
        raise ServeError(str(err)) from None
    cfg = holder.current.cfg
    info = {"model": cfg.promote.model_name, "stage": cfg.promote.stage, "project": str(root)}
    info["modality"] = cfg.modality  # image inputs are files: predict sends absolute paths
    try:
        service = PredictionService(holder, port, max_batch, max_wait_ms, info)
    except OSError as err:
        holder.close()
        why = err.strerror or err
        raise ServeError(f"--port {port}: cannot listen on {HOST}:{port} ({why})", 2) from None
    if not single:
        register(root, service.url, info)

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    snap = holder.current
    what = "the single model" if single else f"{info['model']}@{snap.version} ({info['stage']})"
    say(
        f"serving {what}, answered by {snap.answered_by}, at {service.url} (Ctrl-C stops); "
        f"warming every batch shape first (GET {service.url}/health: ok when done)\n"
        f'  curl -s {service.url}/predict -d \'{{"inputs": ["some text"]}}\''
    )
    service.start_warm_up()
    try:
        service.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        if not single:
            unregister(root)
        service.close()
    say("stopped")
