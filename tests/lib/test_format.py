"""hydra_ops.hydra.format: a hydra.json inconsistent with itself or with its weights is refused,
in one line, before anything is built."""

import json

import pytest
import torch
from tiny_models import make_members, member_plans, positional, tiny_inputs

from hydra_ops.hydra.merge import merge_members
from hydra_ops.hydra.serialization import (
    HydraFormatError,
    load_hydra,
    read_hydra_config,
    save_hydra,
)


# ----- hydra.json consistency and content hashes ------------------------------------------------
def saved_three(tmp_path, family="bert", **merge_kwargs):
    """A saved 3-member model (temperature 1.7) and the model itself."""
    hydra = merge_members(make_members(family, member_plans(3), fine_tuned=True), **merge_kwargs)
    hydra.set_temperature(1.7)
    return save_hydra(hydra, tmp_path / "m", metadata={"run": 1}), hydra


def edit_config(directory, edit):
    """Rewrite ``directory/hydra.json`` with ``edit(config)`` applied (weights untouched)."""
    path = directory / "hydra.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config, indent=2, sort_keys=True))


def refusal(directory, **kwargs) -> str:
    """The one-line message ``load_hydra`` refuses ``directory`` with."""
    with pytest.raises(HydraFormatError) as info:
        load_hydra(directory, **kwargs)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def test_plans_cut_from_three_to_one_are_refused(tmp_path):
    directory, _ = saved_three(tmp_path)
    edit_config(directory, lambda c: c["architecture"].update(plans=c["architecture"]["plans"][:1]))
    message = refusal(directory)
    assert str(directory / "hydra.json") in message
    assert "architecture.plans: found 1 plan(s), expected 3 (architecture.num_members)" in message


def test_members_and_plans_cut_together_are_refused_by_the_head_counts(tmp_path):
    directory, _ = saved_three(tmp_path)

    def cut(config):
        arch = config["architecture"]
        arch.update(plans=arch["plans"][:1], num_members=1)

    edit_config(directory, cut)
    message = refusal(directory)
    assert "architecture.blocks[0].attention.head_counts: found 3 count(s), expected 1" in message


def test_edited_temperature_is_refused(tmp_path):
    directory, hydra = saved_three(tmp_path)
    recorded = read_hydra_config(directory)["temperature"]
    assert recorded == float(hydra.temperature)
    # 1.7 rounds to the same float32 as the buffer but is not the value the model uses.
    for edited in (2.5, 1.7):
        edit_config(directory, lambda c, value=edited: c.update(temperature=value))
        message = refusal(directory)
        assert f"temperature: found {edited!r}, expected {recorded!r}" in message
        assert "the temperature buffer in model.safetensors, which the model uses" in message


def test_edited_class_count_or_names_are_refused(tmp_path):
    directory, _ = saved_three(tmp_path)
    edit_config(directory, lambda c: c["architecture"].update(num_classes=4))
    message = refusal(directory)
    assert "architecture.num_classes: found 4, expected 3" in message
    assert "head.classifier.weight has shape (3, 3, 32)" in message
    edit_config(directory, lambda c: c["architecture"].update(num_classes=3, class_names=["a"]))
    assert "architecture.class_names: found 1 names, expected 3" in refusal(directory)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            lambda a: a["plans"][1].update({"2": [0, 1, 2, 4]}),
            "architecture.plans[1]['2']: found head 4, expected indices 0..3",
        ),
        (
            lambda a: a["plans"][1].update({"2": [0, 1]}),
            "architecture.plans[1]['2']: found 2 head(s) [0, 1], expected 4 "
            "(architecture.blocks[2].attention.head_counts)",
        ),
        (
            lambda a: a["plans"][0].pop("2"),
            "architecture.plans[0]: found 2 layer(s), expected 3",
        ),
        (
            lambda a: a["blocks"].pop(),
            "architecture.plans[0]: found 3 layer(s), expected 2",
        ),
        (lambda a: a.update(mode="bagging"), "architecture.mode: found 'bagging', expected one of"),
        (
            lambda a: a["blocks"][1]["attention"].update(implementation="flash"),
            "architecture.blocks[1].attention.implementation: found 'flash', expected one of",
        ),
        (lambda a: a.update(family="gpt2"), "architecture.family: found 'gpt2', expected one of"),
        (lambda a: a.update(mode="average"), "expected false (architecture.mode is 'average')"),
        (
            lambda a: a["blocks"][0]["mlp"].update(hidden=16),
            "architecture: found 'blocks.0.mlp.fc1.bias' of shape (3, 16), expected (3, 64)",
        ),
        (lambda a: a.pop("head_dim"), "architecture.head_dim: found nothing (field missing)"),
    ],
)
def test_inconsistent_architecture_is_refused_with_one_line(tmp_path, edit, expected):
    directory, _ = saved_three(tmp_path)
    edit_config(directory, lambda c: edit(c["architecture"]))
    message = refusal(directory)
    assert message.startswith(f"{directory / 'hydra.json'}: ")
    assert expected in message


def test_edited_dtype_is_refused(tmp_path):
    directory, _ = saved_three(tmp_path)
    edit_config(directory, lambda c: c.update(dtype="float16"))
    assert "dtype: found 'float16', expected 'float32'" in refusal(directory)
    edit_config(directory, lambda c: c.update(dtype="int8"))
    assert "dtype: found 'int8', expected a torch floating-point dtype name" in refusal(directory)


def test_shared_trunk_round_trips_and_is_checked(tmp_path):
    base = merge_members(
        make_members("bert", member_plans(3, unequal=False), fine_tuned=False),
        mode="average",
        shared_layers=1,
    )
    directory = save_hydra(base, tmp_path / "m")
    loaded = load_hydra(directory)
    batch = tiny_inputs("bert", 4)
    with torch.no_grad():
        assert torch.equal(base(*positional(batch)), loaded(*positional(batch)))
    edit_config(directory, lambda c: c["architecture"]["trunk"][0].update(trunk=False))
    assert "architecture.trunk[0].trunk: found False, expected True" in refusal(directory)
