"""The params against the library: the runtime section (devices, precisions), the selection
penalty default; the model stages run in reduced precision on a tiny prepared dataset."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from hydra_ops.heads.selection import (
    DEFAULT_PENALTIES,
    resolve_penalty,
    select_members,
)
from tasks.params import ConfigError, resolve_params, validate_params


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: one thread avoids OpenMP spin contention on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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
    from tasks.runtime.layout import HYDRA

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


L, H = 6, 12


@pytest.fixture
def scores() -> torch.Tensor:
    return torch.rand(L, H, generator=torch.Generator().manual_seed(0))


def test_resolve_penalty_and_the_pipeline_default(scores: torch.Tensor) -> None:
    from tasks.params import validate_params

    assert DEFAULT_PENALTIES == {"overlap_penalty": 1.0, "circuits": 0.5}
    assert resolve_penalty("overlap_penalty", None) == 1.0
    assert resolve_penalty("circuits", None) == 0.5
    assert resolve_penalty("circuits", 2) == 2.0
    for bad in (-1.0, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="penalty must be a finite number"):
            resolve_penalty("circuits", bad)
    with pytest.raises(ValueError, match=r"strategy='topk'.*overlap_penalty, circuits"):
        resolve_penalty("topk", None)
    taylor = validate_params({"scoring": {"method": "taylor"}})
    assert taylor.members.overlap_penalty is None and taylor.strategy == "overlap_penalty"
    assert select_members(
        scores, 3, 4, taylor.strategy, penalty=taylor.members.overlap_penalty
    ) == select_members(scores, 3, 4, "overlap_penalty", penalty=1.0)
    assert validate_params({"members": {"overlap_penalty": 2.0}}).members.overlap_penalty == 2.0
