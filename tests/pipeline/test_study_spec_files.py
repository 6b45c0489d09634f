"""The study specs of docs/study.md "Plan" load with the project's spec loader (flows.study.spec),
every key they set is a real param that reaches the points' params, the studies can run at one
commit without overwriting each other's experiments, and the full studies' candidates are exactly
the screening variants. No study runs: the loader validates every point's params."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from flows.study.spec import StudyPoint, load_study, study_points
from tasks.params import ConfigError, validate_params

REPO = Path(__file__).resolve().parents[2]
STUDIES = REPO / "benchmarks" / "studies"
#: The studies of docs/study.md "Plan": name -> (choosing seeds, confirmation seeds).
PLAN = {
    "text-evidence": ([0, 1, 2], [3, 4, 5]),
    "fashion-mnist-screen": ([10, 11], []),
    "brown-genres-screen": ([10, 11], []),
    "fashion-mnist": ([0, 1, 2], [3, 4, 5]),
    "brown-genres": ([0, 1, 2], [3, 4, 5]),
    "mpnet-bbc-news": ([], [3, 4, 5]),
    "mpnet-brown-genres": ([], [3, 4, 5]),
}
#: The 12-layer studies: name -> (variant prefix, data source).
BY_SIZE = {"mpnet-bbc-news": ("mp-", "bbc-news"), "mpnet-brown-genres": ("mpbg-", "brown-genres")}
#: Full study -> (its screening study, its variant prefix, the screening's prefix).
SCREENED = {
    "brown-genres": ("brown-genres-screen", "bg-", "bgs-"),
    "fashion-mnist": ("fashion-mnist-screen", "fm-", "fms-"),
}
#: A commented-out candidate variant of a full spec: ``  # bg-ncl: {...}``.
CANDIDATE = re.compile(r"^  # ((?:bg|fm)-[a-z0-9-]+): (\{.*\})$", re.MULTILINE)


def points_of(name: str, folder: Path = STUDIES) -> list[StudyPoint]:
    path = folder / f"{name}.yaml"
    return study_points(load_study(path), path.parent, REPO / "dvc.yaml")


def dotted(params: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        assert isinstance(params, dict) and part in params, f"{key}: not in the point's params"
        params = params[part]
    return params


@pytest.mark.parametrize("name", PLAN)
def test_each_plan_spec_loads_with_its_seeds_and_every_key_reaches_the_points(name):
    spec = load_study(STUDIES / f"{name}.yaml")
    assert spec.name == name
    assert (spec.seeds, spec.confirm_seeds) == PLAN[name]
    points = points_of(name)
    assert len(points) == len(spec.variants) * len(spec.all_seeds)
    for p in points:
        # a key the schema did not know would have failed to load; one a serializer dropped, or
        # that another layer overrode, would not hold the value the spec gave it
        for key, value in {**spec.sets, **spec.variants[p.variant]}.items():
            assert dotted(p.params, key) == value, (p.name, key)
        assert p.params["seed"] == p.seed
        assert p.params["data"]["seed"] == p.seed  # each seed draws its own split


def test_a_misspelt_key_fails_the_spec_in_one_line(tmp_path):
    text = (STUDIES / "brown-genres-screen.yaml").read_text()
    bad = text.replace("members.finetune.objective: ncl", "members.finetune.objectiv: ncl")
    assert bad != text
    (tmp_path / "bad.yaml").write_text(bad)
    with pytest.raises(ConfigError) as err:
        points_of("bad", tmp_path)
    message = str(err.value)
    assert "variant bgs-ncl" in message and "objectiv: unknown key" in message
    assert "\n" not in message


def test_the_plan_studies_share_no_experiment_name():
    # a point is the DVC experiment <variant>-seed<k> of the study's commit, pushed with -f: two
    # studies run at one commit with a shared name would overwrite each other's points
    names = [p.name for study in PLAN for p in points_of(study)]
    assert len(names) == len(set(names))
    for full, (screen, prefix, screen_prefix) in SCREENED.items():
        assert all(v.startswith(prefix) for v in load_study(STUDIES / f"{full}.yaml").variants)
        assert all(
            v.startswith(screen_prefix) for v in load_study(STUDIES / f"{screen}.yaml").variants
        )
        # screening never sees a split the full study chooses or confirms on
        assert not set(PLAN[screen][0]) & set(PLAN[full][0] + PLAN[full][1])


@pytest.mark.parametrize("full", SCREENED)
def test_the_full_studys_candidates_are_its_screening_variants(full, tmp_path):
    screen, prefix, screen_prefix = SCREENED[full]
    text = (STUDIES / f"{full}.yaml").read_text()
    screened = load_study(STUDIES / f"{screen}.yaml").variants
    candidates = dict(CANDIDATE.findall(text))
    chosen = load_study(STUDIES / f"{full}.yaml").variants
    assert f"{prefix}default" in chosen and chosen[f"{prefix}default"] == {}
    # every screening variant is a candidate (commented out until screening chose it) or chosen
    as_screened = {n.replace(prefix, screen_prefix, 1) for n in [*candidates, *chosen]}
    assert as_screened == set(screened)
    # uncommenting any candidates gives a valid spec whose variants equal the screening's
    (tmp_path / f"{full}.yaml").write_text(CANDIDATE.sub(r"  \1: \2", text))
    every = load_study(tmp_path / f"{full}.yaml").variants
    assert set(every) == set(chosen) | set(candidates)
    for name, overrides in every.items():
        assert overrides == screened[name.replace(prefix, screen_prefix, 1)], name
    assert len(points_of(full, tmp_path)) == len(every) * 6


@pytest.mark.parametrize("screen", ["brown-genres-screen", "fashion-mnist-screen"])
def test_the_screening_cost_variants_are_the_forms_they_name(screen):
    cfgs = {}
    for p in points_of(screen):
        if p.seed == PLAN[screen][0][0]:
            cfgs[p.variant.split("-", 1)[1]] = validate_params(p.params, root=REPO)
    default = cfgs["default"]
    assert default.merge.mode == "stack" and default.members.num_members == 3
    trunks = {k: c.shared_layers for k, c in cfgs.items() if re.fullmatch(r"trunk\d", k)}
    assert trunks["trunk0"] == 0  # the paper's merge: every layer pruned
    deeper = [k for k in trunks if k != "trunk0"]
    assert deeper and all(default.shared_layers < trunks[k] < default.model_layers for k in deeper)
    heads = next(c for k, c in cfgs.items() if re.fullmatch(r"heads\d", k))
    assert max(heads.member_head_budgets) < min(default.member_head_budgets)
    assert cfgs["avg-mlp"].merge.mode == "average"
    mixed = cfgs["mixed-heads"].member_head_budgets
    assert len(set(mixed)) == 3 and sum(mixed) == sum(default.member_head_budgets)
    assert cfgs["m5"].members.num_members == 5


@pytest.mark.parametrize("screen", ["brown-genres-screen", "fashion-mnist-screen"])
def test_a_screenings_variants_share_each_seeds_upstream_except_m5(screen):
    # members.num_members is a param of the baselines' stages: M = 5 has an upstream of its own
    points = points_of(screen)
    for seed in PLAN[screen][0]:
        keys = {p.variant: p.upstream for p in points if p.seed == seed}
        m5 = next(v for v in keys if v.endswith("-m5"))
        assert len({k for v, k in keys.items() if v != m5}) == 1
        assert keys[m5] not in {k for v, k in keys.items() if v != m5}
    assert len({p.upstream for p in points}) == 2 * len(PLAN[screen][0])


@pytest.mark.parametrize("name", BY_SIZE)
def test_the_12_layer_studies_register_the_minilm_variants_on_mpnet(name):
    """No choosing step: the variants are the text study's default and the paper's merge as the
    MiniLM-L6 study ran them, on all-mpnet-base-v2 (12 x 12), each point with its twin, the single
    model and a Deep Ensemble of 3; one upstream per seed, shared by both variants."""
    prefix, source = BY_SIZE[name]
    spec = load_study(STUDIES / f"{name}.yaml")
    minilm = load_study(STUDIES / "text-evidence.yaml").variants
    assert spec.registered
    assert {v.removeprefix(prefix): o for v, o in spec.variants.items()} == {
        k: minilm[k] for k in ("taylor-half", "taylor-s0")
    }
    points = points_of(name)
    for p in points:
        cfg = validate_params(p.params, root=REPO)
        assert (cfg.model.family, cfg.data.name) == ("mpnet", source)
        assert (cfg.model_layers, cfg.builds_deep_ensemble, cfg.deep_ensemble_size) == (12, True, 3)
    assert len({p.upstream for p in points}) == 3
