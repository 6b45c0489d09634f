"""The diversity mechanisms and figures in the pipeline, on tiny digits projects (a 3-layer,
4-head, width-32 ViT; stage functions called directly, CPU fp32, one thread).

- With every mechanism off, a member fine-tune is the one of the code before them (checksums).
- ``members.finetune.data``: what each member trains on (full / bootstrap / shards).
- M = 5 with per-member head budgets, shards and the NCL objective: plans of the given sizes, an
  exact merge, and evaluate's diversity figures for every multi-member model and the report.
"""

from __future__ import annotations

import contextlib
import json
import platform
from pathlib import Path

import pytest
import torch

from tasks.params import ConfigError, resolve_params

SETS = {
    "data.name": "digits",
    "data.max_per_split": 48,
    "data.far_ood_size": 32,
    "model.vit.embed_dim": 32,
    "model.vit.depth": 3,
    "model.vit.num_heads": 4,
    "finetune.epochs": 1,
    "scoring.method": "taylor",
    "members.finetune.enabled": True,
    "merge.shared_layers": 1,
    "runtime.device": "cpu",
}
#: ``weights_hash`` of the default project's models, written by the code before the mechanisms
#: (main at 51cbac6) on :data:`WRITTEN_ON`, one thread.
REFERENCE = {
    "base": "1714acb41b36ee92c798284691abecb46bbab06d8329252a9b59c6eb94139709",
    "member_0": "f056a358cc59066f15803e2172e1bc91f0634883b06ff851100524e84623db9b",
    "control_0": "f885a86c34957f133da09be77af0d6d8ee1fee0a8eedb43f86e89ffcddf7ce42",
}
WRITTEN_ON = "AVX512 AuthenticAMD"


def _cpu_kind() -> str:
    """torch's CPU capability and the CPU vendor: bit-identical floats only on the same kind."""
    vendor = platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                vendor = line.split(":", 1)[1].strip()
                break
    return f"{torch.backends.cpu.get_cpu_capability()} {vendor}"


@contextlib.contextmanager
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _upstream(cfg, root: Path) -> None:
    from tasks import finetune_base, prepare_data, score_heads, select_members

    for stage in (prepare_data, finetune_base, score_heads, select_members):
        stage.run(cfg, root)


@pytest.fixture(scope="module")
def default_project(tmp_path_factory):
    from tasks import finetune_members

    root = tmp_path_factory.mktemp("diversity_default")
    cfg = resolve_params("quick", sets=SETS)
    with _one_thread():
        _upstream(cfg, root)
        finetune_members.build_member(cfg, root, 0)
    return cfg, root


def test_with_the_mechanisms_off_a_member_fine_tune_is_unchanged(default_project):
    """The default member recipe, its fingerprint inputs and (on the CPU kind that wrote them)
    the very weights of the code before the mechanisms."""
    from hydra_ops.models.checkpoints import weights_hash
    from tasks.params import to_raw
    from tasks.runtime.layout import BASE, MEMBERS

    cfg, root = default_project
    assert cfg.members.finetune.model_dump(exclude={"max_parallel", "controls"}) == {
        "enabled": True,
        "epochs": 1,
        "lr": None,
        "seed_offset": 100,
    }
    assert set(to_raw(cfg)["members"]["finetune"]) == {
        "enabled",
        "epochs",
        "lr",
        "seed_offset",
        "max_parallel",
        "controls",
    }
    if _cpu_kind() != WRITTEN_ON:
        pytest.skip(f"the reference weights were written on {WRITTEN_ON}, this is {_cpu_kind()}")
    assert weights_hash(root / BASE) == REFERENCE["base"]
    assert weights_hash(root / MEMBERS / "member_0") == REFERENCE["member_0"]
    assert weights_hash(root / MEMBERS / "control_0") == REFERENCE["control_0"]


def _seen(batches_fn) -> list[bytes]:
    """Every training example of epoch 0, as its pixel bytes."""
    return [row.numpy().tobytes() for b in batches_fn(0) for row in b["pixel_values"]]


def test_member_data_full_bootstrap_and_shards(default_project):
    from hydra_ops.models.runtime import Runtime
    from tasks.finetune_members import member_seed, member_train_batches
    from tasks.runtime.data import split, train_batches

    cfg, root = default_project
    rt = Runtime()
    n = len(split(root, "train"))
    full = [member_train_batches(cfg, root, m, rt) for m in range(3)]
    # full: tasks.runtime.data.train_batches itself, the same examples for every member
    reference = train_batches(cfg, root, member_seed(cfg, 1))(0)
    for got, want in zip(full[1](0), reference, strict=True):
        assert all(torch.equal(got[k], want[k]) for k in want)
    assert all(sorted(_seen(f)) == sorted(_seen(full[0])) for f in full)

    boot_cfg = resolve_params("quick", sets={**SETS, "members.finetune.data": "bootstrap"})
    boot = [_seen(member_train_batches(boot_cfg, root, m, rt)) for m in range(3)]
    assert all(len(b) == n for b in boot)
    assert sorted(boot[0]) != sorted(boot[1]) and sorted(boot[1]) != sorted(boot[2])

    shard_cfg = resolve_params("quick", sets={**SETS, "members.finetune.data": "shards"})
    shards = [_seen(member_train_batches(shard_cfg, root, m, rt)) for m in range(3)]
    assert sorted(len(s) for s in shards) == [n // 3, n // 3, n - 2 * (n // 3)]
    assert sorted(shards[0] + shards[1] + shards[2]) == sorted(_seen(full[0]))  # disjoint, all


def test_each_mechanism_changes_the_member_fingerprint(default_project):
    """A member trained with a mechanism is never mistaken for a cached default member."""
    from hydra_ops.models.runtime import Runtime
    from tasks.finetune_members import _unit_fingerprint

    _, root = default_project

    def fp(**sets):
        c = resolve_params("quick", sets={**SETS, **sets})
        return _unit_fingerprint(c, root, "member", [[0]], 0, Runtime())

    prints = {
        fp(),
        fp(**{"members.finetune.data": "bootstrap"}),
        fp(**{"members.finetune.data": "shards"}),
        fp(**{"members.finetune.objective": "ncl"}),
        fp(**{"members.finetune.objective": "ncl", "members.finetune.ncl_strength": 1.0}),
    }
    assert len(prints) == 5
    # shard m of 3 is not shard m of 4
    four = {"members.finetune.data": "shards", "members.num_members": 4}
    assert fp(**four) != fp(**{"members.finetune.data": "shards"})
    assert fp(**{"members.finetune.data": "full", "members.finetune.objective": "ce"}) == fp()


def test_per_member_sizes_are_checked_against_the_members():
    with pytest.raises(ConfigError, match=r"members\.heads_per_layer.*3 entries.*num_members = 2"):
        resolve_params(
            "quick", sets={**SETS, "members.num_members": 2, "members.heads_per_layer": [1, 2, 3]}
        )
    with pytest.raises(ConfigError, match=r"members\.heads_per_layer.*other than circuits"):
        resolve_params(
            "quick",
            sets={**SETS, "members.heads_per_layer": [1, 2, 1], "members.strategy": "circuits"},
        )
    with pytest.raises(ConfigError, match=r"members\.heads_per_layer"):
        resolve_params("quick", sets={**SETS, "members.heads_per_layer": []})
    with pytest.raises(ConfigError, match=r"members\.heads_per_layer.*5 > the model's 4 heads"):
        resolve_params("quick", sets={**SETS, "members.heads_per_layer": [1, 5, 2]})
    cfg = resolve_params("quick", sets={**SETS, "members.heads_per_layer": [1, 3, 2]})
    assert cfg.member_head_budgets == [1, 3, 2] and cfg.heads_per_member == 3


# ----- M = 5, every mechanism on, evaluated ------------------------------------------------------
DIVERSE = {
    **SETS,
    "members.num_members": 5,
    "members.heads_per_layer": [1, 2, 1, 3, 2],
    "members.finetune.data": "shards",
    "members.finetune.objective": "ncl",
    "baselines.deep_ensemble_size": 2,
    "baselines.mc_dropout.samples": 3,
}


@pytest.fixture(scope="module")
def diverse_project(tmp_path_factory):
    from tasks import (
        baseline_logits,
        calibrate,
        evaluate,
        finetune_baselines,
        finetune_members,
        merge,
    )
    from tasks import compile as compile_stage

    root = tmp_path_factory.mktemp("diversity_m5")
    cfg = resolve_params("quick", sets=DIVERSE)
    with _one_thread():
        _upstream(cfg, root)
        for stage in (
            finetune_baselines,
            baseline_logits,
            finetune_members,
            merge,
            calibrate,
            compile_stage,
        ):
            stage.run(cfg, root)
        ev = evaluate.run(cfg, root)
    return cfg, root, ev


def test_five_members_of_their_own_sizes_merge_exactly(diverse_project):
    from hydra_ops.heads.plans import load_plans
    from hydra_ops.hydra.serialization import load_hydra
    from hydra_ops.models.checkpoints import load_member
    from tasks.runtime.data import batches, split
    from tasks.runtime.layout import BASE, MEMBERS, MERGED, PLANS

    cfg, root, _ = diverse_project
    plans = load_plans(root / PLANS / "plans.json")
    assert [p.num_kept() for p in plans] == [[4, k, k] for k in (1, 2, 1, 3, 2)]
    members = [load_member(root / MEMBERS / f"member_{m}", root / BASE) for m in range(5)]
    # shards: each member trained on its fifth of the split (one batch of 16 for ~10 examples)
    done = [
        json.loads((root / MEMBERS / f"member_{m}" / "done.json").read_text()) for m in range(5)
    ]
    assert all(d["info"]["train"]["steps"] == 1 for d in done)
    hydra = load_hydra(root / MERGED).eval()
    batch = batches(cfg, split(root, "test"), 16, with_labels=False)[0]
    with torch.no_grad():
        logits = hydra(batch["pixel_values"])
        separate = torch.stack([m(batch["pixel_values"]) for m in members], dim=1)
    assert logits.shape == (16, 5, len(split(root, "test").classes))
    dp = (logits.softmax(-1) - separate.softmax(-1)).abs().max().item()
    assert dp <= 1e-5, dp


def test_evaluate_reports_member_diversity_for_every_multi_member_model(diverse_project):
    from hydra_ops.models.runtime import Runtime
    from hydra_ops.uq.diversity import pairwise_summary
    from tasks.candidates.baseline_models import eval_batches
    from tasks.candidates.compared import build_candidates
    from tasks.runtime.data import split

    cfg, root, ev = diverse_project
    multi = {n for n, e in ev["models"].items() if e["members"] > 1}
    assert multi == {"hydra", "deep_ensemble", "mc_dropout", "control"}
    for name, entry in ev["models"].items():
        if name not in multi:
            assert entry["diversity"] is None, name
            continue
        d = entry["diversity"]
        assert set(d) == {"id_test", "near_ood"}
        assert d["id_test"]["members"] == entry["members"]
        assert "correctness_correlation" in d["id_test"]
        assert "correctness_correlation" not in d["near_ood"]
        assert 0.0 <= d["near_ood"]["disagreement"] <= 1.0
    # the Hydra's figures are those of its member logits
    cands = {c.name: c for c in build_candidates(cfg, root, Runtime())[0]}
    batched = eval_batches(cfg, root)
    test_labels = torch.as_tensor(split(root, "test").labels, dtype=torch.long)
    want = pairwise_summary(cands["hydra"].member_logits(batched["test"]), test_labels)
    got = ev["models"]["hydra"]["diversity"]["id_test"]
    assert got["matrices"]["disagreement"] == want["matrices"]["disagreement"]  # votes: exact
    for key in ("disagreement", "probability_correlation", "correctness_correlation"):
        # evaluate ran on one thread: the last bits of a probability may differ from here
        assert (got[key] is None) == (want[key] is None), key
        assert got[key] is None or got[key] == pytest.approx(want[key], abs=1e-6), key
    overlap = ev["plan_overlap"]
    assert overlap["num_members"] == 5 and overlap["jaccard_per_layer"][0] == 1.0
    pruned = overlap["jaccard_per_layer"][1:]
    assert overlap["jaccard_mean_pruned_layers"] == pytest.approx(sum(pruned) / len(pruned))
    report = (root / "reports" / "evaluate.md").read_text()
    assert "## Member diversity" in report
    rows = [line for line in report.splitlines() if line.startswith("| hydra | 5 |")]
    assert len(rows) == 1 and f"{overlap['jaccard_mean_pruned_layers']:.3f}" in rows[0]
    section = report.split("## Member diversity")[1].split("\n## ")[0]
    assert "| deep_ensemble | 2 |" in section and "| single |" not in section


def test_the_report_section_shows_undefined_figures_and_skips_old_evaluations():
    from tasks.evaluation.member_diversity import diversity_section, diversity_table

    split = {"disagreement": 0.25, "probability_correlation": 0.5}
    entry = {
        "members": 3,
        "diversity": {
            "id_test": {**split, "correctness_correlation": None},
            "near_ood": {**split, "disagreement": 0.75},
        },
        "ood_by_score": {"near_ood": {"msp": {"auroc": 0.8}, "disagreement": {"auroc": 0.6}}},
    }
    result = {
        "models": {"hydra": entry, "single": {"members": 1, "diversity": None}},
        "plan_overlap": {"jaccard_mean_pruned_layers": 0.125},
    }
    table = diversity_table(result).splitlines()
    assert table[0].endswith("| near AUROC msp | near AUROC disagreement |")
    assert table[2] == "| hydra | 3 | 0.250 / 0.750 | 0.500 / 0.500 | - | 0.125 | 0.800 | 0.600 |"
    assert len(table) == 3  # the one-member model has no row
    # an evaluate.json from before the diversity figures: no section, the rest of the report stays
    assert diversity_section({"models": {"hydra": {"members": 3}}}) == []
