"""Relative-position attention terms of the merged network, by name (``POSITION_SCORES``).

A family whose attention adds a position-dependent term to its scores declares one in its
adapter (``ModelAdapter.position_scores()``); see :mod:`.base` for the contract. Each entry is
imported on first use (its module imports the family's library).
"""

from __future__ import annotations

from hydra_ops.registry import Registry

from .base import PositionContext, PositionScores, packed_offsets

#: ``name -> PositionScores subclass`` (``POSITION_SCORES.register_lazy(name, ".module:Class")``).
POSITION_SCORES: Registry[type[PositionScores]] = Registry("position scores", package=__name__)
POSITION_SCORES.register_lazy("relative_bias", ".relative_bias:RelativeBiasScores")
POSITION_SCORES.register_lazy("disentangled", ".disentangled:DisentangledScores")


def position_scores_class(name: str) -> type[PositionScores]:
    """The :class:`PositionScores` registered as ``name`` (ValueError naming them otherwise)."""
    return POSITION_SCORES.get(name, "positions.kind")


__all__ = [
    "POSITION_SCORES",
    "PositionContext",
    "PositionScores",
    "packed_offsets",
    "position_scores_class",
]
