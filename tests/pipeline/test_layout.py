"""tasks.runtime.layout: the stages in dvc.yaml order, each a python module."""

from __future__ import annotations

from pathlib import Path

import yaml

from tasks.runtime.layout import STAGES

REPO = Path(__file__).resolve().parents[2]


def test_dvc_yaml_declares_the_stages_in_order_and_as_python_modules():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert list(stages) == list(STAGES)
    for name, stage in stages.items():
        assert stage["cmd"] == f"python -m tasks.{name}"
        assert f"tasks/{name}.py" in stage["deps"]
        assert (REPO / "tasks" / f"{name}.py").is_file()
    for name in ("finetune_members", "finetune_baselines"):
        assert stages[name]["outs"][0][next(iter(stages[name]["outs"][0]))]["persist"] is True
