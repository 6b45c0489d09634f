"""The benchmark runs end to end in --smoke mode (shapes of the JSON only; no timing claims)."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # benchmarks/ is a repo folder, not an installed package

from benchmarks.report import evaluate_targets, markdown  # noqa: E402
from benchmarks.run import COLUMNS, expected_rows, shared_values  # noqa: E402
from benchmarks.workloads import MODELS, member_plans  # noqa: E402


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
