"""Stage ``merge``: fuse the M members into one ``HydraEnsemble`` and save it with ``save_hydra``.

Members are the fine-tuned pruned members of ``models/members`` (Taylor variant) or, when members
were not fine-tuned (circuit variant), copies of the base pruned with each plan.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from torch import nn

from hydra_ops.heads.plans import load_plans
from hydra_ops.models.checkpoints import CheckpointError, load_member, load_pruned, weights_hash
from tasks.data import manifest
from tasks.layout import BASE, MEMBERS, MERGED, PLANS
from tasks.outputs import publish_dir, read_json
from tasks.params.core import CoreConfig
from tasks.stage import stage_main

#: The params view this stage validates ``params.yaml`` with (the sections it reads).
SCHEMA = CoreConfig

log = logging.getLogger("hydra_ens")


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


def run(cfg: CoreConfig, root: Path) -> dict[str, Any]:
    from hydra_ops.hydra.merge import merge_members
    from hydra_ops.hydra.serialization import save_hydra

    members = load_members(cfg, root)
    classes = list(manifest(root).classes)
    hydra = merge_members(
        members,
        mode=cfg.merge.mode,
        attention=cfg.merge.attention,
        shared_layers=cfg.shared_layers,
        class_names=classes,
    )
    params = sum(p.numel() for p in hydra.parameters())
    info = {
        "num_members": len(members),
        "mode": cfg.merge.mode,
        "attention": cfg.merge.attention,
        "shared_layers": cfg.shared_layers,
        "parameters": params,
        "variant": cfg.scoring.method,
    }
    with publish_dir(root / MERGED) as tmp:
        save_hydra(hydra, tmp, base_weights_hash=weights_hash(root / BASE), metadata=info)
    log.info("merge: %d members, mode %s, %d parameters", len(members), cfg.merge.mode, params)
    return info


def main() -> None:
    stage_main("merge", run, SCHEMA)


if __name__ == "__main__":
    main()
