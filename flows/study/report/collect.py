"""The points collected per model label and seed (``hydra[<variant>]``, the baselines), pooled
where a baseline is the same model in every variant's run at a seed."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from flows.study.report.results import OOD_SPLITS, PointResult
from flows.study.report.stats import seed_stats
from tasks.params.gates import BASELINES

#: Baselines that depend on the variant (pruned with its heads / given its member fine-tune).
PER_VARIANT_BASELINES = ("naive_pruned", "control")
#: Report order of the baselines (the gates' order); others found in evaluate.json follow, sorted.
BASELINE_ORDER = tuple(b for b in BASELINES if b != "prod")
#: Two runs' metrics of one model at one seed are "the same" within these tolerances.
_ISCLOSE = {"rel_tol": 1e-9, "abs_tol": 1e-12}


def is_number(v: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


#: Keys measured by timing: they differ between two runs of the same model (not compared when
#: deciding whether a baseline is the same model in every run at a seed; averaged when pooled).
TIMING_KEYS = (
    "model.latency_ms",
    "model.cost_ratio",
    "model.cost_ratio_low",
    "model.cost_ratio_high",
)


def cost_keys(point: PointResult, name: str) -> dict[str, float]:
    """``model.cost_ratio`` (to the point's single model) with its within-point interval
    (``_low`` / ``_high``) and ``model.flops`` of model ``name`` from the point's ``cost.json``;
    without one, the ratio of its ``latency.json`` entries (same run, not interleaved: no
    interval)."""
    models = (point.cost or {}).get("models") or {}
    if name in models:
        e = models[name]
        keys = {"ratio": "model.cost_ratio", "ratio_low": "model.cost_ratio_low"}
        keys |= {"ratio_high": "model.cost_ratio_high", "flops": "model.flops"}
        return {k: float(e[src]) for src, k in keys.items() if is_number(e.get(src))}
    lat, ref = point.latency.get(name), point.latency.get("single")
    if point.cost is None and is_number(lat) and is_number(ref) and ref > 0:
        return {"model.cost_ratio": float(lat) / float(ref)}
    return {}


def split_info(points: Sequence[PointResult]) -> dict[str, Any]:
    """Whether the points' data splits vary with the seed: ``{"per_seed": bool, "data_seeds":
    [...], "mark": str}``; ``mark`` is what the report prints beside every interval when the
    split is one and the same (the intervals are then conditional on that split)."""
    data_seeds = sorted({int((p.params.get("data") or {}).get("seed", 0)) for p in points})
    seeds = {p.seed for p in points}
    per_seed = len(seeds) < 2 or len(data_seeds) > 1
    return {"per_seed": per_seed, "data_seeds": data_seeds, "mark": "" if per_seed else " ¹"}


def flatten_entry(entry: Mapping[str, Any], latency_ms: Any) -> tuple[dict[str, float], set[str]]:
    """A model entry as ``{"split.metric": v, "model.latency_ms": v, "model.parameters": v,
    "ood_by_score.split.score.metric": v}`` plus the ``ood_by_score.split.score`` keys that are
    null (the score does not apply to the model, e.g. mutual information of a single model)."""
    out: dict[str, float] = {}
    nulls: set[str] = set()
    for split, metrics in (entry.get("calibrated") or {}).items():
        for metric, v in (metrics or {}).items():
            if is_number(v):
                out[f"{split}.{metric}"] = float(v)
    if is_number(latency_ms):
        out["model.latency_ms"] = float(latency_ms)
    if is_number(entry.get("parameters")):
        out["model.parameters"] = float(entry["parameters"])
    by_score = entry.get("ood_by_score")
    if isinstance(by_score, Mapping):
        for split, scores in by_score.items():
            for score, metrics in (scores or {}).items():
                key = f"ood_by_score.{split}.{score}"
                if metrics is None:
                    nulls.add(key)
                    continue
                for metric, v in metrics.items():
                    if is_number(v):
                        out[f"{key}.{metric}"] = float(v)
                    elif v is None:
                        nulls.add(key)
    return out, nulls


def _baseline_rank(name: str) -> tuple[int, str]:
    return (
        (BASELINE_ORDER.index(name), "") if name in BASELINE_ORDER else (len(BASELINE_ORDER), name)
    )


class Collected:
    """Per model label and seed, the flat metrics of that model at that seed.

    Labels: ``hydra[<variant>]``; a shared baseline by its name (``single``), pooled once per
    seed; a per-variant or unshared one as ``<baseline>[<variant>]``. ``series[label][seed]`` is
    ``{"split.metric": value, "model.latency_ms": ..., ...}`` (see :func:`flatten_entry`);
    ``nulls[label]`` the ``ood_by_score`` keys that do not apply; ``meta[label]`` its model,
    variant and seeds; ``unshared`` the baselines that differ between variants, with the seeds.
    """

    def __init__(self, points: Sequence[PointResult]) -> None:
        self.points = sorted(points, key=lambda p: (p.variant, p.seed))
        self.seeds = sorted({p.seed for p in self.points})
        self.variants = sorted({p.variant for p in self.points})
        names = {n for p in self.points for n in p.evaluation["models"] if n != "hydra"}
        self.baselines = sorted(names, key=_baseline_rank)
        self.flat: dict[tuple[str, int, str], tuple[dict[str, float], set[str]]] = {}
        for p in self.points:
            for name, entry in p.evaluation["models"].items():
                flat, nulls = flatten_entry(entry, p.latency.get(name))
                self.flat[(p.variant, p.seed, name)] = ({**flat, **cost_keys(p, name)}, nulls)
        self.split = split_info(self.points)
        self.mark = self.split["mark"]
        self.unshared: dict[str, list[int]] = {}
        self.shared = [b for b in self.baselines if self._is_shared(b)]
        self.series: dict[str, dict[int, dict[str, float]]] = {}
        self.nulls: dict[str, set[str]] = {}
        self.meta: dict[str, dict[str, Any]] = {}
        for v in self.variants:
            self._add(f"hydra[{v}]", "hydra", v)
        for b in self.baselines:
            if b in self.shared:
                self._add(b, b, None)
            else:
                for v in self.variants:
                    self._add(f"{b}[{v}]", b, v)

    def point(self, variant: str, seed: int) -> PointResult | None:
        """The point of ``variant`` at ``seed``, None if the study has none."""
        for p in self.points:
            if p.variant == variant and p.seed == seed:
                return p
        return None

    def at_seed(self, seed: int, name: str) -> list[PointResult]:
        """The points at ``seed`` whose evaluation has model ``name``."""
        return [p for p in self.points if p.seed == seed and name in p.evaluation["models"]]

    def _is_shared(self, name: str) -> bool:
        if name in PER_VARIANT_BASELINES:
            return False
        differs = []
        for s in self.seeds:
            flats = [self.flat[(p.variant, s, name)][0] for p in self.at_seed(s, name)]
            first = {k: v for k, v in flats[0].items() if k not in TIMING_KEYS} if flats else {}
            for other in flats[1:]:
                rest = {k: v for k, v in other.items() if k not in TIMING_KEYS}
                if rest.keys() != first.keys() or not all(
                    math.isclose(first[k], rest[k], **_ISCLOSE) for k in first
                ):
                    differs.append(s)
                    break
        if differs:
            self.unshared[name] = differs
        return not differs

    def _add(self, label: str, name: str, variant: str | None) -> None:
        per_seed: dict[int, dict[str, float]] = {}
        nulls: set[str] = set()
        for s in self.seeds:
            pts = [p for p in self.at_seed(s, name) if variant is None or p.variant == variant]
            if not pts:
                continue
            flats = [self.flat[(p.variant, s, name)] for p in pts]
            keys = sorted({k for f, _ in flats for k in f})
            # identical across the runs at this seed except the timings, which are averaged
            per_seed[s] = {
                k: math.fsum(f[k] for f, _ in flats if k in f) / sum(k in f for f, _ in flats)
                for k in keys
            }
            for _, n in flats:
                nulls |= n
        if not per_seed:
            return
        self.series[label] = per_seed
        self.nulls[label] = nulls
        self.meta[label] = {"model": name, "variant": variant, "seeds": sorted(per_seed)}

    def labels(self) -> list[str]:
        return list(self.series)

    def stats(self, label: str, key: str) -> dict[str, Any] | None:
        """:func:`~flows.study.report.stats.seed_stats` of ``key`` for ``label``; None if absent."""
        per_seed = {s: m[key] for s, m in self.series[label].items() if key in m}
        return seed_stats(per_seed) if per_seed else None


def ood_summary(col: Collected) -> dict[str, Any]:
    """Per model label, split and OOD score, the across-seed stats of each metric of
    ``ood_by_score`` (None: the score does not apply to that model); ``{"available": False}``
    when no point has ``ood_by_score``."""
    available = any(
        "ood_by_score" in e for p in col.points for e in p.evaluation["models"].values()
    )
    if not available:
        return {"available": False}
    models: dict[str, Any] = {}
    for label in col.labels():
        keys = {k for m in col.series[label].values() for k in m if k.startswith("ood_by_score.")}
        entry: dict[str, Any] = {}
        for split in OOD_SPLITS:
            scores = {k.split(".")[2] for k in keys | col.nulls[label] if k.split(".")[1] == split}
            for score in scores:
                prefix = f"ood_by_score.{split}.{score}"
                metrics = sorted({k.rsplit(".", 1)[1] for k in keys if k.startswith(prefix + ".")})
                if metrics:
                    entry.setdefault(split, {})[score] = {
                        m: col.stats(label, f"{prefix}.{m}") for m in metrics
                    }
                else:
                    entry.setdefault(split, {})[score] = None
        models[label] = entry if entry else "unavailable"
    return {"available": True, "models": models}
