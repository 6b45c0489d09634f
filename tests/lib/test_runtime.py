"""hydra_ops.models.runtime and ``runtime: {device, precision}``: device specs, autocast contexts,
bf16 support, training and inference in bf16 on the CPU (fp32 unchanged bit for bit), the params,
and the finetune_base -> calibrate stages in bf16 on a tiny prepared dataset."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HYDRA_ENS_PROGRESS", "0")

import pytest
import torch
from tiny_models import NUM_CLASSES, make_members, member_plans, tiny_inputs, tiny_model

from hydra_ops.models.inference import logits
from hydra_ops.models.runtime import (
    Runtime,
    autocast,
    bf16_supported,
    grad_scaler,
    move_batch,
    resolve_device,
)
from hydra_ops.models.training import fine_tune
from tasks.params import ConfigError, resolve_params, validate_params

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


# ---- training ----
def _labelled(seed: int = 1) -> dict[str, torch.Tensor]:
    return {**tiny_inputs("bert", 6, seed=seed), "labels": torch.tensor([0, 1, 2, 0, 1, 2])}


def _train(precision: str | None, steps: int = 1) -> tuple[torch.nn.Module, list, list]:
    """A tiny BERT fine-tuned ``steps`` steps; returns it, the loss curve, the dtypes of the
    first encoder layer's query projection seen during training."""
    model = tiny_model("bert")
    seen: list[torch.dtype] = []
    query = model.bert.encoder.layer[0].attention.self.query
    hook = query.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    batches = [_labelled(s) for s in range(1, steps + 1)]
    kwargs = {} if precision is None else {"device": "cpu", "precision": precision}
    report = fine_tune(
        model, lambda _e: batches, epochs=1, lr=1e-3, progress=False, log_fn=None, **kwargs
    )
    hook.remove()
    return model, report.epoch_losses, seen


def test_fine_tune_fp32_with_runtime_is_bit_identical_to_without():
    plain, plain_loss, plain_dtypes = _train(None, steps=2)
    fp32, fp32_loss, fp32_dtypes = _train("fp32", steps=2)
    assert plain_loss == fp32_loss and plain_dtypes == fp32_dtypes == [torch.float32] * 2
    for (name, a), b in zip(plain.state_dict().items(), fp32.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_fine_tune_one_step_in_reduced_precision_on_cpu(precision):
    before = tiny_model("bert")
    model, losses, dtypes = _train(precision)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    assert dtypes == [dtype]  # the forward ran under autocast
    assert len(losses) == 1 and math.isfinite(losses[0])
    # master weights stay float32 and the step moved them
    assert all(p.dtype == torch.float32 for p in model.parameters())
    changed = [
        not torch.equal(a, b) for a, b in zip(before.parameters(), model.parameters(), strict=True)
    ]
    assert any(changed)
    assert not torch.is_autocast_enabled("cpu")


def test_fine_tune_refuses_bad_runtime_before_training():
    model = tiny_model("bert")
    with pytest.raises(ValueError, match="precision: unknown value 'fp64'"):
        fine_tune(model, lambda _e: [_labelled()], precision="fp64", progress=False, log_fn=None)
    with pytest.raises(ValueError, match="device: unknown spec 'gpu'"):
        fine_tune(model, lambda _e: [_labelled()], device="gpu", progress=False, log_fn=None)


# ---- inference ----
@pytest.mark.parametrize("kind", ["classifier", "hydra"])
def test_logits_fp32_identical_and_bf16_close(kind):
    from hydra_ops.hydra.merge import merge_members

    if kind == "classifier":
        model = tiny_model("bert")
    else:
        model = merge_members(make_members("bert", member_plans(2), fine_tuned=True)).eval()
    batches = [tiny_inputs("bert", 5, seed=s) for s in (1, 2)]
    plain = logits(model, batches)
    fp32 = logits(model, batches, device="cpu", precision="fp32")
    bf16 = logits(model, batches, device="cpu", precision="bf16")
    assert torch.equal(plain, fp32)
    assert bf16.dtype == torch.float32 and bf16.device.type == "cpu"
    assert bf16.shape == plain.shape and not torch.equal(bf16, plain)
    torch.testing.assert_close(bf16, plain, atol=5e-2, rtol=5e-2)
    assert not model.training


def test_logits_of_labelled_batches_fp32_identical_and_bf16_close():
    model = tiny_model("bert")
    batches = [_labelled(1), _labelled(2)]
    plain = logits(model, batches)
    fp32 = logits(model, batches, device="cpu", precision="fp32")
    bf16 = logits(model, batches, device="cpu", precision="bf16")
    assert torch.equal(plain, fp32)
    assert plain.shape == (12, NUM_CLASSES)
    torch.testing.assert_close(bf16, plain, atol=5e-2, rtol=5e-2)


def test_logits_refuses_bad_runtime():
    model = tiny_model("bert")
    with pytest.raises(ValueError, match="device: unknown spec"):
        logits(model, [tiny_inputs("bert", 2)], device="tpu")
    with pytest.raises(ValueError, match="precision: unknown value"):
        logits(model, [tiny_inputs("bert", 2)], precision="int8")


@needs_no_cuda
def test_pinning_batches_needs_cuda():
    from hydra_ops.data import split_batches
    from hydra_ops.data.store import Split

    images = torch.zeros(2, 8, 8, dtype=torch.uint8).numpy()
    split = Split("val", "image", ["a", "b"], torch.tensor([0, 1]).numpy(), images=images)
    with pytest.raises(ValueError, match="pin_memory: needs CUDA"):
        split_batches(split, 2, pin_memory=True)


# ---- params ----
def test_params_runtime_defaults_and_accepted_values():
    cfg = resolve_params("default")
    assert (cfg.runtime.device, cfg.runtime.precision) == ("auto", "auto")
    for device in ("auto", "cpu", "cuda", "cuda:0", "cuda:12"):
        for precision in ("auto", "fp32", "bf16", "fp16"):
            raw = {"runtime": {"device": device, "precision": precision}}
            assert validate_params(raw).runtime.device == device


@pytest.mark.parametrize(
    ("runtime", "key", "words"),
    [
        ({"device": "gpu"}, "runtime.device", "allowed: auto, cpu, cuda, cuda:N"),
        ({"device": "cuda:"}, "runtime.device", "unknown device"),
        ({"device": "cuda:x"}, "runtime.device", "unknown device"),
        ({"device": "cuda:0 "}, "runtime.device", "unknown device"),
        ({"precision": "fp8"}, "runtime.precision", "'auto', 'fp32', 'bf16' or 'fp16'"),
        ({"precision": "half"}, "runtime.precision", "'fp16'"),
        ({"bogus": 1}, "runtime.bogus", "unknown key"),
    ],
)
def test_params_refuse_bad_runtime(runtime, key, words):
    with pytest.raises(ConfigError) as err:
        validate_params({"runtime": runtime})
    line = str(err.value)
    assert f"params.yaml: {key}:" in line and words in line


# ---- stages ----
@pytest.mark.parametrize(
    ("precision", "member_finetune"), [("bf16", False), ("fp16", True)], ids=["bf16", "fp16"]
)
def test_model_stages_run_in_reduced_precision(tmp_path, caplog, precision, member_finetune):
    """A tiny digits project in bf16 / fp16 on the CPU, stage by stage up to evaluate:
    finetune_base and finetune_baselines, baseline_logits, score_heads (taylor), member and
    control fine-tunes (fp16: with its grad scaler), calibrate and evaluate run and log their
    runtime."""
    from tasks import (
        baseline_logits,
        calibrate,
        evaluate,
        finetune_base,
        finetune_baselines,
        finetune_members,
        merge,
        prepare_data,
        score_heads,
        select_members,
    )
    from tasks import compile as compile_stage
    from tasks.layout import HYDRA

    sets = {
        "data.name": "digits",
        "data.max_per_split": 48,
        "data.far_ood_size": 32,
        "scoring.method": "taylor",
        "members.finetune.enabled": member_finetune,
        "members.num_members": 2,
        "runtime.device": "cpu",
        "runtime.precision": precision,
    }
    cfg = resolve_params("quick", sets=sets)
    caplog.set_level(logging.INFO, logger="hydra_ens")
    prepare_data.run(cfg, tmp_path)
    base = finetune_base.run(cfg, tmp_path)
    assert math.isfinite(base["train"]["epoch_losses"][0])
    assert 0.0 <= base["val_accuracy"] <= 1.0
    finetune_baselines.run(cfg, tmp_path)
    baseline_logits.run(cfg, tmp_path)
    score_heads.run(cfg, tmp_path)
    select_members.run(cfg, tmp_path)
    finetune_members.run(cfg, tmp_path)
    merge.run(cfg, tmp_path)
    result = calibrate.run(cfg, tmp_path)
    assert math.isfinite(result["temperature"]) and result["temperature"] > 0
    assert result["ood_thresholds"]["uncertain"] <= result["ood_thresholds"]["likely_ood"]
    assert (tmp_path / HYDRA / "hydra.json").is_file()
    compile_stage.run(cfg, tmp_path)  # quick: the eager backend
    ev = evaluate.run(cfg, tmp_path)
    expected = {"hydra", "single", "naive_pruned", "deep_ensemble", "mc_dropout"}
    assert set(ev["models"]) == expected | ({"control"} if member_finetune else set())
    for entry in ev["models"].values():
        assert 0.0 <= entry["calibrated"]["id_test"]["accuracy"] <= 1.0
        assert math.isfinite(entry["calibrated"]["id_test"]["nll"])
        assert entry["latency_ms"] > 0
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("runtime: ")]
    # finetune_base, finetune_baselines, baseline_logits, score_heads, (finetune_members,)
    # calibrate, evaluate
    assert len(lines) == 6 + member_finetune
    assert all(line.startswith("runtime: device cpu (") for line in lines)
    assert all(f", precision {precision} (as configured" in line for line in lines)
