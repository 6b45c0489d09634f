"""Histograms of per-example uncertainty scores on ID test, near-OOD and far-OOD, per model: the
data of the run report's histogram figures (``plots/histograms.json``, written by ``evaluate``).

Two scores per model, each at the model's temperature (:func:`hydra_ops.uq.uncertainty.
calibrated_ood_score`, higher = more OOD): ``ood_score``, the kind the gates read
(``evaluate.ood_score``), and ``disagreement``, the fraction of members whose top class is not the
ensemble's (only for models with more than one member: a single model never disagrees with
itself). The three splits of a model share one set of bins, so their bars line up.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

#: (evaluation split, key in the rows): the splits compared in the histograms.
HISTOGRAM_SPLITS = (("test", "id_test"), ("near_ood", "near_ood"), ("far_ood", "far_ood"))
#: Bins of a continuous score (the range of the model's three splits, cut in equal widths).
CONTINUOUS_BINS = 30


def bin_edges(kind: str, values: list[np.ndarray], members: int) -> np.ndarray:
    """Edges shared by the splits of one model and score.

    ``disagreement`` takes the values ``k / M``, ``k = 0..M-1``: one bin centred on each.
    Any other kind: :data:`CONTINUOUS_BINS` equal bins over the range of ``values`` (widened by
    0.5 either side when every value is the same, so the bins have a width).
    """
    if kind == "disagreement":
        return (np.arange(members + 1) - 0.5) / members
    low = min(float(v.min()) for v in values)
    high = max(float(v.max()) for v in values)
    if high <= low:
        low, high = low - 0.5, high + 0.5
    return np.linspace(low, high, CONTINUOUS_BINS + 1)


def score_histograms(
    ood_score: str,
    outputs: dict[str, dict[str, torch.Tensor]],
    temps: dict[str, float],
) -> list[dict[str, Any]]:
    """One row per (model, score, split, bin): ``{model, score, kind, split, lo, hi, center,
    count, fraction}``, ``fraction`` = count / examples of the split (each split's fractions
    sum to 1). ``outputs[model][split]`` are ``[N, M, C]`` member logits."""
    from hydra_ops.uq.calibrated import calibrated_ood_score

    rows: list[dict[str, Any]] = []
    for name, out in outputs.items():
        members = int(out["test"].shape[1])
        scores = [("ood_score", ood_score)]
        if members > 1:
            scores.append(("disagreement", "disagreement"))
        for label, kind in scores:
            values = {
                key: calibrated_ood_score(out[split], temps[name], kind).double().cpu().numpy()
                for split, key in HISTOGRAM_SPLITS
            }
            edges = bin_edges(kind, list(values.values()), members)
            for key, v in values.items():
                counts, _ = np.histogram(np.clip(v, edges[0], edges[-1]), edges)
                rows += [
                    {
                        "model": name,
                        "score": label,
                        "kind": kind,
                        "split": key,
                        "lo": float(lo),
                        "hi": float(hi),
                        "center": float((lo + hi) / 2),
                        "count": int(c),
                        "fraction": float(c) / len(v),
                    }
                    for lo, hi, c in zip(edges[:-1], edges[1:], counts, strict=True)
                ]
    return rows
