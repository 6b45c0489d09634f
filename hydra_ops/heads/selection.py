"""Diverse member selection: turn head scores [layers, heads] into M head plans.

Strategies (``select_members(..., strategy=...)``):

- ``"topk"``: the ``k`` highest-scoring heads of every layer; one member only (the naive pruned
  baseline). Ties go to the lower head index.
- ``"gumbel_topk"``: each member samples ``k`` heads per layer without replacement from
  ``softmax(z / temperature)`` via the Gumbel-top-k trick, where ``z`` are the layer's scores
  standardised per layer (``(s - mean) / std``; a constant layer gives ``z = 0``, i.e. uniform). The
  standardisation makes ``temperature`` mean the same on every layer and for every scorer:
  ``temperature -> 0`` approaches top-k, ``temperature -> inf`` approaches uniform sampling.
- ``"overlap_penalty"``: greedy and deterministic. Member ``m`` takes, per layer, the top ``k`` of
  ``s - penalty * count * scale`` where ``count[h]`` is the number of earlier members holding head
  ``h`` and ``scale`` is the layer's score range ``max(s) - min(s)`` (1 for a constant layer),
  times ``1 + 1e-6`` so the separation below is strict against rounding. With this scale
  ``penalty = 1`` ranks a head held by one earlier member below every free head, so members are
  disjoint whenever ``k * M <= H``; ``0 < penalty < 1`` lets a held head win over a free one only if
  its score exceeds the free head's by more than ``penalty`` times the layer's score range;
  ``penalty = 0`` gives M copies of the top-k plan.
- ``"circuits"``: the plans found by the circuit scorer (``HeadScores.circuits``). Its overlap
  penalty acts inside the circuit search (``hydra_ops.scoring.circuit_scores``); here ``penalty``
  must match the one the circuits were searched with (recorded in ``HeadScores.meta``).

``penalty=None`` means the strategy's default, :data:`DEFAULT_PENALTIES` (1.0 for
``overlap_penalty``, 0.5 for ``circuits``), resolved by :func:`resolve_penalty` only.

Invariants of every returned plan: ``k_l`` heads in layer ``l`` (``1 <= k_l <= H``), heads sorted,
indices into the unpruned model's heads. The budget ``k_l`` is the same for every member, or one
per member (``heads_per_layer`` as M per-layer budgets: per-member pruning ratios, which every
strategy but ``circuits`` takes; the circuit search keeps one size for all).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from hydra_ops.heads.plans import HeadPlan, plan_overlap
from hydra_ops.heads.scores import HeadScores

STRATEGIES = ("topk", "gumbel_topk", "overlap_penalty", "circuits")
#: The overlap penalty of each penalised strategy when none is given, in units of a layer's score
#: (importance) range. ``circuits``: a head already taken by an earlier circuit must beat a free
#: head by more than half the layer's importance range to be taken again (docs/scoring.md).
DEFAULT_PENALTIES: dict[str, float] = {"overlap_penalty": 1.0, "circuits": 0.5}

__all__ = [
    "DEFAULT_PENALTIES",
    "STRATEGIES",
    "default_heads_per_layer",
    "diversity_report",
    "resolve_penalty",
    "select_members",
]


def resolve_penalty(strategy: str, penalty: float | None) -> float:
    """The overlap penalty ``strategy`` uses: ``penalty``, or its default when ``None``.

    ``strategy`` must be a key of :data:`DEFAULT_PENALTIES`; ``penalty`` a finite number >= 0.
    """
    if strategy not in DEFAULT_PENALTIES:
        raise ValueError(
            f"strategy={strategy!r} has no overlap penalty; allowed: {', '.join(DEFAULT_PENALTIES)}"
        )
    if penalty is None:
        return DEFAULT_PENALTIES[strategy]
    if not (
        isinstance(penalty, int | float)
        and not isinstance(penalty, bool)
        and math.isfinite(penalty)
        and penalty >= 0
    ):
        raise ValueError(f"penalty must be a finite number >= 0 or None, got {penalty!r}")
    return float(penalty)


def default_heads_per_layer(num_heads: int, num_members: int) -> int:
    """Per-member head budget so the members together hold about as many heads as the base model.

    ``max(1, num_heads // num_members)``: 12 heads and 3 members give 4 heads per member per layer.
    """
    return max(1, num_heads // num_members)


def _as_score_tensor(scores: Any) -> tuple[Tensor, list[HeadPlan] | None]:
    circuits = None
    if hasattr(scores, "scores") and hasattr(scores, "method"):
        circuits = getattr(scores, "circuits", None)
        scores = scores.scores
    if not isinstance(scores, Tensor):
        raise ValueError(
            "scores must be a [layers, heads] float tensor or a HeadScores, "
            f"got {type(scores).__name__}"
        )
    if scores.dim() != 2 or scores.shape[0] < 1 or scores.shape[1] < 1:
        raise ValueError(
            f"scores must have shape [layers, heads] with both >= 1, got {tuple(scores.shape)}"
        )
    if not scores.is_floating_point():
        scores = scores.float()
    scores = scores.detach().to("cpu", torch.float64)
    if not torch.isfinite(scores).all():
        bad = (~torch.isfinite(scores)).nonzero().tolist()
        raise ValueError(f"scores must be finite; NaN or inf at [layer, head] {bad[:5]}")
    return scores, circuits


def _budget(
    heads_per_layer: int | Sequence[int] | None, num_layers: int, num_heads: int, num_members: int
) -> list[int]:
    allowed = f"allowed 1..{num_heads} (the number of heads per layer)"
    if heads_per_layer is None:
        return [default_heads_per_layer(num_heads, num_members)] * num_layers
    if isinstance(heads_per_layer, bool):
        raise ValueError(f"heads_per_layer must be an int or a sequence of ints, {allowed}")
    if isinstance(heads_per_layer, int):
        budget = [heads_per_layer] * num_layers
    elif isinstance(heads_per_layer, Sequence):
        budget = list(heads_per_layer)
        if len(budget) != num_layers:
            raise ValueError(
                f"heads_per_layer has {len(budget)} entries but scores has {num_layers} layers"
            )
        if not all(isinstance(k, int) and not isinstance(k, bool) for k in budget):
            raise ValueError(f"heads_per_layer entries must be ints, {allowed}, got {budget}")
    else:
        raise ValueError(
            "heads_per_layer must be an int or a sequence of ints, "
            f"got {type(heads_per_layer).__name__}"
        )
    for layer, k in enumerate(budget):
        if not 1 <= k <= num_heads:
            raise ValueError(f"heads_per_layer={k} for layer {layer} is out of range: {allowed}")
    return budget


def _top(values: Tensor, k: int) -> list[int]:
    """Indices of the ``k`` largest entries of a 1-D tensor; ties go to the lower index."""
    order = torch.argsort(values, descending=True, stable=True)
    return sorted(order[:k].tolist())


def _standardise(row: Tensor) -> Tensor:
    std = row.std(unbiased=False)
    if std <= 0:
        return torch.zeros_like(row)
    return (row - row.mean()) / std


def _member_budgets(
    heads_per_layer: int | Sequence[int] | Sequence[Sequence[int]] | None,
    num_layers: int,
    num_heads: int,
    num_members: int,
) -> list[list[int]]:
    """One per-layer budget per member: a nested sequence gives each member its own (per-member
    pruning ratios), anything else the same budget to every member."""
    if (
        isinstance(heads_per_layer, Sequence)
        and heads_per_layer
        and all(isinstance(b, Sequence) for b in heads_per_layer)
    ):
        if len(heads_per_layer) != num_members:
            raise ValueError(
                f"heads_per_layer has {len(heads_per_layer)} per-member budgets but "
                f"num_members={num_members}"
            )
        return [_budget(b, num_layers, num_heads, num_members) for b in heads_per_layer]
    same = _budget(heads_per_layer, num_layers, num_heads, num_members)  # type: ignore[arg-type]
    return [same] * num_members


def _select_topk(scores: Tensor, budget: list[int]) -> list[HeadPlan]:
    return [HeadPlan(tuple(tuple(_top(scores[i], k)) for i, k in enumerate(budget)))]


def _select_gumbel(
    scores: Tensor, budgets: list[list[int]], seed: int, temperature: float
) -> list[HeadPlan]:
    gen = torch.Generator().manual_seed(seed)
    z = torch.stack([_standardise(row) for row in scores]) / temperature
    plans = []
    for budget in budgets:
        # Gumbel(0, 1) noise: -log(-log(U)), U ~ Uniform(0, 1) bounded away from 0 and 1.
        u = torch.rand(z.shape, generator=gen, dtype=torch.float64).clamp(1e-12, 1 - 1e-12)
        perturbed = z - torch.log(-torch.log(u))
        plans.append(HeadPlan(tuple(tuple(_top(perturbed[i], k)) for i, k in enumerate(budget))))
    return plans


def _select_overlap(scores: Tensor, budgets: list[list[int]], penalty: float) -> list[HeadPlan]:
    counts = torch.zeros_like(scores)
    span = scores.max(dim=1).values - scores.min(dim=1).values
    # Just over the range, so that penalty=1 ranks a held head strictly below every free head.
    scale = torch.where(span > 0, span, torch.ones_like(span)) * (1 + 1e-6)
    plans = []
    for budget in budgets:
        adjusted = scores - penalty * counts * scale[:, None]
        kept = []
        for layer, k in enumerate(budget):
            heads = _top(adjusted[layer], k)
            counts[layer, heads] += 1
            kept.append(tuple(heads))
        plans.append(HeadPlan(tuple(kept)))
    return plans


def _select_circuits(
    circuits: list[HeadPlan] | None,
    num_members: int,
    budgets: list[list[int]],
    num_heads: int,
    penalty: float,
    searched_with: Any,
) -> list[HeadPlan]:
    if not circuits:
        raise ValueError(
            "strategy='circuits' needs scores to be a HeadScores from "
            "score_heads(model, method='circuit', num_circuits=M, ...) carrying circuits"
        )
    if searched_with is not None and not math.isclose(
        float(searched_with), penalty, rel_tol=0.0, abs_tol=1e-12
    ):
        raise ValueError(
            f"penalty={penalty} but the circuits were searched with overlap_penalty="
            f"{float(searched_with)}; the circuits strategy applies its penalty during the search: "
            f"rescore with score_heads(..., method='circuit', overlap_penalty={penalty})"
        )
    if len(circuits) < num_members:
        raise ValueError(
            f"num_members={num_members} but the HeadScores carries only {len(circuits)} circuits; "
            f"allowed 1..{len(circuits)} (or rescore with num_circuits={num_members})"
        )
    chosen = list(circuits[:num_members])
    for i, (plan, budget) in enumerate(zip(chosen, budgets, strict=True)):
        plan.validate_for([num_heads] * len(budget))
        if plan.num_kept() != budget:
            raise ValueError(
                f"heads_per_layer={budget} does not match circuit {i}, which keeps "
                f"{plan.num_kept()} heads per layer; pass the heads_per_layer used for scoring"
            )
    return chosen


def select_members(
    scores: Tensor | HeadScores,
    num_members: int,
    heads_per_layer: int | Sequence[int] | Sequence[Sequence[int]] | None = None,
    strategy: str = "overlap_penalty",
    seed: int = 0,
    *,
    temperature: float = 1.0,
    penalty: float | None = None,
) -> list[HeadPlan]:
    """Choose ``num_members`` head plans from head importance scores.

    Args:
        scores: [L, H] float tensor, higher = more important, finite; or a ``HeadScores``.
        num_members: M >= 1.
        heads_per_layer: heads each member keeps per layer, an int for all layers or one int per
            layer, each in 1..H; or M such budgets, one per member (per-member pruning ratios:
            member ``m`` keeps ``heads_per_layer[m][l]`` heads of layer ``l``). ``None``:
            ``default_heads_per_layer(H, M)`` (4 for H=12, M=3).
        strategy: one of ``STRATEGIES`` (see the module docstring).
        seed: seeds ``gumbel_topk``; the other strategies are deterministic and ignore it.
        temperature: > 0, for ``gumbel_topk`` (relative to per-layer standardised scores).
        penalty: >= 0, for ``overlap_penalty`` and ``circuits`` (in units of the layer's score
            range); ``None`` = the strategy's default (:data:`DEFAULT_PENALTIES`). ``circuits``
            checks it against the penalty recorded in the ``HeadScores`` (ValueError if they
            differ: the circuits must be rescored).

    Returns:
        M plans of ``L`` layers; plan ``m`` keeps its budget's ``k_l`` heads in layer ``l``.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is unknown; allowed: {', '.join(STRATEGIES)}")
    if isinstance(num_members, bool) or not isinstance(num_members, int) or num_members < 1:
        raise ValueError(f"num_members must be an int >= 1, got {num_members!r}")
    tensor, circuits = _as_score_tensor(scores)
    num_layers, num_heads = tensor.shape
    budgets = _member_budgets(heads_per_layer, num_layers, num_heads, num_members)
    if strategy == "topk":
        if num_members != 1:
            raise ValueError(
                f"strategy='topk' builds a single member (num_members=1), got num_members="
                f"{num_members}; for diverse members use 'overlap_penalty', 'gumbel_topk' or "
                "'circuits'"
            )
        return _select_topk(tensor, budgets[0])
    if strategy == "gumbel_topk":
        if not (
            isinstance(temperature, int | float) and math.isfinite(temperature) and temperature > 0
        ):
            raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
        return _select_gumbel(tensor, budgets, int(seed), float(temperature))
    resolved = resolve_penalty(strategy, penalty)
    if strategy == "overlap_penalty":
        return _select_overlap(tensor, budgets, resolved)
    meta = getattr(scores, "meta", None) or {}
    searched_with = meta.get("overlap_penalty")
    return _select_circuits(circuits, num_members, budgets, num_heads, resolved, searched_with)


def diversity_report(
    plans: Sequence[HeadPlan], heads_per_layer: int | Sequence[int] | None = None
) -> dict[str, Any]:
    """Diversity of a set of member plans, JSON-ready.

    Args:
        plans: M >= 1 plans with the same number of layers.
        heads_per_layer: the base model's heads per layer (int or one per layer), for coverage. If
            omitted it is inferred as ``max kept index + 1`` per layer, a lower bound.

    Returns:
        ``{"num_members", "jaccard_per_layer", "jaccard_mean", "coverage_per_layer", "coverage",
        "heads_per_member"}``: mean pairwise Jaccard of the kept heads (``plans.plan_overlap``; 1.0
        for a single member), the fraction of the base's heads held by at least one member per layer
        and overall (over all heads of all layers), and each member's total kept heads.
    """
    if not plans:
        raise ValueError("plans is empty; pass at least one HeadPlan")
    overlap = plan_overlap(plans)
    num_layers = plans[0].num_layers
    if heads_per_layer is None:
        base = [max(max(p.heads(i)) for p in plans) + 1 for i in range(num_layers)]
    elif isinstance(heads_per_layer, int):
        base = [heads_per_layer] * num_layers
    else:
        base = list(heads_per_layer)
        if len(base) != num_layers:
            raise ValueError(
                f"heads_per_layer has {len(base)} entries but the plans have {num_layers} layers"
            )
    for p in plans:
        p.validate_for(base)
    covered = [len(set().union(*(p.heads(i) for p in plans))) for i in range(num_layers)]
    return {
        "num_members": len(plans),
        "jaccard_per_layer": list(overlap.per_layer),
        "jaccard_mean": overlap.overall,
        "coverage_per_layer": [c / n for c, n in zip(covered, base, strict=True)],
        "coverage": sum(covered) / sum(base),
        "heads_per_member": [p.total_heads() for p in plans],
    }
