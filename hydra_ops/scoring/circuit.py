"""``circuit``: HeadMap's layer-conditioned greedy circuit search (Wang et al., ICLR 2025), M times.

The objectives live in :mod:`.objectives`, the prefix replay in :mod:`.replay`; docs/scoring.md
describes the search, the diversity mechanisms and the measured costs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from hydra_ops.adapters import get_adapter
from hydra_ops.heads.plans import HeadPlan, plan_overlap
from hydra_ops.heads.scores import HeadScores
from hydra_ops.heads.selection import DEFAULT_PENALTIES, resolve_penalty

from .base import HeadImportance
from .inputs import Batch, eval_mode, materialise, model_device, uniform_heads
from .objectives import EvalSet, Objective, objective_list
from .replay import recording, replaying

#: Default overlap penalty of the circuit search, in units of the layer's importance range (see
#: docs/scoring.md): a head already taken by an earlier circuit must be better than a free head by
#: more than half the layer's importance range to be taken again. Defined, with the other
#: strategies' defaults, in ``hydra_ops.heads.selection.DEFAULT_PENALTIES``.
DEFAULT_CIRCUIT_PENALTY = DEFAULT_PENALTIES["circuits"]

ProgressCallback = Callable[[dict[str, Any]], None]


class _Progress:
    """The search's tqdm bar and ``callback``: one :meth:`step` per head evaluation."""

    def __init__(self, total: int, show: bool, callback: ProgressCallback | None) -> None:
        self.total, self.callback, self.done = total, callback, 0
        self.bar = tqdm(total=total, desc="circuit search", disable=not show)

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.bar.close()

    def step(self, **event: Any) -> None:
        """Count one evaluation; call ``callback({**event, "done": n, "total": N})``."""
        self.done += 1
        self.bar.update(1)
        if self.callback is not None:
            self.callback({**event, "done": self.done, "total": self.total})


def _int_in(value: Any, low: int, high: int | None = None) -> bool:
    """``value`` is an int (not a bool) in ``low..high`` (no upper bound if ``high`` is None)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    return low <= value and (high is None or value <= high)


def _check_heads_per_layer(heads_per_layer: Any, num_heads: int, num_members: int) -> int:
    if heads_per_layer is None:
        return max(1, num_heads // num_members)
    if not _int_in(heads_per_layer, 1, num_heads):
        raise ValueError(
            f"heads_per_layer={heads_per_layer!r} is out of range: allowed an int in "
            f"1..{num_heads} (the model's heads per layer)"
        )
    return heads_per_layer


def _finite_or_none(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _top(values: Tensor, k: int) -> list[int]:
    order = torch.argsort(values, descending=True, stable=True)
    return sorted(order[:k].tolist())


def circuit_scores(
    model: nn.Module,
    val_batches: Iterable[Batch],
    *,
    ood_val_batches: Iterable[Batch] | None = None,
    num_circuits: int = 3,
    heads_per_layer: int | None = None,
    objective: str | Sequence[str] | None = None,
    bootstrap: bool = True,
    overlap_penalty: float | None = None,
    seed: int = 0,
    max_batches: int | None = None,
    progress: bool = True,
    callback: ProgressCallback | None = None,
    reuse_prefix: bool = True,
    shared_layers: int = 0,
    search_trunk: bool = False,
) -> HeadScores:
    """Layer-conditioned greedy circuit search (HeadMap), ``num_circuits`` diverse circuits.

    For circuit ``c`` (objective ``objective[c % len(objective)]``, validation data resampled with
    replacement from seed ``(seed, c)`` when ``bootstrap``): all heads start on; for ``l = 0..L-1``
    and every head ``h`` of layer ``l``, gate ``h`` to 0 on top of the heads removed in earlier
    layers and measure the objective; importance ``= J(masked) - J(current)``. Layer ``l`` keeps the
    top ``heads_per_layer`` heads of ``importance - overlap_penalty * count * range(importance)``
    (``count`` = earlier circuits holding the head in that layer) and masks the rest.

    Args:
        val_batches: ID validation batches with ``labels``.
        ood_val_batches: OOD validation batches (labels not needed); required by ``ood``/``avg``.
        num_circuits: M >= 1.
        heads_per_layer: heads each circuit keeps per layer, 1..H; default ``max(1, H // M)``.
        objective: one of ``OBJECTIVES`` or a list rotated across circuits. Default: all three
            rotated when ``ood_val_batches`` is given, else ``"nll"``.
        bootstrap: resample the validation sets per circuit (seeded).
        overlap_penalty: >= 0, see above; 0 disables it; ``None`` = ``DEFAULT_CIRCUIT_PENALTY``
            (0.5, via ``hydra_ops.heads.selection.resolve_penalty``).
        callback: called after every head evaluation (``L * H * M`` times) with a dict
            ``{circuit, layer, head, objective, importance, done, total}``.
        reuse_prefix: while scoring layer ``l``, replay the outputs of blocks ``0..l-1`` recorded
            on that layer's reference run instead of recomputing them (their inputs and gates do
            not change). Same result, about ``(L + 1) / (2L)`` of the compute; False recomputes.
        shared_layers: ``k`` in ``0..L-1``: layers ``0..k-1`` keep every head in every circuit
            (the unpruned trunk of a merge with ``shared_layers = k``) and are not searched; their
            importances are 0. The search starts at layer ``k``, conditioned on the full trunk.
        search_trunk: with ``shared_layers = k > 0``, search every layer as if the trunk were
            pruned too (later layers are chosen in the context of a pruned prefix, and the trunk's
            importances are measured), then keep every head of the trunk in the returned
            circuits. Costs the full search; docs/scoring.md has the measured trade-off.

    Returns:
        ``HeadScores(method="circuit")``: ``scores`` = mean importance over circuits [L, H],
        ``circuits`` = the M plans; ``meta`` records objectives, seeds and the plans' overlap.
    """
    if not _int_in(num_circuits, 1):
        raise ValueError(f"num_circuits must be an int >= 1, got {num_circuits!r}")
    try:
        overlap_penalty = resolve_penalty("circuits", overlap_penalty)
    except ValueError:
        raise ValueError(
            f"overlap_penalty must be a finite number >= 0 or None, got {overlap_penalty!r}"
        ) from None
    adapter = get_adapter(model)
    num_layers, num_heads = uniform_heads(adapter)
    k = _check_heads_per_layer(heads_per_layer, num_heads, num_circuits)
    if not _int_in(shared_layers, 0, num_layers - 1):
        raise ValueError(
            f"shared_layers must be an int in 0..{num_layers - 1}, got {shared_layers!r}"
        )
    objectives = objective_list(objective, ood_val_batches is not None)
    device = model_device(model)
    need_labels = any(o in ("nll", "avg") for o in objectives)
    id_batches = materialise(
        val_batches, "val_batches", device, need_labels=need_labels, max_batches=max_batches
    )
    ood_batches = None
    if any(o in ("ood", "avg") for o in objectives):
        ood_batches = materialise(
            ood_val_batches, "ood_val_batches", device, need_labels=False, max_batches=max_batches
        )
    dtype = adapter.out_proj(0).weight.dtype
    blocks = [adapter.block(layer) for layer in range(num_layers)]

    searched = range(0 if search_trunk else shared_layers, num_layers)
    total = num_circuits * len(searched) * num_heads
    importance = torch.zeros(num_circuits, num_layers, num_heads, dtype=torch.float64)
    held = torch.zeros(num_layers, num_heads, dtype=torch.float64)
    plans: list[HeadPlan] = []
    circuit_meta: list[dict[str, Any]] = []
    with eval_mode(model), _Progress(total, progress, callback) as report:
        for c in range(num_circuits):
            name = objectives[c % len(objectives)]
            gen_id = torch.Generator().manual_seed(seed * 1_000_003 + 2 * c) if bootstrap else None
            gen_ood = (
                torch.Generator().manual_seed(seed * 1_000_003 + 2 * c + 1) if bootstrap else None
            )
            id_set = EvalSet.build(id_batches, gen_id)
            ood_set = None if ood_batches is None else EvalSet.build(ood_batches, gen_ood)
            evaluate = Objective(name, adapter, id_set, ood_set)
            gates = torch.ones(num_layers, num_heads, device=device, dtype=dtype)
            kept: list[tuple[int, ...]] = [tuple(range(num_heads))] * searched.start
            for layer in searched:
                prefix = blocks[:layer] if reuse_prefix else []
                with recording(prefix) as records:
                    current = evaluate(gates)
                with replaying(prefix, records):
                    for head in range(num_heads):
                        trial = gates.clone()
                        trial[layer, head] = 0
                        importance[c, layer, head] = evaluate(trial) - current
                        report.step(
                            circuit=c,
                            layer=layer,
                            head=head,
                            objective=name,
                            importance=float(importance[c, layer, head]),
                        )
                row = importance[c, layer]
                span = float(row.max() - row.min())
                adjusted = row - overlap_penalty * held[layer] * (span if span > 0 else 1.0)
                heads = _top(adjusted, k)
                held[layer, heads] += 1
                kept.append(tuple(heads))
                drop = [h for h in range(num_heads) if h not in heads]
                gates[layer, drop] = 0
            trunk = [tuple(range(num_heads))] * shared_layers
            plans.append(HeadPlan((*trunk, *kept[shared_layers:])))
            gates[:shared_layers] = 1  # the circuit as returned (only differs with search_trunk)
            circuit_meta.append(
                {
                    "objective": name,
                    "bootstrap_seed": None if not bootstrap else seed * 1_000_003 + 2 * c,
                    "reference_nll": _finite_or_none(evaluate.ref_nll),
                    "reference_auroc": _finite_or_none(evaluate.ref_auroc),
                    "final_objective": evaluate(gates),
                }
            )
    overlap = plan_overlap(plans)
    meta = {
        "num_circuits": num_circuits,
        "heads_per_layer": k,
        "objectives": objectives,
        "bootstrap": bootstrap,
        "overlap_penalty": float(overlap_penalty),
        "shared_layers": shared_layers,
        "search_trunk": bool(search_trunk),
        "seed": seed,
        "num_val_batches": len(id_batches),
        "num_ood_val_batches": 0 if ood_batches is None else len(ood_batches),
        "circuits": circuit_meta,
        "jaccard_per_layer": list(overlap.per_layer),
        "jaccard_mean": overlap.overall,
        "per_circuit_importance": importance.tolist(),
    }
    return HeadScores(importance.mean(0).float(), "circuit", meta=meta, circuits=plans)


@dataclass(frozen=True)
class CircuitImportance(HeadImportance):
    """``circuit`` as a criterion: ``CircuitImportance(num_circuits=3)(model, val_batches=...)``.

    Options as :func:`circuit_scores`; data: ``val_batches`` (ID, with ``labels``) and, for the
    ``ood``/``avg`` objectives, ``ood_val_batches`` (an OOD *validation* set).
    """

    name = "circuit"

    num_circuits: int = 3
    heads_per_layer: int | None = None
    objective: str | Sequence[str] | None = None
    bootstrap: bool = True
    overlap_penalty: float | None = None
    seed: int = 0
    max_batches: int | None = None
    progress: bool = True
    callback: ProgressCallback | None = None
    reuse_prefix: bool = True
    shared_layers: int = 0
    search_trunk: bool = False

    def __call__(
        self,
        model: nn.Module,
        *,
        val_batches: Iterable[Batch] | None = None,
        ood_val_batches: Iterable[Batch] | None = None,
    ) -> HeadScores:
        return circuit_scores(model, val_batches, ood_val_batches=ood_val_batches, **self.options())
