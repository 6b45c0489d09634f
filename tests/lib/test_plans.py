"""hydra_ops.heads.plans: HeadPlan and its plans file."""

from __future__ import annotations

import json

import pytest
from tiny_models import member_plans

from hydra_ops.heads.plans import load_plans, save_plans


def test_plans_file_bytes_and_round_trip(tmp_path):
    plans = member_plans(3)
    path = save_plans(tmp_path / "p" / "plans.json", plans, strategy="topk")
    expected = {"plans": [p.to_dict() for p in plans], "strategy": "topk"}
    assert path.read_text() == json.dumps(expected, indent=2) + "\n"
    assert load_plans(path) == plans
    with pytest.raises(ValueError, match="is missing"):
        load_plans(tmp_path / "nope.json")
    path.write_text('{"plans": [{"0": []}]}')
    with pytest.raises(ValueError, match="not a valid plans file"):
        load_plans(path)
