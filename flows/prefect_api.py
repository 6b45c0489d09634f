"""A Prefect API for a study whose workers are local processes (``hydra-ens study``)."""

from __future__ import annotations

import os
from collections.abc import Callable


class LocalPrefectApi:
    """A local Prefect server for a study whose workers are local processes (they inherit its
    URL through ``PREFECT_API_URL``); nothing when ``PREFECT_API_URL`` is set (remote workers
    need it set too). ``note`` gets the one line said when a cluster's workers would report
    elsewhere, ``announce`` the URL of the server it starts."""

    def __init__(
        self,
        cluster: str | None,
        note: Callable[[str], None],
        announce: Callable[[str], None] = lambda url: None,
    ):
        self.cluster, self.note, self.announce, self.server = cluster, note, announce, None

    def __enter__(self) -> str | None:
        if os.environ.get("PREFECT_API_URL"):
            return None
        if self.cluster:
            self.note(
                "note: PREFECT_API_URL is not set; remote workers will report to their own "
                "Prefect API (docs/study.md: running on a cluster)"
            )
        from prefect.server.api.server import SubprocessASGIServer
        from prefect.settings import PREFECT_API_URL, temporary_settings

        self.server = SubprocessASGIServer()
        self.server.start(timeout=120)
        os.environ["PREFECT_API_URL"] = self.server.api_url  # for the worker processes
        self.settings = temporary_settings(updates={PREFECT_API_URL: self.server.api_url})
        self.settings.__enter__()
        self.announce(self.server.api_url)
        return self.server.api_url

    def __exit__(self, *exc: object) -> None:
        if self.server is not None:
            from prefect.logging.handlers import APILogWorker

            APILogWorker.drain_all(timeout=5)  # the run's last log lines, while it still listens
            self.settings.__exit__(*exc)
            self.server.stop()
            os.environ.pop("PREFECT_API_URL", None)
