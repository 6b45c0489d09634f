"""hydra_ops.models.runtime: device specs, autocast contexts, grad scaler, bf16 support, the
Runtime of a spec, batches moved to a device."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HYDRA_ENS_PROGRESS", "0")

import pytest
import torch

from hydra_ops.models.runtime import (
    Runtime,
    autocast,
    bf16_supported,
    grad_scaler,
    move_batch,
    resolve_device,
)

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only path")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: one thread avoids OpenMP spin contention on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


# ---- devices ----
def test_resolve_device_without_cuda(no_cuda):
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    for spec in ("cuda", "cuda:0", "cuda:3"):
        with pytest.raises(ValueError, match=rf"device: '{spec}' is not available: no CUDA"):
            resolve_device(spec)


def test_resolve_device_with_cuda(two_gpus):
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ValueError, match=r"'cuda:2' is not available: 2 CUDA device\(s\)"):
        resolve_device("cuda:2")


@pytest.mark.parametrize("spec", ["gpu", "CUDA", "cuda:", "cuda:-1", "cuda:x", "", "mps", 0])
def test_resolve_device_refuses_bad_specs(spec):
    with pytest.raises(
        ValueError, match=r"device: unknown spec .*allowed: auto, cpu, cuda, cuda:N"
    ):
        resolve_device(spec)


# ---- precision ----
def test_autocast_contexts_on_cpu():
    layer = torch.nn.Linear(4, 2)
    x = torch.randn(3, 4)
    with autocast("cpu", "fp32"):
        assert not torch.is_autocast_enabled("cpu")
        assert layer(x).dtype == torch.float32
    for precision, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        with autocast(torch.device("cpu"), precision):
            assert torch.is_autocast_enabled("cpu")
            assert torch.get_autocast_dtype("cpu") == dtype
            assert layer(x).dtype == dtype
        assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("precision", ["fp8", "auto", "half", "float32"])
def test_autocast_refuses_unknown_precisions(precision):
    with pytest.raises(ValueError, match=r"precision: unknown value .*allowed: fp32, bf16, fp16"):
        autocast("cpu", precision)


def test_grad_scaler_only_for_fp16():
    assert grad_scaler("cpu", "fp32") is None
    assert grad_scaler("cpu", "bf16") is None
    scaler = grad_scaler("cpu", "fp16")
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.is_enabled()


def test_bf16_supported_gives_a_reason():
    ok, why = bf16_supported("cpu")
    assert isinstance(ok, bool) and why and "\n" not in why
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    assert ok == ("amx_bf16" in flags or "avx512_bf16" in flags)
    assert torch.backends.cpu.get_cpu_capability() in why


@pytest.mark.parametrize(
    ("flags", "capability", "native", "said"),
    [
        ("fpu avx2 avx512f", "AVX512", False, "neither amx_bf16 nor avx512_bf16"),
        ("fpu avx2 avx512f avx512_bf16", "AVX512", True, "CPU has avx512_bf16"),
        ("fpu avx512_bf16 amx_bf16 amx_tile", "AVX512", True, "amx_bf16 + avx512_bf16"),
        ("fpu avx512_bf16 amx_bf16", "AVX2", False, "capability AVX2 (ATEN_CPU_CAPABILITY)"),
        ("fp asimd bf16", "SVE256", False, "neither amx_bf16 nor avx512_bf16"),
    ],
)
def test_bf16_supported_reads_the_flags_and_torchs_capability(
    tmp_path, monkeypatch, flags, capability, native, said
):
    from hydra_ops.models import runtime

    info = tmp_path / "cpuinfo"
    key = "Features" if "asimd" in flags else "flags"
    info.write_text(f"processor\t: 0\n{key}\t\t: {flags}\n")
    monkeypatch.setattr(runtime, "_CPUINFO", info)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    ok, why = bf16_supported("cpu")
    assert ok is native and said in why and "\n" not in why


def test_bf16_supported_without_cpuinfo_asks_torch(tmp_path, monkeypatch):
    from hydra_ops.models import runtime

    monkeypatch.setattr(runtime, "_CPUINFO", tmp_path / "missing")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    assert bf16_supported("cpu") == (True, "CPU has amx_bf16 (torch capability AVX512)")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert bf16_supported("cpu")[0] is False


def test_a_lowered_aten_cpu_capability_keeps_bf16_off_in_a_real_process():
    """``ATEN_CPU_CAPABILITY=avx2`` (how an AVX2 machine's kernels are reproduced on a newer CPU)
    counts as no native bf16 on any CPU: ``auto`` then keeps the exact fp32 path."""
    code = "from hydra_ops.models.runtime import bf16_supported; print(bf16_supported('cpu'))"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("(False, ") and "AVX2" in out, out


@needs_no_cuda
def test_bf16_supported_on_cuda_without_cuda():
    ok, why = bf16_supported("cuda")
    assert not ok and "no CUDA device" in why


def test_runtime_from_spec_resolves_auto_and_describes_itself(no_cuda):
    rt = Runtime.from_spec("auto", "auto")
    assert (rt.device, rt.precision) == (torch.device("cpu"), "fp32")
    assert rt.is_default and rt.tag == "cpu/fp32" and not rt.pin_memory
    assert "auto" in rt.why
    trained = Runtime.from_spec("auto", "auto", training=True)
    assert trained.precision == "fp32" and "CPU" in trained.why
    line = Runtime.from_spec("cpu", "bf16").describe()
    assert line.startswith("runtime: device cpu (") and ", precision bf16 (" in line
    assert "\n" not in line
    assert Runtime.from_spec("cpu", "bf16") == Runtime(torch.device("cpu"), "bf16", why="other")
    with pytest.raises(dataclasses.FrozenInstanceError):
        rt.precision = "bf16"  # type: ignore[misc]
    with pytest.raises(ValueError, match="precision: unknown value 'fp8'"):
        Runtime.from_spec("cpu", "fp8")
    with pytest.raises(ValueError, match="no CUDA"):
        Runtime.from_spec("cuda", "auto")


@pytest.mark.parametrize(("native", "expected"), [(True, "bf16"), (False, "fp32")])
def test_training_auto_precision_on_cuda(two_gpus, monkeypatch, native, expected):
    """``auto`` for training: bf16 on a CUDA device with native bf16, else fp32; inference fp32."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _d=None: "Stub GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda _d=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: native)
    trained = Runtime.from_spec("cuda:1", "auto", training=True)
    assert trained.device == torch.device("cuda", 1) and trained.precision == expected
    assert trained.pin_memory and "Stub GPU" in trained.why
    assert Runtime.from_spec("cuda", "auto").precision == "fp32"
    if not native:
        with pytest.raises(ValueError, match="precision 'bf16' does not run on cuda:0"):
            Runtime.from_spec("cuda", "bf16")


def test_move_batch_keeps_tensors_already_there():
    batch = {"input_ids": torch.arange(4), "note": "x"}
    moved = move_batch(batch, torch.device("cpu"))
    assert moved["input_ids"] is batch["input_ids"] and moved["note"] == "x"
