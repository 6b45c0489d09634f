"""tasks.evaluate: the MC Dropout baseline and the OOD metrics under every OOD score, on a tiny
digits project (stage functions called directly, CPU fp32)."""

from __future__ import annotations

import json
import logging
import math

import pytest

from hydra_ops.ood_criteria import ENSEMBLE_ONLY_KINDS, OOD_SCORE_KINDS
from tasks.params import OOD_METRICS, resolve_params

SETS = {
    "data.name": "digits",
    "data.max_per_split": 48,
    "data.far_ood_size": 32,
    "scoring.method": "taylor",
    "members.finetune.enabled": False,
    "members.num_members": 2,
    "runtime.device": "cpu",
    "baselines.mc_dropout.samples": 3,
}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
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

    root = tmp_path_factory.mktemp("evaluate_baselines")
    cfg = resolve_params("quick", sets=SETS)
    for stage in (
        prepare_data,
        finetune_base,
        finetune_baselines,
        baseline_logits,
        score_heads,
        select_members,
        finetune_members,
        merge,
        calibrate,
        compile_stage,
    ):
        stage.run(cfg, root)
    ev = evaluate.run(cfg, root)
    return cfg, root, ev, (root / "metrics" / "evaluate.json").read_bytes()


def test_mc_dropout_is_evaluated_like_every_baseline_and_reruns_are_byte_identical(project, caplog):
    from tasks import evaluate

    cfg, root, ev, first = project
    assert set(ev["models"]) == {"hydra", "single", "naive_pruned", "deep_ensemble", "mc_dropout"}
    mc, single = ev["models"]["mc_dropout"], ev["models"]["single"]
    assert mc["members"] == 3 and mc["parameters"] == single["parameters"]
    assert mc["temperature"] > 0 and mc["latency_ms"] > 0
    assert mc["calibrated"] != single["calibrated"]  # dropout on: not the base's numbers
    assert "mc_dropout" in ev["bootstrap"]
    # every model timed side by side in this one process, as a ratio to single (tasks.cost)
    cost = json.loads((root / "metrics" / "cost.json").read_text())
    assert set(cost["models"]) == set(ev["models"]) and cost["models"]["single"]["ratio"] == 1.0
    assert all(m["ratio_low"] <= m["ratio"] <= m["ratio_high"] for m in cost["models"].values())
    assert cost["models"]["mc_dropout"]["flops_ratio"] == 3.0  # three passes of the base
    # a rerun: the same masks, the same bytes (the gate verdict is bound to this file's hash)
    caplog.set_level(logging.INFO, logger="hydra_ens")
    evaluate.run(cfg, root)
    assert (root / "metrics" / "evaluate.json").read_bytes() == first
    # the from-scratch timm ViT has p = 0 dropouts: the fallback rate, said in one log line
    said = [r.getMessage() for r in caplog.records if "fallback" in r.getMessage()]
    assert len(said) == 1 and "mc_dropout" in said[0]


def test_evaluate_reads_the_seed_baselines_logits_stage_baseline_logits_computed(project):
    """single, deep_ensemble and mc_dropout: the stored logits are exactly what the models give
    (so evaluate's numbers are those of running them); a stale store is refused in one line."""
    import torch

    from tasks import data as prepared
    from tasks.baseline_logits import load_baseline_logits
    from tasks.baseline_models import EVAL_SPLITS, eval_batches, seed_baselines

    cfg, root, _, _ = project
    sizes = {s: len(prepared.split(root, s)) for s in EVAL_SPLITS}
    stored = load_baseline_logits(root, sizes)
    assert set(stored) == {"single", "deep_ensemble", "mc_dropout"}
    from hydra_ops.runtime import Runtime

    # at the precision the stage resolved (auto may pick bf16 where it is native and faster)
    resolved = json.loads((root / "metrics" / "baseline_logits.json").read_text())["precision"]
    batched = eval_batches(cfg, root)
    for cand in seed_baselines(cfg, root, Runtime(precision=resolved["precision"])):
        assert stored[cand.name]["members"] == cand.members
        for split, batches in batched.items():
            assert torch.equal(stored[cand.name]["outputs"][split], cand.member_logits(batches))
    with pytest.raises(ValueError, match="re-run stage baseline_logits"):
        load_baseline_logits(root, {**sizes, "test": sizes["test"] + 1})


def test_ood_metrics_under_every_score_with_nulls_for_single_models(project):
    cfg, root, ev, _ = project
    for name, entry in ev["models"].items():
        by_score = entry["ood_by_score"]
        assert set(by_score) == {"near_ood", "far_ood"}
        for split, by_kind in by_score.items():
            assert list(by_kind) == list(OOD_SCORE_KINDS)
            for kind, metrics in by_kind.items():
                if entry["members"] == 1 and kind in ENSEMBLE_ONLY_KINDS:
                    assert metrics is None, (name, split, kind)
                    continue
                assert set(metrics) >= set(OOD_METRICS), (name, split, kind)
                assert all(math.isfinite(v) for v in metrics.values())
            # the score the gates read is the same number in both places
            assert by_kind[cfg.evaluate.ood_score] == entry["calibrated"][split]
    assert ev["models"]["single"]["ood_by_score"]["near_ood"]["disagreement"] is None
    assert ev["models"]["mc_dropout"]["ood_by_score"]["near_ood"]["disagreement"] is not None
    stored = json.loads((root / "metrics" / "evaluate.json").read_text())
    assert stored["models"]["naive_pruned"]["ood_by_score"]["far_ood"]["mutual_information"] is None
    report = (root / "reports" / "evaluate.md").read_text()
    assert "OOD detection by score" in report
    assert "| mc_dropout | near_ood |" in report and "| single | far_ood |" in report
    header = next(line for line in report.splitlines() if line.startswith("| model | split |"))
    assert all(kind in header for kind in OOD_SCORE_KINDS)


def test_precision_quality_compares_the_shipped_precision_with_fp32(project):
    """``benchmarks.precision_quality`` on the finished project: fp32 against itself differs by
    exactly 0 everywhere; bf16 differs a little, and every interval brackets its difference."""
    import sys

    from conftest import REPO

    sys.path.insert(0, str(REPO))  # benchmarks/ is a repo folder, not an installed package
    from benchmarks.precision_quality import compare

    cfg, root, _, _ = project
    result = compare(root, ["fp32", "bf16"], n_resamples=50, cfg=cfg)
    keys = {f"{s}.{m}" for s in ("id_test", "shift") for m in ("nll", "ece", "accuracy")}
    keys |= {"near_ood.auroc", "far_ood.auroc"}
    for precision in ("fp32", "bf16"):
        assert set(result[precision]) == keys | {"compile_check"}
    same = result["fp32"]
    assert same["compile_check"]["max_abs_diff_probs"] == 0.0 and same["compile_check"]["passed"]
    assert all(same[k]["difference"] == 0.0 and same[k]["inside"] for k in keys)
    low = result["bf16"]
    assert 0.0 < low["compile_check"]["max_abs_diff_probs"] < 0.5
    for k in keys:
        assert low[k]["low"] <= low[k]["difference"] <= low[k]["high"], k
