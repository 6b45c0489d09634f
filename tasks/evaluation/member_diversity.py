"""What ``evaluate`` reports about how the members of each multi-member model differ.

Per model with ``M >= 2`` members (the Hydra, the Deep Ensemble, MC Dropout's passes, the
controls): the pairwise measures of :mod:`hydra_ops.uq.diversity` from the raw member logits (the
temperature rescales the ensemble, not the members) on ID test (with labels: also the correctness
correlation) and near-OOD. For the Hydra's plans: the head-set overlap
(:func:`hydra_ops.heads.plans.plan_overlap`, mean pairwise Jaccard per layer) overall and over the
pruned layers. :func:`diversity_table` renders them beside the near-OOD AUROC of every OOD score
that ``evaluate`` already computed (``ood_by_score``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tasks.params.core import CoreConfig
from tasks.runtime.layout import PLANS

if TYPE_CHECKING:  # the report (and the flow process that renders it) runs without torch
    import torch

#: (evaluation split, report key, with labels)
DIVERSITY_SPLITS = (("test", "id_test", True), ("near_ood", "near_ood", False))


def model_diversity(
    out: dict[str, torch.Tensor], labels: dict[str, torch.Tensor]
) -> dict[str, Any] | None:
    """``{split key: hydra_ops.uq.diversity.pairwise_summary}`` on ID test and near-OOD of one
    model's member logits ``out[split]`` [N, M, C]; None for a one-member model."""
    from hydra_ops.uq.diversity import pairwise_summary

    if out["test"].shape[1] < 2:
        return None
    return {
        key: pairwise_summary(out[split], labels[split] if with_labels else None)
        for split, key, with_labels in DIVERSITY_SPLITS
    }


def plan_overlap_summary(cfg: CoreConfig, root: Path) -> dict[str, Any]:
    """The Hydra's head-set overlap from ``artifacts/plans/plans.json``: mean pairwise Jaccard
    per layer, overall and over the pruned layers (after the ``merge.shared_layers`` trunk)."""
    from hydra_ops.heads.plans import load_plans, plan_overlap

    plans = load_plans(root / PLANS / "plans.json")
    overlap = plan_overlap(plans)
    pruned = overlap.per_layer[cfg.shared_layers :] or overlap.per_layer
    return {
        "num_members": len(plans),
        "jaccard_per_layer": list(overlap.per_layer),
        "jaccard_mean": overlap.overall,
        "jaccard_mean_pruned_layers": sum(pruned) / len(pruned),
        "heads_per_member": [p.total_heads() for p in plans],
    }


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def diversity_table(result: dict[str, Any]) -> str:
    """Markdown: per multi-member model, disagreement and correlations on ID test / near-OOD,
    the Hydra's head-set Jaccard, and the near-OOD AUROC of every OOD score."""
    models = {n: e for n, e in result["models"].items() if e.get("diversity")}
    if not models:
        return "No model with two or more members was evaluated."
    kinds = list(next(iter(models.values())).get("ood_by_score", {}).get("near_ood", {}))
    header = [
        "model",
        "M",
        "disagreement id / near",
        "prob. corr. id / near",
        "correctness corr. id",
        "head Jaccard (pruned layers)",
        *[f"near AUROC {k}" for k in kinds],
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    overlap = result.get("plan_overlap") or {}
    for name, entry in models.items():
        d = entry["diversity"]
        ident, near = d["id_test"], d["near_ood"]
        jaccard = overlap.get("jaccard_mean_pruned_layers") if name == "hydra" else None
        by_score = entry.get("ood_by_score", {}).get("near_ood", {})
        row = [
            name,
            str(entry["members"]),
            f"{_cell(ident['disagreement'])} / {_cell(near['disagreement'])}",
            f"{_cell(ident['probability_correlation'])} / {_cell(near['probability_correlation'])}",
            _cell(ident.get("correctness_correlation")),
            _cell(jaccard),
            *[_cell((by_score.get(k) or {}).get("auroc")) for k in kinds],
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def diversity_section(result: dict[str, Any]) -> list[str]:
    """The report's diversity section (heading, legend, table); empty when the evaluation
    has no diversity figures (an evaluate.json from before them)."""
    if not any("diversity" in e for e in result["models"].values()):
        return []
    return [
        "## Member diversity",
        "Pairwise means over member pairs, from the raw member predictions (docs/diversity.md): "
        "disagreement = fraction of inputs where two members' top classes differ (Fort et al. "
        "2019); prob. corr. = Pearson correlation of two members' class-probability tables; "
        "correctness corr. = Kuncheva & Whitaker's (2003) correlation of two members' "
        "right/wrong vectors (lower = errors on different inputs); head Jaccard = mean pairwise "
        "overlap of the Hydra members' kept heads in the pruned layers. `-`: undefined (a "
        "member right on every input, or not applicable).",
        diversity_table(result),
    ]
