"""hydra_ops.hydra.serialization: save_hydra / load_hydra round trips, tampering detected,
expected content hashes, no network and no base weights needed to load."""

import hashlib
import json
import subprocess
import sys

import pytest
import torch
from tiny_models import FAMILIES, make_members, member_plans, positional, tiny_inputs

from hydra_ops.hydra.merge import merge_members
from hydra_ops.hydra.serialization import (
    HydraFormatError,
    config_sha256,
    load_hydra,
    read_hydra_config,
    save_hydra,
    weights_sha256,
)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", ["stack", "average"])
def test_round_trip_is_bit_exact(tmp_path, family, mode):
    hydra = merge_members(make_members(family, member_plans(3), fine_tuned=True), mode)
    hydra.set_temperature(1.7)
    save_hydra(hydra, tmp_path / "m", base_weights_hash="abc123", metadata={"run": 1})
    loaded = load_hydra(tmp_path / "m")
    batch = tiny_inputs(family, 5)
    with torch.no_grad():
        assert torch.equal(hydra(*positional(batch)), loaded(*positional(batch)))
    assert float(loaded.temperature) == pytest.approx(1.7)
    assert [p.kept for p in loaded.plans] == [p.kept for p in hydra.plans]
    for key, value in hydra.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key
    config = read_hydra_config(tmp_path / "m")
    assert config["base_weights_hash"] == "abc123"
    assert config["architecture"]["mode"] == mode
    assert {"torch", "transformers", "safetensors"} <= set(config["library_versions"])


def test_load_needs_no_base_weights_or_network(tmp_path):
    hydra = merge_members(make_members("bert", member_plans(2), fine_tuned=True))
    save_hydra(hydra, tmp_path / "m")
    code = (
        "import socket, sys\n"
        "def no_network(*a, **k): raise RuntimeError('network used')\n"
        "socket.socket.connect = no_network\n"
        "from hydra_ops.hydra.serialization import load_hydra\n"
        f"m = load_hydra({str(tmp_path / 'm')!r})\n"
        "print(m.num_members)\n"
    )
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2"


def saved(tmp_path):
    hydra = merge_members(make_members("timm_vit", member_plans(2), fine_tuned=True))
    return save_hydra(hydra, tmp_path / "m")


def test_truncated_weights_are_detected(tmp_path):
    directory = saved(tmp_path)
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(HydraFormatError, match="truncated or was modified"):
        load_hydra(directory)


def test_tampered_weights_are_detected(tmp_path):
    directory = saved(tmp_path)
    weights = directory / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(HydraFormatError, match="does not match"):
        load_hydra(directory)


def test_tampered_or_missing_config_is_detected(tmp_path):
    directory = saved(tmp_path)
    config = directory / "hydra.json"
    config.write_text(config.read_text()[:50])
    with pytest.raises(HydraFormatError, match="not valid JSON"):
        load_hydra(directory)
    config.write_text(json.dumps({"format": "other"}))
    with pytest.raises(HydraFormatError, match="format must be"):
        load_hydra(directory)
    with pytest.raises(HydraFormatError, match="not found"):
        load_hydra(tmp_path / "nowhere")


def test_no_temporary_files_are_left_behind(tmp_path):
    directory = saved(tmp_path)
    assert sorted(p.name for p in directory.iterdir()) == ["hydra.json", "model.safetensors"]


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


def test_expected_hashes_refuse_an_edited_config_or_weights(tmp_path):
    directory, _ = saved_three(tmp_path)
    config_hash, weights_hash = config_sha256(directory), weights_sha256(directory)
    assert config_hash == hashlib.sha256((directory / "hydra.json").read_bytes()).hexdigest()
    load_hydra(directory, expected_config_sha256=config_hash, expected_weights_sha256=weights_hash)
    # An edit that keeps hydra.json consistent (metadata) is still refused by the recorded hash.
    edit_config(directory, lambda c: c["metadata"].update(run=2))
    assert load_hydra(directory).num_members == 3
    message = refusal(directory, expected_config_sha256=config_hash)
    assert message.startswith(f"{directory / 'hydra.json'}: SHA-256 ")
    assert f"does not match the expected {config_hash[:12]}..." in message
    other = "0" * 64
    message = refusal(directory, expected_weights_sha256=other)
    assert message.startswith(f"{directory / 'model.safetensors'}: SHA-256 {weights_hash[:12]}")
    with pytest.raises(ValueError, match="expected_config_sha256 must be None or a 64-character"):
        load_hydra(directory, expected_config_sha256="abc")


def test_untouched_round_trip_with_expected_hashes_is_bit_exact(tmp_path):
    directory, hydra = saved_three(tmp_path, "hf_vit", attention="block_diagonal")
    loaded = load_hydra(
        directory,
        expected_config_sha256=config_sha256(directory),
        expected_weights_sha256=weights_sha256(directory),
    )
    batch = tiny_inputs("hf_vit", 4)
    with torch.no_grad():
        assert torch.equal(hydra(*positional(batch)), loaded(*positional(batch)))
        assert torch.equal(
            hydra.predict_proba(*positional(batch)), loaded.predict_proba(*positional(batch))
        )


def test_bfloat16_temperature_round_trips(tmp_path):
    hydra = merge_members(make_members("timm_vit", member_plans(2), fine_tuned=True))
    hydra.to(torch.bfloat16).set_temperature(1.7)
    directory = save_hydra(hydra, tmp_path / "m")
    config = read_hydra_config(directory)
    assert config["dtype"] == "bfloat16"
    assert config["temperature"] == float(torch.tensor(1.7, dtype=torch.bfloat16))
    loaded = load_hydra(directory)
    assert loaded.temperature.dtype == torch.bfloat16
    assert torch.equal(loaded.temperature, hydra.temperature)
