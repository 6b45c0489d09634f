"""The client side of ``hydra-ens serve-model``: how ``predict`` finds a project's running service
and asks it. Standard library only, and little of it (``http.client``), so asking costs a small
part of the command's start-up and no torch import.
"""

from __future__ import annotations

import http.client
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

SERVICE_FILE = Path(".hydra-ens") / "service.json"


class RequestError(ValueError):
    """A request the service refuses: ``status`` and a one-line message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class ServiceUnavailable(OSError):
    """The service could not be reached (the caller loads the model itself)."""


def _pid_alive(pid: Any) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def find_service(root: Path) -> dict[str, Any] | None:
    """The registered service of the project at ``root`` when its process is alive, else None."""
    try:
        record = json.loads((root / SERVICE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("url"), str):
        return None
    return record if _pid_alive(record.get("pid")) else None


def ask(url: str, inputs: list[str], timeout: float = 60.0) -> dict[str, Any]:
    """POST ``inputs`` to ``url``/predict; the answer, RequestError for a refused request, or
    ServiceUnavailable when nothing answers."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    body = json.dumps({"inputs": inputs}).encode()
    try:
        conn.request("POST", "/predict", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
    except (OSError, http.client.HTTPException) as err:
        raise ServiceUnavailable(f"{url}: {err}") from None
    finally:
        conn.close()
    try:
        answer = json.loads(data)
    except ValueError:
        raise ServiceUnavailable(f"{url}: answered {resp.status} with no JSON") from None
    if resp.status != 200:
        raise RequestError(resp.status, str(answer.get("error", f"status {resp.status}")))
    return answer


def ask_project_service(
    root: Path, inputs: list[str], note: Callable[[str], None]
) -> dict[str, Any] | None:
    """The answer of the project's running ``serve-model`` to ``inputs`` with the service's
    ``model``, ``stage`` and ``url`` added, each row's ``input`` as given; None when none runs or
    it does not answer (``note`` gets why). A request it refuses raises :class:`RequestError`."""
    service = find_service(root)
    if service is None:
        return None
    sent = inputs
    if service.get("modality") == "image":  # files: the service's folder is not this one's
        sent = [str(Path(x).resolve()) for x in inputs]
    try:
        answer = ask(service["url"], sent)
    except ServiceUnavailable as err:
        note(f"note: the registered service did not answer ({err}); loading the model here")
        return None
    for row, given in zip(answer["rows"], inputs, strict=True):
        row["input"] = given  # as the user gave it, like a local predict
    return {
        **answer,
        "model": service.get("model"),
        "stage": service.get("stage"),
        "url": service["url"],
    }
