"""The circuit search's objectives: relative NLL / OOD AUROC of a gated model on cached data.

An :class:`EvalSet` is the validation data of one circuit (optionally a bootstrap resample, run as
the distinct drawn examples weighted by their counts); an :class:`Objective` turns a ``[L, H]``
gate tensor into a loss-like number relative to the all-heads-on model.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from hydra_ops.heads.gating import head_gates

from .inputs import batch_size, select_rows

OBJECTIVES = ("nll", "ood", "avg")


@dataclass
class EvalSet:
    """Cached evaluation data: batches cut to the examples a resample uses, with their counts."""

    batches: list[dict[str, Tensor]]
    counts: list[Tensor]  # per batch, [B'] long, how often each kept example is drawn (>= 1)

    @classmethod
    def build(cls, batches: list[dict[str, Tensor]], gen: torch.Generator | None) -> EvalSet:
        """Every example once (``gen`` None) or a same-size resample with replacement."""
        sizes = [batch_size(b) for b in batches]
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
            kept_batches.append(batch if rows.numel() == c.numel() else select_rows(batch, rows))
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


class Objective:
    """Loss-like objective (lower = better) of a gated model, relative to the all-heads-on model.

    ``nll``: ``NLL / NLL_full``. ``ood``: ``1 - AUROC / AUROC_full`` (MSP, OOD positive).
    ``avg``: the mean of the two. The importance of a head is the objective's increase when it is
    masked, so all three are unitless relative harms and can be averaged across circuits.
    """

    def __init__(self, name: str, adapter: Any, id_set: EvalSet, ood_set: EvalSet | None):
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
                # imported here: torchmetrics' import takes seconds; only this objective needs it
                from torchmetrics.functional.classification import binary_auroc

                auroc = float(binary_auroc(unc, target))
        return nll, auroc

    def __call__(self, gates: Tensor | None) -> float:
        """``J`` of the model with head gates ``gates`` ``[L, H]`` (None: all heads on)."""
        nll, auroc = self._raw(gates)
        rel_nll = nll / max(self.ref_nll, 1e-12)
        rel_auroc = 1.0 - auroc / max(self.ref_auroc, 1e-12)
        if self.name == "nll":
            return rel_nll
        if self.name == "ood":
            return rel_auroc
        return 0.5 * rel_nll + 0.5 * rel_auroc


def objective_list(objective: str | Sequence[str] | None, have_ood: bool) -> list[str]:
    """The objectives rotated across circuits; default all three with OOD data, else ``nll``."""
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
