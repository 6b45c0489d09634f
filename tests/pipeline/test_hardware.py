"""tasks.runtime.hardware: the per-machine-kind record, the choices file the stages depend on, and
what ``--remeasure`` reports."""

from __future__ import annotations

import json

import yaml

from hydra_ops import measurements
from tasks.runtime import hardware


def _choices(root) -> dict:
    return yaml.safe_load((root / hardware.CHOICES).read_text())


def test_sync_writes_every_stage_unmeasured_then_what_the_stages_noted(tmp_path):
    synced = hardware.sync_choices(tmp_path)
    assert set(synced) == {"kind", *hardware.STAGES}
    assert {synced[s] for s in hardware.STAGES} == {hardware.UNMEASURED}
    record = json.loads(hardware.record_path(tmp_path).read_text())
    assert record["machine"] == measurements.machine_kind()
    assert "1.15x" in record["rule"]["text"] and record["rule"]["margin"] == 0.15
    hardware.note_choice(tmp_path, "calibrate", "inference precision", "fp32")
    assert _choices(tmp_path)["calibrate"] == {"inference precision": "fp32"}
    assert _choices(tmp_path)["compile"] == hardware.UNMEASURED
    # a fresh sync (the next run) writes the same file: nothing for DVC to rerun
    before = (tmp_path / hardware.CHOICES).read_bytes()
    hardware.sync_choices(tmp_path)
    assert (tmp_path / hardware.CHOICES).read_bytes() == before


def test_another_machine_kind_gets_its_own_record_and_its_own_choices(tmp_path, monkeypatch):
    hardware.sync_choices(tmp_path)
    hardware.note_choice(tmp_path, "finetune_base", "training precision", "bf16")
    here = hardware.record_path(tmp_path)
    other = {**measurements.machine_kind(), "gpus": ["NVIDIA H100 80GB HBM3"]}
    monkeypatch.setattr(hardware, "machine_kind", lambda: other)
    synced = hardware.sync_choices(tmp_path)
    assert hardware.record_path(tmp_path) != here and here.is_file()
    assert "nvidia-h100" in hardware.record_path(tmp_path).name
    assert synced["finetune_base"] == hardware.UNMEASURED and synced["kind"] != here.stem


def test_remeasure_forgets_this_kind_and_reports_each_changed_choice(tmp_path):
    hardware.sync_choices(tmp_path)
    hardware.note_choice(tmp_path, "calibrate", "inference precision", "fp32")
    hardware.note_choice(
        tmp_path, "compile", "artifact", {"backend": "export", "precision": "fp32"}
    )
    hardware.note_choice(tmp_path, "finetune_base", "training precision", "fp32")
    before = hardware.forget(tmp_path)
    assert hardware.current_choices(tmp_path) == {}
    assert {s for s, v in hardware.sync_choices(tmp_path).items() if v != hardware.UNMEASURED} == {
        "kind"
    }
    hardware.note_choice(tmp_path, "calibrate", "inference precision", "bf16")
    hardware.note_choice(
        tmp_path, "compile", "artifact", {"backend": "export", "precision": "bf16"}
    )
    hardware.note_choice(tmp_path, "finetune_base", "training precision", "fp32")
    lines = hardware.changed_choices(before, hardware.current_choices(tmp_path))
    assert lines == [
        "calibrate inference precision: fp32 -> bf16",
        "compile artifact: backend export, precision fp32 -> backend export, precision bf16",
    ]


def test_a_stage_outside_the_list_is_refused(tmp_path):
    import pytest

    with pytest.raises(ValueError, match="not one of"):
        hardware.note_choice(tmp_path, "merge", "x", "y")


def test_the_hardware_command_shows_this_kind_its_rule_and_choices(tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app

    res = CliRunner().invoke(app, ["hardware", "-C", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "(not yet measured)" in res.output
    hardware.sync_choices(tmp_path)
    hardware.note_choice(tmp_path, "calibrate", "inference precision", "bf16")
    res = CliRunner().invoke(app, ["hardware", "-C", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert f"machine kind: {hardware.record_path(tmp_path).stem}" in res.output
    assert "calibrate: inference precision: bf16" in res.output
    assert "finetune_base: unmeasured" in res.output and "1.15x" in res.output
