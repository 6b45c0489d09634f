"""What an OOD criterion is, and :func:`ood_scores`, which computes one by its registered name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from torch import Tensor

from hydra_ops.uq.ood_criteria import OOD_CRITERIA
from hydra_ops.uq.uncertainty import validate_probs

Need = Literal["members", "logits"]
NEEDS: tuple[Need, ...] = ("members", "logits")


@dataclass(frozen=True)
class OodInputs:
    """What a criterion reads, validated; only what it declared in ``needs`` is set.

    Shape:
        probs: [N, C] ensemble probabilities (always).
        member_probs: [N, M, C] member probabilities (``members``), else None.
        logits: [N, C] or [N, M, C] logits (``logits``), else None.
    """

    probs: Tensor
    member_probs: Tensor | None = None
    logits: Tensor | None = None


class OodCriterion:
    """One OOD score. A subclass sets :attr:`needs`, :attr:`higher_is_ood` and :attr:`meaning`
    and implements :meth:`statistic`; calling it returns the score oriented higher = more OOD.

    Shape: :class:`OodInputs` -> [N].
    """

    needs: ClassVar[frozenset[Need]] = frozenset()
    """What beyond the ensemble probabilities the statistic reads: ``members`` (member
    probabilities) and/or ``logits``."""
    higher_is_ood: ClassVar[bool] = True
    """The statistic's direction: False for a confidence (the score is then its negative)."""
    meaning: ClassVar[str] = ""
    """One line: what the score measures, as ``hydra-ens predict`` explains it."""

    def statistic(self, inputs: OodInputs) -> Tensor:
        """[N] the criterion's statistic, in its own direction."""
        raise NotImplementedError

    def __call__(self, inputs: OodInputs) -> Tensor:
        value = self.statistic(inputs)
        return value if self.higher_is_ood else -value

    @classmethod
    def needs_members(cls) -> bool:
        """True for an ensemble-only score: a single model (M = 1) gives 0 for every input."""
        return "members" in cls.needs


def ood_criterion(kind: str, argument: str = "kind") -> type[OodCriterion]:
    """The registered criterion ``kind``; one-line ValueError naming the registered ones."""
    return OOD_CRITERIA.get(kind, argument)


def _member_probs(member_probs: Tensor | None, n: int, c: int, kind: str) -> Tensor:
    if member_probs is None:
        raise ValueError(f"member_probs [N, M, C] is required for kind={kind!r}")
    member_probs = validate_probs(member_probs, "member_probs", ndim=3)
    if member_probs.shape[0] != n or member_probs.shape[2] != c:
        raise ValueError(
            f"member_probs must have shape [{n}, M, {c}] to match probs, "
            f"got {tuple(member_probs.shape)}"
        )
    return member_probs


def _logits(logits: Tensor | None, n: int, c: int, kind: str) -> Tensor:
    if logits is None:
        raise ValueError(f"logits [N, C] or [N, M, C] are required for kind={kind!r}")
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
    return logits


def ood_scores(
    probs: Tensor,
    member_probs: Tensor | None = None,
    logits: Tensor | None = None,
    kind: str = "msp",
) -> Tensor:
    """Per-example OOD scores of the registered criterion ``kind``, higher = more OOD.

    Args:
        probs: [N, C] (ensemble) probabilities; always validated.
        member_probs: [N, M, C] member probabilities; required by criteria that need ``members``.
        logits: [N, C] or [N, M, C] logits; required by criteria that need ``logits``.
        kind: a name in :data:`OOD_CRITERIA`.

    Returns:
        [N] float tensor.
    """
    criterion = ood_criterion(kind)
    probs = validate_probs(probs, "probs", ndim=2)
    n, c = probs.shape
    inputs = OodInputs(
        probs=probs,
        member_probs=_member_probs(member_probs, n, c, kind)
        if "members" in criterion.needs
        else None,
        logits=_logits(logits, n, c, kind) if "logits" in criterion.needs else None,
    )
    return criterion()(inputs)
