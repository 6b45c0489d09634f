"""The benchmark runs end to end in --smoke mode (shapes of the JSON only; no timing claims)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.report import evaluate_targets, markdown
from benchmarks.run import COLUMNS, expected_rows, shared_values
from benchmarks.workloads import MODELS, member_plans

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_benchmark_writes_every_row_and_column(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.run",
        "--smoke",
        "--models",
        "tiny_bert",
        "--batches",
        "2",
        "--threads",
        "1",
        "--backends",
        "export",
        "--out",
        str(tmp_path),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["columns"] == list(COLUMNS)
    rows = results["rows"]
    expected = expected_rows(MODELS["tiny_bert"], ["export"])
    assert [r["row"] for r in rows] == expected
    assert "hydra+export" in expected and "hydra_shared1" in expected
    for row in rows:
        assert set(row) == set(COLUMNS)
        assert row["error"] is None, (row["row"], row["error"])
        assert row["repeats"] == 1 and row["params"] > 0 and row["flops"] > 0
    by_name = {r["row"]: r for r in rows}
    assert by_name["base"]["latency_ratio"] == 1.0
    assert by_name["deep_ensemble_seq"]["params_ratio"] == 3.0
    # 1/M of the heads per member: attention FLOPs match the base, MLPs run on 3 streams
    assert 1.0 < by_name["hydra[padded_bmm]"]["flops_ratio"] < 3.0
    assert by_name["hydra_average"]["params_ratio"] < 1.1
    assert results["models"]["tiny_bert"]["default_implementation"] in {
        r["implementation"] for r in rows if r["kind"] == "hydra"
    }
    table = (tmp_path / "results.md").read_text()
    assert all(f"| {name} |" in table for name in expected)


def test_member_plans_are_disjoint_slices():
    plans = member_plans(MODELS["minilm"], 3)
    for layer in range(6):
        heads = [set(p.kept[layer]) for p in plans]
        assert all(len(h) == 4 for h in heads) and set.union(*heads) == set(range(12))
    shared = member_plans(MODELS["minilm"], 3, shared_layers=3)
    assert all(p.kept[2] == tuple(range(12)) and len(p.kept[3]) == 4 for p in shared)
    assert shared_values(6) == [0, 2, 3] and shared_values(12) == [0, 4, 6]


def test_targets_are_judged_from_rows():
    def row(name, kind, ms, flops_ratio=1.0, params_ratio=1.0, **extra):
        return {
            "case": "minilm b32 s64",
            "model": "minilm",
            "batch": 32,
            "row": name,
            "kind": kind,
            "latency_ms_median": ms,
            "latency_ratio": ms / 10.0,
            "flops_ratio": flops_ratio,
            "params_ratio": params_ratio,
            "latency_ms_p25": ms,
            "latency_ms_p75": ms,
            "error": None,
            **extra,
        }

    results = {
        "machine": {"processor": "x", "cpu_count": 2, "torch": "t", "device": "cpu"},
        "config": {"threads": 2, "dtype": "float32", "members": 3},
        "models": {"minilm": {"default_implementation": "padded_bmm", "compile_errors": {}}},
        "rows": [
            row("base", "single", 10.0),
            row("deep_ensemble_seq", "deep_ensemble", 30.0, 3.0, 3.0),
            row("hydra[padded_bmm]", "hydra", 23.0, 2.3),
            row("hydra_average", "hydra", 22.0, 2.3, 1.05),
            row("hydra+onnxruntime", "hydra_compiled", 15.0, 2.3, backend="onnxruntime"),
            row("hydra_shared3", "hydra_shared", 17.0, 1.6, shared_layers=3),
        ],
    }
    met = {t["target"].split(" (")[0]: t["met"] for t in evaluate_targets(results)}
    assert met["hydra[padded_bmm] latency ratio / FLOP ratio"] is True
    assert met["hydra / sequential Deep Ensemble latency"] is True  # 23/30 = 0.77
    assert met["best compiled"] is True  # 23/15 = 1.53
    assert met["hydra_shared3 / sequential Deep Ensemble"] is True
    assert met["hydra_shared3 / single"] is True
    results["rows"][2]["latency_ms_median"] = 29.0
    results["rows"][2]["latency_ratio"] = 2.9
    met = {t["target"].split(" (")[0]: t["met"] for t in evaluate_targets(results)}
    assert met["hydra / sequential Deep Ensemble latency"] is False
    assert "| hydra+onnxruntime |" in markdown({**results, "targets": []})


def _run(args, tmp_path, timeout=600):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_precision_axis_has_reference_row_and_ratio_columns(tmp_path):
    args = ["-m", "benchmarks.run", "--smoke", "--models", "tiny_bert", "--batches", "2"]
    args += ["--threads", "1", "--backends", "none", "--precisions", "fp32,bf16"]
    _run([*args, "--out", str(tmp_path)], tmp_path)
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["config"]["precisions"] == ["fp32", "bf16"]
    assert set(results["config"]["precision_notes"]) == {"fp32", "bf16"}
    assert results["reference"] == {
        "row": "base",
        "precision": "fp32",
        "label": "single model, fp32 eager",
    }
    rows = results["rows"]
    expected = expected_rows(MODELS["tiny_bert"], [])
    assert [(r["row"], r["precision"]) for r in rows] == [
        (name, p) for p in ("fp32", "bf16") for name in expected
    ]
    ref = rows[0]
    assert (ref["row"], ref["precision"], ref["latency_ratio"]) == ("base", "fp32", 1.0)
    base_bf16 = next(r for r in rows if r["row"] == "base" and r["precision"] == "bf16")
    assert base_bf16["same_precision_ratio"] == 1.0
    # every ratio is against the reference (base, fp32): bf16 base / fp32 base, same FLOPs
    assert base_bf16["latency_ratio"] == pytest.approx(
        base_bf16["latency_ms_median"] / ref["latency_ms_median"]
    )
    assert base_bf16["flops_ratio"] == 1.0
    for row in rows:
        assert set(row) == set(COLUMNS) and row["error"] is None, (row["row"], row["error"])
        assert row["same_precision_over_flops"] == pytest.approx(
            row["same_precision_ratio"] / row["flops_ratio"]
        )
    targets = {(t["case"], t["target"].split(" /")[0]) for t in evaluate_targets(results)}
    default = results["models"]["tiny_bert"]["default_implementation"]
    assert ("tiny_bert b2 s8 bf16", f"served hydra[{default}] bf16 eager") in targets
    assert ("tiny_bert b2 s8 fp32", f"hydra[{default}]") in targets
    table = (tmp_path / "results.md").read_text()
    assert "**base: single model, fp32 eager (reference)**" in table
    assert "latency ×single same precision" in table and "÷ FLOP ratio" in table


def test_precision_axis_rejects_fp16_on_cpu(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    args = ["-m", "benchmarks.run", "--smoke", "--precisions", "fp32,fp16", "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode != 0 and "fp16 runs only on CUDA" in done.stderr


def test_gpu_check_script_runs_on_cpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    args = ["-m", "benchmarks.gpu_check", "--device", "cpu", "--steps", "2", "--tiny"]
    args += ["--backends", "eager"]  # the script, the member fine-tunes and the merge checks
    args += ["--batch", "4", "--seq", "8", "--train-batch", "4"]  # shapes do not matter here
    args += ["--shared-layers", "0,half"]  # the paper's merge and the served default's trunk
    args += ["--implementation", "member_gemm"]  # not the merge's default, so it must be passed on
    done = _run([*args, "--out", str(out)], tmp_path)
    report = json.loads(out.read_text())
    assert report["default_implementation"] == "member_gemm"
    assert report["fine_tune"]["steps"] == 2
    variants = {v["model"]: v for v in report["variants"]}
    assert {m: v["shared_layers"] for m, v in variants.items()} == {"hydra": 0, "hydra_shared1": 1}
    # the trunk is frozen in the shared variant's fine-tune, and it is computed once: fewer FLOPs
    shared, paper = variants["hydra_shared1"], variants["hydra"]
    assert shared["fine_tune"]["trainable_parameters"] < paper["fine_tune"]["trainable_parameters"]
    assert 1.0 < shared["flops"]["ratio"] < paper["flops"]["ratio"] <= 3.0
    checks = report["equivalence"]
    assert {(c["model"], c["precision"]) for c in checks} == {
        (m, p) for m in variants for p in ("bf16", "fp32")
    }
    assert all(c["ok"] for c in checks), checks
    for row in report["rows"]:
        assert row["error"] is None and row["repeats"] == 2, row
    cells = {(r["model"], r["precision"], r["backend"]) for r in report["rows"]}
    assert cells == {(m, p, "eager") for m in ("single", *variants) for p in ("bf16", "fp32")}
    assert len(report["table"]) == 4 and all(t["hydra_over_single"] for t in report["table"])
    for t in report["table"]:
        assert t["flop_ratio"] == variants[t["model"]]["flops"]["ratio"]
    assert "hydra_shared1 | fp32 | eager" in done.stdout


def test_gpu_stages_script_runs_every_model_stage_on_cpu(tmp_path):
    out = tmp_path / "gpu_stages.json"
    args = ["-m", "benchmarks.gpu_stages", "--device", "cpu", "--tiny", "--precision", "bf16"]
    args += ["--train-precision", "fp32", "--steps", "1", "--batch", "4", "--seq", "8"]
    _run([*args, "--out", str(out)], tmp_path)
    report = json.loads(out.read_text())
    rows = {r["step"]: r for r in report["rows"]}
    assert list(rows) == [
        "finetune_base",
        "score_heads",
        "select_members+finetune_members",
        "merge",
        "calibrate",
        "baseline_logits",
        "evaluate",
        "bundle+predict (save, load onto the device)",
    ]
    assert all(r["status"] == "ok" for r in rows.values()), rows
    assert report["failed"] == [] and report["shared_layers"] == 1  # tiny: L/2 of 3 layers
    assert rows["merge"]["max_prob_diff"] <= rows["merge"]["tolerance"] == 2e-2
    plans = rows["select_members+finetune_members"]["plans"]
    assert all(plan[0] == list(range(6)) and len(plan[1]) == 2 for plan in plans)  # trunk whole
    assert rows["baseline_logits"]["max_sample_spread"] > 0
    assert 0.0 <= rows["evaluate"]["auroc"] <= 1.0
    assert rows["bundle+predict (save, load onto the device)"]["max_abs_logit_diff"] == 0.0


def test_gpu_stages_skips_the_steps_a_failed_step_feeds():
    from benchmarks.gpu_stages import Skip, Steps

    def no_library():
        raise Skip("scikit-learn is not installed")

    steps = Steps(torch.device("cpu"))
    steps.run("fails", lambda: 1 / 0)
    steps.run("needs what failed", lambda: {}, needs=("hydra",))
    steps.run("optional library", no_library)
    steps.state["hydra"] = object()
    steps.run("runs", lambda: {"value": 1}, needs=("hydra",))
    assert [r["status"] for r in steps.rows] == ["error", "skipped", "skipped", "ok"]
    assert steps.failed == ["fails"] and "ZeroDivisionError" in steps.rows[0]["why"]
    assert steps.rows[1]["why"] == "needs hydra from a step that failed"
    assert steps.rows[3]["value"] == 1


@pytest.mark.parametrize(
    ("script", "args", "said"),
    [
        ("gpu_check", ["--shared-layers", "3"], "shared-layers must be in 0..2, got 3"),
        ("gpu_check", ["--shared-layers", "two"], "shared-layers must be ints or 'half'"),
        ("gpu_check", ["--precisions", "fp64"], "precisions must be among"),
        ("gpu_check", ["--min-agreement", "2"], "min-agreement must be in [0, 1]"),
        ("gpu_check", ["--precisions", "fp16"], "fp16 runs only on CUDA"),
        ("gpu_check", ["--implementation", "dense"], "invalid choice: 'dense'"),
        ("gpu_stages", ["--shared-layers", "3"], "shared-layers must be in 0..2, got 3"),
        ("gpu_stages", ["--steps", "0"], "steps must be >= 1"),
        ("gpu_stages", ["--precision", "fp16"], "fp16 runs only on CUDA"),
    ],
)
def test_gpu_scripts_refuse_bad_input_in_one_line(script, args, said, tmp_path, capsys):
    """Each refusal comes before any work: argparse's usage and its error line (exit status 2),
    or ``sys.exit`` with one line. In process: the scripts' runs above cover ``python -m``."""
    import importlib

    out = tmp_path / "report.json"
    main = importlib.import_module(f"benchmarks.{script}").main
    with pytest.raises(SystemExit) as exited:
        main(["--device", "cpu", "--tiny", "--out", str(out), *args])
    code, err = exited.value.code, capsys.readouterr().err
    message = err if code == 2 else str(code)
    assert code not in (0, None) and said in message.strip().splitlines()[-1], (code, err)
    assert "Traceback" not in err and not out.exists()


@pytest.mark.parametrize(
    ("args", "said"),
    [(["--precisions", "fp64"], "bf16 and/or fp16"), (["--project", "nowhere"], "no models/hydra")],
)
def test_precision_quality_refuses_bad_input_before_any_work(args, said):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.precision_quality", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and said in done.stderr


def test_training_precision_refuses_a_folder_without_a_finished_project(tmp_path):
    projects = ["--fp32", "nowhere", "--bf16", "nowhere"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.training_precision",
            *projects,
            "--json",
            str(tmp_path / "r.json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "no models/base" in done.stderr, done.stderr
    assert not (tmp_path / "r.json").exists()


def test_allocator_benchmark_writes_ratios_against_system(tmp_path):
    """One child process (tiny model, one workload): the JSON has the reference row and the
    columns docs/benchmarks.md reads; an unknown allocator is refused before any child starts."""
    out = tmp_path / "allocators.json"
    cmd = [sys.executable, "-m", "benchmarks.allocators", "--model", "tiny_bert"]
    cmd += ["--workloads", "single", "--rounds", "1", "--reps", "1"]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    run = [*cmd, "--allocators", "system", "--out", str(out)]
    subprocess.run(run, cwd=ROOT, env=env, check=True, timeout=300)
    record = json.loads(out.read_text())
    assert record["model"] == "tiny_bert" and record["allocators"] == {"system": {}}
    row = record["results"]["single"]["system"]
    assert row["wall_ratio_to_system"] == 1.0 and row["cpu_ratio_to_system"] == 1.0
    assert row["wall_ms"] > 0 and row["cpu_ms"] > 0 and row["peak_rss_mib"] > 0
    bad = subprocess.run(
        [*cmd, "--allocators", "ptmalloc9"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert bad.returncode == 2 and "unknown allocator(s) ['ptmalloc9']" in bad.stderr


def test_compile_probe_refuses_a_folder_without_a_finished_project(tmp_path):
    from tasks.params import resolve_params, write_params

    def probe() -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "benchmarks.compile_probe", "--project", str(tmp_path)]
        return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)

    done = probe()
    assert done.returncode == 2 and "no models/hydra" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    (tmp_path / "models" / "hydra").mkdir(parents=True)
    write_params(resolve_params("quick"), tmp_path / "params.yaml")  # compile.backend: eager
    done = probe()
    assert done.returncode == 2 and "compile.backend is 'eager'" in done.stderr, done.stderr


def test_compile_probe_builds_every_candidate_or_defers_the_slow_precision(tmp_path, monkeypatch):
    from tiny_models import make_members, tiny_inputs

    from benchmarks import compile_probe
    from hydra_ops import compile as hc
    from hydra_ops.heads.plans import HeadPlan
    from hydra_ops.hydra.merge import merge_members
    from hydra_ops.hydra.serialization import save_hydra
    from tasks import compile as stage
    from tasks.params import resolve_params, write_params

    plans = [HeadPlan(((0,),)), HeadPlan(((1, 2),))]
    hydra = merge_members(make_members("bert", plans, fine_tuned=True, num_hidden_layers=1))
    save_hydra(hydra, tmp_path / "models" / "hydra")
    write_params(
        resolve_params("quick", sets={"compile.backend": "auto"}), tmp_path / "params.yaml"
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(hc.compiler, "CPU_BACKENDS", ("export",))
    monkeypatch.setattr(hc.compiler, "fast_bf16_unavailable_reason", lambda device: None)
    batches = [tiny_inputs("bert", 4, seed=1), tiny_inputs("bert", 4, seed=2)]
    monkeypatch.setattr(stage, "check_batches", lambda cfg, root: (batches[0], {"test": batches}))
    monkeypatch.setattr(stage, "eager_precision_ms", lambda *a: {"fp32": 30.0, "bf16": 10.0})
    every = compile_probe.compile_once(tmp_path, "every")
    probe = compile_probe.compile_once(tmp_path, "probe")
    assert every["built"] == ["export/bf16", "export/fp32"] and every["deferred"] == []
    assert every["eager_ms"] is None and every["seconds"] > 0
    assert probe["built"] == ["export/bf16"] and probe["deferred"] == ["export/fp32"]
    assert probe["eager_ms"] == {"fp32": 30.0, "bf16": 10.0}
    assert probe["shipped"] == "export/bf16"  # the only one built, so it agreed
    assert not (tmp_path / "models" / "compiled").exists()  # the project is only read


#: ``tasks/finetune_members.py`` of the project below: ``--member m`` writes unit ``m``; without
#: it, every missing unit and the index (as the stage does, verifying what is there).
STUB_MEMBERS_STAGE = """\
import json, sys
from pathlib import Path

out = Path("models/members")
wanted = [int(sys.argv[-1])] if "--member" in sys.argv else range(3)
if Path("fail").exists():
    sys.exit("stage failed on purpose")
for m in wanted:
    unit = out / f"member_{m}"
    if not unit.is_dir():
        unit.mkdir(parents=True)
        (unit / "model.bin").write_text(f"weights {m}")
if "--member" not in sys.argv:
    (out / "index.json").write_text(json.dumps(sorted(p.name for p in out.iterdir())))
"""


def _members_project(root: Path, method: str = "taylor") -> Path:
    from tasks.params import resolve_params, write_params

    (root / "tasks").mkdir(parents=True)
    (root / "tasks" / "__init__.py").write_text("")
    (root / "tasks" / "finetune_members.py").write_text(STUB_MEMBERS_STAGE)
    write_params(resolve_params("quick", {"scoring": {"method": method}}), root / "params.yaml")
    (root / "models" / "members").mkdir(parents=True)
    (root / "models" / "members" / "index.json").write_text("the run's own")
    return root


def _member_processes(project: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "benchmarks.member_processes", "--project", str(project), *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_member_processes_builds_the_same_members_both_ways_and_puts_the_runs_back(tmp_path):
    project = _members_project(tmp_path / "proj")
    done = _member_processes(project, "--rounds", "2", "--out", str(tmp_path / "r.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["same_files"] is True and result["members"] == 3
    modes = [(r["mode"], len(r["processes"])) for r in result["runs"]]
    assert modes == [("per_member", 4), ("in_stage", 1), ("in_stage", 1), ("per_member", 4)]
    assert result["per_member_over_in_stage"] > 0
    assert (project / "models" / "members" / "index.json").read_text() == "the run's own"
    assert sorted(p.name for p in (project / "models").iterdir()) == ["members"]


def test_member_processes_refuses_in_one_line_and_loses_nothing(tmp_path):
    done = _member_processes(tmp_path)
    assert done.returncode == 2 and "no models/members/index.json" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    circuit = _members_project(tmp_path / "circuit", method="circuit")
    done = _member_processes(circuit)
    assert done.returncode == 2 and "fine-tunes no members" in done.stderr, done.stderr
    failing = _members_project(tmp_path / "failing")
    (failing / "fail").write_text("")
    done = _member_processes(failing)
    assert done.returncode == 1 and "stage failed on purpose" in done.stderr, done.stderr
    assert (failing / "models" / "members" / "index.json").read_text() == "the run's own"
    assert sorted(p.name for p in (failing / "models").iterdir()) == ["members"]


def test_rounds_alternate_the_order_and_take_each_modes_median():
    from benchmarks.rounds import alternating, median_seconds

    order = list(alternating(("a", "b"), 3))
    assert order == [(0, "a"), (0, "b"), (1, "b"), (1, "a"), (2, "a"), (2, "b")]
    runs = [{"mode": m, "seconds": s} for m, s in (("a", 1.0), ("b", 5.0), ("a", 3.0), ("a", 2.0))]
    assert median_seconds(runs, ("a", "b")) == {"a": 2.0, "b": 5.0}


def test_warm_stage_benchmark_records_fresh_and_warm_side_by_side(tmp_path):
    """One round with a light probe: both kinds timed, their ratio recorded; a missing folder for
    the record is refused before anything runs."""
    out = tmp_path / "warm.json"
    cmd = [sys.executable, "-m", "benchmarks.warm_stages", "--rounds", "1"]
    cmd += ["--imports", "json", "--preload", "json"]
    subprocess.run([*cmd, "--out", str(out)], cwd=ROOT, check=True, timeout=300)
    record = json.loads(out.read_text())
    assert record["imports"] == ["json"] and record["rounds"] == 1
    fresh, warm = record["medians"]["fresh"], record["medians"]["warm"]
    assert fresh["wall_s"] > 0 and warm["wall_s"] > 0 and warm["cpu_s"] > 0
    assert record["ratios_warm_to_fresh"]["wall_s"] == round(warm["wall_s"] / fresh["wall_s"], 4)
    bad = subprocess.run(
        [*cmd, "--out", str(tmp_path / "no" / "warm.json")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "is not a folder" in bad.stderr
    assert not (tmp_path / "no").exists()
