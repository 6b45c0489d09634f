"""A small cache of speed measurements, keyed by the machine that made them and what was measured.

A measured choice (the training / inference precision of :mod:`hydra_ops.perf.precision_probe`, the
candidates ``compile: auto`` times) is worth making once per machine and shape: re-measuring it on
every run costs time, and a choice that flips with timing noise between two runs of the same params
would give two different models. :class:`MeasurementCache` keeps them in one JSON file (the project
puts it at ``.hydra-ens/measurements.json``: local to the checkout, never a DVC output), keyed by

- :func:`machine_key`: the CPU model name and its vector / matrix flags (``avx2``, ``avx512*``,
  ``amx*``), the torch version and thread count, and the CUDA device name and capability for a
  CUDA device;
- ``kind`` (e.g. ``precision/training``) and a JSON-able ``key`` (model signature, batch shape).

Reads and writes hold an exclusive ``fcntl`` lock on ``<file>.lock``, so concurrent stage processes
(members fine-tuned in parallel) see one measurement: :meth:`MeasurementCache.get_or_measure`
measures at most once per key. Writes are atomic (:func:`hydra_ops.atomic.atomic_write_bytes`).
A missing, unreadable or corrupt file is an empty cache (it is a cache: the measurement reruns).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
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


def machine_key(device: torch.device | str = "cpu") -> dict[str, Any]:
    """What a timing on ``device`` depends on besides the workload (JSON-able, sorted flags)."""
    device = torch.device(device)
    name, flags = _cpuinfo()
    key: dict[str, Any] = {
        "cpu": name,
        "cpu_flags": sorted(flags.intersection(RELEVANT_CPU_FLAGS)),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "device": device.type,
    }
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

    The file holds ``{"format": 1, "entries": {id: {"kind", "machine", "key", "value"}}}``.
    """

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = None if path is None else Path(path)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self.path is None:
            yield
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def _read(self) -> dict[str, Any]:
        if self.path is None or not self.path.is_file():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as error:
            log.warning("measurement cache %s unreadable (%s): measuring again", self.path, error)
            return {}
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return {}
        entries = data.get("entries")
        return entries if isinstance(entries, dict) else {}

    def _write(self, entries: Mapping[str, Any]) -> None:
        if self.path is None:
            return
        blob = json.dumps({"format": FORMAT, "entries": entries}, indent=1, sort_keys=True)
        atomic_write_bytes(self.path, (blob + "\n").encode(), keep_suffix=False)

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
