"""Stage ``merge``: fuse the M members into one ``HydraEnsemble`` and save it with ``save_hydra``.

Members are the fine-tuned pruned members of ``models/members`` (Taylor variant) or, when members
were not fine-tuned (circuit variant), copies of the base pruned with each plan.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from torch import nn

from tasks import models_io
from tasks.common import BASE, MEMBERS, MERGED, PLANS, publish_dir, read_json, stage_main
from tasks.params import PipelineConfig

log = logging.getLogger("hydra_ens")


def load_members(cfg: PipelineConfig, root: Path, kind: str = "member") -> list[nn.Module]:
    """The M members (``kind="member"``) or, when fine-tuned, the M controls (``"control"``)."""
    index = read_json(root / MEMBERS / "index.json", "finetune_members output")
    plans = models_io.read_plans(root / PLANS / "plans.json")
    if index.get("finetuned"):
        return [
            models_io.load_member(root / MEMBERS / f"{kind}_{m}", root / BASE)
            for m in range(len(plans))
        ]
    if kind == "control":
        return []
    return [models_io.pruned_copy(root / BASE, plan) for plan in plans]


def run(cfg: PipelineConfig, root: Path) -> dict[str, Any]:
    from hydra_ops.merge import merge_members
    from hydra_ops.serialization import save_hydra

    members = load_members(cfg, root)
    classes = list(models_io.manifest(root).classes)
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
        save_hydra(
            hydra, tmp, base_weights_hash=models_io.base_weights_hash(root / BASE), metadata=info
        )
    log.info("merge: %d members, mode %s, %d parameters", len(members), cfg.merge.mode, params)
    return info


def main() -> None:
    stage_main("merge", run)


if __name__ == "__main__":
    main()
