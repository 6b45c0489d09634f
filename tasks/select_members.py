"""Stage ``select_members``: M head plans (``artifacts/plans/plans.json``), the naive single pruned
baseline's plan (top-k, one member, same per-layer budget) and the plans' diversity report.

With ``merge.shared_layers = k > 0`` the first ``k`` layers of every member plan, and of the naive
plan, keep all heads (the merge runs them once, unpruned, as a shared trunk; the circuit scorer does
not search them); the plans' later layers are those of the configured scorer and strategy.
``jaccard_mean_pruned_layers`` is the plans' overlap over the layers that are pruned.

``members.heads_per_layer`` as a list gives each member its own size (per-member pruning ratios);
the naive plan then keeps the members' mean size, rounded."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra_ops.heads.plans import save_plans
from tasks.params.core import CoreConfig
from tasks.runtime.layout import METRICS, PLANS, SCORES
from tasks.runtime.outputs import publish_dir, write_json
from tasks.runtime.stage import stage_main

#: The params view this stage validates ``params.yaml`` with (the sections it reads).
SCHEMA = CoreConfig

log = logging.getLogger("hydra_ens")


def run(cfg: CoreConfig, root: Path) -> dict[str, Any]:
    from hydra_ops.heads.scores import HeadScores
    from hydra_ops.heads.selection import diversity_report, select_members

    scores = HeadScores.load(root / SCORES / "scores.safetensors")
    m, shared = cfg.members.num_members, cfg.shared_layers
    sizes = cfg.member_head_budgets
    # the trunk's layers keep every head; the others keep k_m per member (members.heads_per_layer)
    budgets = [[scores.num_heads] * shared + [k] * (scores.num_layers - shared) for k in sizes]
    # the naive twin: one member of the members' (mean) size
    k = sizes[0] if len(set(sizes)) == 1 else round(sum(sizes) / m)
    budget = [scores.num_heads] * shared + [k] * (scores.num_layers - shared)
    plans = select_members(
        scores,
        m,
        budgets,
        cfg.strategy,
        cfg.members_seed,
        temperature=cfg.members.temperature,
        penalty=cfg.members.overlap_penalty,
    )
    naive = select_members(scores.scores, 1, budget, "topk")
    if shared:
        log.info(
            "select_members: layers 0..%d kept whole (merge.shared_layers=%d)", shared - 1, shared
        )
    diversity = diversity_report(plans, scores.num_heads)
    pruned_jaccard = diversity["jaccard_per_layer"][shared:]
    with publish_dir(root / PLANS) as tmp:
        save_plans(tmp / "plans.json", plans, strategy=cfg.strategy)
        save_plans(tmp / "naive_plan.json", naive, strategy="topk")
    summary = {
        "strategy": cfg.strategy,
        "num_members": m,
        "heads_per_layer": k if len(set(sizes)) == 1 else sizes,
        "shared_layers": shared,
        **diversity,
        "jaccard_mean_pruned_layers": sum(pruned_jaccard) / len(pruned_jaccard),
    }
    write_json(root / METRICS / "diversity.json", summary)
    log.info(
        "select_members: %d plans (%s, %s heads/layer), mean pairwise Jaccard %.3f "
        "(%.3f over the pruned layers)",
        m,
        cfg.strategy,
        summary["heads_per_layer"],
        diversity["jaccard_mean"],
        summary["jaccard_mean_pruned_layers"],
    )
    return summary


def main() -> None:
    stage_main("select_members", run, SCHEMA)


if __name__ == "__main__":
    main()
