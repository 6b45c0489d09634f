"""OOD criteria: per-example scores that say how out-of-distribution an input looks.

Higher = more OOD. The scoring rule a detector thresholds (torch-uncertainty keeps these apart
from the metrics too, as ``ood_criteria``): ``msp``, ``entropy``, ``energy`` (logits needed) and
the ensemble-only ``mutual_information`` and ``disagreement`` (member probabilities needed; see
:data:`ENSEMBLE_ONLY_KINDS`). :mod:`hydra_ops.metrics` judges them (AUROC, FPR@95...).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from hydra_ops.uq.uncertainty import decompose, entropy, validate_probs

OOD_SCORE_KINDS: tuple[str, ...] = (
    "msp",
    "entropy",
    "mutual_information",
    "energy",
    "disagreement",
)
OodScoreKind = Literal["msp", "entropy", "mutual_information", "energy", "disagreement"]
ENSEMBLE_ONLY_KINDS: tuple[str, ...] = ("mutual_information", "disagreement")
"""Kinds that read how members differ: a single model (M = 1) has none to read (0 for every
input), so they mean something only for M >= 2."""


def ood_scores(
    probs: Tensor,
    member_probs: Tensor | None = None,
    logits: Tensor | None = None,
    kind: OodScoreKind = "msp",
) -> Tensor:
    """Per-example OOD scores, higher = more OOD.

    Args:
        probs: [N, C] (ensemble) probabilities; always validated.
        member_probs: [N, M, C] member probabilities; required for ``mutual_information`` and
            ``disagreement``.
        logits: [N, C] or [N, M, C] logits; required for ``energy``.
        kind: ``msp`` (``-max_c probs``), ``entropy`` (``H[probs]``, nats),
            ``mutual_information`` (of ``member_probs``), ``disagreement`` (``1 - (1/M)
            #{m : argmax member_probs[n, m] == argmax probs[n]}``: the fraction of members that
            do not vote for the ensemble's class, in ``[0, (M - 1) / M]``; ties in an argmax go
            to the lowest class index), ``energy`` (``-logsumexp(logits)``; averaged over
            members for [N, M, C]).

    Returns:
        [N] float tensor.
    """
    if kind not in OOD_SCORE_KINDS:
        raise ValueError(f"kind must be one of {list(OOD_SCORE_KINDS)}, got {kind!r}")
    probs = validate_probs(probs, "probs", ndim=2)
    n, c = probs.shape
    if kind == "msp":
        return -probs.max(dim=1).values
    if kind == "entropy":
        return entropy(probs)
    if kind in ENSEMBLE_ONLY_KINDS:
        if member_probs is None:
            raise ValueError(f"member_probs [N, M, C] is required for kind={kind!r}")
        member_probs = validate_probs(member_probs, "member_probs", ndim=3)
        if member_probs.shape[0] != n or member_probs.shape[2] != c:
            raise ValueError(
                f"member_probs must have shape [{n}, M, {c}] to match probs, "
                f"got {tuple(member_probs.shape)}"
            )
        if kind == "mutual_information":
            return decompose(member_probs)["mutual_information"]
        votes = member_probs.argmax(dim=-1) == probs.argmax(dim=-1)[:, None]  # [N, M]
        return 1.0 - votes.to(probs.dtype).mean(dim=1)
    if logits is None:
        raise ValueError("logits [N, C] or [N, M, C] are required for kind='energy'")
    if not isinstance(logits, Tensor):
        logits = torch.as_tensor(logits)
    if not logits.is_floating_point() or logits.ndim not in (2, 3):
        raise ValueError(
            f"logits must be a floating tensor of shape [N, C] or [N, M, C], got "
            f"{logits.dtype} {tuple(logits.shape)}"
        )
    if logits.shape[0] != n or logits.shape[-1] != c:
        raise ValueError(
            f"logits must have N={n} rows and C={c} classes to match probs, "
            f"got {tuple(logits.shape)}"
        )
    if not bool(torch.isfinite(logits).all()):
        raise ValueError("logits contains NaN or infinite values")
    energy = -torch.logsumexp(logits, dim=-1)
    return energy.mean(dim=1) if energy.ndim == 2 else energy
