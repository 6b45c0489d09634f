"""A fake clock for the hardware probes of every Python process a pipeline test starts with this
folder first on ``PYTHONPATH`` (Python imports ``sitecustomize`` at start-up).

``HYDRA_ENS_TEST_BF16_TIME`` (a float, e.g. ``0.95``): each timing a probe takes reads 10 ms for
fp32 and that many times 10 ms for bf16, whatever the machine does: compile's candidates
(:func:`hydra_ops.compile.latency.latency_rounds_ms`, the calls still run) and the precision
probes (:func:`hydra_ops.perf.precision_probe.alternating_timings`, nothing runs). Two projects
given ``0.95`` and ``1.05`` see bf16 5% faster in one and 5% slower in the other: timings within
noise of each other, which must not change what either ships. Unset: nothing is patched.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

RATIO = os.environ.get("HYDRA_ENS_TEST_BF16_TIME")
_current = {"precision": "fp32"}


def _ms(precision: str) -> float:
    return 10.0 * (float(RATIO) if precision == "bf16" else 1.0)


def _patch_build(module) -> None:
    real = module.Build.build

    def build(self, name, precision="fp32"):
        _current["precision"] = precision
        return real(self, name, precision)

    module.Build.build = build


def _patch_auto(module) -> None:
    def latency_rounds_ms(call, repeats, device=None):
        import torch

        with torch.no_grad():
            out = call()
        return out, [_ms(_current["precision"])] * repeats

    module.latency_rounds_ms = latency_rounds_ms


def _patch_probe(module) -> None:
    def alternating_timings(run, device, steps, warmup):
        return module.Timings((_ms("fp32") / 1e3,) * steps, (_ms("bf16") / 1e3,) * steps)

    module.alternating_timings = alternating_timings


PATCHES = {
    "hydra_ops.compile.build": _patch_build,
    "hydra_ops.compile.auto": _patch_auto,
    "hydra_ops.perf.precision_probe": _patch_probe,
}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module, run=run, patch=PATCHES[name]):
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


if RATIO:
    sys.meta_path.insert(0, _PatchAfterImport())
