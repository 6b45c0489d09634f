"""Compile backends: each CPU backend round-trips through save/load and matches eager."""

import dataclasses
import itertools
import json
import logging
import os
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from tiny_models import FAMILIES, NUM_CLASSES, make_members, member_plans, positional, tiny_inputs
from torch import nn

from hydra_ops import compile as hc
from hydra_ops.compile import auto as hc_auto
from hydra_ops.compile import build as hc_build
from hydra_ops.heads.plans import HeadPlan
from hydra_ops.hydra.grouped import ATTENTION_IMPLEMENTATIONS, MemberGemmAttention, MemberGemmMLP
from hydra_ops.hydra.merge import merge_members
from hydra_ops.hydra.serialization import load_hydra, save_hydra
from hydra_ops.margin import clearly_faster
from hydra_ops.models.inference import logits

ATOL = 1e-4


# One layer keeps inductor's compile short on 2 cores; member head counts differ (1, 2, 3).
PLANS = [HeadPlan(((0,),)), HeadPlan(((1, 2),)), HeadPlan(((0, 2, 3),))]


@pytest.fixture(scope="module")
def hydra():
    members = make_members("bert", PLANS, fine_tuned=True, num_hidden_layers=1)
    return merge_members(members, mode="stack")


@pytest.fixture(scope="module")
def export_dir(hydra, tmp_path_factory):
    out = tmp_path_factory.mktemp("export")
    hc.compile_model(hydra, "export", tiny_inputs("bert", 3, seed=7), out, max_batch=8)
    return out


def heldout():
    return [tiny_inputs("bert", 3, seed=11), tiny_inputs("bert", 5, seed=12)]


@pytest.mark.parametrize("backend", hc.CPU_BACKENDS)
def test_cpu_backend_round_trips_and_matches_eager(hydra, backend, tmp_path):
    example = tiny_inputs("bert", 4, seed=3)
    artifact = hc.compile_model(hydra, backend, example, tmp_path, max_batch=8)
    assert artifact.backend == backend
    meta = json.loads((tmp_path / hc.METADATA_FILE).read_text())
    assert meta["backend"] == backend and meta["requested_backend"] == backend
    assert meta["input_names"] == ["input_ids", "attention_mask"]
    assert meta["library_versions"]["torch"] == torch.__version__
    assert meta["device"] == "cpu" and meta["dtype"] == "float32" and meta["precision"] == "fp32"
    assert meta["device_name"] and meta["requested_precision"] == "fp32"
    assert "precision_reason" not in meta  # an explicit precision needs no reason
    assert dict(artifact)["artifact_sha256"] == meta["artifact_sha256"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temp files left"

    loaded = hc.load_compiled(tmp_path)
    for batch in heldout():
        with torch.no_grad():
            eager = hydra(*positional(batch))
        assert (loaded(batch) - eager).abs().max().item() <= ATOL
        assert (loaded(*positional(batch)) - eager).abs().max().item() <= ATOL
    report = hc.verify_compiled(loaded, hydra, heldout(), out_path=tmp_path / "check.json")
    assert report["passed"] and report["argmax_agreement"] == 1.0
    assert report["num_examples"] == 8
    assert json.loads((tmp_path / "check.json").read_text())["passed"] is True


def test_export_program_loads_without_project_classes(hydra, export_dir, tmp_path):
    batch = tiny_inputs("bert", 6, seed=8)
    with torch.no_grad():
        expected = hydra(*positional(batch))
    torch.save(
        {"ids": batch["input_ids"], "mask": batch["attention_mask"], "out": expected},
        tmp_path / "io.pt",
    )
    script = (
        "import sys\n"
        "sys.modules['hydra_ops'] = None  # any import of the project now fails\n"
        "import torch\n"
        f"io = torch.load({str(tmp_path / 'io.pt')!r}, weights_only=True)\n"
        f"module = torch.export.load({str(export_dir / 'program.pt2')!r}).module()\n"
        "out = module(io['ids'], io['mask'])\n"
        "print((out - io['out']).abs().max().item())\n"
    )
    env = {**os.environ, "PYTHONPATH": ""}
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.strip().splitlines()[-1]) <= ATOL


def test_auto_without_cuda_keeps_the_first_unless_another_is_clearly_faster(
    hydra, tmp_path, monkeypatch
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert hc.tensorrt_unavailable_reason() == "no CUDA device"
    # two quick backends (inductor's compile is slow on 2 cores) and one that cannot build
    monkeypatch.setattr(hc.compiler, "CPU_BACKENDS", ("no_such_backend", "export", "onnxruntime"))
    artifact = hc.compile_model(
        hydra, "auto", tiny_inputs("bert", 4), tmp_path, max_batch=8, auto_repeats=3
    )
    trials = artifact["auto_selection"]["trials"]
    assert set(trials) == {"no_such_backend/fp32", "export/fp32", "onnxruntime/fp32"}
    ran = {k: t for k, t in trials.items() if "median_ms" in t}
    assert set(ran) == {"export/fp32", "onnxruntime/fp32"}
    # the first in the order given ships unless a later one is clearly faster (the margin rule),
    # not the lowest median: two runs whose timings differ by noise ship the same backend
    rounds = {k: t["rounds_ms"] for k, t in ran.items()}
    later_wins = clearly_faster(rounds["onnxruntime/fp32"], rounds["export/fp32"])
    assert f"{artifact.backend}/fp32" == ("onnxruntime/fp32" if later_wins else "export/fp32")
    assert all(t["ok"] and t["max_abs_diff_member_probs"] <= ATOL for t in ran.values())
    assert not trials["no_such_backend/fp32"]["ok"] and trials["no_such_backend/fp32"]["why_not"]
    assert artifact["precision"] == "fp32" and artifact["dtype"] == "float32"
    assert "no_such_backend" in artifact["failed_backends"][0]
    assert artifact["requested_backend"] == "auto"
    assert "no CUDA device" in artifact["fallback_reason"]
    files = {p.name for p in tmp_path.iterdir()}
    assert files == {hc.METADATA_FILE, hc.get_backend(artifact.backend).artifact_file}  # the winner
    assert hc.verify_compiled(hc.load_compiled(tmp_path), hydra, heldout())["passed"]


def test_auto_never_keeps_a_backend_that_disagrees_with_eager(hydra, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(hc.compiler, "CPU_BACKENDS", ("export",))
    build_runner = hc_build.load_runner

    def wrong(backend, directory, device):
        runner = build_runner(backend, directory, device)
        return lambda *tensors: runner(*tensors) + torch.arange(3.0)  # shifts the softmax

    monkeypatch.setattr(hc_build, "load_runner", wrong)
    with pytest.raises(hc.CompileError, match=r"export/fp32: max \|dp\|"):
        hc.compile_model(hydra, "auto", tiny_inputs("bert", 2), tmp_path, max_batch=8)


def test_tensorrt_request_falls_back_with_one_line(hydra, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(hc.compiler, "CPU_BACKENDS", ("export",))
    with caplog.at_level(logging.WARNING, logger="hydra_ops.compile"):
        artifact = hc.compile_model(hydra, "tensorrt", tiny_inputs("bert", 2), tmp_path)
    lines = [r.getMessage() for r in caplog.records if r.name == "hydra_ops.compile"]
    assert len(lines) == 1 and "tensorrt unavailable" in lines[0] and "\n" not in lines[0]
    assert artifact.backend == "export" and artifact["requested_backend"] == "tensorrt"
    assert "torch_tensorrt" not in sys.modules or torch.cuda.is_available()


def test_bad_arguments_and_tampered_artifact(hydra, export_dir, tmp_path):
    with pytest.raises(ValueError, match="backend='tvm' is unknown; registered: auto, tensorrt"):
        hc.compile_model(hydra, "tvm", tiny_inputs("bert", 2), tmp_path)
    with pytest.raises(ValueError, match="max_batch must be"):
        hc.compile_model(hydra, "export", tiny_inputs("bert", 4), tmp_path, max_batch=2)
    with pytest.raises(ValueError, match="auto_repeats must be"):
        hc.compile_model(hydra, "auto", tiny_inputs("bert", 2), tmp_path, auto_repeats=0)
    with pytest.raises(ValueError, match="input_ids"):
        hc.compile_model(hydra, "export", {"labels": torch.zeros(2)}, tmp_path)
    with pytest.raises(ValueError, match=r"no compiled\.json"):
        hc.load_compiled(tmp_path)
    for name in (hc.METADATA_FILE, "program.pt2"):
        shutil.copy(export_dir / name, tmp_path / name)
    assert hc.load_compiled(tmp_path).backend == "export"
    with open(tmp_path / "program.pt2", "ab") as handle:
        handle.write(b"x")
    with pytest.raises(ValueError, match="SHA-256"):
        hc.load_compiled(tmp_path)


def test_backend_registry_lists_the_backends_and_refuses_unknown_names(tmp_path):
    assert list(hc.BACKEND_REGISTRY) == ["tensorrt", "inductor", "export", "onnxruntime"]
    assert ("auto", *hc.BACKEND_REGISTRY.names()) == hc.backend_names()
    assert set(hc.available_backends()) == set(hc.BACKEND_REGISTRY)
    allowed = r"backend='tvm' is unknown; registered: tensorrt, inductor, export, onnxruntime$"
    with pytest.raises(ValueError, match=allowed):
        hc.get_backend("tvm")
    with pytest.raises(ValueError, match=allowed):
        hc.backends.load_runner("tvm", tmp_path, torch.device("cpu"))
    with pytest.raises(ValueError, match="'export' is already registered"):
        hc.register_backend(hc.get_backend("export"))
    with pytest.raises(ValueError, match="'auto' is reserved"):
        hc.register_backend(dataclasses.replace(hc.get_backend("export"), name="auto"))


def test_a_backend_registered_after_import_is_taken_by_compile_model(hydra, tmp_path):
    """compile_model used to check a copy of the registry made at import: a backend added later
    with the public register_backend was refused as unknown."""
    late = dataclasses.replace(hc.get_backend("export"), name="export_late")
    hc.register_backend(late)
    try:
        assert "export_late" in hc.backend_names()
        artifact = hc.compile_model(hydra, "export_late", tiny_inputs("bert", 2), tmp_path)
        assert artifact.backend == "export_late"
        assert hc.load_compiled(tmp_path).backend == "export_late"
    finally:
        hc.BACKEND_REGISTRY.unregister("export_late")
    assert "export_late" not in hc.backend_names()


def test_verify_flags_a_wrong_artifact(hydra):
    wrong = lambda *x: 2.0 * hydra(*x)  # noqa: E731 - sharper softmax, same argmax
    report = hc.verify_compiled(wrong, hydra, heldout())
    assert not report["passed"] and report["max_abs_diff_probs"] > ATOL
    with pytest.raises(ValueError, match="min_agreement"):
        hc.verify_compiled(wrong, hydra, heldout(), min_agreement=2.0)


def test_verify_by_split_checks_every_split_and_length_on_its_own(hydra, export_dir):
    """Held-out batches per split at two sequence lengths: the overall record and each split's;
    an artifact wrong on short inputs only fails that split (and the whole check)."""
    short = {k: v[:, :4] for k, v in tiny_inputs("bert", 4, seed=13).items()}
    groups = {"test": heldout(), "far_ood": [short]}
    report = hc.verify_compiled_by_split(hc.load_compiled(export_dir), hydra, groups)
    assert report["passed"] and report["num_examples"] == 3 + 5 + 4
    assert report["seq_lengths"] == [4, 9]
    assert {s: r["num_examples"] for s, r in report["splits"].items()} == {"test": 8, "far_ood": 4}
    assert report["splits"]["far_ood"]["seq_lengths"] == [4]

    def wrong_when_short(*x):
        return -hydra(*x) if x[0].shape[1] == 4 else hydra(*x)

    report = hc.verify_compiled_by_split(wrong_when_short, hydra, groups)
    assert report["splits"]["test"]["passed"] and not report["splits"]["far_ood"]["passed"]
    assert not report["passed"]
    with pytest.raises(ValueError, match="at least one batch"):
        hc.verify_compiled_by_split(wrong_when_short, hydra, {"test": []})


def test_verify_by_split_against_a_reference_computed_once(hydra, export_dir):
    """Checking against :func:`eager_outputs` gives the record checking against the model gives,
    without running the model; a reference of other examples is refused."""
    short = {k: v[:, :4] for k, v in tiny_inputs("bert", 4, seed=13).items()}
    groups = {"test": heldout(), "far_ood": [short]}
    reference = hc.eager_outputs(hydra, groups)
    assert {k: v.shape[0] for k, v in reference.items()} == {"test": 8, "far_ood": 4}
    assert reference["test"].shape[1:] == (len(PLANS), NUM_CLASSES)
    artifact = hc.load_compiled(export_dir)
    direct = hc.verify_compiled_by_split(artifact, hydra, groups)

    class NotRun(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = hydra

        def forward(self, *x):
            raise AssertionError("the eager model ran again")

    cached = hc.verify_compiled_by_split(artifact, NotRun(), groups, reference=reference)
    assert cached == direct
    wrong = {**reference, "far_ood": reference["far_ood"][:2]}
    with pytest.raises(ValueError, match="reference shape"):
        hc.verify_compiled_by_split(artifact, hydra, groups, reference=wrong)


def test_missing_mask_is_filled_exactly(hydra):
    ids = tiny_inputs("bert", 3, padded=False)["input_ids"]
    names = ["input_ids", "attention_mask", "token_type_ids"]
    ids_, mask, types = hc.arrange_inputs({"input_ids": ids}, names)
    assert mask.eq(1).all() and types.eq(0).all() and ids_ is ids
    with torch.no_grad():
        assert torch.allclose(hydra(ids, mask, types), hydra(ids), atol=1e-6)


class _Attn(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


def test_attention_fallback_report_finds_pytorch_partitions():
    outer = nn.Module()
    outer.add_module("_run_on_acc_0", torch.fx.symbolic_trace(_Attn()))
    assert hc.attention_fallback_report(outer) == []
    outer.add_module("_run_on_gpu_1", torch.fx.symbolic_trace(_Attn()))
    report = hc.attention_fallback_report(outer)
    assert len(report) == 1 and report[0].startswith("_run_on_gpu_1")


# ----- the member_gemm implementation ----------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_member_gemm_equals_other_implementations(family, tmp_path):
    members = make_members(family, member_plans(3, unequal=True), fine_tuned=True)
    batch = tiny_inputs(family, 5)
    outs = {}
    for name in sorted(ATTENTION_IMPLEMENTATIONS):
        with torch.no_grad():
            outs[name] = merge_members(members, attention=name)(*positional(batch))
    for name, out in outs.items():
        assert (out - outs["member_gemm"]).abs().max().item() <= 1e-5, name
    hydra = merge_members(members, attention="member_gemm")
    assert isinstance(hydra.blocks[0].attention, MemberGemmAttention)
    assert hydra.num_parameters() == merge_members(members).num_parameters()
    loaded = load_hydra(save_hydra(hydra, tmp_path / "h"))
    switched = merge_members(members).set_attention_implementation("member_gemm")
    gemm_mlp = merge_members(members, attention="member_gemm")
    for block in gemm_mlp.blocks:
        block.mlp = MemberGemmMLP.from_grouped(block.mlp)
    with torch.no_grad():
        for other in (loaded, switched, gemm_mlp):
            assert (other(*positional(batch)) - outs["member_gemm"]).abs().max().item() <= 1e-5


# ----- precision ------------------------------------------------------------------------------
def _no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_bf16_candidate_is_built_and_verified(hydra, tmp_path, monkeypatch):
    """A bf16 export artifact: casts inside, fp32 logits out, recorded as bf16 on cpu, and the
    bf16 merged model matches its bf16 members run one by one."""
    _no_cuda(monkeypatch)
    members = make_members("bert", PLANS, fine_tuned=True, num_hidden_layers=1)
    batch = tiny_inputs("bert", 4, seed=5)
    with torch.no_grad():
        merged = merge_members(members, mode="stack").to(torch.bfloat16)(*positional(batch))
    # each member cast to bf16 and run on its own (logits() returns its bf16 output as fp32)
    separate = torch.stack([logits(m.to(torch.bfloat16), [batch]) for m in members], 1)
    assert merged.dtype == torch.bfloat16
    diff = (merged.float().softmax(-1) - separate.float().softmax(-1)).abs().max().item()
    assert diff <= hc.DEFAULT_TOLERANCES["bf16"]

    artifact = hc.compile_model(
        hydra, "export", tiny_inputs("bert", 4), tmp_path, max_batch=8, precision="bf16"
    )
    assert artifact.backend == "export" and artifact["precision"] == "bf16"
    meta = json.loads((tmp_path / hc.METADATA_FILE).read_text())
    assert meta["precision"] == "bf16" and meta["dtype"] == "bfloat16"
    assert meta["device"] == "cpu" and meta["device_name"]
    assert {p.name for p in tmp_path.iterdir()} == {hc.METADATA_FILE, "program.pt2"}
    out = hc.load_compiled(tmp_path)(tiny_inputs("bert", 3, seed=11))
    assert out.dtype == torch.float32
    report = hc.verify_compiled(hc.load_compiled(tmp_path), hydra, heldout())
    assert report["tolerance"] == hc.DEFAULT_TOLERANCES["bf16"]  # the artifact's precision
    assert report["passed"] and 0 < report["max_abs_diff_probs"] <= 2e-2
    assert next(hydra.parameters()).dtype == torch.float32  # the source is left as it was


def test_auto_precision_never_keeps_a_precision_beyond_tolerance(
    hydra, tmp_path, monkeypatch, caplog
):
    _no_cuda(monkeypatch)
    monkeypatch.setattr(hc.compiler, "CPU_BACKENDS", ("export",))
    monkeypatch.setattr(hc.compiler, "fast_bf16_unavailable_reason", lambda device: None)
    # bf16 "measures" faster, so only its check can keep it out
    monkeypatch.setattr(hc_auto, "latency_rounds_ms", _ordered_ms(2.0, 1.0))
    tight = {"fp32": 1e-4, "bf16": 1e-9}  # no bf16 output is that close to fp32
    with caplog.at_level(logging.INFO, logger="hydra_ops.compile"):
        artifact = hc.compile_model(
            hydra,
            "auto",
            tiny_inputs("bert", 4),
            tmp_path,
            max_batch=8,
            auto_repeats=1,
            precision="auto",
            heldout_inputs=heldout(),
            tolerance=tight,
        )
    lines = [r.getMessage() for r in caplog.records if "auto precision" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(
        "compile: auto precision keeps fp32: bf16 failed"
    )
    assert artifact["precision_reason"].startswith("bf16 failed its check (max |dp|")
    assert "fp16 skipped (fp16 runs only on CUDA)" in artifact["precision_reason"]
    trials = artifact["auto_selection"]["trials"]
    assert set(trials) == {"export/fp32", "export/bf16"}
    assert not trials["export/bf16"]["ok"] and "max |dp|" in trials["export/bf16"]["why_not"]
    assert trials["export/bf16"]["max_abs_diff_probs"] > 1e-9
    assert trials["export/fp32"]["ok"] and trials["export/fp32"]["argmax_agreement"] == 1.0
    assert artifact["precision"] == "fp32" and artifact["requested_precision"] == "auto"
    assert artifact["auto_selection"]["heldout_examples"] == 8
    assert artifact["auto_selection"]["skipped_precisions"] == {"fp16": "fp16 runs only on CUDA"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "staging left"
    build_runner = hc_build.load_runner  # nothing agrees: auto raises, naming every trial
    monkeypatch.setattr(
        hc_build,
        "load_runner",
        lambda *a: lambda *t: build_runner(*a)(*t) + torch.arange(3.0),
    )
    with pytest.raises(hc.CompileError, match=r"export/fp32: max \|dp\|.*export/bf16: max"):
        hc.compile_model(
            hydra, "auto", tiny_inputs("bert", 2), tmp_path / "b", precision="auto", auto_repeats=1
        )


def test_auto_precision_without_fast_bf16_keeps_fp32_and_says_why(
    hydra, tmp_path, monkeypatch, caplog
):
    _no_cuda(monkeypatch)
    monkeypatch.setattr(hc.compiler, "CPU_BACKENDS", ("export", "onnxruntime"))
    reason = "CPU has no fast bf16 (test)"
    monkeypatch.setattr(hc.compiler, "fast_bf16_unavailable_reason", lambda device: reason)
    with caplog.at_level(logging.INFO, logger="hydra_ops.compile"):
        artifact = hc.compile_model(
            hydra, "auto", tiny_inputs("bert", 2), tmp_path, auto_repeats=1, precision="auto"
        )
    lines = [r.getMessage() for r in caplog.records if "auto precision" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0] == f"compile: auto precision keeps fp32: {artifact['precision_reason']}"
    assert artifact["precision_reason"].startswith(f"bf16 skipped ({reason})")
    assert artifact["precision"] == "fp32"
    selection = artifact["auto_selection"]
    assert selection["skipped_precisions"]["bf16"] == reason
    assert all(t["precision"] == "fp32" for t in selection["trials"].values())
    meta = json.loads((tmp_path / hc.METADATA_FILE).read_text())
    assert meta["precision_reason"] == artifact["precision_reason"]
    caplog.clear()  # one backend, one candidate: nothing measured, the same one line
    with caplog.at_level(logging.INFO, logger="hydra_ops.compile"):
        one = hc.compile_model(
            hydra, "export", tiny_inputs("bert", 2), tmp_path / "one", precision="auto"
        )
    lines = [r.getMessage() for r in caplog.records if "auto precision" in r.getMessage()]
    assert len(lines) == 1 and reason in lines[0] and "auto_selection" not in one
    assert one["precision"] == "fp32" and one["precision_reason"].startswith("bf16 skipped")


def _ordered_ms(*times):
    """A ``latency_rounds_ms`` stand-in: the real warm-up output and ``times`` in call order,
    repeated (``auto`` times its candidates in order: each backend's fp32, then its bf16)."""
    queue = itertools.cycle(times)

    def fake(call, repeats, device=None):
        with torch.no_grad():
            return call(), [next(queue)] * repeats

    return fake


@pytest.mark.parametrize(
    ("trials", "skipped", "chosen", "reason"),
    [
        ({}, {"bf16": "no fast bf16", "fp16": "CUDA only"}, "fp32", "bf16 skipped (no fast bf16)"),
        (
            {
                "a/fp32": {"precision": "fp32", "ok": True},
                "a/bf16": {"precision": "bf16", "ok": True},
            },
            {"fp16": "CUDA only"},
            "fp32",
            "bf16 agreed but was slower; fp16 skipped (CUDA only)",
        ),
        (
            {"onnxruntime/bf16": {"precision": "bf16", "ok": False, "why_not": "no bf16\nkernels"}},
            {},
            "fp32",
            "bf16 could not be built (no bf16 kernels); fp16 not tried",
        ),
        ({}, {}, "bf16", "bf16 is the fastest candidate that agrees with the fp32 eager model"),
    ],
)
def test_precision_reason_names_why_each_other_precision_lost(trials, skipped, chosen, reason):
    got = hc.precision_reason(chosen, trials, skipped)
    assert got.startswith(reason) and "\n" not in got


def test_precision_arguments_and_backend_limits(hydra, tmp_path, monkeypatch):
    _no_cuda(monkeypatch)
    with pytest.raises(ValueError, match=r"precision must be one of \['fp32', 'bf16', 'fp16'"):
        hc.compile_model(hydra, "export", tiny_inputs("bert", 2), tmp_path, precision="int8")
    with pytest.raises(hc.CompileError, match="fp16 runs only on CUDA"):
        hc.compile_model(hydra, "export", tiny_inputs("bert", 2), tmp_path, precision="fp16")
    with pytest.raises(hc.CompileError, match="no bf16 kernels"):
        hc.compile_model(hydra, "onnxruntime", tiny_inputs("bert", 2), tmp_path, precision="bf16")
    with pytest.raises(ValueError, match="tolerance keys"):
        hc.compile_model(hydra, "export", tiny_inputs("bert", 2), tmp_path, tolerance={"x": 1})
    assert hc.precision_name(torch.bfloat16) == "bf16" and hc.precision_name("float32") == "fp32"
    assert hc.default_tolerance("bf16") == 2e-2 and hc.default_tolerance(torch.float32) == 1e-4


def test_onnxruntime_is_a_bf16_candidate_only_with_its_cuda_provider(monkeypatch):
    import onnxruntime as ort

    from hydra_ops.compile.backends import get_backend

    reason = get_backend("onnxruntime").precision_reason
    cuda = torch.device("cuda")
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert "no CUDA execution provider" in reason("bf16", cuda)
    assert "no bf16 kernels" in reason("bf16", torch.device("cpu"))
    assert reason("fp16", cuda) is None and reason("fp32", torch.device("cpu")) is None
    gpu_build = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: gpu_build)
    assert reason("bf16", cuda) is None
    assert "no bf16 kernels" in reason("bf16", torch.device("cpu"))


def test_fast_bf16_check_is_the_runtimes(tmp_path, monkeypatch):
    """compile skips bf16 for the reason every stage's precision check gives (one check)."""
    from hydra_ops.compile import precision
    from hydra_ops.models import runtime

    info = tmp_path / "cpuinfo"
    monkeypatch.setattr(runtime, "_CPUINFO", info)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n")
    assert "neither amx_bf16 nor avx512_bf16" in precision.fast_bf16_unavailable_reason("cpu")
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    assert precision.fast_bf16_unavailable_reason("cpu") is None


@pytest.mark.parametrize("backend", ["export", "onnxruntime"])
def test_an_artifact_names_no_source_file_so_two_checkouts_build_the_same_bytes(
    hydra, tmp_path, backend
):
    import zipfile

    artifact = hc.compile_model(hydra, backend, tiny_inputs("bert", 4), tmp_path, max_batch=8)
    path = tmp_path / artifact["artifact"]
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            blob = b"".join(archive.read(name) for name in archive.namelist())
    else:
        blob = path.read_bytes()
    assert b"hydra_ops/" not in blob and b"stack_trace" not in blob
    assert hc.load_compiled(tmp_path)(tiny_inputs("bert", 3, seed=4)).shape[0] == 3
