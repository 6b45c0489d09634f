"""Physical head removal: delete pruned heads' rows of q/k/v and columns of the output projection.

``prune_heads(model, plan)`` edits ``model`` in place (and returns it). Afterwards the model
computes exactly what the unpruned model computes with the pruned heads gated to 0 (see
:mod:`hydra_ops.heads.gating`), up to float rounding (tested to 1e-6 in fp32).

The plan's indices refer to the model's *current* heads. The cumulative plan relative to the
original model is kept on the model as ``model.hydra_head_plan`` (a :class:`HeadPlan`), so a pruned
member always knows which original heads it holds.
"""

from __future__ import annotations

from torch import nn

from hydra_ops.adapters import get_adapter

from .plans import HeadPlan

PLAN_ATTRIBUTE = "hydra_head_plan"


def head_plan_of(model: nn.Module) -> HeadPlan:
    """Original-model head indices that ``model`` holds (all heads if it was never pruned)."""
    plan = getattr(model, PLAN_ATTRIBUTE, None)
    if plan is None:
        return HeadPlan.full(get_adapter(model).heads_per_layer())
    return plan


def prune_heads(model: nn.Module, plan: HeadPlan) -> nn.Module:
    """Keep only ``plan``'s heads in every layer of ``model`` (in place; returns ``model``).

    Raises:
        ValueError: the plan does not fit the model (layer count, head index out of range) or
            keeps no head in some layer.
    """
    if not isinstance(plan, HeadPlan):
        raise ValueError(f"plan must be a HeadPlan, got {type(plan).__name__}")
    adapter = get_adapter(model)
    plan.validate_for(adapter.heads_per_layer())
    previous = head_plan_of(model)
    for layer in range(adapter.num_layers):
        kept = list(plan.heads(layer))
        if kept == list(range(adapter.num_heads(layer))):
            continue
        adapter.set_attention_weights(layer, adapter.attention_weights(layer).select_heads(kept))
    cumulative = HeadPlan(
        tuple(
            tuple(previous.heads(layer)[i] for i in plan.heads(layer))
            for layer in range(adapter.num_layers)
        )
    )
    setattr(model, PLAN_ATTRIBUTE, cumulative)
    return model
