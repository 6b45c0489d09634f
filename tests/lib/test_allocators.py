"""hydra_ops.perf.allocators: the environment that picks a stage process's memory allocator.

Unit tests resolve every spec with the library search monkeypatched; the process tests start
real Python children with each environment and check what the allocator is for (large blocks
reused, no page faults) and what it must not do (change a single bit of a model's output).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

import pytest

from hydra_ops.perf import allocators
from hydra_ops.perf.allocators import GLIBC_TUNED, allocator_env

GLIBC = allocators._has_glibc()


@pytest.fixture
def no_libraries(monkeypatch):
    monkeypatch.setattr(allocators, "find_library", lambda name, dirs=(): None)


@pytest.fixture
def fake_tcmalloc(monkeypatch):
    monkeypatch.setattr(
        allocators,
        "find_library",
        lambda name, dirs=(): "/opt/lib/libtcmalloc_minimal.so.4" if name == "tcmalloc" else None,
    )


def test_unknown_allocator_is_one_line_naming_the_variable():
    with pytest.raises(ValueError) as err:
        allocator_env("ptmalloc9", environ={})
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("HYDRA_ENS_MALLOC: unknown allocator 'ptmalloc9'")
    assert "auto, system, glibc_tuned, tcmalloc, jemalloc" in msg
    with pytest.raises(ValueError, match="'bogus'"):
        allocator_env(environ={"HYDRA_ENS_MALLOC": "bogus"})


def test_a_missing_library_is_refused_with_the_package_to_install(no_libraries):
    for name, package in (("tcmalloc", "libtcmalloc-minimal4"), ("jemalloc", "libjemalloc2")):
        with pytest.raises(ValueError) as err:
            allocator_env(name, environ={})
        assert "\n" not in str(err.value)
        assert f"HYDRA_ENS_MALLOC={name}: lib{name} not found" in str(err.value)
        assert package in str(err.value)


def test_auto_prefers_tcmalloc_and_keeps_an_existing_preload(fake_tcmalloc):
    env, why = allocator_env(environ={})
    assert env == {"LD_PRELOAD": "/opt/lib/libtcmalloc_minimal.so.4"}
    assert why == "allocator: tcmalloc (/opt/lib/libtcmalloc_minimal.so.4)"
    env, _ = allocator_env(environ={"LD_PRELOAD": "/opt/libfoo.so"})
    assert env == {"LD_PRELOAD": "/opt/lib/libtcmalloc_minimal.so.4 /opt/libfoo.so"}
    assert allocator_env("system", environ={}) == ({}, "allocator: system malloc")


@pytest.mark.skipif(not GLIBC, reason="glibc_tuned needs Linux with glibc")
def test_auto_without_tcmalloc_tunes_glibc(no_libraries):
    env, why = allocator_env(environ={})
    assert env == {"GLIBC_TUNABLES": GLIBC_TUNED}
    assert "no mmap, no trim" in why
    assert allocator_env("glibc_tuned", environ={})[0] == env


def test_auto_leaves_an_allocator_the_environment_already_chose(fake_tcmalloc):
    preloaded = {"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"}
    assert allocator_env(environ=preloaded) == (
        {},
        "allocator: /usr/lib/libjemalloc.so.2 (LD_PRELOAD as set)",
    )
    assert allocator_env(environ={"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})[0] == {}
    # an explicit choice is applied whatever the environment holds
    assert allocator_env("tcmalloc", environ=preloaded)[0] == {
        "LD_PRELOAD": "/opt/lib/libtcmalloc_minimal.so.4 /usr/lib/libjemalloc.so.2"
    }


CHILD = """
import resource, sys, torch
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 8))
x = torch.randn(2048, 64)
with torch.no_grad():
    for _ in range(3):  # tuned glibc grows its heap over the first forwards
        out = model(x)  # its [2048, 4096] activation is 32 MiB: above glibc's mmap threshold
    faults = []
    for _ in range(8):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        model(x)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
sys.stdout.buffer.write(out.numpy().tobytes())
sys.stderr.write("FAULTS " + " ".join(map(str, faults)) + "\\n")
"""


def _child(extra: dict[str, str]) -> tuple[bytes, list[int]]:
    """The child's output bytes and its page faults in each of 8 forwards after warm-up."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "GLIBC_TUNABLES")}
    env.update(extra)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, timeout=120, check=True
    )
    faults = [ln for ln in proc.stderr.decode().splitlines() if ln.startswith("FAULTS")]
    return proc.stdout, [int(n) for n in faults[-1].split()[1:]]


def _installed() -> list[str]:
    names = ["glibc_tuned"] if GLIBC else []
    return names + [n for n in ("tcmalloc", "jemalloc") if allocators.find_library(n)]


@pytest.mark.skipif(not GLIBC, reason="the page-fault count is glibc's behaviour")
def test_every_installed_allocator_computes_the_same_bits_and_glibc_tuned_stops_refaulting():
    """8 forwards that each allocate and free two 32 MiB activations: glibc as is maps them afresh
    and faults every 4 KiB page in again (16k faults in every forward); tuned glibc and tcmalloc
    reuse them, so the typical forward faults nothing (tuned glibc still moves its heap top now and
    then, one forward in four at most where measured, so the check is on the median forward and
    on the total). jemalloc as configured by default gives memory back, so it is only checked for
    the bits. The output bytes are the same under every allocator found here."""
    reference, system = _child({})
    typical_system = statistics.median(system)
    assert typical_system > 8000, system  # glibc as is: >= half the pages, every time
    for name in _installed():
        out, faults = _child(allocator_env(name, environ={})[0])
        assert out == reference, name
        if name in ("glibc_tuned", "tcmalloc"):
            assert statistics.median(faults) < typical_system / 10, (name, faults, system)
            assert sum(faults) < sum(system) / 2, (name, faults, system)
