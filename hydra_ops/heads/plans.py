"""Head plans: which attention heads each ensemble member keeps, and how much the plans overlap.

A :class:`HeadPlan` maps every layer ``l`` of a model to the sorted tuple of head indices (into the
*unpruned* model's ``heads_per_layer[l]`` heads) that survive pruning. Every layer keeps at least
one head: removing all heads of a layer is not a pruning the merge can represent.

A plans file (:func:`save_plans` / :func:`load_plans`) is JSON ``{"plans": [plan.to_dict(), ...],
...extra}``, indented by 2, keys in insertion order, ending in a newline.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra_ops.atomic import atomic_write_bytes


@dataclass(frozen=True)
class HeadPlan:
    """Kept heads per layer.

    Attributes:
        kept: ``kept[l]`` is the sorted tuple of kept head indices of layer ``l``; layers are
            ``0 .. num_layers - 1`` with none missing.
    """

    kept: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        normalised = []
        for layer, heads in enumerate(self.kept):
            heads = tuple(int(h) for h in heads)
            if len(heads) == 0:
                raise ValueError(
                    f"HeadPlan: layer {layer} keeps no head; "
                    "every layer must keep at least one head"
                )
            if len(set(heads)) != len(heads):
                raise ValueError(f"HeadPlan: layer {layer} lists a head twice: {list(heads)}")
            if min(heads) < 0:
                raise ValueError(
                    f"HeadPlan: layer {layer} has a negative head index: {list(heads)}"
                )
            normalised.append(tuple(sorted(heads)))
        object.__setattr__(self, "kept", tuple(normalised))

    @classmethod
    def from_layers(cls, kept: Sequence[Sequence[int]] | Mapping[Any, Sequence[int]]) -> HeadPlan:
        """Build a plan from a list indexed by layer or a ``{layer: heads}`` mapping."""
        if isinstance(kept, Mapping):
            layers = sorted(int(k) for k in kept)
            if layers != list(range(len(layers))):
                raise ValueError(
                    f"HeadPlan: layers must be 0..{len(layers) - 1} with none missing, got {layers}"
                )
            by_int = {int(k): v for k, v in kept.items()}
            return cls(tuple(tuple(by_int[layer]) for layer in layers))
        return cls(tuple(tuple(heads) for heads in kept))

    @classmethod
    def full(cls, heads_per_layer: Sequence[int]) -> HeadPlan:
        """The plan that keeps every head."""
        return cls(tuple(tuple(range(n)) for n in heads_per_layer))

    @property
    def num_layers(self) -> int:
        return len(self.kept)

    def heads(self, layer: int) -> tuple[int, ...]:
        return self.kept[layer]

    def num_kept(self) -> list[int]:
        """Number of kept heads per layer."""
        return [len(h) for h in self.kept]

    def total_heads(self) -> int:
        return sum(self.num_kept())

    def validate_for(self, heads_per_layer: Sequence[int]) -> None:
        """Raise ``ValueError`` unless this plan fits a model with ``heads_per_layer`` heads."""
        if len(heads_per_layer) != self.num_layers:
            raise ValueError(
                f"plan has {self.num_layers} layers but the model has {len(heads_per_layer)}"
            )
        for layer, (heads, available) in enumerate(zip(self.kept, heads_per_layer, strict=True)):
            if max(heads) >= available:
                raise ValueError(
                    f"plan: layer {layer} keeps head {max(heads)} but the layer has only "
                    f"{available} heads (allowed indices 0..{available - 1})"
                )

    def to_dict(self) -> dict[str, list[int]]:
        """JSON-ready form ``{"0": [heads...], ...}``."""
        return {str(layer): list(heads) for layer, heads in enumerate(self.kept)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Sequence[int]]) -> HeadPlan:
        return cls.from_layers(data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


def save_plans(path: str | os.PathLike[str], plans: Sequence[HeadPlan], **extra: Any) -> Path:
    """Write ``plans`` (and the JSON-ready ``extra`` fields after them) to ``path`` atomically;
    the same plans and extras give the same bytes. Returns ``path``."""
    path = Path(path)
    data = {"plans": [plan.to_dict() for plan in plans], **extra}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(data, indent=2) + "\n").encode(), keep_suffix=False)
    return path


def load_plans(path: str | os.PathLike[str]) -> list[HeadPlan]:
    """The plans of a file written by :func:`save_plans` (ValueError naming ``path`` when it is
    missing or not a plans file)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"plans file {str(path)!r} is missing")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [HeadPlan.from_layers(p) for p in data["plans"]]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as err:
        raise ValueError(f"plans file {str(path)!r} is not a valid plans file: {err}") from None


def jaccard(a: Sequence[int], b: Sequence[int]) -> float:
    """Jaccard overlap |a & b| / |a | b| of two head sets (1.0 for two empty sets)."""
    sa, sb = set(a), set(b)
    union = sa | sb
    return 1.0 if not union else len(sa & sb) / len(union)


@dataclass(frozen=True)
class OverlapReport:
    """Mean pairwise Jaccard overlap of a set of plans.

    Attributes:
        per_layer: mean over member pairs of the Jaccard overlap of layer ``l``'s kept heads.
        overall: mean of ``per_layer``. 0 = disjoint members, 1 = identical members.
        num_members: how many plans were compared (1 gives overlaps of 1.0 by convention).
    """

    per_layer: tuple[float, ...]
    overall: float
    num_members: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "per_layer": list(self.per_layer),
            "overall": self.overall,
            "num_members": self.num_members,
        }


def plan_overlap(plans: Sequence[HeadPlan]) -> OverlapReport:
    """Mean pairwise Jaccard overlap of ``plans`` per layer and overall."""
    if not plans:
        raise ValueError("plan_overlap: plans is empty; pass at least one HeadPlan")
    num_layers = plans[0].num_layers
    if any(p.num_layers != num_layers for p in plans):
        raise ValueError("plan_overlap: all plans must have the same number of layers")
    if len(plans) == 1:
        return OverlapReport(tuple(1.0 for _ in range(num_layers)), 1.0, 1)
    per_layer = []
    for layer in range(num_layers):
        pairs = [
            jaccard(a.heads(layer), b.heads(layer)) for a, b in itertools.combinations(plans, 2)
        ]
        per_layer.append(sum(pairs) / len(pairs))
    return OverlapReport(tuple(per_layer), sum(per_layer) / num_layers, len(plans))
