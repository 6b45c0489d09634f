"""hydra_ops.compile.auto: a candidate that lost by SKIP_RATIO on this machine and shape before, or
whose precision the eager probe found SKIP_RATIO x slower, is skipped, said so in the metadata and
the log, and measured after all if nothing else agrees."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
import torch
from tiny_models import make_members, tiny_inputs

from hydra_ops import compile as hc
from hydra_ops.compile import auto as hc_auto
from hydra_ops.compile import build as hc_build
from hydra_ops.compile.auto import SKIP_RATIO, defer_slower_precisions, skip_losers
from hydra_ops.heads.plans import HeadPlan
from hydra_ops.hydra.merge import merge_members
from hydra_ops.measurements import MeasurementCache

CANDIDATES = [("inductor", "fp32"), ("inductor", "bf16"), ("export", "fp32"), ("onnx", "fp32")]


def test_skip_losers_skips_only_wide_losers_of_an_agreeing_best():
    history = {
        "inductor/fp32": {"median_ms": 10.0, "ok": True},
        "inductor/bf16": {"median_ms": 4.0, "ok": False},  # fastest, but disagreed: not the best
        "export/fp32": {"median_ms": 19.9, "ok": True},  # < 2x the best: measured again
        "onnx/fp32": {"median_ms": 20.0, "ok": True},  # >= 2x: skipped
    }
    keep, skipped = skip_losers(CANDIDATES, history, ratio=2.0)
    assert keep == CANDIDATES[:3] and list(skipped) == ["onnx/fp32"]
    assert "2x" in skipped["onnx/fp32"] and "this machine and shape" in skipped["onnx/fp32"]
    assert skip_losers(CANDIDATES, None) == (CANDIDATES, {})
    nothing_agreed = {k: {**v, "ok": False} for k, v in history.items()}
    assert skip_losers(CANDIDATES, nothing_agreed) == (CANDIDATES, {})
    assert SKIP_RATIO >= 1.5  # "by a wide margin"


def test_defer_slower_precisions_defers_only_a_precision_twice_as_slow_eager():
    cands = [("inductor", "fp32"), ("inductor", "bf16"), ("export", "fp32"), ("export", "bf16")]
    first, deferred = defer_slower_precisions(cands, {"fp32": 20.0, "bf16": 10.0}, ratio=2.0)
    assert first == [("inductor", "bf16"), ("export", "bf16")]
    assert list(deferred) == ["inductor/fp32", "export/fp32"]
    assert "eager fp32 >= 2x slower than eager bf16" in deferred["export/fp32"]
    assert defer_slower_precisions(cands, {"fp32": 19.9, "bf16": 10.0}, ratio=2.0) == (cands, {})
    # bf16 the slower one (no fast bf16 kernels): bf16 waits
    _, deferred = defer_slower_precisions(cands, {"fp32": 10.0, "bf16": 25.0}, ratio=2.0)
    assert list(deferred) == ["inductor/bf16", "export/bf16"]
    # one precision timed (bf16 disagreed, or no probe): nothing to compare, nothing deferred
    assert defer_slower_precisions(cands, {"fp32": 10.0}) == (cands, {})
    assert defer_slower_precisions(cands, None) == (cands, {})
    fp32_only = [c for c in cands if c[1] == "fp32"]
    assert defer_slower_precisions(fp32_only, {"fp32": 30.0, "bf16": 1.0}) == (fp32_only, {})


@pytest.fixture(scope="module")
def hydra():
    plans = [HeadPlan(((0,),)), HeadPlan(((1, 2),))]
    return merge_members(make_members("bert", plans, fine_tuned=True, num_hidden_layers=1))


def _patch(monkeypatch, fp32_ms: float, bf16_ms: float, fp32_wrong: bool = False) -> None:
    """No CUDA, the export backend only, fast bf16; candidates "time" ``fp32_ms`` / ``bf16_ms``
    (the real outputs are kept); ``fp32_wrong``: the fp32 artifact disagrees with eager."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(hc.compiler, "CPU_BACKENDS", ("export",))
    monkeypatch.setattr(hc.compiler, "fast_bf16_unavailable_reason", lambda device: None)
    current = {}
    real_build = hc_build.Build.build

    def build(self, name, precision="fp32"):
        current["precision"] = precision
        runner, extra, device = real_build(self, name, precision)
        if fp32_wrong and precision == "fp32":
            return (lambda *t: runner(*t) + torch.arange(3.0)), extra, device
        return runner, extra, device

    def timed(call, repeats, device=None):
        with torch.no_grad():
            out = call()
        return out, [bf16_ms if current["precision"] == "bf16" else fp32_ms] * repeats

    monkeypatch.setattr(hc_build.Build, "build", build)
    monkeypatch.setattr(hc_auto, "latency_rounds_ms", timed)


def test_second_compile_skips_the_earlier_loser(hydra, tmp_path, monkeypatch, caplog):
    _patch(monkeypatch, fp32_ms=1.0, bf16_ms=3.0)  # bf16 3x slower than fp32
    cache = MeasurementCache(tmp_path / "measurements.json")
    kwargs = dict(max_batch=8, auto_repeats=1, precision="auto", measurements=cache)
    first = hc.compile_model(hydra, "auto", tiny_inputs("bert", 4), tmp_path / "a", **kwargs)
    assert set(first["auto_selection"]["trials"]) == {"export/fp32", "export/bf16"}
    assert "skipped_candidates" not in first["auto_selection"]
    with caplog.at_level(logging.INFO, logger="hydra_ops.compile"):
        second = hc.compile_model(hydra, "auto", tiny_inputs("bert", 4), tmp_path / "b", **kwargs)
    selection = second["auto_selection"]
    assert set(selection["trials"]) == {"export/fp32"}
    assert list(selection["skipped_candidates"]) == ["export/bf16"]
    assert second["precision"] == "fp32" and second.backend == "export"
    assert "bf16 skipped (lost by >= 2x" in second["precision_reason"]
    assert any("auto skips export/bf16" in r.getMessage() for r in caplog.records)
    # the loser keeps its earlier timing (still skipped the time after); another shape is
    # another key
    entries = [e for e in json.loads(cache.path.read_text())["entries"].values()]
    assert len(entries) == 1 and entries[0]["value"]["export/bf16"] == {
        "median_ms": 3.0,
        "ok": True,
    }
    assert entries[0]["key"]["inputs"][0] == [[4, 9], "torch.int64"]


def test_skipped_candidates_are_measured_when_nothing_else_agrees(hydra, tmp_path, monkeypatch):
    cache = MeasurementCache(tmp_path / "measurements.json")
    kwargs = dict(max_batch=8, auto_repeats=1, precision="auto", measurements=cache)
    with monkeypatch.context() as patched:  # an earlier run: fp32 won, bf16 lost by 3x
        _patch(patched, fp32_ms=1.0, bf16_ms=3.0)
        hc.compile_model(hydra, "auto", tiny_inputs("bert", 4), tmp_path / "a", **kwargs)
    _patch(monkeypatch, fp32_ms=1.0, bf16_ms=3.0, fp32_wrong=True)  # now fp32 disagrees
    artifact = hc.compile_model(hydra, "auto", tiny_inputs("bert", 4), tmp_path / "b", **kwargs)
    assert set(artifact["auto_selection"]["trials"]) == {"export/fp32", "export/bf16"}
    assert "skipped_candidates" not in artifact["auto_selection"]
    assert artifact["precision"] == "bf16"


def test_a_candidate_deferred_by_the_eager_probe_is_logged_and_kept_out_of_history(
    hydra, tmp_path, monkeypatch, caplog
):
    _patch(monkeypatch, fp32_ms=1.0, bf16_ms=3.0)
    cache = MeasurementCache(tmp_path / "measurements.json")
    kwargs = dict(max_batch=8, auto_repeats=1, precision="auto", measurements=cache)
    with caplog.at_level(logging.INFO, logger="hydra_ops.compile"):
        artifact = hc.compile_model(
            hydra,
            "auto",
            tiny_inputs("bert", 4),
            tmp_path / "a",
            eager_ms={"fp32": 5.0, "bf16": 1.0},
            **kwargs,
        )
    assert set(artifact["auto_selection"]["trials"]) == {"export/bf16"}
    assert artifact["precision"] == "bf16"
    assert any("auto defers export/fp32 (eager ms" in r.getMessage() for r in caplog.records)
    # only what was timed is remembered: a later call without the probe measures fp32 again
    (entry,) = json.loads(cache.path.read_text())["entries"].values()
    assert set(entry["value"]) == {"export/bf16"}


def test_eager_timings_are_not_applied_to_tensorrt_candidates(hydra, tmp_path, monkeypatch):
    """``eager_ms`` timed the model where it is (here the CPU); TensorRT's candidates run on CUDA,
    so only the CPU backends' measurement (after TensorRT failed) gets it."""
    seen = []

    def measured(build, candidates, *args, eager_ms=None, **kwargs):
        seen.append(({name for name, _ in candidates}, eager_ms))
        if "tensorrt" in seen[-1][0]:
            raise RuntimeError("no engine")
        return "cpu artifact"

    monkeypatch.setattr(hc.compiler, "tensorrt_unavailable_reason", lambda: None)
    monkeypatch.setattr(hc.compiler, "fast_bf16_unavailable_reason", lambda device: None)
    monkeypatch.setattr(hc.compiler, "CPU_BACKENDS", ("export",))
    monkeypatch.setattr(hc.compiler, "measure_fastest", measured)
    eager = {"fp32": 5.0, "bf16": 1.0}
    out = hc.compile_model(
        hydra, "auto", tiny_inputs("bert", 4), tmp_path, precision="auto", eager_ms=eager
    )
    assert out == "cpu artifact"
    assert seen == [({"tensorrt"}, None), ({"export"}, eager)]
    # a backend named explicitly that runs on another device than the model's: no eager timings
    gpu = dataclasses.replace(hc.get_backend("export"), name="export_gpu", device="cuda")
    hc.register_backend(gpu)
    try:
        seen.clear()
        hc.compile_model(
            hydra, "export_gpu", tiny_inputs("bert", 4), tmp_path, precision="auto", eager_ms=eager
        )
        hc.compile_model(
            hydra, "export", tiny_inputs("bert", 4), tmp_path, precision="auto", eager_ms=eager
        )
    finally:
        hc.BACKEND_REGISTRY.unregister("export_gpu")
    assert seen == [({"export_gpu"}, None), ({"export"}, eager)]


def test_pick_keeps_the_fixed_order_default_unless_a_candidate_is_clearly_faster():
    def trials(**rounds):
        return {k.replace("_", "/"): {"rounds_ms": v} for k, v in rounds.items()}

    backends = ("inductor", "export", "onnxruntime")
    noisy = trials(inductor_fp32=[472.0, 480.0], export_fp32=[463.7, 470.0])  # 1.8% apart
    assert hc_auto.pick(["export/fp32", "inductor/fp32"], noisy, backends) == "inductor/fp32"
    clear = trials(inductor_fp32=[472.0, 480.0], export_fp32=[300.0, 310.0])
    assert hc_auto.pick(["inductor/fp32", "export/fp32"], clear, backends) == "export/fp32"
    # bf16 comes after every fp32 candidate and must beat the current pick clearly
    mixed = trials(export_fp32=[300.0, 310.0], inductor_bf16=[280.0, 290.0])
    assert hc_auto.pick(["inductor/bf16", "export/fp32"], mixed, backends) == "export/fp32"
    assert hc_auto.fixed_order(["onnxruntime/bf16", "export/fp32", "inductor/bf16"], backends) == [
        "export/fp32",
        "inductor/bf16",
        "onnxruntime/bf16",
    ]
