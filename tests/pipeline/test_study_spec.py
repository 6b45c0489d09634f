"""Issue 25's pieces outside the report: the study spec's per-seed splits and confirmation seeds,
the ``any_of`` gate groups that hold a Hydra against the cheaper models its run built, and the
cost record ``evaluate`` writes (real tiny torch models, no timing asserted)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest
import torch
import yaml

from tasks.gate import evaluate_check
from tasks.params import TWIN_GROUP, ConfigError, GateCheck, default_gates, validate_params
from tasks.twin_gate import resolve_any_of

STUB_DVC = Path(__file__).parent / "study_stub" / "dvc.yaml"


def _spec(tmp_path: Path, **extra) -> Path:
    spec = {"name": "s", "profile": "quick", "variants": {"a": {}, "b": {}}, "seeds": [0, 1]}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({**spec, **extra}))
    return path


def test_each_seed_draws_its_own_split_unless_data_seed_is_pinned(tmp_path):
    from flows.study.spec import load_study, study_points

    def data_seeds(path: Path) -> dict[str, int]:
        points = study_points(load_study(path), path.parent, STUB_DVC)
        return {p.name: p.params["data"]["seed"] for p in points}

    assert data_seeds(_spec(tmp_path)) == {"a-seed0": 0, "a-seed1": 1, "b-seed0": 0, "b-seed1": 1}
    pinned = _spec(tmp_path, sets={"data.seed": 7})
    assert set(data_seeds(pinned).values()) == {7}
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({"data": {"seed": 3}}))
    assert set(data_seeds(_spec(tmp_path, params="base.yaml")).values()) == {3}
    one_variant = _spec(tmp_path, variants={"a": {"data.seed": 5}, "b": {}})
    assert data_seeds(one_variant) == {"a-seed0": 5, "a-seed1": 5, "b-seed0": 0, "b-seed1": 1}
    # the points of one seed still share their upstream (same data, same base)
    points = study_points(load_study(_spec(tmp_path)), tmp_path, STUB_DVC)
    by_seed = {}
    for p in points:
        by_seed.setdefault(p.seed, set()).add(p.upstream)
    assert (
        all(len(keys) == 1 for keys in by_seed.values()) and len(set.union(*by_seed.values())) == 2
    )


def test_confirmation_seeds_are_run_and_must_be_held_out(tmp_path):
    from flows.study.spec import load_study, study_points

    spec = load_study(_spec(tmp_path, confirm_seeds=[5]))
    assert spec.all_seeds == [0, 1, 5]
    points = study_points(spec, tmp_path, STUB_DVC)
    assert sorted({p.seed for p in points}) == [0, 1, 5]
    assert {p.params["data"]["seed"] for p in points if p.seed == 5} == {5}
    with pytest.raises(ConfigError, match="confirm_seeds must not repeat seeds: \\[1\\]"):
        load_study(_spec(tmp_path, confirm_seeds=[1, 4]))


def _entry(nll: float, ece: float, auroc: float, shift_nll: float) -> dict:
    return {
        "parameters": 10,
        "calibrated": {
            "id_test": {"accuracy": 0.9, "nll": nll, "ece": ece},
            "shift": {"accuracy": 0.8, "nll": shift_nll},
            "near_ood": {"auroc": auroc},
            "far_ood": {"auroc": 0.99},
        },
    }


def _evaluation(hydra: dict, twin: dict, single: dict, half: float) -> dict:
    """An evaluation with paired bootstrap intervals of Hydra minus each baseline, +-half."""
    ev = {"models": {"hydra": hydra, "naive_pruned": twin, "single": single}, "bootstrap": {}}
    ev["models"]["deep_ensemble"] = copy.deepcopy(hydra)
    for name in ("naive_pruned", "single", "deep_ensemble"):
        out: dict = {}
        for split, metrics in hydra["calibrated"].items():
            for m, v in metrics.items():
                d = v - ev["models"][name]["calibrated"][split][m]
                w = 0.0 if name == "deep_ensemble" else half
                out.setdefault(split, {})[m] = {"low": d - w, "high": d + w, "difference": d}
        ev["bootstrap"][name] = {"calibrated": out}
    return ev


def _verdict(ev: dict) -> dict[str, dict]:
    gates = [GateCheck(**g) for g in default_gates() if not g["metric"].startswith("compile")]
    checks = resolve_any_of(gates, [evaluate_check(g, ev, None) for g in gates], ev)
    return {c["name"]: c for c in checks}


def test_no_default_gate_passes_a_hydra_its_cheaper_twin_matches():
    """The property of issue 25: the same Hydra passes the default gates when its paired
    bootstrap separates it from its naive pruned twin, and fails them when the twin is the same
    model (a zero-width interval at 0) or when the difference is inside the test-set noise."""
    single = _entry(0.40, 0.05, 0.80, 0.50)
    hydra = _entry(0.30, 0.03, 0.85, 0.40)
    good = _verdict(_evaluation(hydra, _entry(0.36, 0.04, 0.82, 0.45), single, half=0.01))
    assert all(c["status"] == "passed" for c in good.values()), good
    assert good["id_test.nll vs naive_pruned"]["better"] is True

    for twin, half in ((copy.deepcopy(hydra), 0.0), (_entry(0.305, 0.031, 0.849, 0.41), 0.02)):
        bad = _verdict(_evaluation(hydra, twin, single, half))
        group = [c for c in bad.values() if c.get("any_of") == TWIN_GROUP]
        assert len(group) == 4 and all(c["status"] == "failed" for c in group)
        assert all(not c["better"] for c in group)
        assert "better than naive_pruned on none of" in group[0]["note"]
        # the rest of the gates pass: the twin group alone catches it
        assert all(c["status"] == "passed" for c in bad.values() if c.get("any_of") != TWIN_GROUP)


def test_the_default_gates_hold_the_hydra_against_the_single_model_too():
    single = _entry(0.30, 0.03, 0.80, 0.415)
    hydra = _entry(0.30, 0.03, 0.85, 0.40)  # shift NLL 0.015 better: inside +-0.02 noise
    v = _verdict(_evaluation(hydra, _entry(0.40, 0.05, 0.80, 0.50), single, half=0.02))
    assert v["shift.nll vs single"]["status"] == "failed"
    assert "any_of 'beats single'" in v["shift.nll vs single"]["note"]


def test_a_group_member_worse_beyond_tolerance_fails_even_when_another_is_better():
    single = _entry(0.40, 0.05, 0.80, 0.50)
    hydra = _entry(0.30, 0.03, 0.85, 0.40)
    twin = _entry(0.36, 0.04, 0.90, 0.45)  # near-OOD AUROC 0.05 worse than its twin
    v = _verdict(_evaluation(hydra, twin, single, half=0.01))
    assert v["near_ood.auroc vs naive_pruned"]["status"] == "failed"
    assert v["id_test.nll vs naive_pruned"]["status"] == "passed"


def test_any_of_needs_a_baseline_and_is_left_out_of_the_dump():
    with pytest.raises(ValueError, match="'any_of' needs a baseline other than 'prod'"):
        GateCheck(metric="nll", threshold=1.0, any_of="x")
    plain = GateCheck(metric="nll", baseline="single", tolerance=0.1)
    assert "any_of" not in plain.model_dump()
    dumped = validate_params({}).model_dump(mode="json")["gates"]
    assert sum(g.get("any_of") == TWIN_GROUP for g in dumped) == 4


def test_the_cost_record_times_every_model_in_one_process():
    from tasks.cost import measure_cost

    torch.manual_seed(0)
    x = torch.randn(4, 16)
    small, big = torch.nn.Linear(16, 16), torch.nn.Linear(16, 64)
    models = [
        ("hydra", lambda: (small(x), small(x)), 2 * 272),
        ("single", lambda: small(x), 272),
        ("deep_ensemble", lambda: big(x), 1088),
    ]
    cost = measure_cost(models, rounds=3, batch=4, precision="fp32")
    assert cost["reference"] == "single" and cost["pid"] == os.getpid() and cost["rounds"] == 3
    m = cost["models"]
    assert sorted(m) == ["deep_ensemble", "hydra", "single"]
    assert m["single"]["ratio"] == 1.0 and m["single"]["ratio_low"] == 1.0
    assert m["hydra"]["flops"] == 2 * 2 * 4 * 16 * 16 and m["hydra"]["flops_ratio"] == 2.0
    assert (
        m["deep_ensemble"]["flops_ratio"] == 4.0 and m["deep_ensemble"]["parameters_ratio"] == 4.0
    )
    for e in m.values():
        assert e["ratio_low"] <= e["ratio"] <= e["ratio_high"] and e["median_ms"] > 0


def test_real_prepare_data_draws_another_split_per_seed_unless_pinned(tmp_path):
    """The quick profile's real ``prepare_data`` for the points of seeds 0 and 1: train/val/
    test membership, the shift corruption and the far-OOD sample all differ (file hashes); a
    pinned spec gives seed 1 the data params of seed 0, i.e. the same split."""
    from flows.study.spec import load_study, study_points
    from tasks import prepare_data
    from tasks.params import validate_params

    small = {"data.max_per_split": 40, "data.far_ood_size": 20}
    points = study_points(load_study(_spec(tmp_path, sets=small)), tmp_path, STUB_DVC)
    pinned_spec = _spec(tmp_path, sets={**small, "data.seed": 0})
    pinned = study_points(load_study(pinned_spec), tmp_path, STUB_DVC)
    by_name = {p.name: p for p in points}
    assert {p.name: p.params["data"] for p in pinned}["a-seed1"] == by_name["a-seed0"].params[
        "data"
    ]
    hashes = {}
    for name in ("a-seed0", "a-seed1"):
        root = tmp_path / name
        prepare_data.run(validate_params(by_name[name].params), root)
        manifest = json.loads((root / "data/prepared/manifest.json").read_text())
        hashes[name] = {s: info["sha256"] for s, info in manifest["splits"].items()}
    for split in ("train", "val", "test", "shift", "far_ood"):
        assert hashes["a-seed0"][split] != hashes["a-seed1"][split], split
