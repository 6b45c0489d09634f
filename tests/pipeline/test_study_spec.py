"""flows.study.spec: a study spec loaded, its points' params resolved: per-seed splits unless
``data.seed`` is pinned, confirmation seeds held out, points of one seed sharing an upstream."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tasks.params import ConfigError, validate_params

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
    assert spec.all_seeds == [0, 1, 5] and not spec.registered
    registered = load_study(_spec(tmp_path, seeds=[], confirm_seeds=[3, 4]))
    assert registered.registered and registered.all_seeds == [3, 4]
    with pytest.raises(ConfigError, match="a study needs a seed"):
        load_study(_spec(tmp_path, seeds=[]))
    points = study_points(spec, tmp_path, STUB_DVC)
    assert sorted({p.seed for p in points}) == [0, 1, 5]
    assert {p.params["data"]["seed"] for p in points if p.seed == 5} == {5}
    with pytest.raises(ConfigError, match="confirm_seeds must not repeat seeds: \\[1\\]"):
        load_study(_spec(tmp_path, confirm_seeds=[1, 4]))


def test_only_selects_points_by_name_pattern_and_refuses_a_pattern_matching_none(tmp_path):
    from flows.study.spec import load_study, select_points, study_points

    points = study_points(load_study(_spec(tmp_path, confirm_seeds=[5])), tmp_path, STUB_DVC)
    assert select_points(points, []) == points
    assert [p.name for p in select_points(points, ["b-seed[15]"])] == ["b-seed1", "b-seed5"]
    picked = select_points(points, ["a-seed5", "b-*"])
    assert [p.name for p in picked] == ["a-seed5", "b-seed0", "b-seed1", "b-seed5"]
    with pytest.raises(ConfigError, match="--only 'c-seed5' matches no point of the study"):
        select_points(points, ["a-*", "c-seed5"])


def test_real_prepare_data_draws_another_split_per_seed_unless_pinned(tmp_path):
    """The quick profile's real ``prepare_data`` for the points of seeds 0 and 1: train/val/
    test membership, the shift corruption and the far-OOD sample all differ (file hashes); a
    pinned spec gives seed 1 the data params of seed 0, i.e. the same split."""
    from flows.study.spec import load_study, study_points
    from tasks import prepare_data

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
