"""tasks.runtime.preflight: what ``run`` refuses before anything is written (a CUDA device this
machine lacks, a compile precision the compile stage would refuse, a ``--set`` value that is not
YAML, an unknown allocator)."""

from __future__ import annotations

import pytest
import torch
from test_cli import _said
from typer.testing import CliRunner

from flows import dvcops
from flows.cli import app
from tasks.params import ConfigError, resolve_params, write_params
from tasks.runtime.preflight import check_compile_here, check_device_here


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal needs a machine without CUDA")
def test_run_refuses_a_cuda_device_this_machine_lacks_before_anything(tmp_path):
    """``runtime.device: cuda`` without CUDA: one line naming the key, exit 2, before params.yaml is
    rewritten or any stage (or Prefect) starts; ``auto`` and ``cpu`` are never refused."""
    params = tmp_path / "params.yaml"
    write_params(resolve_params("quick", {}), params)
    before = params.read_bytes()
    runner = CliRunner()
    for args in (
        ["--set", "runtime.device=cuda"],
        ["--profile", "quick", "--set", "runtime.device=cuda:1"],
    ):
        res = runner.invoke(app, ["run", "-C", str(tmp_path), *args])
        said = " ".join(res.output.split())
        assert res.exit_code == 2, res.output
        assert "error: params: runtime.device: 'cuda" in said and "no CUDA device here" in said
        assert params.read_bytes() == before
    write_params(resolve_params("quick", {"runtime": {"device": "cuda"}}), params)
    res = runner.invoke(app, ["run", "-C", str(tmp_path)])  # a hand edit is checked too
    assert res.exit_code == 2 and "runtime.device" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]
    for device in ("auto", "cpu"):
        check_device_here(resolve_params("quick", {"runtime": {"device": device}}))


def test_run_refuses_a_set_value_that_is_not_yaml_in_one_line(tmp_path):
    """``--set 'data.classes=[a'``: one line naming the item and YAML's complaint, exit 2, no
    traceback, params.yaml untouched (the bracket is shown, not taken for console markup)."""
    params = tmp_path / "params.yaml"
    write_params(resolve_params("quick", {}), params)
    before = params.read_bytes()
    runner = CliRunner()
    for args in (["--set", "data.classes=[a"], ["--profile", "quick", "--set", "seed={x"]):
        res = runner.invoke(app, ["run", "-C", str(tmp_path), *args])
        assert res.exit_code == 2, res.output
        assert len(res.output.strip().splitlines()) == 1, res.output
        assert "Traceback" not in res.output and isinstance(res.exception, SystemExit)
        assert params.read_bytes() == before
    assert _said(res).startswith("error: --set 'seed={x': value is not valid YAML (while parsing")
    res = runner.invoke(app, ["run", "-C", str(tmp_path), "--set", "data.classes=[a"])
    assert _said(res) == (
        "error: --set 'data.classes=[a': value is not valid YAML (while parsing a flow sequence: "
        "expected ',' or ']', but got '<stream end>')"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal needs a machine without CUDA")
def test_run_refuses_a_compile_precision_the_compile_stage_would_refuse_here(tmp_path):
    """``compile.precision: fp16`` (needs CUDA) with a compiling backend on a CPU-only machine:
    one line naming ``compile.precision``, exit 2, before params.yaml is rewritten (not a
    CompileError after every model is trained). ``eager`` and ``auto`` precision are never
    refused; onnxruntime has no bf16 on the CPU, the other backends do."""
    params = tmp_path / "params.yaml"
    write_params(resolve_params("quick", {}), params)
    before = params.read_bytes()
    runner = CliRunner()
    for backend in ("auto", "inductor"):
        args = ["--set", f"compile.backend={backend}", "--set", "compile.precision=fp16"]
        res = runner.invoke(app, ["run", "-C", str(tmp_path), *args])
        assert res.exit_code == 2, res.output
        assert len(res.output.strip().splitlines()) == 1, res.output
        assert _said(res).startswith("error: params: compile.precision: precision 'fp16' cannot")
        assert f"compile.backend {backend!r}" in _said(res)
        assert params.read_bytes() == before
    hand_edit = {"compile": {"backend": "auto", "precision": "fp16"}}
    write_params(resolve_params("quick", hand_edit), params)
    res = runner.invoke(app, ["run", "-C", str(tmp_path)])  # a hand edit is checked too
    assert res.exit_code == 2 and "compile.precision" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]

    def refused(backend: str, precision: str) -> bool:
        cfg = resolve_params("quick", {"compile": {"backend": backend, "precision": precision}})
        try:
            check_compile_here(cfg)
        except ConfigError as err:
            assert "compile.precision" in str(err)
            return True
        return False

    assert refused("onnxruntime", "bf16") and refused("export", "fp16")
    assert refused("tensorrt", "fp16")
    for backend, precision in (
        ("eager", "fp16"),
        ("auto", "auto"),
        ("auto", "fp32"),
        ("auto", "bf16"),
        ("inductor", "bf16"),
        ("onnxruntime", "fp32"),
    ):
        assert not refused(backend, precision), (backend, precision)


def test_run_refuses_an_unknown_or_missing_allocator_before_anything(tmp_path, monkeypatch):
    """``HYDRA_ENS_MALLOC`` is checked before params.yaml is rewritten; the stage processes'
    environment carries the allocator asked for."""
    from hydra_ops.perf import allocators

    params = tmp_path / "params.yaml"
    write_params(resolve_params("quick", {}), params)
    before = params.read_bytes()
    monkeypatch.setattr(allocators, "find_library", lambda name, dirs=(): None)
    runner = CliRunner()
    for value, said in (("bogus", "unknown allocator 'bogus'"), ("jemalloc", "libjemalloc2")):
        args = ["run", "-C", str(tmp_path), "--profile", "default"]
        res = runner.invoke(app, args, env={"HYDRA_ENS_MALLOC": value})
        assert res.exit_code == 2, res.output
        assert said in " ".join(res.output.split())
        assert params.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]
    monkeypatch.setenv("HYDRA_ENS_MALLOC", "system")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert "LD_PRELOAD" not in dvcops.subprocess_env()
    if allocators._has_glibc():
        monkeypatch.setenv("HYDRA_ENS_MALLOC", "auto")
        monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
        assert dvcops.subprocess_env()["GLIBC_TUNABLES"] == allocators.GLIBC_TUNED
