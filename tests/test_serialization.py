import json
import subprocess
import sys

import pytest
import torch
from tiny_models import FAMILIES, make_members, member_plans, positional, tiny_inputs

from hydra_ops.merge import merge_members
from hydra_ops.serialization import HydraFormatError, load_hydra, read_hydra_config, save_hydra


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
        "from hydra_ops.serialization import load_hydra\n"
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
