"""Which memory allocator a model process starts with: the environment that selects it.

A CPU forward of a Hydra (or any transformer at batch 32) allocates activations of tens of MB per
op. glibc's malloc serves blocks above its mmap threshold (at most 32 MB) with fresh ``mmap``\\ s
and unmaps them on free, so every call page-faults its largest activations in again, and trims
the heap back to the OS. A caching allocator keeps freed memory for the next call instead
(PyTorch's CPU performance guide recommends tcmalloc or jemalloc for this).

An allocator is fixed when a process starts, so this module only builds the environment a child
process is started with (the pipeline's stage processes, :func:`flows.dvcops.subprocess_env`):

* ``system``: nothing changed.
* ``glibc_tuned``: ``GLIBC_TUNABLES`` with no mmap for large blocks and no trimming, so glibc
  reuses freed memory (no install; Linux with glibc).
* ``tcmalloc`` / ``jemalloc``: ``LD_PRELOAD`` of the library (e.g. Debian's
  ``libtcmalloc-minimal4`` / ``libjemalloc2``); an error when it is not installed.
* ``auto``: ``tcmalloc`` when installed, else ``glibc_tuned`` on glibc, else ``system``.

The allocator changes where memory comes from, not what is computed: torch aligns its CPU tensors
itself (64 bytes), so results are bit-identical under every choice. No torch import here.
"""

from __future__ import annotations

import glob
import os
import platform
import sys
from collections.abc import Mapping

ALLOCATORS = ("auto", "system", "glibc_tuned", "tcmalloc", "jemalloc")
"""Values of ``HYDRA_ENS_MALLOC`` (:data:`ENV_VAR`)."""
ENV_VAR = "HYDRA_ENS_MALLOC"
GLIBC_TUNED = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967295"
"""``GLIBC_TUNABLES`` of ``glibc_tuned``: never mmap a block, never trim the heap."""
LIBRARY_GLOBS = {
    "tcmalloc": ("libtcmalloc_minimal.so*", "libtcmalloc.so*"),
    "jemalloc": ("libjemalloc.so*",),
}
LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)
INSTALL_HINT = {
    "tcmalloc": "Debian/Ubuntu: apt-get install libtcmalloc-minimal4",
    "jemalloc": "Debian/Ubuntu: apt-get install libjemalloc2",
}


def find_library(name: str, dirs: tuple[str, ...] = LIBRARY_DIRS) -> str | None:
    """The first shared library of allocator ``name`` (``tcmalloc`` / ``jemalloc``) in ``dirs``
    (and ``$VIRTUAL_ENV/lib``, ``$CONDA_PREFIX/lib``), or None."""
    prefixes = [os.environ.get(v) for v in ("VIRTUAL_ENV", "CONDA_PREFIX")]
    search = [os.path.join(p, "lib") for p in prefixes if p] + list(dirs)
    for folder in search:
        for pattern in LIBRARY_GLOBS[name]:
            found = sorted(glob.glob(os.path.join(folder, pattern)))
            if found:
                return found[0]
    return None


def _has_glibc() -> bool:
    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def _preloaded(environ: Mapping[str, str]) -> str | None:
    for entry in environ.get("LD_PRELOAD", "").replace(":", " ").split():
        base = os.path.basename(entry)
        if any(k in base for k in ("tcmalloc", "jemalloc", "mimalloc")):
            return entry
    return None


def allocator_env(
    spec: str | None = None, environ: Mapping[str, str] | None = None
) -> tuple[dict[str, str], str]:
    """``(variables to set, one-line description)`` for allocator ``spec`` (default: the
    ``HYDRA_ENS_MALLOC`` of ``environ``, else ``auto``).

    An allocator the environment already selects (a malloc library in ``LD_PRELOAD``, or
    ``GLIBC_TUNABLES`` set) is kept as it is under ``auto``. ValueError, in one line, for an
    unknown spec or a library that is not installed.
    """
    environ = os.environ if environ is None else environ
    spec = (spec or environ.get(ENV_VAR) or "auto").strip()
    if spec not in ALLOCATORS:
        raise ValueError(f"{ENV_VAR}: unknown allocator {spec!r}; allowed: {', '.join(ALLOCATORS)}")
    if spec == "auto":
        if preloaded := _preloaded(environ):
            return {}, f"allocator: {preloaded} (LD_PRELOAD as set)"
        if environ.get("GLIBC_TUNABLES"):
            return {}, "allocator: glibc malloc with GLIBC_TUNABLES as set"
        if find_library("tcmalloc"):
            spec = "tcmalloc"
        elif _has_glibc():
            spec = "glibc_tuned"
        else:
            return {}, "allocator: system malloc (auto: no tcmalloc, not glibc)"
    if spec == "system":
        return {}, "allocator: system malloc"
    if spec == "glibc_tuned":
        if not _has_glibc():
            raise ValueError(f"{ENV_VAR}=glibc_tuned: this system's C library is not glibc")
        return {"GLIBC_TUNABLES": GLIBC_TUNED}, "allocator: glibc malloc, no mmap, no trim"
    library = find_library(spec)
    if library is None:
        raise ValueError(
            f"{ENV_VAR}={spec}: lib{spec} not found in {', '.join(LIBRARY_DIRS)} "
            f"({INSTALL_HINT[spec]})"
        )
    current = environ.get("LD_PRELOAD", "")
    preload = f"{library} {current}".strip() if library not in current else current
    return {"LD_PRELOAD": preload}, f"allocator: {spec} ({library})"
