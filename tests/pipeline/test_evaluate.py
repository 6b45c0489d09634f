"""tasks.evaluate: the MC Dropout, LoRA-Ensemble and BatchEnsemble baselines, every candidate
scored for the gate, and the OOD metrics under every OOD score, on a tiny digits project (stage
functions called directly, CPU fp32)."""

from __future__ import annotations

import json
import logging
import math

import pytest

from hydra_ops.uq.ood_criteria import OOD_CRITERIA
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
    "baselines.lora_ensemble.enabled": True,
    "baselines.lora_ensemble.rank": 2,
    "baselines.batch_ensemble.enabled": True,
    "baselines.batch_ensemble.members": 3,
}
EFFICIENT = {"lora_ensemble": 2, "batch_ensemble": 3}  # their members (lora: M = 2)


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
    assert set(ev["models"]) == {
        "hydra",
        "single",
        "naive_pruned",
        "deep_ensemble",
        "mc_dropout",
        *EFFICIENT,
    }
    mc, single = ev["models"]["mc_dropout"], ev["models"]["single"]
    assert mc["members"] == 3 and mc["parameters"] == single["parameters"]
    assert mc["temperature"] > 0 and mc["latency_ms"] > 0
    assert mc["calibrated"] != single["calibrated"]  # dropout on: not the base's numbers
    assert "mc_dropout" in ev["bootstrap"]
    # every model timed side by side in this one process, as a ratio to single
    # (tasks.evaluation.cost)
    cost = json.loads((root / "metrics" / "cost.json").read_text())
    assert set(cost["models"]) == set(ev["models"]) and cost["models"]["single"]["ratio"] == 1.0
    assert all(m["ratio_low"] <= m["ratio"] <= m["ratio_high"] for m in cost["models"].values())
    assert cost["models"]["mc_dropout"]["flops_ratio"] == 3.0  # three passes of the base
    # the efficient ensembles: evaluated, bootstrapped and timed like every baseline
    for name, k in EFFICIENT.items():
        e = ev["models"][name]
        assert e["members"] == k and name in ev["bootstrap"] and e["latency_ms"] > 0
        assert e["calibrated"] != single["calibrated"]
        assert e["diversity"]["id_test"]["members"] == k
        assert cost["models"][name]["flops_ratio"] > k - 1  # k forward passes' worth of compute
    # BatchEnsemble holds the base's weights once plus small fast weights, unlike k models
    assert single["parameters"] < ev["models"]["batch_ensemble"]["parameters"]
    assert ev["models"]["batch_ensemble"]["parameters"] < 1.5 * single["parameters"]
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

    from tasks.baseline_logits import load_baseline_logits
    from tasks.candidates.baseline_models import EVAL_SPLITS, eval_batches, seed_baselines
    from tasks.runtime import data as prepared

    cfg, root, _, _ = project
    sizes = {s: len(prepared.split(root, s)) for s in EVAL_SPLITS}
    stored = load_baseline_logits(root, sizes)
    assert set(stored) == {"single", "deep_ensemble", "mc_dropout", *EFFICIENT}
    from hydra_ops.models.runtime import Runtime

    # at the precision the stage resolved (auto may pick bf16 where it is native and faster)
    resolved = json.loads((root / "metrics" / "baseline_logits.json").read_text())["precision"]
    batched = eval_batches(cfg, root)
    for cand in seed_baselines(cfg, root, Runtime(precision=resolved["precision"])):
        assert stored[cand.name]["members"] == cand.members
        if cand.name in EFFICIENT:  # trained members that differ from each other
            test = stored[cand.name]["outputs"]["test"]
            assert all((test[:, 0] - test[:, m]).abs().max() > 0 for m in range(1, cand.members))
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
            assert list(by_kind) == list(OOD_CRITERIA)
            for kind, metrics in by_kind.items():
                if entry["members"] == 1 and OOD_CRITERIA[kind].needs_members():
                    assert metrics is None, (name, split, kind)
                    continue
                assert set(metrics) >= set(OOD_METRICS), (name, split, kind)
                assert all(math.isfinite(v) for v in metrics.values())
            # the score the gates read is the same number in both places
            assert by_kind[cfg.evaluate.ood_score] == entry["calibrated"][split]
    assert ev["models"]["single"]["ood_by_score"]["near_ood"]["disagreement"] is None
    for name in ("mc_dropout", *EFFICIENT):
        assert ev["models"][name]["ood_by_score"]["near_ood"]["disagreement"] is not None
        assert ev["models"][name]["ood_by_score"]["near_ood"]["mutual_information"] is not None
    stored = json.loads((root / "metrics" / "evaluate.json").read_text())
    assert stored["models"]["naive_pruned"]["ood_by_score"]["far_ood"]["mutual_information"] is None
    report = (root / "reports" / "evaluate.md").read_text()
    assert "OOD detection by score" in report
    assert "| mc_dropout | near_ood |" in report and "| single | far_ood |" in report
    assert "| lora_ensemble | near_ood |" in report and "| batch_ensemble | far_ood |" in report
    assert "3 members in one pass" in report  # what batch_ensemble's latency timed
    header = next(line for line in report.splitlines() if line.startswith("| model | split |"))
    assert all(kind in header for kind in OOD_CRITERIA)


def test_precision_quality_compares_the_shipped_precision_with_fp32(project):
    """``benchmarks.precision_quality`` on the finished project: fp32 against itself differs by
    exactly 0 everywhere; bf16 differs a little, and every interval brackets its difference."""
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


def test_training_precision_of_a_project_against_itself_and_refused_on_other_data(
    project, tmp_path
):
    """``benchmarks.training_precision`` with the same project as A and B: every model scored,
    A's and B's metrics equal, every difference and interval exactly 0, the training precisions
    read from what the stages recorded; a project on other data is refused in one line before
    any model is loaded."""
    import shutil
    import sys

    from conftest import REPO

    sys.path.insert(0, str(REPO))  # benchmarks/ is a repo folder, not an installed package
    from benchmarks.training_precision import WATCHED, compare, markdown
    from tasks.runtime import data as prepared

    cfg, root, _, _ = project
    result = compare(root, root, n_resamples=50, cfgs=(cfg, cfg))
    assert list(result["models"]) == ["single", "deep_ensemble", "hydra"]
    assert result["skipped"] == [] and result["counts"]["test"] == len(prepared.split(root, "test"))
    for name, entry in result["models"].items():
        assert entry["temperature"]["fp32"] == entry["temperature"]["bf16"] > 0
        for split, metric in WATCHED:
            r = entry[f"{split}.{metric}"]
            assert r["fp32"] == r["bf16"] and math.isfinite(r["fp32"]), (name, split, metric)
            assert r["difference"] == r["low"] == r["high"] == 0.0, (name, split, metric)
    recorded = json.loads((root / "metrics" / "finetune_base.json").read_text())["runtime"]
    assert result["trained"]["fp32"]["base"]["precision"] == recorded["precision"]
    assert len(markdown(result).splitlines()) == 2 + 3 * len(WATCHED)

    other = tmp_path / "other"
    shutil.copytree(root / "data", other / "data")
    manifest = other / "data" / "prepared" / "manifest.json"
    changed = json.loads(manifest.read_text())
    changed["duplicates_removed"] += 1
    manifest.write_text(json.dumps(changed))
    with pytest.raises(ValueError, match="hold different prepared data") as err:
        compare(root, other, n_resamples=50, cfgs=(cfg, cfg))
    assert "\n" not in str(err.value)


def test_every_candidate_is_scored_for_the_gate_and_ships_as_it_was_scored(project, tmp_path):
    """What evaluate adds for every candidate (tasks.candidates.scoring): its paired bootstrap
    against every other baseline, its own verdict thresholds and its export; the gate judges
    them all; a candidate rebuilt from its bundled files computes the logits it was scored on."""
    import torch

    from hydra_ops.heads.plans import load_plans
    from hydra_ops.models.checkpoints import load_pruned
    from hydra_ops.models.inference import logits
    from hydra_ops.models.runtime import Runtime
    from tasks.candidates.baseline_models import eval_batches, seed_baselines
    from tasks.candidates.bundle import write_candidate
    from tasks.candidates.export import source_hashes
    from tasks.candidates.serving import candidate_logits
    from tasks.gates.verdict import decide, load_cost
    from tasks.runtime.outputs import load_evaluation

    cfg, root, _, _ = project
    ev = json.loads((root / "metrics" / "evaluate.json").read_text())
    models = ev["models"]
    others = set(models) - {"hydra"}
    assert set(ev["candidate_bootstrap"]) == others
    for name in others:
        assert set(ev["candidate_bootstrap"][name]) == others - {name}
    # (candidate - baseline) is the difference of the two models' own metrics
    got = ev["candidate_bootstrap"]["naive_pruned"]["single"]["calibrated"]["id_test"]["nll"]
    want = models["naive_pruned"]["calibrated"]["id_test"]["nll"]
    assert got["difference"] == pytest.approx(
        want - models["single"]["calibrated"]["id_test"]["nll"]
    )
    kind = cfg.evaluate.ood_score
    # the efficient baselines are judged but have no export: they cannot ship (yet)
    unexported = {"lora_ensemble", "batch_ensemble"} & others
    assert unexported and set(ev["scored"]["candidates"]) == others - unexported
    for name in others:
        one_model = models[name]["members"] == 1 and OOD_CRITERIA[kind].needs_members()
        assert (models[name]["ood_thresholds"] is None) == one_model
        if name in unexported:
            continue
        export = ev["scored"]["candidates"][name]
        assert export["sha256"] == source_hashes(root, export["sources"])
    # the gate judges every candidate; compile checks do not apply to the eager candidates
    allowed = cfg.model_copy(
        update={
            "promote": cfg.promote.model_copy(update={"candidates": ["hydra", *sorted(others)]})
        }
    )
    verdict = decide(allowed, load_evaluation(root), None, load_cost(root))
    assert set(verdict["candidates"]) == set(models)
    for name in others:
        statuses = {c["metric"]: c["status"] for c in verdict["candidates"][name]["checks"]}
        assert statuses["compile_argmax_agreement"] == "not applicable"
        assert verdict["candidates"][name]["cost"]["ratio"] > 0
        assert verdict["candidates"][name]["shippable"] == (name not in unexported)
    # shipped files rebuild the scored models: the Deep Ensemble and the naive pruned model
    test = eval_batches(cfg, root)["test"]
    scored = {c.name: c for c in seed_baselines(cfg, root, Runtime())}
    plan = load_plans(root / "artifacts" / "plans" / "naive_plan.json")[0]
    naive = logits(load_pruned(root / "models" / "base", plan), test)[:, None, :]
    for name, expected in (
        ("deep_ensemble", scored["deep_ensemble"].member_logits(test)),
        ("naive_pruned", naive),
    ):
        out = tmp_path / name
        out.mkdir()
        write_candidate(root, ev, name, out)
        run = candidate_logits(out / "candidate", ev["scored"]["candidates"][name]["recipe"])
        assert torch.allclose(torch.cat([run(b) for b in test]), expected, atol=1e-6)
