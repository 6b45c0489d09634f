"""tasks.params.schema: params.yaml validation, every problem one line naming its key; the
defaults; profiles resolve."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tasks.params import (
    PROFILES,
    ConfigError,
    load_params,
    resolve_params,
    validate_params,
    write_params,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("raw", "key", "words"),
    [
        ({"bogus": 1}, "bogus", "unknown key"),
        ({"members": {"bogus": 1}}, "members.bogus", "unknown key"),
        ({"members": {"num_members": 0}}, "members.num_members", "greater than or equal to 1"),
        ({"members": {"heads_per_layer": 13}}, "members.heads_per_layer", "12 heads"),
        (
            {"data": {"name": "digits"}, "members": {"heads_per_layer": 7}},
            "members.heads_per_layer",
            "6 heads",
        ),
        ({"data": {"name": "csv"}}, "data.path", "needs 'path'"),
        ({"data": {"name": "folder", "path": "/no/such/dir"}}, "data.path", "does not exist"),
        ({"gates": [{"metric": "accurasy", "threshold": 0.9}]}, "gates.0.metric", "unknown metric"),
        ({"gates": [{"metric": "auroc", "split": "id_test", "threshold": 0.9}]}, "gates.0", "OOD"),
        ({"gates": [{"metric": "nll"}]}, "gates.0", "exactly one of"),
        (
            {"gates": [{"metric": "compile_max_abs_diff", "threshold": "compile_tol"}]},
            "gates.0.threshold",
            "must be a number or 'compile_tolerance'",
        ),
        (
            {"gates": [{"metric": "accuracy", "threshold": "compile_tolerance"}]},
            "gates.0",
            "applies only to metric 'compile_max_abs_diff'",
        ),
        (
            {
                "gates": [
                    {
                        "metric": "compile_max_abs_diff",
                        "threshold": "compile_tolerance",
                        "greater_is_better": True,
                    }
                ]
            },
            "gates.0",
            "upper bound",
        ),
        ({"compile": {"precision": "int8"}}, "compile.precision", "'fp32', 'bf16', 'fp16'"),
        ({"model": {"family": "timm_vit"}}, "model.family", "image data.source"),
        ({"merge": {"shared_layers": 6}}, "merge.shared_layers", "6 layers"),
        ({"merge": {"shared_layers": -1}}, "merge.shared_layers", "greater than or equal to 0"),
    ],
)
def test_bad_params_give_one_line_naming_the_key(raw, key, words):
    with pytest.raises(ConfigError) as info:
        validate_params(raw)
    msg = str(info.value)
    assert len(msg.splitlines()) == 1, msg
    assert msg.startswith(f"params.yaml: {key}: "), msg
    assert words in msg


def test_several_problems_give_one_line_each():
    with pytest.raises(ConfigError) as info:
        validate_params({"bogus": 1, "members": {"num_members": 0}})
    lines = str(info.value).splitlines()
    assert sorted(line.split(": ")[1] for line in lines) == ["bogus", "members.num_members"]


def test_defaults_match_the_issue():
    cfg = validate_params({})
    assert cfg.data.name == "bbc-news" and cfg.family == "bert"
    assert cfg.members.num_members == 3 and cfg.heads_per_member == 4
    assert cfg.finetune.epochs == 3 and cfg.model.max_length == 64
    assert cfg.scoring.method == "taylor" and cfg.finetune_members  # the text study's choice
    assert not validate_params({"scoring": {"method": "circuit"}}).finetune_members
    assert cfg.merge.shared_layers is None and cfg.shared_layers == 3  # half of MiniLM's 6 layers
    assert validate_params({"data": {"name": "digits"}}).shared_layers == 2  # ViT depth 4
    assert validate_params({"merge": {"shared_layers": 0}}).shared_layers == 0  # the paper's merge
    names = {(g.split, g.metric, g.baseline, g.threshold) for g in cfg.gates}
    # every default quality check compares with a model the run builds: no absolute bound
    assert ("far_ood", "auroc", "deep_ensemble", None) in names
    assert ("near_ood", "auroc", "deep_ensemble", None) in names
    assert all(g.baseline is not None for g in cfg.gates if g.split != "model")
    tolerances = {(g.split, g.metric): g.tolerance for g in cfg.gates if g.baseline}
    assert tolerances[("id_test", "accuracy")] == 0.01
    assert tolerances[("id_test", "ece")] == 0.015
    # compile measures the precision it ships; the gate applies that precision's tolerance
    assert cfg.compile.backend == "auto" and cfg.compile.precision == "auto"
    assert ("model", "compile_max_abs_diff", None, "compile_tolerance") in names
    assert ("model", "compile_argmax_agreement", None, 1.0) in names
    assert cfg.compile.tolerance("fp32") == 1e-4 and cfg.compile.tolerance("bf16") == 2e-2
    quick = resolve_params("quick").compile
    assert quick.backend == "eager" and quick.precision == "auto"


def test_numeric_string_thresholds_still_parse():
    agreement = {"metric": "compile_argmax_agreement", "threshold": 1.0}
    cfg = validate_params(
        {"gates": [{"metric": "compile_max_abs_diff", "threshold": "1e-4"}, agreement]}
    )
    assert (
        cfg.gates[0].threshold == 1e-4
        and cfg.gates[0].name == "model.compile_max_abs_diff vs 0.0001"
    )


def test_taylor_variant_fine_tunes_members():
    assert validate_params({"scoring": {"method": "taylor"}}).finetune_members
    assert validate_params({"scoring": {"method": "taylor"}}).strategy == "overlap_penalty"


def test_profiles_and_overrides(tmp_path):
    assert set(PROFILES) >= {"default", "quick"}
    quick = resolve_params("quick", {"members": {"num_members": 2}}, {"seed": 5})
    assert quick.profile == "quick" and quick.finetune.epochs == 1
    assert quick.members.num_members == 2 and quick.seed == 5
    with pytest.raises(ConfigError, match="unknown profile"):
        resolve_params("fast")
    path = write_params(quick, tmp_path / "params.yaml")
    assert load_params(path) == quick  # resolved params round-trip


def test_repo_params_yaml_is_valid_and_resolved():
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    cfg = validate_params(raw)
    assert raw == cfg.model_dump(mode="json")


def test_missing_or_broken_file(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_params(tmp_path / "nope.yaml")
    (tmp_path / "p.yaml").write_text("members: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_params(tmp_path / "p.yaml")
