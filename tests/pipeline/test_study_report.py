"""The study report on synthetic points (2 variants x 3 seeds, and 1 seed): numbers across seeds,
paired differences, gates of Hydra and of the baselines as candidates, the recommendation, the
figures. No pipeline runs: the evaluate.json / gate.json dicts are built here in the shape
tasks/evaluate.py and tasks/gate.py write."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml
from scipy import stats

from flows.study.report import (
    PointResult,
    load_point,
    write_study_report,
)
from flows.study.report.paired import BEATS_SINGLE, claim_word
from flows.study.report.stats import seed_stats
from tasks.gates.checks import evaluate_check
from tasks.gates.twin import resolve_any_of
from tasks.params import CLASSIFICATION_METRICS, OOD_METRICS, GateCheck, default_gates

SEEDS = (0, 1, 2)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PARAMS = {"seed": 0, "gates": [GateCheck(**g).model_dump(mode="json") for g in default_gates()]}

# Per model: (id accuracy, id nll, id ece, near-OOD AUROC, near-OOD FPR95) at seed s.
SINGLE = {s: (0.90 + 0.01 * s, 0.30 + 0.01 * s, 0.030, 0.80 + 0.01 * s, 0.50) for s in SEEDS}
DEEP = {s: (0.91 + 0.01 * s, 0.27 + 0.01 * s, 0.020, 0.86 + 0.01 * s, 0.40) for s in SEEDS}
MCD = {s: (0.905 + 0.01 * s, 0.29 + 0.01 * s, 0.025, 0.83 + 0.01 * s, 0.45) for s in SEEDS}
# Hydra: NLL/ECE within noise of the single model; near-OOD AUROC clearly above it; `fast`
# falls 0.04 below the Deep Ensemble's near-OOD AUROC at seed 1 (gate tolerance 0.015).
NLL_NOISE = {"fast": (0.01, -0.01, 0.005), "slow": (-0.008, 0.012, -0.002)}
ECE_NOISE = {"fast": (0.002, -0.001, 0.0), "slow": (-0.002, 0.003, -0.0005)}
NEAR_GAP = {"fast": (-0.005, -0.04, -0.004), "slow": (-0.003, -0.006, -0.002)}
HYDRA_LATENCY = {"fast": 5.0, "slow": 9.0}
HYDRA_PARAMS = {"fast": 20_000_000, "slow": 40_000_000}


def hydra_values(v: str, s: int) -> tuple[float, ...]:
    acc, nll, ece, _, _ = SINGLE[s]
    return (
        acc + 0.002,
        nll + NLL_NOISE[v][s],
        ece + ECE_NOISE[v][s],
        DEEP[s][3] + NEAR_GAP[v][s],
        0.42 + 0.01 * s,
    )


def entry(values: tuple[float, ...], parameters: int, members: int, ood_scores: bool) -> dict:
    acc, nll, ece, near, fpr = values
    cls = {m: 0.1 for m in CLASSIFICATION_METRICS} | {"accuracy": acc, "nll": nll, "ece": ece}
    # synthetic: under shift an ensemble's NLL rises 0.05 less than a single network's, so the
    # strict `shift.nll vs single` check separates them
    shift = {**cls, "accuracy": acc - 0.05, "nll": nll + (0.05 if members > 1 else 0.1)}
    near_m = {m: 0.7 for m in OOD_METRICS} | {"auroc": near, "fpr_at_95_tpr": fpr}
    far_m = {m: 0.9 for m in OOD_METRICS} | {"auroc": 0.99, "fpr_at_95_tpr": 0.05}
    calibrated = {"id_test": cls, "shift": shift, "near_ood": near_m, "far_ood": far_m}
    out = {
        "members": members,
        "temperature": 1.2,
        "parameters": parameters,
        "calibrated": calibrated,
        "raw": copy.deepcopy(calibrated),
    }
    if ood_scores:

        def per_score(auroc: float) -> dict:
            scores = {"msp": auroc, "entropy": auroc + 0.01, "energy": auroc - 0.01}
            by = {
                k: {"auroc": a, "fpr_at_95_tpr": 1 - a, "aupr_in": 0.5} for k, a in scores.items()
            }
            multi = {"auroc": auroc + 0.02, "fpr_at_95_tpr": 0.3, "aupr_in": 0.5}
            by["mutual_information"] = multi if members > 1 else None
            by["disagreement"] = dict(multi) if members > 1 else None
            return by

        out["ood_by_score"] = {"near_ood": per_score(near), "far_ood": per_score(0.99)}
    return out


def bootstrap(hydra: dict, base: dict) -> dict:
    """Interval of width +-0.02 around the point difference, as evaluate.json records it."""
    out: dict = {}
    splits = (
        ("id_test", ("accuracy", "nll", "ece")),
        ("shift", ("nll",)),
        ("near_ood", ("auroc",)),
    )
    for split, metrics in splits:
        for m in metrics:
            d = hydra["calibrated"][split][m] - base["calibrated"][split][m]
            rec = {"difference": d, "low": d - 0.02, "high": d + 0.02, "mean": d}
            out.setdefault(split, {})[m] = {**rec, "n_resamples": 100}
    return {"calibrated": out}


def gate_json(evaluation: dict, latency: dict) -> dict:
    ev = copy.deepcopy(evaluation)
    for name, e in ev["models"].items():
        e["latency_ms"] = latency[name]
    gates = [GateCheck(**g) for g in PARAMS["gates"]]
    checks = resolve_any_of(gates, [evaluate_check(g, ev, None) for g in gates], ev)
    failed = [c["name"] for c in checks if c["status"] == "failed"]
    return {
        "passed": not failed,
        "verdict": "failed" if failed else "passed",
        "failed": failed,
        "checks": checks,
    }


def make_point(
    v: str, s: int, ood_scores: bool = True, near_gap: float | None = None
) -> PointResult:
    hv = hydra_values(v, s)
    if near_gap is not None:
        hv = (*hv[:3], DEEP[s][3] + near_gap, hv[4])
    hydra = entry(hv, HYDRA_PARAMS[v], 3, ood_scores)
    hydra |= {"compile_backend": "eager", "compile_max_abs_diff": None}
    hydra["compile_argmax_agreement"] = None
    offset = 0.0 if v == "fast" else 0.001
    models = {
        "hydra": hydra,
        "single": entry(SINGLE[s], 22_000_000, 1, ood_scores),
        "naive_pruned": entry((0.85 + offset, 0.5, 0.05, 0.7, 0.6), 8_000_000, 1, ood_scores),
        "deep_ensemble": entry(DEEP[s], 66_000_000, 3, ood_scores),
        "mc_dropout": entry(MCD[s], 22_000_000, 8, ood_scores),
        "control": entry((0.91 + offset, 0.28, 0.02, 0.85, 0.42), 66_000_000, 3, ood_scores),
    }
    boots = {n: bootstrap(hydra, e) for n, e in models.items() if n != "hydra"}
    evaluation = {"variant": "circuit", "num_members": 3, "models": models, "bootstrap": boots}
    # the shared baselines' latency is measured again by every run: it differs between runs
    run = 0.2 if v == "slow" else 0.0
    latency = {
        "hydra": HYDRA_LATENCY[v] + 0.1 * s,
        "single": 3.0 + run,
        "naive_pruned": 1.5,
        "deep_ensemble": 9.0 + run,
        "mc_dropout": 24.0 + run,
        "control": 9.5,
    }
    return PointResult(v, s, evaluation, latency, gate_json(evaluation, latency), PARAMS)


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> tuple[dict, str, Path]:
    out = tmp_path_factory.mktemp("study")
    points = [make_point(v, s) for v in ("slow", "fast") for s in SEEDS]
    variants = {"fast": {"members": {"heads_per_layer": 2}}, "slow": {}}
    summary = write_study_report(
        points,
        out,
        "Study: heads",
        command="hydra-ens study s.yaml",
        wall_seconds=3723.4,
        variants=variants,
    )
    return summary, (out / "study.md").read_text(), out


def test_metrics_per_model_mean_and_interval(study):
    summary, md, _ = study
    labels = set(summary["models"])
    assert {"hydra[fast]", "hydra[slow]", "single", "deep_ensemble", "mc_dropout"} <= labels
    # naive_pruned and control depend on the variant; single & co. are pooled once per seed
    assert {"naive_pruned[fast]", "naive_pruned[slow]", "control[fast]", "control[slow]"} <= labels
    assert "single[fast]" not in labels and summary["shared_baselines"] == [
        "single",
        "deep_ensemble",
        "mc_dropout",
    ]
    acc = summary["models"]["hydra[slow]"]["metrics"]["id_test.accuracy"]
    vals = [hydra_values("slow", s)[0] for s in SEEDS]
    lo, hi = stats.t.interval(0.95, 2, loc=sum(vals) / 3, scale=stats.sem(vals))
    assert acc["n"] == 3
    assert acc["mean"] == pytest.approx(sum(vals) / 3)
    assert (acc["low"], acc["high"]) == pytest.approx((lo, hi))
    assert [r["value"] for r in acc["per_seed"]] == pytest.approx(vals)
    # one value per seed for single (not one per run); its latency averaged over the runs
    single_lat = summary["models"]["single"]["metrics"]["model.latency_ms"]
    assert single_lat["n"] == 3 and single_lat["mean"] == pytest.approx(3.1)
    nll = summary["models"]["single"]["metrics"]["id_test.nll"]
    assert nll["n"] == 3 and nll["mean"] == pytest.approx(0.31)
    # every calibrated metric of every split, plus latency and parameters
    for split in ("id_test", "shift"):
        for m in CLASSIFICATION_METRICS:
            assert f"{split}.{m}" in summary["models"]["single"]["metrics"]
    for split in ("near_ood", "far_ood"):
        for m in OOD_METRICS:
            assert f"{split}.{m}" in summary["models"]["hydra[fast]"]["metrics"]
    assert summary["models"]["hydra[fast]"]["metrics"]["model.parameters"]["mean"] == 20_000_000
    # the Markdown shows it: mean [low, high] with 4 decimals, and n
    assert f"{sum(vals) / 3:.4f} [{lo:.4f}, {hi:.4f}]" in md
    header = next(line for line in md.splitlines() if line.startswith("| model | n | accuracy"))
    assert "| adaptive_ece (lower better) |" in header and "| augrc (lower better) |" in header
    assert "# Study: heads" in md and "`hydra-ens study s.yaml`" in md
    assert "3723 s (1h 02m 03s)" in md and "Seeds: 0, 1, 2 (n = 3)" in md
    assert "`members.heads_per_layer=2`" in md and "(none: the defaults)" in md


def test_per_seed_paired_differences(study):
    summary, md, _ = study
    near = summary["paired"]["fast"]["single"]["near_ood.auroc"]
    expected = [hydra_values("fast", s)[3] - SINGLE[s][3] for s in SEEDS]
    assert [r["value"] for r in near["per_seed"]] == pytest.approx(expected)
    lo, hi = stats.t.interval(0.95, 2, loc=sum(expected) / 3, scale=stats.sem(expected))
    assert (near["low"], near["high"]) == pytest.approx((lo, hi))
    nll_de = summary["paired"]["slow"]["deep_ensemble"]["id_test.nll"]
    assert [r["value"] for r in nll_de["per_seed"]] == pytest.approx(
        [hydra_values("slow", s)[1] - DEEP[s][1] for s in SEEDS]
    )
    # the Hydra is paired with its own twin and control too
    assert set(summary["paired"]["slow"]) == {
        "single",
        "naive_pruned",
        "control",
        "deep_ensemble",
        "mc_dropout",
    }
    twin = summary["paired"]["slow"]["naive_pruned"]["id_test.nll"]
    assert [r["value"] for r in twin["per_seed"]] == pytest.approx(
        [hydra_values("slow", s)[1] - 0.5 for s in SEEDS]
    )
    assert "### `hydra[slow]` - `naive_pruned`" in md and "### `hydra[slow]` - `control`" in md
    # the per-point bootstrap: seed 1 of `fast` is 0.04 below the Deep Ensemble (interval
    # +-0.02 excludes 0: `< 0`, one run's uncorrected reading, never the word "worse"); NLL vs
    # single within +-0.02 contains 0
    boot = summary["paired"]["fast"]["deep_ensemble"]["near_ood.auroc"]["bootstrap"]
    assert [b["excludes_zero"] for b in boot] == [False, True, False]
    assert boot[1]["direction"] == "< 0"
    nll_boot = summary["paired"]["fast"]["single"]["id_test.nll"]["bootstrap"]
    assert {b["direction"] for b in nll_boot} == {"n.s."}
    section3 = md.split("## 3.")[1].split("## 4.")[0]
    assert "### `hydra[fast]` - `single`" in md and " < 0)" in section3
    assert "] worse)" not in section3 and "] better)" not in section3
    # the within-seed bootstrap interval is printed beside each per-seed difference
    d, lo = boot[1]["low"] + 0.02, boot[1]["low"]
    assert f"{d:+.4f} (b: [{lo:+.4f}, {boot[1]['high']:+.4f}] < 0)" in md
    assert f"{expected[1]:+.4f}" in md
    # FPR95 has no bootstrap interval in evaluate.json
    assert summary["paired"]["fast"]["single"]["near_ood.fpr_at_95_tpr"]["bootstrap"] == []


def test_recommendation_skips_a_variant_failing_one_seed(study):
    summary, md, _ = study
    fast = {g["seed"]: g for g in summary["gates"]["points"] if g["variant"] == "fast"}
    assert [fast[s]["passed"] for s in SEEDS] == [True, False, True]
    assert fast[1]["failed"] == ["near_ood.auroc vs deep_ensemble"]
    rec = summary["recommendation"]
    assert rec["variant"] == "slow"  # slower, but the only one that passes on every seed
    assert rec["sentence"].startswith("Recommended: `slow`")
    assert rec["sentence"] in md
    assert "| `fast` | 1 | FAILED | near_ood.auroc vs deep_ensemble |" in md


def test_no_variant_passing_every_seed_says_so_plainly(tmp_path):
    points = [make_point("fast", s) for s in SEEDS]
    points += [make_point("slow", s, near_gap=-0.05 if s == 2 else None) for s in SEEDS]
    summary = write_study_report(points, tmp_path, "t")
    rec = summary["recommendation"]
    assert rec["variant"] is None
    assert rec["sentence"].startswith("No variant passes the gates on every seed.")
    # both pass 2 of 3 seeds with one failed check: the cheaper one is named
    assert "`fast` (passes 2 of 3 seeds)" in rec["sentence"]
    assert "seed 1: near_ood.auroc vs deep_ensemble" in rec["sentence"]
    assert rec["sentence"] in (tmp_path / "study.md").read_text()


def test_beats_single_sentences(study):
    summary, md, _ = study
    beats = summary["beats_single"]
    for key in ("id_test.nll", "id_test.ece"):
        assert beats[key]["variants"] == []
        assert f"no variant beats the single model on {key} across seeds" in md
    # near-OOD AUROC: about +0.055 at every seed, but `fast` has +0.02 at seed 1, so its
    # interval across seeds contains 0
    assert beats["near_ood.auroc"]["variants"] == ["slow"]
    # FPR95 and shift NLL are better at every seed (p < 0.02 each alone), but not after Holm's
    # step-down over the 10 (variant, metric) comparisons
    family = beats["_family"]
    for key in ("near_ood.fpr_at_95_tpr", "shift.nll"):
        assert beats[key]["variants"] == []
        assert all(family["tests"][f"{v}|{key}"]["p"] < 0.02 for v in ("fast", "slow"))
    assert (
        "beat the single model on near_ood.auroc across seeds (Hydra - single, mean [95%], "
        "Holm-corrected over 10 comparisons at 0.05): `slow` (+0.0563" in md
    )
    assert family["m"] == 10 and len(family["tests"]) == 10
    assert "no variant beats the single model on near_ood.auroc" not in md


def test_baselines_as_candidates(study):
    summary, md, _ = study
    base = summary["gates"]["baselines_as_candidates"]
    single = base["single"]
    assert [r["seed"] for r in single["rows"]] == list(SEEDS)  # once per seed, not per run
    assert single["seeds_passed"] == []
    # a strict improvement over single: no model improves on itself; an any_of group over
    # single does not apply to single (as in the run's gate, tasks.gates.candidates)
    assert single["caught_by"] == {
        "near_ood.auroc vs deep_ensemble": [0, 1, 2],
        "shift.nll vs single": [0, 1, 2],
    }
    checks = {c["name"]: c for c in single["rows"][0]["checks"]}
    assert checks["near_ood.auroc vs deep_ensemble"]["status"] == "failed"
    assert checks["near_ood.auroc vs deep_ensemble"]["difference"] == pytest.approx(-0.06)
    # a baseline against itself and the model-level checks do not apply
    assert checks["id_test.accuracy vs single"]["status"] == "n/a"
    assert checks["model.compile_argmax_agreement vs 1"]["status"] == "n/a"
    assert checks["shift.nll vs single"]["status"] == "failed"
    far = checks["far_ood.auroc vs deep_ensemble"]
    assert far["status"] == "passed" and far["against"] == "deep_ensemble"
    assert single["rows"][0]["not_applicable"] == [
        "id_test.accuracy vs single",
        "id_test.ece vs single",
        "id_test.nll vs single",
        "shift.accuracy vs single",
    ]
    assert checks["id_test.nll vs single"]["note"].startswith("any_of 'beats single' holds")
    # the Deep Ensemble passes; naive_pruned (per variant) is caught by accuracy and NLL too
    assert base["deep_ensemble"]["seeds_passed"] == list(SEEDS)
    caught = base["naive_pruned[fast]"]["caught_by"]
    assert {"id_test.accuracy vs single", "near_ood.auroc vs deep_ensemble"} <= set(caught)
    assert "- `single` passes on 0 of 3 seeds; caught by: near_ood.auroc vs deep_ensemble" in md
    # the naive pruned twin judged as the candidate: its own any_of group does not apply (the
    # group holds a model against this cheaper model), said per check, as in the run's gate
    twin = base["naive_pruned[fast]"]
    assert "id_test.nll vs naive_pruned" not in twin["caught_by"]
    assert "id_test.nll vs naive_pruned" in twin["rows"][0]["not_applicable"]
    assert "- `deep_ensemble` passes on 3 of 3 seeds; no check catches it" in md


def test_other_gates_judge_the_same_evidence(tmp_path):
    """``gates=``: every point and baseline judged by the given checks, not the points' own; a
    check that asks for a strict improvement over a baseline fails that baseline as candidate."""
    points = [make_point(v, s) for v in ("slow", "fast") for s in SEEDS]
    beat_single = GateCheck(
        name="near_ood.auroc beats single",
        metric="auroc",
        split="near_ood",
        baseline="single",
        min_absolute_change=0.03,
    )
    summary = write_study_report(points, tmp_path, "regated", gates=[beat_single])
    md = (tmp_path / "study.md").read_text()
    verdicts = {(g["variant"], g["seed"]): g["passed"] for g in summary["gates"]["points"]}
    # Hydra - single on near-OOD AUROC: 0.06 + NEAR_GAP; fast's seed-1 gap leaves 0.02 < 0.03
    assert verdicts == {
        **{("slow", s): True for s in SEEDS},
        **{("fast", s): s != 1 for s in SEEDS},
    }
    assert summary["recommendation"]["variant"] == "slow"
    base = summary["gates"]["baselines_as_candidates"]
    assert base["single"]["seeds_passed"] == []
    assert base["single"]["caught_by"] == {"near_ood.auroc beats single": list(SEEDS)}
    assert base["deep_ensemble"]["seeds_passed"] == list(SEEDS)  # 0.06 above single
    assert summary["gates"]["checks"][0]["name"] == "near_ood.auroc beats single"
    assert "Judged with the gates given to the report" in md


def test_ood_by_score_table(study):
    summary, md, _ = study
    ood = summary["ood_by_score"]
    assert ood["available"]
    assert ood["models"]["single"]["near_ood"]["mutual_information"] is None
    msp = ood["models"]["hydra[slow]"]["near_ood"]["msp"]["auroc"]
    vals = [hydra_values("slow", s)[3] for s in SEEDS]
    assert msp["mean"] == pytest.approx(sum(vals) / 3) and msp["n"] == 3
    assert "| model | msp | entropy | energy | mutual_information | disagreement |" in md
    single_row = next(
        line for line in md.split("### near_ood auroc")[1].splitlines() if "`single`" in line
    )
    assert single_row.count("n/a (single model)") == 2


def test_missing_ood_by_score_and_one_seed(tmp_path):
    points = [make_point("fast", 0, ood_scores=False), make_point("slow", 0, ood_scores=False)]
    summary = write_study_report(points, tmp_path, "one seed")
    md = (tmp_path / "study.md").read_text()
    assert summary["ood_by_score"] == {"available": False}
    assert "The per-score OOD table is unavailable" in md
    assert "n=1, no interval" in md
    acc = summary["models"]["hydra[fast]"]["metrics"]["id_test.accuracy"]
    assert acc["n"] == 1 and acc["low"] is None and acc["high"] is None
    # no interval, so no variant can be said to beat the single model
    assert "no variant beats the single model on near_ood.auroc across seeds (n=1" in md
    # both pass seed 0, but one seed cannot show a Hydra beating its twin across seeds
    rec = summary["recommendation"]
    assert rec["variant"] is None and rec["pruned_enough"] == "naive_pruned[slow]"
    assert "the pruned model is enough" in rec["sentence"]


def test_figures_are_pngs_linked_from_the_markdown(study):
    summary, md, out = study
    assert summary["files"]["figures"] == [
        "figures/pareto_near_ood_auroc.png",
        "figures/pareto_nll.png",
        "figures/pareto_shift_nll.png",
    ]
    for rel in summary["files"]["figures"]:
        data = (out / rel).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000
        assert f"]({rel})" in md
    # `naive_pruned` is fastest; the Deep Ensemble has the best NLL
    nll_front = summary["pareto"]["id_test.nll"]["front"]
    assert nll_front[0].startswith("naive_pruned[") and "deep_ensemble" in nll_front
    assert json.loads((out / "study.json").read_text()) == summary
    assert sorted(p.name for p in out.iterdir()) == ["figures", "study.json", "study.md"]


def test_deterministic_markdown_and_unshared_baseline(tmp_path):
    points = [make_point(v, s) for v in ("fast", "slow") for s in SEEDS]
    # a variant that changes the Deep Ensemble (e.g. num_members): it is no longer pooled
    de = points[3].evaluation["models"]["deep_ensemble"]
    de["parameters"] = 88_000_000
    s1 = write_study_report(points, tmp_path / "a", "t")
    s2 = write_study_report(list(reversed(points)), tmp_path / "b", "t")
    assert (tmp_path / "a" / "study.md").read_text() == (tmp_path / "b" / "study.md").read_text()
    assert s1 == s2
    assert s1["unshared_baselines"] == {"deep_ensemble": [0]}
    assert {"deep_ensemble[fast]", "deep_ensemble[slow]"} <= set(s1["models"])


def test_load_point_and_bad_input(tmp_path):
    p = make_point("fast", 0)
    for rel, obj in (
        ("metrics/evaluate.json", p.evaluation),
        ("metrics/latency.json", p.latency),
        ("reports/gate.json", p.gate),
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(json.dumps(obj))
    with pytest.raises(ValueError, match=r"params\.yaml is missing") as err:
        load_point(tmp_path, "fast", 0)
    assert "\n" not in str(err.value) and "'fast' seed 0" in str(err.value)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(p.params))
    assert load_point(tmp_path, "fast", 0) == p
    (tmp_path / "reports/gate.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"gate\.json is corrupted"):
        load_point(tmp_path, "fast", 0)
    with pytest.raises(ValueError, match="points: duplicate point"):
        write_study_report([p, p], tmp_path / "x", "t")
    with pytest.raises(ValueError, match="points must be a non-empty"):
        write_study_report([], tmp_path / "x", "t")
    assert not (tmp_path / "x").exists()


def test_a_missing_point_counts_as_not_passing(tmp_path):
    points = [make_point(v, s) for v in ("fast", "slow") for s in SEEDS if (v, s) != ("slow", 2)]
    summary = write_study_report(points, tmp_path, "t")
    rec = summary["recommendation"]
    assert rec["variant"] is None
    slow = next(r for r in rec["variants"] if r["variant"] == "slow")
    assert slow["failing"] == {"2": ["no result for this seed"]}
    assert summary["models"]["hydra[slow]"]["metrics"]["id_test.accuracy"]["n"] == 2
    # single still has all three seeds (the `fast` runs evaluated it)
    assert summary["models"]["single"]["metrics"]["id_test.accuracy"]["n"] == 3


# --- evidence you can bet on ----------------------------------------------------------------


def with_cost(p: PointResult, hydra_ratio: float, flops: int, width: float = 0.05) -> PointResult:
    """``p`` with a ``cost.json`` whose Hydra ratio to single is ``hydra_ratio`` [+-width]."""
    models = {}
    for name, lat in p.latency.items():
        ratio = hydra_ratio if name == "hydra" else lat / p.latency["single"]
        models[name] = {
            "ratio": ratio,
            "ratio_low": ratio - width,
            "ratio_high": ratio + width,
            "flops": flops if name == "hydra" else 1_000_000,
            "parameters": p.evaluation["models"][name]["parameters"],
        }
    return dataclasses.replace(p, cost={"reference": "single", "pid": 1, "models": models})


def twin_like_hydra(p: PointResult) -> PointResult:
    """``p`` whose naive pruned twin is the Hydra itself (the evidence cannot separate them)."""
    ev = copy.deepcopy(p.evaluation)
    ev["models"]["naive_pruned"] = copy.deepcopy(ev["models"]["hydra"])
    ev["bootstrap"]["naive_pruned"] = bootstrap(ev["models"]["hydra"], ev["models"]["hydra"])
    return dataclasses.replace(p, evaluation=ev, gate=gate_json(ev, p.latency))


def test_optional_failed_checks_count_under_other_gates(tmp_path):
    """Failing before: with ``gates=`` an optional check that was compared and failed was
    ignored, while tasks.gates.checks (and the baselines' rows) count it."""
    points = [make_point("fast", s) for s in SEEDS]
    impossible = GateCheck(metric="accuracy", split="id_test", threshold=0.99, optional=True)
    summary = write_study_report(points, tmp_path, "t", gates=[impossible])
    assert all(not g["passed"] for g in summary["gates"]["points"])
    assert summary["gates"]["points"][0]["failed"] == ["id_test.accuracy vs 0.99"]


def test_a_shared_baseline_seed_passes_only_when_every_run_passed(tmp_path):
    """Failing before: a shared baseline judged differently by two runs at a seed counted as
    passed at that seed if any one run passed."""
    points = [make_point(v, s) for v in ("fast", "slow") for s in SEEDS]
    gate = GateCheck(metric="latency_ms", threshold=1e9)  # model-level: n/a for a baseline
    by_run = GateCheck(metric="accuracy", split="id_test", baseline="mc_dropout", tolerance=0.0)
    # in the `slow` run at seed 0, mc_dropout's accuracy is lower: the single model (as the
    # candidate) passes by_run in that run only, and fails it in the `fast` run
    p = next(q for q in points if (q.variant, q.seed) == ("slow", 0))
    p.evaluation["models"]["mc_dropout"]["calibrated"]["id_test"]["accuracy"] = 0.5
    summary = write_study_report(points, tmp_path, "t", gates=[gate, by_run])
    single = summary["gates"]["baselines_as_candidates"]
    rows = single["single"]["rows"] if "single" in single else []
    at_0 = {r["in_run_of"]: r["passed"] for r in rows if r["seed"] == 0}
    assert at_0 == {"fast": False, "slow": True}
    assert 0 not in single["single"]["seeds_passed"]


def test_a_zero_width_interval_is_no_evidence_of_a_difference(tmp_path):
    """Failing before: three equal per-seed differences gave a zero-width interval, and any
    nonzero difference counted as a win."""
    from flows.study.report.paired import _beats

    st = {"n": 3, "mean": -0.01, "low": -0.01, "high": -0.01}
    assert not _beats(st, "nll")
    from flows.study.report.stats import t_test_p

    assert t_test_p([-0.01, -0.01, -0.01]) == 1.0
    points = [make_point("fast", s) for s in SEEDS]
    for p in points:  # Hydra ECE 0.001 below single at every seed
        p.evaluation["models"]["hydra"]["calibrated"]["id_test"]["ece"] = 0.029
    summary = write_study_report(points, tmp_path, "t")
    assert summary["beats_single"]["id_test.ece"]["variants"] == []


def test_displayed_intervals_stay_inside_the_metric_range(tmp_path):
    """Failing before: an AUROC near 1 printed an interval past 1."""
    from flows.study.report.cells import diff_cell, stat_cell

    assert stat_cell({"mean": 0.99, "low": 0.97, "high": 1.01}, "far_ood.auroc") == (
        "0.9900 [0.9700, 1.0000]"
    )
    assert stat_cell({"mean": 0.01, "low": -0.02, "high": 0.04}, "nll") == "0.0100 [0.0000, 0.0400]"
    assert diff_cell({"mean": 0.9, "low": 0.5, "high": 1.3}, "near_ood.auroc") == (
        "+0.9000 [+0.5000, +1.0000]"
    )
    points = [make_point("fast", s) for s in SEEDS]
    for s, p in zip(SEEDS, points, strict=True):
        p.evaluation["models"]["hydra"]["calibrated"]["far_ood"]["auroc"] = (0.97, 1.0, 1.0)[s]
    summary = write_study_report(points, tmp_path, "t")
    assert summary["models"]["hydra[fast]"]["metrics"]["far_ood.auroc"]["high"] > 1.0
    md = (tmp_path / "study.md").read_text()
    far = next(ln for ln in md.split("### far_ood")[1].splitlines() if "`hydra[fast]`" in ln)
    low = summary["models"]["hydra[fast]"]["metrics"]["far_ood.auroc"]["low"]
    assert f"0.9900 [{low:.4f}, 1.0000]" in far
    for lo, hi in re.findall(r"\[(\d\.\d{4}), (\d\.\d{4})\]", md.split("### model")[0]):
        assert 0.0 <= float(lo) <= float(hi) <= 1.0


def test_the_split_mark_follows_data_seed(tmp_path):
    pinned = write_study_report([make_point("fast", s) for s in SEEDS], tmp_path / "a", "t")
    md = (tmp_path / "a" / "study.md").read_text()
    assert not pinned["split"]["per_seed"] and "Conditional on one data split" in md
    assert md.count(" ¹") > 50  # beside every interval
    drawn = []
    for s in SEEDS:
        p = make_point("fast", s)
        drawn.append(dataclasses.replace(p, params={**p.params, "data": {"seed": s}}))
    summary = write_study_report(drawn, tmp_path / "b", "t")
    md = (tmp_path / "b" / "study.md").read_text()
    assert summary["split"]["per_seed"] and " ¹" not in md
    assert "drawn per seed (`data.seed` follows the seed)" in md


def test_the_recommendation_refuses_a_hydra_its_twin_matches(tmp_path):
    """`slow` passes every gate the points were judged with, but its naive pruned twin is the
    same model: it is not named; the report says the pruned model is enough and its cost."""
    points = [with_cost(make_point("slow", s), 2.8, 9_000_000) for s in SEEDS]
    points = [twin_like_hydra(p) for p in points]
    points += [with_cost(make_point("fast", s, near_gap=-0.05), 1.7, 5_000_000) for s in SEEDS]
    summary = write_study_report(points, tmp_path, "t")
    rec = summary["recommendation"]
    assert rec["variant"] is None
    assert summary["beats_twin"]["variants"]["slow"]["beats"] is False
    # the default gates' twin group fails it on every seed too
    slow_gates = [g for g in summary["gates"]["points"] if g["variant"] == "slow"]
    assert all("id_test.nll vs naive_pruned" in g["failed"] for g in slow_gates)
    md = (tmp_path / "study.md").read_text()
    assert "`hydra[slow]` does not beat its naive pruned twin" in md


def test_pruned_enough_when_the_gates_pass_but_the_twin_is_not_beaten(tmp_path):
    """Gates without the twin group pass `slow`; the across-seed twin comparison still refuses
    it, and the sentence names the naive pruned model and both costs."""
    points = [twin_like_hydra(with_cost(make_point("slow", s), 2.8, 9_000_000)) for s in SEEDS]
    loose = [GateCheck(metric="accuracy", split="id_test", threshold=0.5)]
    rec = write_study_report(points, tmp_path, "t", gates=loose)["recommendation"]
    assert rec["variant"] is None and rec["pruned_enough"] == "naive_pruned[slow]"
    assert "the pruned model is enough: `naive_pruned[slow]`" in rec["sentence"]
    assert "costs 0.47x single" in rec["sentence"] and "2.80x single" in rec["sentence"]


def test_cost_ties_inside_the_interval_are_broken_by_flops():
    """`fast` is 5% cheaper by latency ratio: inside the intervals' half-width (0.2) a tie,
    broken by FLOPs (`slow` has fewer), then parameters; with narrow intervals `fast` wins."""
    from flows.study.report.recommend import cheapest

    def row(v: str, ratio: float, half: float, flops: int, parameters: int) -> dict:
        cost = {"ratio": ratio, "half_width": half, "flops": flops, "parameters": parameters}
        return {"variant": v, "cost": cost}

    best, tied = cheapest([row("fast", 1.50, 0.2, 9, 1), row("slow", 1.58, 0.2, 7, 1)])
    assert best["variant"] == "slow" and tied == ["fast"]
    best, tied = cheapest([row("fast", 1.50, 0.01, 9, 1), row("slow", 1.58, 0.01, 7, 1)])
    assert best["variant"] == "fast" and tied == []
    best, _ = cheapest([row("fast", 1.50, 0.2, 9, 5), row("slow", 1.58, 0.2, 9, 3)])
    assert best["variant"] == "slow"  # equal FLOPs: fewer parameters


def test_cost_ratios_come_from_cost_json_else_the_same_runs_latency(tmp_path):
    p = with_cost(make_point("fast", 0), 1.7, 5_000_000)
    q = make_point("slow", 0)  # written before cost.json: latency.json of the same run
    summary = write_study_report([p, q], tmp_path, "t")
    m = summary["models"]
    assert m["hydra[fast]"]["metrics"]["model.cost_ratio"]["mean"] == pytest.approx(1.7)
    assert m["hydra[fast]"]["metrics"]["model.flops"]["mean"] == 5_000_000
    assert m["hydra[slow]"]["metrics"]["model.cost_ratio"]["mean"] == pytest.approx(9.0 / 3.2)
    assert "model.cost_ratio_low" not in m["hydra[slow]"]["metrics"]
    md = (tmp_path / "study.md").read_text()
    assert "| `hydra[fast]` | 1 | 1.70 (n=1, no interval) | s0: [1.65, 1.75] |" in md
    nums = summary["pareto"]["near_ood.auroc"]["points"]
    assert [q["number"] for q in nums] == list(range(1, len(nums) + 1))
    assert nums[0]["x"] == pytest.approx(1.7)


def test_confirmation_seeds_are_reported_apart_and_never_change_the_choice(tmp_path):
    choosing = [make_point(v, s) for v in ("fast", "slow") for s in SEEDS]
    alone = write_study_report(choosing, tmp_path / "a", "t")
    assert alone["recommendation"]["variant"] == "slow" and alone["confirmation"] is None
    # held-out seeds on which `slow` fails and `fast` passes everything
    held = [make_point("slow", s, near_gap=-0.05) for s in (0, 1)]
    held += [make_point("fast", s) for s in (0, 2)]
    held = [dataclasses.replace(p, seed=p.seed + 10) for p in held]
    summary = write_study_report(choosing + held, tmp_path / "b", "t", confirm_seeds=[10, 11, 12])
    assert summary["recommendation"] == alone["recommendation"]
    assert summary["seeds"] == list(SEEDS)
    conf = summary["confirmation"]
    assert conf["seeds"] == [10, 11, 12] and conf["variant"] == "slow"
    assert {(g["variant"], g["seed"]) for g in conf["gates"]} == {
        ("slow", 10),
        ("slow", 11),
        ("fast", 10),
        ("fast", 12),
    }
    assert not any(g["passed"] for g in conf["gates"] if g["variant"] == "slow")
    # every variant run on the held-out seeds (the chosen one first in study.md, below), each
    # its own twin family
    assert set(conf["paired"]) == set(conf["cost"]) == {"slow", "fast"}
    assert [p["seed"] for p in conf["paired"]["fast"]["single"]["near_ood.auroc"]["per_seed"]] == [
        10,
        12,
    ]
    assert conf["twin"]["m"] == 4 and set(conf["twin"]["variants"]) == {"slow", "fast"}
    md = (tmp_path / "b" / "study.md").read_text()
    main, confirm = md.split("## 7. Confirmation on held-out seeds")
    assert "10" not in main.split("## 1.")[0].split("Confirmation seeds")[0]
    assert "| `slow` | 10 | FAILED |" in confirm and "| `slow` | 10 |" not in main
    assert confirm.index("### `hydra[slow]` on the") < confirm.index("### `hydra[fast]` on the")
    assert confirm.count("(Holm over 4 comparisons)") == 2
    # every comparison on the held-out seeds is worded by its Holm-corrected test, and every
    # model's cost there comes from those seeds alone
    for v in ("slow", "fast"):
        claims = conf["claims"][v]
        assert claims["twin"]["m"] == 4 and claims["baselines"]["m"] == 3 * len(BEATS_SINGLE)
        for fam in claims.values():
            for name, t in fam["tests"].items():
                word = claim_word(t["rejected"], t["mean"], name.split(".", 1)[1])
                assert t["word"] == word and f"on {name.split('|')[1]}: **{word}**" in confirm
    assert set(conf["costs"]["fast"]) >= {"hydra[fast]", "single", "naive_pruned[fast]"}
    assert conf["costs"]["fast"]["hydra[fast]"] == conf["cost"]["fast"]


def test_registered_variants_are_confirmed_each_on_its_own_and_none_is_chosen(tmp_path):
    """Confirmation seeds only (variants registered before any point ran): no choice, the
    descriptive sections read every point, section 7 words every variant's claims, and each
    variant's claims equal those it gets beside chosen-on seeds (they never depend on a choice)."""
    held = [make_point(v, s) for v in ("fast", "slow") for s in SEEDS]
    held = [dataclasses.replace(p, seed=p.seed + 10) for p in held]
    seeds = [s + 10 for s in SEEDS]
    summary = write_study_report(held, tmp_path / "r", "t", confirm_seeds=seeds)
    rec, conf = summary["recommendation"], summary["confirmation"]
    assert rec["variant"] is None and rec["registered"] and conf["registered"]
    assert summary["seeds"] == seeds and conf["seeds"] == seeds
    assert set(conf["claims"]) == {"fast", "slow"}
    choosing = [make_point(v, s) for v in ("fast", "slow") for s in SEEDS]
    beside = write_study_report(choosing + held, tmp_path / "b", "t", confirm_seeds=seeds)
    assert beside["confirmation"]["claims"] == conf["claims"]
    md = (tmp_path / "r" / "study.md").read_text()
    assert "Registered variants: fixed before any point ran" in md
    assert "No choosing step" in md.split("## 7.")[0] and "passes every seed" not in md
    assert "confirm variants registered before any point ran" in md.split("## 7.")[1]


def test_efficient_baselines_are_paired_and_gated_like_the_deep_ensemble():
    """LoRA-Ensemble and BatchEnsemble in a point's evaluation: the Hydra is paired with each
    (per-seed differences and their bootstrap) and each is judged by the gates as the
    candidate, pooled once per seed like the Deep Ensemble."""
    from flows.study.report.collect import Collected
    from flows.study.report.gates import baseline_gates
    from flows.study.report.paired import paired_differences

    efficient = {"lora_ensemble": 23_000_000, "batch_ensemble": 22_100_000}
    points = []
    for s in SEEDS:
        p = make_point("fast", s)
        for name, parameters in efficient.items():
            p.evaluation["models"][name] = entry(DEEP[s], parameters, 3, True)
            p.evaluation["bootstrap"][name] = bootstrap(
                p.evaluation["models"]["hydra"], p.evaluation["models"][name]
            )
            p.latency[name] = 8.0
        points.append(p)
    col = Collected(points)
    paired = paired_differences(col)
    gated = baseline_gates(col)
    for name in efficient:
        near = paired["fast"][name]["near_ood.auroc"]
        assert [r["value"] for r in near["per_seed"]] == pytest.approx(
            [hydra_values("fast", s)[3] - DEEP[s][3] for s in SEEDS]
        )
        assert len(near["bootstrap"]) == len(SEEDS)
        # the Deep Ensemble's numbers: it passes where the Deep Ensemble passes
        assert gated[name]["seeds_passed"] == gated["deep_ensemble"]["seeds_passed"] == list(SEEDS)


def test_a_comparison_is_better_or_worse_only_where_holm_rejects():
    """The words follow the corrected test: a difference whose seeds agree tightly is `better`
    (or `worse`, by the metric's direction); two whose uncorrected p-values are below 5% but whose
    Holm-corrected ones are not are `no detectable difference`."""
    from flows.study.report.paired import NO_DIFFERENCE, worded_claims

    def diffs(values: list[float]) -> dict:
        return {**seed_stats(dict(enumerate(values))), "bootstrap": []}

    tight = [0.050, 0.051, 0.049, 0.050, 0.052]
    weak = [0.004, 0.036, 0.008, 0.032, 0.020]  # p ~ 0.035 alone
    by_baseline = {
        "single": {"near_ood.auroc": diffs(tight)},
        "deep_ensemble": {"near_ood.auroc": diffs(weak), "shift.nll": diffs(weak)},
        "naive_pruned": {"shift.nll": diffs([-x for x in tight]), "id_test.nll": diffs(tight)},
    }
    claims = worded_claims(by_baseline)
    tests = claims["baselines"]["tests"]
    assert claims["baselines"]["m"] == 3 and claims["twin"]["m"] == 2
    assert tests["single|near_ood.auroc"]["word"] == "better"
    for name in ("deep_ensemble|near_ood.auroc", "deep_ensemble|shift.nll"):
        assert tests[name]["p"] < 0.05 < tests[name]["p_holm"]
        assert tests[name]["word"] == NO_DIFFERENCE
    twin = claims["twin"]["tests"]
    assert twin["naive_pruned|shift.nll"]["word"] == "better"  # NLL down is better
    assert twin["naive_pruned|id_test.nll"]["word"] == "worse"  # NLL up is worse
    assert claim_word(True, 0.0, "auroc") == NO_DIFFERENCE
