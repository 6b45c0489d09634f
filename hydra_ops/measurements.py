"""A small cache of speed measurements, keyed by the machine that made them and what was measured.

A measured choice (the training / inference precision of :mod:`hydra_ops.perf.precision_probe`, the
candidates ``compile: auto`` times) is worth making once per machine and shape: re-measuring it on
every run costs time, and a choice that flips with timing noise between two runs of the same params
would give two different models. :class:`MeasurementCache` keeps them in one JSON file (the project
keeps one per machine kind, its hardware record ``hardware/<kind id>.json``, tracked by git:
:mod:`tasks.runtime.hardware`), keyed by

- :func:`machine_key`: the machine kind (:func:`machine_kind`: the CPU model name, its vector /
  matrix flags ``avx2``, ``avx512*``, ``amx*``, the logical CPUs this process may use, the GPUs'
  names and the torch version) and the device the timing ran on (its CUDA capability on a GPU).
  Not the thread count of the process: members trained side by side with fewer threads each get
  the answer a lone process gets;
- ``kind`` (e.g. ``precision/training``) and a JSON-able ``key`` (model signature, batch shape).

Reads and writes hold an exclusive ``fcntl`` lock on ``.locks/<file>.lock`` beside it, so stage
processes (members fine-tuned in parallel) see one measurement:
:meth:`MeasurementCache.get_or_measure` measures at most once per key. Writes are atomic
(:func:`hydra_ops.atomic.atomic_write_bytes`). A missing, unreadable or corrupt file is an empty
cache (the measurement reruns).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from hydra_ops.atomic import atomic_write_bytes
from hydra_ops.hashing import sha256_bytes

log = logging.getLogger("hydra_ops.measurements")

#: ``/proc/cpuinfo`` flags that decide which kernels (and so which timings) a CPU gets.
RELEVANT_CPU_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
FORMAT = 1


def _cpuinfo() -> tuple[str, set[str]]:
    """``(model name, flags)`` of the first CPU in ``/proc/cpuinfo`` (``("unknown", set())``)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown", set()
    name, flags = "unknown", set()
    for line in text.splitlines():
        if line.startswith("model name") and name == "unknown":
            name = line.split(":", 1)[1].strip()
        elif line.startswith(("flags", "Features")) and not flags:
            flags = set(line.split(":", 1)[1].split())
    return name, flags


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def machine_kind() -> dict[str, Any]:
    """What this machine is, as far as a speed choice goes (JSON-able, sorted flags): the CPU
    model, its :data:`RELEVANT_CPU_FLAGS`, torch's CPU kernel level, the logical CPUs this
    process may use, the CUDA devices' names and the torch version. Two machines of one kind get
    one hardware record (:func:`kind_id`)."""
    name, flags = _cpuinfo()
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else []
    )
    return {
        "cpu": name,
        "cpu_flags": sorted(flags.intersection(RELEVANT_CPU_FLAGS)),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpus": _cpus(),
        "gpus": gpus,
        "torch": torch.__version__,
    }


def kind_id(kind: Mapping[str, Any]) -> str:
    """A file-name-safe id of a machine kind: the CPU (and first GPU) model as a slug and 10 hex
    digits of the sha256 of the whole kind, e.g. ``amd-epyc-3f2a9c1b07``."""
    names = [str(kind.get("cpu", "cpu")), *[str(g) for g in kind.get("gpus", [])[:1]]]
    slug = re.sub(r"[^a-z0-9]+", "-", " ".join(names).lower()).strip("-")[:48].strip("-")
    digest = sha256_bytes(json.dumps(dict(kind), sort_keys=True).encode())[:10]
    return f"{slug or 'machine'}-{digest}"


def machine_key(device: torch.device | str = "cpu") -> dict[str, Any]:
    """What a timing on ``device`` depends on besides the workload: :func:`machine_kind` and the
    device type (and a CUDA device's name and capability)."""
    device = torch.device(device)
    key: dict[str, Any] = {**machine_kind(), "device": device.type}
    if device.type == "cuda":
        key["cuda_device"] = torch.cuda.get_device_name(device)
        key["cuda_capability"] = list(torch.cuda.get_device_capability(device))
    return key


def entry_id(kind: str, machine: Mapping[str, Any], key: Mapping[str, Any]) -> str:
    """A short stable id of one measurement: sha256 of ``kind``, ``machine`` and ``key``."""
    blob = json.dumps({"kind": kind, "machine": machine, "key": key}, sort_keys=True)
    return sha256_bytes(blob.encode())[:24]


class MeasurementCache:
    """Measurements in the JSON file ``path`` (None: nothing is kept; every lookup misses).

    The file holds ``{"format": 1, "entries": {id: {"kind", "machine", "key", "value"}}}`` and
    whatever else its owner keeps there (``header``, written with every write: e.g. the machine
    kind and the decision rule; :meth:`update` for the rest).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        header: Mapping[str, Any] | None = None,
    ) -> None:
        self.path = None if path is None else Path(path)
        self.header = dict(header or {})

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self.path is None:
            yield
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = self.path.parent / ".locks" / (self.path.name + ".lock")
        lock.parent.mkdir(exist_ok=True)
        with open(lock, "a") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def _read_file(self) -> dict[str, Any]:
        if self.path is None or not self.path.is_file():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as error:
            log.warning("measurement cache %s unreadable (%s): measuring again", self.path, error)
            return {}
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return {}
        return data

    def _read(self) -> dict[str, Any]:
        entries = self._read_file().get("entries")
        return entries if isinstance(entries, dict) else {}

    def _write_file(self, data: Mapping[str, Any]) -> None:
        if self.path is None:
            return
        data = {**data, **self.header, "format": FORMAT}
        data.setdefault("entries", {})
        blob = json.dumps(data, indent=1, sort_keys=True)
        atomic_write_bytes(self.path, (blob + "\n").encode(), keep_suffix=False)

    def _write(self, entries: Mapping[str, Any]) -> None:
        self._write_file({**self._read_file(), "entries": dict(entries)})

    def read(self) -> dict[str, Any]:
        """The whole file (``{}`` when missing or unreadable)."""
        with self._locked():
            return self._read_file()

    def update(self, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Apply ``change`` to the whole file's data under the lock and write it; returns it."""
        with self._locked():
            data = self._read_file()
            change(data)
            self._write_file(data)
            return data

    def get(
        self, kind: str, key: Mapping[str, Any], machine: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """The stored value of ``(kind, machine, key)``, or None."""
        with self._locked():
            entry = self._read().get(entry_id(kind, machine, key))
        return None if entry is None else entry.get("value")

    def put(
        self,
        kind: str,
        key: Mapping[str, Any],
        machine: Mapping[str, Any],
        value: Mapping[str, Any],
    ) -> None:
        """Store ``value`` (JSON-able) for ``(kind, machine, key)``, replacing an older one."""
        with self._locked():
            entries = self._read()
            entries[entry_id(kind, machine, key)] = {
                "kind": kind,
                "machine": dict(machine),
                "key": dict(key),
                "value": dict(value),
            }
            self._write(entries)

    def get_or_measure(
        self,
        kind: str,
        key: Mapping[str, Any],
        machine: Mapping[str, Any],
        measure: Callable[[], Mapping[str, Any]],
    ) -> tuple[dict[str, Any], bool]:
        """``(value, cached)``: the stored value, or ``measure()``'s, stored. The lock is held
        while measuring, so two processes asking for the same entry measure it once."""
        with self._locked():
            entries = self._read()
            ident = entry_id(kind, machine, key)
            if ident in entries and isinstance(entries[ident].get("value"), dict):
                return dict(entries[ident]["value"]), True
            value = dict(measure())
            entries = self._read()  # unchanged under the lock, but cheap and safe
            entries[ident] = {
                "kind": kind,
                "machine": dict(machine),
                "key": dict(key),
                "value": value,
            }
            self._write(entries)
            return value, False
