"""Re-checking a compiled artifact against the eager model it was compiled from."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .artifact import model_device_dtype, write_json
from .inputs import arrange_inputs, input_names_of
from .precision import DEFAULT_TOLERANCES, precision_name


def default_tolerance(dtype: torch.dtype | str) -> float:
    """Max abs difference of probabilities allowed for an artifact of this dtype or precision
    (``fp32``: 1e-4, ``bf16``/``fp16``: 2e-2)."""
    return DEFAULT_TOLERANCES[precision_name(dtype)]


def compare_logits(
    eager: Tensor, compiled: Tensor, tolerance: float, min_agreement: float
) -> dict[str, Any]:
    """How far ``compiled`` member logits ``[N, M, C]`` are from ``eager``'s (same shape).

    Returns ``{"max_abs_diff_probs", "max_abs_diff_member_probs", "max_abs_diff_logits",
    "argmax_agreement", "raw_argmax_agreement", "near_ties", "member_argmax_agreement",
    "passed"}``: ``passed`` is max |dp| of the ensemble probabilities (mean of member softmaxes)
    <= ``tolerance`` and ensemble argmax agreement >= ``min_agreement``; a NaN output fails.

    ``argmax_agreement`` counts only the examples the eager model decides: those whose top-two
    ensemble probabilities differ by more than ``tolerance``. Closer than that the two classes
    are tied at the artifact's precision (the tolerance is the probability change it accepts as
    rounding), so a flip between them is not a disagreement; ``near_ties`` says how many examples
    were left out and ``raw_argmax_agreement`` is the agreement over all of them. With no decided
    example the agreement is 1.0. A flip on a decided example with max |dp| <= ``tolerance`` is
    possible (margins between ``tolerance`` and ``2 * tolerance``), so the agreement check is
    not implied by the probability check.
    """
    eager, compiled = eager.float().cpu(), compiled.float().cpu()
    if eager.shape != compiled.shape:
        raise ValueError(f"compiled output shape {tuple(compiled.shape)} != {tuple(eager.shape)}")
    # The mean of the member softmaxes taken directly (not through ensemble_log_probs): these
    # numbers reach metrics/compile.json and the gate, and a NaN output must fail, not raise.
    pe_m, pc_m = eager.softmax(-1), compiled.softmax(-1)
    pe, pc = pe_m.mean(1), pc_m.mean(1)
    agree = pe.argmax(-1) == pc.argmax(-1)
    top2 = pe.topk(min(2, pe.shape[-1]), dim=-1).values
    margin = top2[:, 0] - top2[:, -1] if pe.shape[-1] > 1 else torch.full_like(top2[:, 0], 1.0)
    decided = margin > tolerance
    result: dict[str, Any] = {
        "max_abs_diff_probs": float((pe - pc).abs().max()),
        "max_abs_diff_member_probs": float((pe_m - pc_m).abs().max()),
        "max_abs_diff_logits": float((eager - compiled).abs().max()),
        "argmax_agreement": float(agree[decided].float().mean()) if decided.any() else 1.0,
        "raw_argmax_agreement": float(agree.float().mean()),
        "near_ties": int((~decided).sum()),
        "member_argmax_agreement": float((pe_m.argmax(-1) == pc_m.argmax(-1)).float().mean()),
    }
    result["passed"] = bool(
        result["max_abs_diff_probs"] <= tolerance and result["argmax_agreement"] >= min_agreement
    )
    return result


#: What :func:`verify_compiled_by_split` keeps of each split's :func:`compare_logits` record.
PER_SPLIT_KEYS = (
    "max_abs_diff_probs",
    "argmax_agreement",
    "raw_argmax_agreement",
    "near_ties",
    "passed",
)


def _batches(inputs: Mapping[str, Tensor] | Sequence[Any] | Iterable[Any]) -> list[Any]:
    if isinstance(inputs, Mapping):
        return [inputs]
    items = list(inputs)
    if items and isinstance(items[0], Tensor):
        return [tuple(items)]
    return items


@torch.no_grad()
def verify_compiled(
    artifact: Callable[..., Tensor],
    model: nn.Module,
    heldout_inputs: Mapping[str, Tensor] | Sequence[Any] | Iterable[Any],
    *,
    tolerance: float | None = None,
    min_agreement: float = 1.0,
    out_path: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """Re-check a compiled artifact against the eager model on held-out inputs.

    Args:
        artifact: a :class:`~hydra_ops.compile.CompiledArtifact` (or any callable with its call
            convention).
        model: the eager merged model it was compiled from.
        heldout_inputs: one batch (mapping or positional tuple) or an iterable of batches.
        tolerance: max allowed abs difference of ensemble probabilities (default by the
            artifact's ``precision``, else the model's dtype: 1e-4 for fp32, 2e-2 for fp16/bf16).
        min_agreement: minimum fraction of examples whose ensemble argmax agrees.
        out_path: if given, the result is also written there as JSON (atomically).

    Returns:
        ``{"backend", "passed", "max_abs_diff_probs", "max_abs_diff_member_probs",
        "max_abs_diff_logits", "argmax_agreement", "member_argmax_agreement", "num_examples",
        "tolerance", "min_agreement"}``; ``passed`` is what the gate stage checks.
    """
    if not 0.0 <= min_agreement <= 1.0:
        raise ValueError(f"min_agreement must be in [0, 1], got {min_agreement!r}")
    batches = _batches(heldout_inputs)
    if not batches:
        raise ValueError("heldout_inputs must hold at least one batch")
    tol = _tolerance(artifact, model, tolerance)
    eager, compiled, _ = _both_outputs(artifact, model, batches)
    compared = compare_logits(eager, compiled, tol, min_agreement)
    result = {
        "backend": getattr(artifact, "backend", "callable"),
        "num_examples": int(eager.shape[0]),
        **compared,
        "tolerance": tol,
        "min_agreement": float(min_agreement),
    }
    if out_path is not None:
        target = Path(out_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        write_json(target, result)
    return result


def _tolerance(artifact: Any, model: nn.Module, tolerance: float | None) -> float:
    """The tolerance given, else the default of the artifact's ``precision`` (else the model's
    dtype)."""
    if tolerance is not None:
        return float(tolerance)
    _, dtype = model_device_dtype(model)
    shipped = artifact.get("precision") if isinstance(artifact, Mapping) else None
    return default_tolerance(shipped or dtype)


def _both_outputs(
    artifact: Callable[..., Tensor],
    model: nn.Module,
    batches: list[Any],
    eager: Tensor | None = None,
) -> tuple[Tensor, Tensor, list[int]]:
    """``(eager [N, M, C], compiled [N, M, C], sorted distinct sequence lengths)`` on CPU in
    fp32 over ``batches`` (image batches have no sequence length: ``[]``); ``eager`` given: the
    model's outputs on ``batches``, not computed again."""
    model.eval()
    names = getattr(artifact, "input_names", None)
    eager_out, compiled_out, lengths = [], [], set()
    for batch in batches:
        tensors = arrange_inputs(batch, names or input_names_of(batch))
        if not tensors[0].is_floating_point():
            lengths.add(int(tensors[0].shape[1]))
        if eager is None:
            eager_out.append(model(*tensors).float().cpu())
        compiled_out.append(artifact(*tensors).float().cpu())
    compiled = torch.cat(compiled_out)
    if eager is None:
        eager = torch.cat(eager_out)
    elif eager.shape != compiled.shape:
        raise ValueError(f"reference shape {tuple(eager.shape)} != {tuple(compiled.shape)}")
    return eager, compiled, sorted(lengths)


@torch.no_grad()
def eager_outputs(model: nn.Module, groups: Mapping[str, Sequence[Any]]) -> dict[str, Tensor]:
    """The eager model's member logits on every group, in fp32 on CPU: the ``reference`` of
    :func:`verify_compiled_by_split`, computed once when several artifacts are checked on the
    same groups.

    Shape:
        ``{split: [N, M, C]}``, N the examples of the split's batches.
    """
    model.eval()
    out: dict[str, Tensor] = {}
    for name, batches in groups.items():
        if len(batches):
            names = input_names_of(batches[0])
            out[name] = torch.cat([model(*arrange_inputs(b, names)).float().cpu() for b in batches])
    return out


@torch.no_grad()
def verify_compiled_by_split(
    artifact: Callable[..., Tensor],
    model: nn.Module,
    groups: Mapping[str, Sequence[Any]],
    *,
    tolerance: float | None = None,
    min_agreement: float = 1.0,
    reference: Mapping[str, Tensor] | None = None,
) -> dict[str, Any]:
    """:func:`verify_compiled` over held-out batches grouped by split, every group at once and
    each on its own.

    Args:
        groups: ``{split: [batch, ...]}`` (batches as :func:`verify_compiled` takes them; text
            batches may differ in sequence length). At least one non-empty group.
        reference: ``model``'s outputs on ``groups`` (:func:`eager_outputs`), so checking a
            second artifact does not run the eager model again; None: computed here.

    Returns:
        :func:`verify_compiled`'s record over all groups together (``passed`` needs every
        example within ``tolerance`` and the overall agreement), plus ``seq_lengths`` (distinct
        text lengths checked) and ``splits``: ``{split: {"num_examples", "seq_lengths",
        "max_abs_diff_probs", "argmax_agreement", "passed"}}``.
    """
    if not 0.0 <= min_agreement <= 1.0:
        raise ValueError(f"min_agreement must be in [0, 1], got {min_agreement!r}")
    groups = {name: list(b) for name, b in groups.items() if len(b)}
    if not groups:
        raise ValueError("groups must hold at least one batch")
    tol = _tolerance(artifact, model, tolerance)
    per: dict[str, dict[str, Any]] = {}
    eager_all, compiled_all, lengths_all = [], [], set()
    for name, batches in groups.items():
        known = None if reference is None else reference[name]
        eager, compiled, lengths = _both_outputs(artifact, model, batches, known)
        compared = compare_logits(eager, compiled, tol, min_agreement)
        per[name] = {
            "num_examples": int(eager.shape[0]),
            "seq_lengths": lengths,
            **{k: compared[k] for k in PER_SPLIT_KEYS},
        }
        eager_all.append(eager)
        compiled_all.append(compiled)
        lengths_all.update(lengths)
    eager, compiled = torch.cat(eager_all), torch.cat(compiled_all)
    return {
        "backend": getattr(artifact, "backend", "callable"),
        "num_examples": int(eager.shape[0]),
        **compare_logits(eager, compiled, tol, min_agreement),
        "tolerance": tol,
        "min_agreement": float(min_agreement),
        "seq_lengths": sorted(lengths_all),
        "splits": per,
    }
