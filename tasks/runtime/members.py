"""The members ``merge`` fuses and ``evaluate`` compares, read back from ``finetune_members``'
output (``models/members``) or, when members were not fine-tuned, the base pruned with each plan."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from hydra_ops.heads.plans import load_plans
from hydra_ops.models.checkpoints import CheckpointError, load_member, load_pruned
from tasks.params.core import CoreConfig
from tasks.runtime.layout import BASE, MEMBERS, PLANS
from tasks.runtime.outputs import read_json


def load_members(cfg: CoreConfig, root: Path, kind: str = "member") -> list[nn.Module]:
    """The M members (``kind="member"``) or, when fine-tuned with controls, the M controls
    (``"control"``; none when ``finetune_members`` built none)."""
    index = read_json(root / MEMBERS / "index.json", "finetune_members output")
    if kind == "control" and not index.get("controls", True):
        return []
    plans = load_plans(root / PLANS / "plans.json")
    if index.get("finetuned"):
        try:
            return [
                load_member(root / MEMBERS / f"{kind}_{m}", root / BASE) for m in range(len(plans))
            ]
        except CheckpointError as err:
            raise ValueError(f"{err}; rerun finetune_members") from None
    if kind == "control":
        return []
    return [load_pruned(root / BASE, plan) for plan in plans]
