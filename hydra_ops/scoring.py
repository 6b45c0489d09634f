"""Head importance scores: which attention heads of a fine-tuned model matter.

``score_heads(model, method, ...)`` returns a :class:`HeadScores` whose ``scores`` is a float
tensor ``[layers, heads]``, higher = more important. Methods (details in docs/scoring.md):

- ``taylor``: Michel et al. (2019). A per-example gate ``xi = 1`` multiplies every head's context
  before the output projection; importance = mean over training examples of ``|dL_i/dxi|``,
  ``L_i`` the example's cross-entropy; optionally L2-normalised per layer. Training data only.
- ``circuit``: the layer-conditioned greedy circuit search of HeadMap (Wang et al., ICLR 2025), run
  ``num_circuits`` times with different objectives / validation bootstrap resamples / an overlap
  penalty so the circuits differ. ``scores`` is the mean importance over circuits, ``circuits`` the
  plans (one per circuit, ``heads_per_layer`` heads per layer).
- ``magnitude``: per-head L2 norm of its q/k/v rows and output-projection columns.
- ``random``: seeded uniform noise, a baseline.

Every method runs the model in eval mode (dropout off) and restores its train/eval state.
Scoring works on unpruned models only: every layer must have the same number of heads.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from torchmetrics.functional.classification import binary_auroc
from tqdm.auto import tqdm

from hydra_ops.adapters import get_adapter
from hydra_ops.gating import head_gates
from hydra_ops.plans import HeadPlan, plan_overlap
from hydra_ops.selection import DEFAULT_PENALTIES, resolve_penalty

METHODS = ("taylor", "circuit", "magnitude", "random")
OBJECTIVES = ("nll", "ood", "avg")
#: Default overlap penalty of the circuit search, in units of the layer's importance range (see
#: docs/scoring.md): a head already taken by an earlier circuit must be better than a free head by
#: more than half the layer's importance range to be taken again. Defined, with the other
#: strategies' defaults, in ``hydra_ops.selection.DEFAULT_PENALTIES``.
DEFAULT_CIRCUIT_PENALTY = DEFAULT_PENALTIES["circuits"]

_FORMAT = "hydra-ens/head-scores/v1"

Batch = Mapping[str, Tensor]
ProgressCallback = Callable[[dict[str, Any]], None]

__all__ = [
    "DEFAULT_CIRCUIT_PENALTY",
    "METHODS",
    "OBJECTIVES",
    "HeadScores",
    "circuit_scores",
    "magnitude_scores",
    "random_scores",
    "score_heads",
    "taylor_scores",
]


# ----------------------------------------------------------------------------------------------
# The result
# ----------------------------------------------------------------------------------------------
@dataclass
class HeadScores:
    """Head importance of one model.

    Attributes:
        scores: ``[L, H]`` float32, higher = more important, finite.
        method: the scoring method (one of ``METHODS``).
        meta: JSON-serialisable details (parameters, data sizes, per-circuit objectives, overlap).
        circuits: for ``circuit`` only, the M plans found (``heads_per_layer`` heads per layer).
    """

    scores: Tensor
    method: str
    meta: dict[str, Any] = field(default_factory=dict)
    circuits: list[HeadPlan] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.scores, Tensor) or self.scores.dim() != 2:
            raise ValueError("HeadScores.scores must be a [layers, heads] tensor")
        if not self.scores.is_floating_point():
            raise ValueError(f"HeadScores.scores must be a float tensor, got {self.scores.dtype}")
        if not torch.isfinite(self.scores).all():
            raise ValueError("HeadScores.scores must be finite (no NaN or inf)")
        self.scores = self.scores.detach().to("cpu", torch.float32).contiguous()
        if self.circuits is not None:
            for plan in self.circuits:
                plan.validate_for([self.num_heads] * self.num_layers)

    @property
    def num_layers(self) -> int:
        return int(self.scores.shape[0])

    @property
    def num_heads(self) -> int:
        return int(self.scores.shape[1])

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write one safetensors file (tensor ``scores`` + JSON metadata), atomically."""
        path = Path(path)
        header = {
            "format": _FORMAT,
            "method": self.method,
            "meta": self.meta,
            "circuits": None if self.circuits is None else [p.to_dict() for p in self.circuits],
        }
        try:
            metadata = {"hydra_head_scores": json.dumps(header, allow_nan=False)}
        except (TypeError, ValueError) as err:
            raise ValueError(f"HeadScores.meta must be JSON-serialisable: {err}") from err
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        try:
            save_file({"scores": self.scores}, tmp, metadata=metadata)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> HeadScores:
        """Read a file written by :meth:`save`."""
        from safetensors import safe_open

        path = Path(path)
        try:
            with safe_open(str(path), framework="pt") as f:
                metadata = f.metadata() or {}
            tensors = load_file(str(path))
        except Exception as err:
            raise ValueError(
                f"{path} is not a readable head-scores safetensors file: {err}"
            ) from err
        raw = metadata.get("hydra_head_scores")
        if raw is None or "scores" not in tensors:
            raise ValueError(f"{path} is a safetensors file but not one written by HeadScores.save")
        header = json.loads(raw)
        if header.get("format") != _FORMAT:
            raise ValueError(f"{path}: unknown head-scores format {header.get('format')!r}")
        circuits = header.get("circuits")
        return cls(
            scores=tensors["scores"],
            method=header["method"],
            meta=header.get("meta") or {},
            circuits=None if circuits is None else [HeadPlan.from_dict(c) for c in circuits],
        )


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------
def _model_device(model: nn.Module) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def _uniform_heads(adapter: Any) -> tuple[int, int]:
    heads = adapter.heads_per_layer()
    if len(set(heads)) != 1:
        raise ValueError(
            f"model: head scoring needs the unpruned model (equal heads per layer), got {heads}"
        )
    return adapter.num_layers, heads[0]


def _materialise(
    batches: Iterable[Batch] | None,
    name: str,
    device: torch.device,
    *,
    need_labels: bool,
    max_batches: int | None,
) -> list[dict[str, Tensor]]:
    """Cache a batch iterable as a list of dicts on ``device`` (run once, reused by every eval)."""
    if batches is None:
        raise ValueError(f"{name} is required for this method (an iterable of batch dicts)")
    if isinstance(batches, Mapping):
        batches = [batches]
    out: list[dict[str, Tensor]] = []
    for batch in batches:
        if max_batches is not None and len(out) >= max_batches:
            break
        if not isinstance(batch, Mapping):
            raise ValueError(f"{name} must yield dicts of tensors, got {type(batch).__name__}")
        if need_labels and "labels" not in batch:
            raise ValueError(f"{name}: every batch needs 'labels' [B] for this method")
        out.append({k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()})
    if not out:
        raise ValueError(f"{name} is empty; pass at least one batch")
    return out


def _batch_size(batch: Mapping[str, Any]) -> int:
    for key in ("input_ids", "pixel_values", "labels"):
        if key in batch:
            return int(batch[key].shape[0])
    raise ValueError("batch has none of input_ids, pixel_values, labels; cannot tell its size")


def _slice(batch: Mapping[str, Any], rows: Tensor) -> dict[str, Any]:
    size = _batch_size(batch)
    return {
        k: v.index_select(0, rows.to(v.device))
        if isinstance(v, Tensor) and v.dim() > 0 and v.shape[0] == size
        else v
        for k, v in batch.items()
    }


def _check_heads_per_layer(heads_per_layer: Any, num_heads: int, num_members: int) -> int:
    if heads_per_layer is None:
        return max(1, num_heads // num_members)
    if (
        isinstance(heads_per_layer, bool)
        or not isinstance(heads_per_layer, int)
        or not 1 <= heads_per_layer <= num_heads
    ):
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


# ----------------------------------------------------------------------------------------------
# taylor
# ----------------------------------------------------------------------------------------------
def taylor_scores(
    model: nn.Module,
    train_batches: Iterable[Batch],
    *,
    normalize: bool = True,
    max_batches: int | None = None,
    progress: bool = False,
) -> HeadScores:
    """Michel et al. (2019) head importance: mean over examples of ``|dL_i/dxi_{l,h}|``.

    ``xi`` is a per-example gate of ones, ``[B, L, H]``, on every head's context
    (``hydra_ops.gating``) and ``L_i`` the cross-entropy of example ``i`` on its label. One
    backward pass of ``sum_i L_i`` gives each example's own gradient ``dL_i/dxi_{i,l,h}`` (the
    examples do not interact in eval mode); the absolute value is taken per example, so opposite
    signs of different examples never cancel, and the mean runs over all examples of all batches.
    With ``normalize`` each layer's row is divided by its L2 norm (Michel et al., section 4.2), so
    every row has unit norm. Only gradients w.r.t. the gates are computed; parameter ``.grad`` is
    left untouched.
    """
    adapter = get_adapter(model)
    num_layers, num_heads = _uniform_heads(adapter)
    device = _model_device(model)
    batches = _materialise(
        train_batches, "train_batches", device, need_labels=True, max_batches=max_batches
    )
    dtype = adapter.out_proj(0).weight.dtype
    total = torch.zeros(num_layers, num_heads, dtype=torch.float64)
    num_examples = 0
    was_training = model.training
    model.eval()
    try:
        for batch in tqdm(batches, desc="taylor", disable=not progress):
            size = _batch_size(batch)
            gates = torch.ones(
                size, num_layers, num_heads, device=device, dtype=dtype, requires_grad=True
            )
            with torch.enable_grad(), head_gates(model, gates):
                logits = adapter.logits(batch)
                loss = F.cross_entropy(logits.float(), batch["labels"].long(), reduction="sum")
                (grad,) = torch.autograd.grad(loss, gates)
            total += grad.detach().abs().sum(dim=0).to("cpu", torch.float64)
            num_examples += size
    finally:
        model.train(was_training)
    scores = total / num_examples
    if normalize:
        norms = scores.norm(dim=1, keepdim=True)
        scores = torch.where(norms > 0, scores / norms.clamp_min(1e-300), scores)
    return HeadScores(
        scores.float(),
        "taylor",
        meta={
            "normalize": normalize,
            "num_batches": len(batches),
            "num_examples": num_examples,
            "loss": "cross_entropy",
            "abs": "per_example",
        },
    )


# ----------------------------------------------------------------------------------------------
# circuit
# ----------------------------------------------------------------------------------------------
@dataclass
class _EvalSet:
    """Cached evaluation data: batches cut to the examples a resample uses, with their counts."""

    batches: list[dict[str, Tensor]]
    counts: list[Tensor]  # per batch, [B'] long, how often each kept example is drawn (>= 1)

    @classmethod
    def build(cls, batches: list[dict[str, Tensor]], gen: torch.Generator | None) -> _EvalSet:
        sizes = [_batch_size(b) for b in batches]
        total = sum(sizes)
        if gen is None:
            counts = torch.ones(total, dtype=torch.long)
        else:
            draw = torch.randint(total, (total,), generator=gen)
            counts = torch.bincount(draw, minlength=total)
        kept_batches, kept_counts = [], []
        for batch, c in zip(batches, torch.split(counts, sizes), strict=True):
            rows = (c > 0).nonzero().flatten()
            if rows.numel() == 0:
                continue
            kept_batches.append(batch if rows.numel() == c.numel() else _slice(batch, rows))
            kept_counts.append(c[rows])
        return cls(kept_batches, kept_counts)

    def log_probs(self, adapter: Any) -> tuple[Tensor, Tensor, Tensor | None]:
        """Per drawn example: log-probabilities [N, C], counts [N], labels [N] (or None)."""
        logps, labels = [], []
        for batch in self.batches:
            logps.append(torch.log_softmax(adapter.logits(batch).float(), dim=-1).cpu())
            if "labels" in batch:
                labels.append(batch["labels"].long().cpu())
        lab = torch.cat(labels) if len(labels) == len(self.batches) else None
        return torch.cat(logps), torch.cat(self.counts), lab


class _Objective:
    """Loss-like objective (lower = better) of a gated model, relative to the all-heads-on model.

    ``nll``: ``NLL / NLL_full``. ``ood``: ``1 - AUROC / AUROC_full`` (MSP, OOD positive).
    ``avg``: the mean of the two. The importance of a head is the objective's increase when it is
    masked, so all three are unitless relative harms and can be averaged across circuits.
    """

    def __init__(self, name: str, adapter: Any, id_set: _EvalSet, ood_set: _EvalSet | None):
        self.name, self.adapter, self.id_set, self.ood_set = name, adapter, id_set, ood_set
        self.ref_nll = 1.0
        self.ref_auroc = 1.0
        self.ref_nll, self.ref_auroc = self._raw(None)

    def _raw(self, gates: Tensor | None) -> tuple[float, float]:
        gating = nullcontext() if gates is None else head_gates(self.adapter.model, gates)
        with torch.inference_mode(), gating:
            nll = auroc = float("nan")
            logp_id, counts_id, labels = self.id_set.log_probs(self.adapter)
            if self.name in ("nll", "avg"):
                per = -logp_id.gather(1, labels[:, None]).squeeze(1)
                nll = float((per * counts_id).sum() / counts_id.sum())
            if self.name in ("ood", "avg"):
                assert self.ood_set is not None
                logp_ood, counts_ood, _ = self.ood_set.log_probs(self.adapter)
                unc = torch.cat(
                    [
                        (1 - logp_id.max(-1).values.exp()).repeat_interleave(counts_id),
                        (1 - logp_ood.max(-1).values.exp()).repeat_interleave(counts_ood),
                    ]
                )
                target = torch.cat(
                    [
                        torch.zeros(int(counts_id.sum()), dtype=torch.long),
                        torch.ones(int(counts_ood.sum()), dtype=torch.long),
                    ]
                )
                auroc = float(binary_auroc(unc, target))
        return nll, auroc

    def __call__(self, gates: Tensor | None) -> float:
        nll, auroc = self._raw(gates)
        rel_nll = nll / max(self.ref_nll, 1e-12)
        rel_auroc = 1.0 - auroc / max(self.ref_auroc, 1e-12)
        if self.name == "nll":
            return rel_nll
        if self.name == "ood":
            return rel_auroc
        return 0.5 * rel_nll + 0.5 * rel_auroc


@contextmanager
def _recording(blocks: Sequence[nn.Module]) -> Iterator[list[list[Any]]]:
    """Record every output of each block in ``blocks``, in call order (one list per block)."""
    records: list[list[Any]] = [[] for _ in blocks]
    handles = [
        block.register_forward_hook(lambda _m, _a, out, rec=rec: rec.append(out))
        for block, rec in zip(blocks, records, strict=True)
    ]
    try:
        yield records
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def _replaying(blocks: Sequence[nn.Module], records: Sequence[Sequence[Any]]) -> Iterator[None]:
    """Within the block, each of ``blocks`` skips its computation and returns its recorded outputs.

    The ``n``-th call of block ``j`` returns ``records[j][n % len(records[j])]``: valid while
    every model run inside the block feeds the same batches in the same order as the recorded
    run(s), and the blocks' inputs and gates are unchanged (the circuit search only varies the gates
    of later layers). Raises RuntimeError if a block was called a number of times that is not a
    multiple of what was recorded (the batch order changed).
    """
    calls = [0] * len(blocks)

    def replay(j: int) -> Callable[..., Any]:
        def forward(*_args: Any, **_kwargs: Any) -> Any:
            out = records[j][calls[j] % len(records[j])]
            calls[j] += 1
            return out

        return forward

    if any(not rec for rec in records):
        raise RuntimeError("a block recorded no output; cannot replay it")
    shadowed = [vars(block).get("forward") for block in blocks]
    for j, block in enumerate(blocks):
        block.forward = replay(j)  # an instance attribute shadows the class's forward
    try:
        yield
    finally:
        for block, previous in zip(blocks, shadowed, strict=True):
            if previous is None:
                del block.forward
            else:
                block.forward = previous
    for j, count in enumerate(calls):
        if count % len(records[j]):
            raise RuntimeError(
                f"replayed block {j} was called {count} times, not a multiple of the "
                f"{len(records[j])} recorded calls: the batches changed during the search"
            )


def _objective_list(objective: str | Sequence[str] | None, have_ood: bool) -> list[str]:
    if objective is None:
        return list(OBJECTIVES) if have_ood else ["nll"]
    names = [objective] if isinstance(objective, str) else list(objective)
    if not names:
        raise ValueError(f"objective is empty; allowed: {', '.join(OBJECTIVES)} or a list of them")
    for name in names:
        if name not in OBJECTIVES:
            raise ValueError(f"objective={name!r} is unknown; allowed: {', '.join(OBJECTIVES)}")
        if name in ("ood", "avg") and not have_ood:
            raise ValueError(
                f"objective={name!r} needs ood_val_batches (an OOD validation set); pass them or "
                "use objective='nll'"
            )
    return names


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
            (0.5, via ``hydra_ops.selection.resolve_penalty``).
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
    if isinstance(num_circuits, bool) or not isinstance(num_circuits, int) or num_circuits < 1:
        raise ValueError(f"num_circuits must be an int >= 1, got {num_circuits!r}")
    try:
        overlap_penalty = resolve_penalty("circuits", overlap_penalty)
    except ValueError:
        raise ValueError(
            f"overlap_penalty must be a finite number >= 0 or None, got {overlap_penalty!r}"
        ) from None
    adapter = get_adapter(model)
    num_layers, num_heads = _uniform_heads(adapter)
    k = _check_heads_per_layer(heads_per_layer, num_heads, num_circuits)
    if (
        isinstance(shared_layers, bool)
        or not isinstance(shared_layers, int)
        or not 0 <= shared_layers < num_layers
    ):
        raise ValueError(
            f"shared_layers must be an int in 0..{num_layers - 1}, got {shared_layers!r}"
        )
    objectives = _objective_list(objective, ood_val_batches is not None)
    device = _model_device(model)
    need_labels = any(o in ("nll", "avg") for o in objectives)
    id_batches = _materialise(
        val_batches, "val_batches", device, need_labels=need_labels, max_batches=max_batches
    )
    ood_batches = None
    if any(o in ("ood", "avg") for o in objectives):
        ood_batches = _materialise(
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
    was_training = model.training
    model.eval()
    bar = tqdm(total=total, desc="circuit search", disable=not progress)
    done = 0
    try:
        for c in range(num_circuits):
            name = objectives[c % len(objectives)]
            gen_id = torch.Generator().manual_seed(seed * 1_000_003 + 2 * c) if bootstrap else None
            gen_ood = (
                torch.Generator().manual_seed(seed * 1_000_003 + 2 * c + 1) if bootstrap else None
            )
            id_set = _EvalSet.build(id_batches, gen_id)
            ood_set = None if ood_batches is None else _EvalSet.build(ood_batches, gen_ood)
            evaluate = _Objective(name, adapter, id_set, ood_set)
            gates = torch.ones(num_layers, num_heads, device=device, dtype=dtype)
            kept: list[tuple[int, ...]] = [tuple(range(num_heads))] * searched.start
            for layer in searched:
                prefix = blocks[:layer] if reuse_prefix else []
                with _recording(prefix) as records:
                    current = evaluate(gates)
                with _replaying(prefix, records):
                    for head in range(num_heads):
                        trial = gates.clone()
                        trial[layer, head] = 0
                        importance[c, layer, head] = evaluate(trial) - current
                        done += 1
                        bar.update(1)
                        if callback is not None:
                            callback(
                                {
                                    "circuit": c,
                                    "layer": layer,
                                    "head": head,
                                    "objective": name,
                                    "importance": float(importance[c, layer, head]),
                                    "done": done,
                                    "total": total,
                                }
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
    finally:
        bar.close()
        model.train(was_training)
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


# ----------------------------------------------------------------------------------------------
# baselines
# ----------------------------------------------------------------------------------------------
def magnitude_scores(model: nn.Module) -> HeadScores:
    """Per-head weight norm: ``sqrt(|Wq_h|^2 + |Wk_h|^2 + |Wv_h|^2 + |Wo_h|^2)`` (Frobenius).

    ``Wq_h`` etc. are head ``h``'s ``head_dim`` rows of the query/key/value weights and ``Wo_h`` its
    columns of the output projection (``adapter.attention_weights(layer)``); biases are ignored.
    """
    adapter = get_adapter(model)
    num_layers, num_heads = _uniform_heads(adapter)
    rows = []
    for layer in range(num_layers):
        w = adapter.attention_weights(layer)
        dh = w.head_dim

        def per_head(t: Tensor, dh: int = dh) -> Tensor:
            return t.detach().float().reshape(num_heads, dh, -1).pow(2).sum(dim=(1, 2))

        sq = per_head(w.q_weight) + per_head(w.k_weight) + per_head(w.v_weight)
        sq = sq + per_head(w.o_weight.t().contiguous())
        rows.append(sq.sqrt().cpu())
    return HeadScores(torch.stack(rows), "magnitude", meta={"norm": "l2", "biases": False})


def random_scores(model: nn.Module, *, seed: int = 0) -> HeadScores:
    """Uniform(0, 1) scores of the model's shape from ``torch.Generator().manual_seed(seed)``."""
    adapter = get_adapter(model)
    num_layers, num_heads = _uniform_heads(adapter)
    gen = torch.Generator().manual_seed(seed)
    return HeadScores(
        torch.rand(num_layers, num_heads, generator=gen), "random", meta={"seed": seed}
    )


# ----------------------------------------------------------------------------------------------
# dispatch
# ----------------------------------------------------------------------------------------------
def score_heads(
    model: nn.Module,
    method: str,
    *,
    train_batches: Iterable[Batch] | None = None,
    val_batches: Iterable[Batch] | None = None,
    ood_val_batches: Iterable[Batch] | None = None,
    normalize: bool = True,
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
    """Score every attention head of ``model`` with ``method`` (one of ``METHODS``).

    ``taylor`` needs ``train_batches`` (with labels; ``normalize``); ``circuit`` needs
    ``val_batches`` (+ ``ood_val_batches`` for the ``ood``/``avg`` objectives) and takes
    ``num_circuits``, ``heads_per_layer``, ``objective``, ``bootstrap``, ``overlap_penalty``,
    ``seed``, ``callback``, ``reuse_prefix``, ``shared_layers``, ``search_trunk`` (see
    :func:`circuit_scores`); ``magnitude`` needs nothing; ``random`` takes ``seed``. Batches
    follow docs/architecture.md; they are cached on the model's device once.
    """
    if method not in METHODS:
        raise ValueError(f"method={method!r} is unknown; allowed: {', '.join(METHODS)}")
    if method == "taylor":
        return taylor_scores(
            model, train_batches, normalize=normalize, max_batches=max_batches, progress=progress
        )
    if method == "circuit":
        return circuit_scores(
            model,
            val_batches,
            ood_val_batches=ood_val_batches,
            num_circuits=num_circuits,
            heads_per_layer=heads_per_layer,
            objective=objective,
            bootstrap=bootstrap,
            overlap_penalty=overlap_penalty,
            seed=seed,
            max_batches=max_batches,
            progress=progress,
            callback=callback,
            reuse_prefix=reuse_prefix,
            shared_layers=shared_layers,
            search_trunk=search_trunk,
        )
    if method == "magnitude":
        return magnitude_scores(model)
    return random_scores(model, seed=seed)
