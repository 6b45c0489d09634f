"""The study report: every (variant, seed) point of ``hydra-ens study`` summarised across seeds.

A study runs one full pipeline per (variant, seed) point; each point leaves
``metrics/evaluate.json``, ``metrics/latency.json``, ``reports/gate.json`` and its resolved
``params.yaml`` (:func:`load_point` reads them into a :class:`PointResult`).
:func:`write_study_report` turns the points into ``study.md``, ``study.json`` (the numbers behind
the Markdown) and ``figures/*.png`` (Pareto plots), all written atomically. It is a pure function
of its inputs: no Prefect, no DVC, no clock; orders are sorted and figure sizes fixed.

Conventions (docs/study_report.md says what each table means):

- Statistics are across seeds: the mean and the 95% Student-t interval
  ``mean +- t(0.975, n - 1) * s / sqrt(n)`` (``s`` the sample standard deviation); one seed has
  no interval. Metrics are the calibrated ones (temperature scaling fitted on validation).
- Models: ``hydra[<variant>]`` per variant; ``naive_pruned`` and ``control`` depend on the variant
  (``naive_pruned[<variant>]``...); every other baseline (``single``, ``deep_ensemble``,
  ``mc_dropout``) is recomputed by every point but is the same model at a given seed, so it is
  pooled once per seed (its latency, measured by every run, averaged over the runs at that seed).
  A "shared" baseline whose metrics differ between variants at one seed (a variant overrides
  something it depends on, e.g. ``members.num_members`` sizes the Deep Ensemble) is kept per
  variant instead, and the report says so.
- Paired differences are Hydra minus a baseline within one point (the same run), per seed.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hydra_ops.atomic import atomic_write_bytes, atomic_write_dir
from tasks.gate import evaluate_check
from tasks.params import (
    CLASSIFICATION_METRICS,
    GREATER_IS_BETTER,
    OOD_METRICS,
    GateCheck,
    default_gates,
)

#: The calibrated splits of evaluate.json, in report order.
SPLITS = ("id_test", "shift", "near_ood", "far_ood")
OOD_SPLITS = ("near_ood", "far_ood")
#: Baselines that depend on the variant (pruned with its heads / given its member fine-tune).
PER_VARIANT_BASELINES = ("naive_pruned", "control")
#: Report order of the baselines; others found in evaluate.json follow, sorted.
BASELINE_ORDER = ("single", "naive_pruned", "deep_ensemble", "mc_dropout", "control")
#: Report order of the OOD scores of ``ood_by_score``; others follow, sorted.
OOD_SCORE_ORDER = ("msp", "entropy", "energy", "mutual_information", "disagreement")
#: The headline metrics of the paired differences (split.metric).
HEADLINE = (
    "id_test.accuracy",
    "id_test.nll",
    "id_test.ece",
    "near_ood.auroc",
    "near_ood.fpr_at_95_tpr",
    "far_ood.auroc",
)
#: Baselines Hydra is paired with (those present in evaluate.json).
PAIRED_BASELINES = ("single", "deep_ensemble", "mc_dropout")
#: The UQ metrics on which the report states whether any variant beats the single model.
BEATS_SINGLE = ("id_test.nll", "id_test.ece", "near_ood.auroc", "near_ood.fpr_at_95_tpr")
#: Pareto panels: (file stem, y metric key, y label).
PARETO = (
    ("pareto_near_ood_auroc", "near_ood.auroc", "near-OOD AUROC (higher is better)"),
    ("pareto_nll", "id_test.nll", "ID test NLL (lower is better)"),
)
CONFIDENCE = 0.95
FIGSIZE = (7.0, 5.0)
DPI = 100
_ISCLOSE = {"rel_tol": 1e-9, "abs_tol": 1e-12}

POINT_FILES = {
    "evaluation": "metrics/evaluate.json",
    "latency": "metrics/latency.json",
    "gate": "reports/gate.json",
    "params": "params.yaml",
}


@dataclass(frozen=True)
class PointResult:
    """One (variant, seed) point of a study: what its pipeline run left.

    ``evaluation``: ``metrics/evaluate.json``; ``latency``: ``metrics/latency.json`` (model name ->
    median ms per batch); ``gate``: ``reports/gate.json``; ``params``: the resolved
    ``params.yaml`` as a plain dict.
    """

    variant: str
    seed: int
    evaluation: dict[str, Any]
    latency: dict[str, Any]
    gate: dict[str, Any]
    params: dict[str, Any]


def load_point(folder: str | os.PathLike[str], variant: str, seed: int) -> PointResult:
    """Read a point's files from ``folder`` (the pipeline's layout, :data:`POINT_FILES`).

    A missing or unreadable file raises a one-line ValueError naming the point and the path.
    """
    folder = Path(folder)
    where = f"study point {variant!r} seed {seed}"
    loaded: dict[str, Any] = {}
    for field, rel in POINT_FILES.items():
        path = folder / rel
        if not path.is_file():
            raise ValueError(f"{where}: {path} is missing; did that pipeline run finish?")
        text = path.read_text()
        try:
            value = yaml.safe_load(text) if path.suffix == ".yaml" else json.loads(text)
        except (json.JSONDecodeError, yaml.YAMLError) as err:
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ValueError(f"{where}: {path} is corrupted ({first})") from None
        if not isinstance(value, dict):
            raise ValueError(f"{where}: {path} must hold a mapping, got {type(value).__name__}")
        loaded[field] = value
    return PointResult(variant=variant, seed=int(seed), **loaded)


# ---------------------------------------------------------------- statistics


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """``{"n", "mean", "low", "high"}`` of ``values`` (across seeds): the Student-t interval of the
    mean at ``confidence``; ``low``/``high`` are None for n = 1 (no interval), ``mean`` None for
    n = 0."""
    from scipy.stats import t

    vals = [float(v) for v in values]
    n = len(vals)
    if n == 0:
        return {"n": 0, "mean": None, "low": None, "high": None}
    mean = math.fsum(vals) / n
    if n == 1:
        return {"n": 1, "mean": mean, "low": None, "high": None}
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (n - 1))
    half = float(t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "low": mean - half, "high": mean + half}


def _stats(per_seed: Mapping[int, float]) -> dict[str, Any]:
    seeds = sorted(per_seed)
    return {
        **mean_interval([per_seed[s] for s in seeds]),
        "per_seed": [{"seed": s, "value": per_seed[s]} for s in seeds],
    }


def pareto_front(
    points: Iterable[tuple[str, float, float]], y_greater_is_better: bool
) -> list[str]:
    """Labels of the non-dominated ``(label, x, y)`` points, x (latency) lower is better, sorted
    by x then label. ``q`` dominates ``p`` when it is no worse on both axes and better on one."""
    pts = list(points)

    def better_eq(a: float, b: float) -> bool:
        return a >= b if y_greater_is_better else a <= b

    front = []
    for label, x, y in pts:
        dominated = any(
            qx <= x and better_eq(qy, y) and (qx < x or qy != y)
            for q_label, qx, qy in pts
            if q_label != label
        )
        if not dominated:
            front.append((x, label))
    return [label for _, label in sorted(front)]


# ---------------------------------------------------------------- collecting the points


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _flat(entry: Mapping[str, Any], latency_ms: Any) -> tuple[dict[str, float], set[str]]:
    """A model entry as ``{"split.metric": v, "model.latency_ms": v, "model.parameters": v,
    "ood_by_score.split.score.metric": v}`` plus the ``ood_by_score.split.score`` keys that are
    null (the score does not apply to the model, e.g. mutual information of a single model)."""
    out: dict[str, float] = {}
    nulls: set[str] = set()
    for split, metrics in (entry.get("calibrated") or {}).items():
        for metric, v in (metrics or {}).items():
            if _number(v):
                out[f"{split}.{metric}"] = float(v)
    if _number(latency_ms):
        out["model.latency_ms"] = float(latency_ms)
    if _number(entry.get("parameters")):
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
                    if _number(v):
                        out[f"{key}.{metric}"] = float(v)
                    elif v is None:
                        nulls.add(key)
    return out, nulls


def _baseline_rank(name: str) -> tuple[int, str]:
    return (
        (BASELINE_ORDER.index(name), "") if name in BASELINE_ORDER else (len(BASELINE_ORDER), name)
    )


def _validate(points: Sequence[PointResult], title: str) -> None:
    if not isinstance(title, str) or not title.strip():
        raise ValueError(f"title must be a non-empty string, got {title!r}")
    if not isinstance(points, Sequence) or isinstance(points, str) or not points:
        raise ValueError("points must be a non-empty list of PointResult")
    seen: set[tuple[str, int]] = set()
    for i, p in enumerate(points):
        if not isinstance(p, PointResult):
            raise ValueError(f"points[{i}] must be a PointResult, got {type(p).__name__}")
        key = (p.variant, p.seed)
        if key in seen:
            raise ValueError(f"points: duplicate point variant {p.variant!r} seed {p.seed}")
        seen.add(key)
        models = p.evaluation.get("models")
        if not isinstance(models, Mapping) or "hydra" not in models:
            raise ValueError(
                f"points[{i}] (variant {p.variant!r} seed {p.seed}): evaluation has no "
                "models.hydra; is it a metrics/evaluate.json?"
            )


class _Collected:
    """Per model label and seed, the flat metrics of that model at that seed."""

    def __init__(self, points: Sequence[PointResult]) -> None:
        self.points = sorted(points, key=lambda p: (p.variant, p.seed))
        self.seeds = sorted({p.seed for p in self.points})
        self.variants = sorted({p.variant for p in self.points})
        names = {n for p in self.points for n in p.evaluation["models"] if n != "hydra"}
        self.baselines = sorted(names, key=_baseline_rank)
        self.flat: dict[tuple[str, int, str], tuple[dict[str, float], set[str]]] = {}
        for p in self.points:
            for name, entry in p.evaluation["models"].items():
                self.flat[(p.variant, p.seed, name)] = _flat(entry, p.latency.get(name))
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
        for p in self.points:
            if p.variant == variant and p.seed == seed:
                return p
        return None

    def at_seed(self, seed: int, name: str) -> list[PointResult]:
        return [p for p in self.points if p.seed == seed and name in p.evaluation["models"]]

    def _is_shared(self, name: str) -> bool:
        if name in PER_VARIANT_BASELINES:
            return False
        differs = []
        for s in self.seeds:
            flats = [self.flat[(p.variant, s, name)][0] for p in self.at_seed(s, name)]
            first = {k: v for k, v in flats[0].items() if k != "model.latency_ms"} if flats else {}
            for other in flats[1:]:
                rest = {k: v for k, v in other.items() if k != "model.latency_ms"}
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
            # identical across the runs at this seed except latency, which is averaged
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
        per_seed = {s: m[key] for s, m in self.series[label].items() if key in m}
        return _stats(per_seed) if per_seed else None


# ---------------------------------------------------------------- gates


def _gate_checks(params: Mapping[str, Any]) -> list[GateCheck]:
    raw = params.get("gates")
    return [GateCheck.model_validate(g) for g in (default_gates() if raw is None else raw)]


def _with_latency(p: PointResult) -> dict[str, Any]:
    models = {
        name: {**entry, **({"latency_ms": p.latency[name]} if name in p.latency else {})}
        for name, entry in p.evaluation["models"].items()
    }
    return {**p.evaluation, "models": models}


def baseline_as_candidate(
    checks: Sequence[GateCheck], evaluation: Mapping[str, Any], candidate: str
) -> list[dict[str, Any]]:
    """The gate checks judged with baseline ``candidate`` in Hydra's place (a shim over
    :func:`tasks.gate.evaluate_check`, which always judges ``models.hydra``).

    Not applicable (status ``n/a``): model-level checks (split ``model``: compile, latency and
    parameter thresholds are facts of the shipped Hydra artifact), ``prod`` comparisons (a study
    point has no prod model) and a comparison of the candidate with itself, unless the check asks
    for a strict improvement (``min_absolute_change > 0``), which no model makes on itself: that
    fails. A check with
    ``use_bootstrap_bound`` compares the point difference instead: the paired bootstrap in
    evaluate.json is Hydra minus each baseline, not candidate minus baseline.
    """
    ev = {
        **evaluation,
        "models": {**evaluation["models"], "hydra": evaluation["models"][candidate]},
        "bootstrap": {},
    }
    out = []
    for check in checks:
        rec = {"name": check.name, "metric": check.metric, "split": check.split}
        if check.split == "model":
            out.append({**rec, "status": "n/a", "note": "model-level check (Hydra artifact)"})
        elif check.baseline == "prod":
            out.append({**rec, "status": "n/a", "note": "no prod model in a study point"})
        elif check.baseline == candidate and (check.min_absolute_change or 0) > 0:
            r = evaluate_check(check.model_copy(update={"use_bootstrap_bound": False}), ev, None)
            out.append({**r, "note": "a model cannot improve on itself"})
        elif check.baseline == candidate:
            out.append({**rec, "status": "n/a", "note": "the candidate is this check's baseline"})
        elif check.use_bootstrap_bound:
            r = evaluate_check(check.model_copy(update={"use_bootstrap_bound": False}), ev, None)
            note = "point difference: no paired bootstrap of candidate - baseline"
            out.append({**r, "note": note})
        else:
            out.append(evaluate_check(check, ev, None))
    return out


def _point_gate(p: PointResult, gates: Sequence[GateCheck] | None = None) -> dict[str, Any]:
    """The point's verdict: its ``reports/gate.json``, or ``gates`` judged on its evaluation."""
    if gates is not None:
        from tasks.gate import evaluate_check

        ev = _with_latency(p)
        checks = [evaluate_check(c, ev, None) for c in gates]
        failed = [c["name"] for c in checks if c["status"] == "failed" and not c.get("optional")]
        gate = {"verdict": "failed" if failed else "passed", "failed": failed, "checks": checks}
    else:
        gate = p.gate
    failed = sorted(
        gate.get("failed")
        or [c["name"] for c in gate.get("checks", []) if c.get("status") == "failed"]
    )
    verdict = gate.get("verdict") or ("passed" if gate.get("passed") and not failed else "failed")
    return {
        "variant": p.variant,
        "seed": p.seed,
        "verdict": verdict,
        "passed": verdict == "passed",
        "failed": failed,
        "statuses": {c["name"]: c.get("status") for c in gate.get("checks", [])},
    }


def _baseline_gates(col: _Collected, gates: Sequence[GateCheck] | None = None) -> dict[str, Any]:
    """Per baseline label: per seed the verdict with the gate checks of that point's params (or
    ``gates``)."""
    result: dict[str, Any] = {}
    for b in col.baselines:
        for v in [None] if b in col.shared else col.variants:
            label = b if v is None else f"{b}[{v}]"
            rows = []
            for s in col.seeds:
                pts = [p for p in col.at_seed(s, b) if v is None or p.variant == v]
                judged = [
                    (p, baseline_as_candidate(gates or _gate_checks(p.params), _with_latency(p), b))
                    for p in pts
                ]
                if not judged:
                    continue
                statuses = {json.dumps([(c["name"], c["status"]) for c in j]) for _, j in judged}
                # a shared baseline judged identically by every run at this seed: one row
                groups = judged[:1] if len(statuses) == 1 else judged
                for p, checks in groups:
                    failed = sorted(c["name"] for c in checks if c["status"] == "failed")
                    rows.append(
                        {
                            "seed": s,
                            "in_run_of": p.variant if v is None and len(groups) > 1 else None,
                            "passed": not failed,
                            "failed": failed,
                            "not_applicable": sorted(
                                c["name"]
                                for c in checks
                                if c["status"] == "n/a" and c["split"] != "model"
                            ),
                            "checks": checks,
                        }
                    )
            if rows:
                caught: dict[str, list[int]] = {}
                for r in rows:
                    for name in r["failed"]:
                        caught.setdefault(name, []).append(r["seed"])
                result[label] = {
                    "model": b,
                    "variant": v,
                    "rows": rows,
                    "seeds_passed": sorted({r["seed"] for r in rows if r["passed"]}),
                    "caught_by": {k: sorted(set(ss)) for k, ss in sorted(caught.items())},
                }
    return result


# ---------------------------------------------------------------- paired differences


def _paired(col: _Collected) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for v in col.variants:
        for b in PAIRED_BASELINES:
            per_metric: dict[str, Any] = {}
            for key in HEADLINE:
                split, metric = key.split(".", 1)
                diffs: dict[int, float] = {}
                boot: list[dict[str, Any]] = []
                for s in col.seeds:
                    p = col.point(v, s)
                    if p is None or b not in p.evaluation["models"]:
                        continue
                    h = col.flat[(v, s, "hydra")][0]
                    base = col.flat[(v, s, b)][0]
                    if key not in h or key not in base:
                        continue
                    diffs[s] = h[key] - base[key]
                    interval = (
                        p.evaluation.get("bootstrap", {})
                        .get(b, {})
                        .get("calibrated", {})
                        .get(split, {})
                        .get(metric)
                    )
                    if interval is not None:
                        lo, hi = float(interval["low"]), float(interval["high"])
                        boot.append(
                            {
                                "seed": s,
                                "low": lo,
                                "high": hi,
                                "excludes_zero": lo > 0 or hi < 0,
                                "direction": _direction(metric, lo, hi),
                            }
                        )
                if diffs:
                    per_metric[key] = {
                        **_stats(diffs),
                        "greater_is_better": GREATER_IS_BETTER.get(metric),
                        "bootstrap": boot,
                    }
            if per_metric:
                out.setdefault(v, {})[b] = per_metric
    return out


def _direction(metric: str, low: float, high: float) -> str:
    """``better`` / ``worse`` when the interval of Hydra - baseline excludes 0, else ``n.s.``."""
    gib = GREATER_IS_BETTER.get(metric, True)
    if low > 0:
        return "better" if gib else "worse"
    if high < 0:
        return "worse" if gib else "better"
    return "n.s."


def _beats(stats: Mapping[str, Any], metric: str) -> bool:
    if stats.get("low") is None:
        return False
    return stats["low"] > 0 if GREATER_IS_BETTER.get(metric, True) else stats["high"] < 0


def _beats_single(col: _Collected, paired: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for key in BEATS_SINGLE:
        metric = key.split(".", 1)[1]
        winners = []
        for v in col.variants:
            st = paired.get(v, {}).get("single", {}).get(key)
            if st is not None and _beats(st, metric):
                winners.append(v)
        if winners:
            details = []
            for v in winners:
                st = paired[v]["single"][key]
                details.append(f"`{v}` ({_diff_cell(st)}, n={st['n']})")
            sentence = (
                f"Variants that beat the single model on {key} across seeds (Hydra - single, "
                "mean [95%]): " + ", ".join(details) + "."
            )
        else:
            n_max = max(
                (
                    paired.get(v, {}).get("single", {}).get(key, {}).get("n", 0)
                    for v in col.variants
                ),
                default=0,
            )
            why = " (n=1, no interval)" if n_max == 1 else ""
            if "single" not in col.baselines:
                why = " (no single model evaluated)"
            sentence = f"no variant beats the single model on {key} across seeds{why}."
        out[key] = {"variants": winners, "sentence": sentence}
    return out


# ---------------------------------------------------------------- recommendation


def _recommend(col: _Collected, gates: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    by_point = {(g["variant"], g["seed"]): g for g in gates}
    rows = []
    for v in col.variants:
        failing: dict[int, list[str]] = {}
        for s in col.seeds:
            g = by_point.get((v, s))
            if g is None:
                failing[s] = ["no result for this seed"]
            elif not g["passed"]:
                failing[s] = g["failed"] or [f"verdict {g['verdict']}"]
        lat = col.stats(f"hydra[{v}]", "model.latency_ms")
        par = col.stats(f"hydra[{v}]", "model.parameters")
        rows.append(
            {
                "variant": v,
                "passes_every_seed": not failing,
                "seeds_passed": [s for s in col.seeds if s not in failing],
                "failing": {str(s): f for s, f in sorted(failing.items())},
                "latency_ms": lat["mean"] if lat else None,
                "parameters": par["mean"] if par else None,
            }
        )

    def cost(r: Mapping[str, Any]) -> tuple[float, float, str]:
        lat, par = r["latency_ms"], r["parameters"]
        return (math.inf if lat is None else lat, math.inf if par is None else par, r["variant"])

    passing = sorted((r for r in rows if r["passes_every_seed"]), key=cost)
    n = len(col.seeds)
    if passing:
        best = passing[0]
        lat = "unknown" if best["latency_ms"] is None else f"{best['latency_ms']:.2f} ms"
        sentence = (
            f"Recommended: `{best['variant']}`, the cheapest variant that passes the gates on "
            f"every seed ({n} seed{'s' if n != 1 else ''}); mean Hydra latency {lat}"
            + (
                f", {best['parameters']:,.0f} parameters."
                if best["parameters"] is not None
                else "."
            )
        )
        others = [r["variant"] for r in passing[1:]]
        if others:
            sentence += (
                " Also passing on every seed (costlier): "
                + ", ".join(f"`{o}`" for o in others)
                + "."
            )
        return {"variant": best["variant"], "sentence": sentence, "variants": rows}
    best = sorted(
        rows,
        key=lambda r: (
            -len(r["seeds_passed"]),
            sum(len(f) for f in r["failing"].values()),
            *cost(r),
        ),
    )[0]
    fails = "; ".join(f"seed {s}: {', '.join(f)}" for s, f in best["failing"].items())
    sentence = (
        "No variant passes the gates on every seed. The best is "
        f"`{best['variant']}` (passes {len(best['seeds_passed'])} of {n} seeds); it fails on "
        f"{fails}."
    )
    return {"variant": None, "best": best["variant"], "sentence": sentence, "variants": rows}


# ---------------------------------------------------------------- figures


def _pareto_figure(
    entries: Sequence[Mapping[str, Any]], front: Sequence[str], ylabel: str
) -> bytes:
    """PNG bytes: one error-barred point per model at its mean (squares: Hydra variants), the
    Pareto front filled red and joined."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    names_at: dict[tuple[float, float], list[str]] = {}
    for e in entries:
        on_front = e["label"] in front
        ax.errorbar(
            e["x"],
            e["y"],
            xerr=e["xerr"],
            yerr=e["yerr"],
            fmt="s" if e["label"].startswith("hydra[") else "o",
            color="tab:red" if on_front else "tab:blue",
            mfc="tab:red" if on_front else "white",
            capsize=3,
        )
        names_at.setdefault((e["x"], e["y"]), []).append(e["label"])
    for (x, y), names in names_at.items():  # models at the same point share one label
        ax.annotate(", ".join(names), (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    by_label = {e["label"]: e for e in entries}
    if len(front) > 1:
        ax.plot(
            [by_label[f]["x"] for f in front],
            [by_label[f]["y"] for f in front],
            "--",
            color="tab:red",
            label="Pareto front",
        )
        ax.legend(loc="best", fontsize=8)
    ax.set_xlabel("latency (ms per batch, mean across seeds)")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _err(st: Mapping[str, Any] | None) -> list[list[float]] | None:
    if st is None or st["low"] is None:
        return None
    return [[st["mean"] - st["low"]], [st["high"] - st["mean"]]]


def _pareto(col: _Collected) -> tuple[dict[str, Any], dict[str, bytes]]:
    summary: dict[str, Any] = {}
    figures: dict[str, bytes] = {}
    for stem, key, ylabel in PARETO:
        entries, missing = [], []
        for label in col.labels():
            xs, ys = col.stats(label, "model.latency_ms"), col.stats(label, key)
            if xs is None or ys is None:
                missing.append(label)
                continue
            entries.append(
                {
                    "label": label,
                    "x": xs["mean"],
                    "y": ys["mean"],
                    "xerr": _err(xs),
                    "yerr": _err(ys),
                }
            )
        metric = key.split(".", 1)[1]
        front = pareto_front(
            ((e["label"], e["x"], e["y"]) for e in entries), GREATER_IS_BETTER[metric]
        )
        path = f"figures/{stem}.png"
        figures[path] = _pareto_figure(entries, front, ylabel)
        summary[key] = {
            "figure": path,
            "front": front,
            "points": [{k: e[k] for k in ("label", "x", "y")} for e in entries],
            "missing": missing,
        }
    return summary, figures


# ---------------------------------------------------------------- Markdown


def _fmt(v: float | None, key: str = "") -> str:
    if v is None:
        return "-"
    if key.endswith("parameters"):
        return f"{v:,.0f}"
    if key.endswith("latency_ms"):
        return f"{v:.2f}"
    return f"{v:.4f}" if abs(v) < 100 else f"{v:,.1f}"


def _cell(st: Mapping[str, Any] | None, key: str = "") -> str:
    if st is None:
        return "-"
    if st["low"] is None:
        return f"{_fmt(st['mean'], key)} (n=1, no interval)"
    if key.endswith("parameters") and st["low"] == st["high"]:
        return _fmt(st["mean"], key)  # the same at every seed
    return f"{_fmt(st['mean'], key)} [{_fmt(st['low'], key)}, {_fmt(st['high'], key)}]"


def _diff_cell(st: Mapping[str, Any]) -> str:
    if st["low"] is None:
        return f"{st['mean']:+.4f} (n=1, no interval)"
    return f"{st['mean']:+.4f} [{st['low']:+.4f}, {st['high']:+.4f}]"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _ordered_metrics(keys: Iterable[str], split: str) -> list[str]:
    found = {k.split(".", 1)[1] for k in keys if k.startswith(f"{split}.")}
    known = [m for m in (*CLASSIFICATION_METRICS, *OOD_METRICS) if m in found]
    return known + sorted(found - set(known))


def _arrow(metric: str) -> str:
    gib = GREATER_IS_BETTER.get(metric)
    return "" if gib is None else (" (higher better)" if gib else " (lower better)")


def _flatten_overrides(d: Mapping[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k in sorted(d):
        v = d[k]
        if isinstance(v, Mapping) and v:
            out += _flatten_overrides(v, f"{prefix}{k}.")
        else:
            out.append(f"`{prefix}{k}={json.dumps(v, sort_keys=True)}`")
    return out


def _wall(seconds: float) -> str:
    s = round(seconds)
    return f"{seconds:.0f} s ({s // 3600}h {s % 3600 // 60:02d}m {s % 60:02d}s)"


def _header(
    col: _Collected,
    title: str,
    command: str | None,
    wall_seconds: float | None,
    variants: Mapping[str, Mapping[str, Any]] | None,
) -> list[str]:
    lines = [f"# {title}", ""]
    if command is not None:
        lines.append(f"- Command: `{command}`")
    if wall_seconds is not None:
        lines.append(f"- Wall time: {_wall(wall_seconds)}")
    lines.append(
        f"- Seeds: {', '.join(str(s) for s in col.seeds)} (n = {len(col.seeds)}); "
        f"points: {len(col.points)}"
    )
    lines += ["", "Variants:", ""]
    rows = []
    for v in sorted(set(col.variants) | set(variants or {})):
        seeds = [str(p.seed) for p in col.points if p.variant == v]
        if variants is None or v not in variants:
            over = "(not given)"
        else:
            over = ", ".join(_flatten_overrides(variants[v])) or "(none: the defaults)"
        rows.append([f"`{v}`", over, ", ".join(seeds) or "no results"])
    lines.append(_table(["variant", "overrides", "seeds with results"], rows))
    lines += [
        "",
        "Every number is calibrated (temperature scaling fitted on validation) and given as the "
        "mean across seeds with its 95% Student-t interval `[low, high]` "
        "(mean +- t(0.975, n-1) s / sqrt(n)); with one seed: `n=1, no interval`.",
    ]
    return lines


def _section_metrics(col: _Collected) -> list[str]:
    lines = ["## 1. Metrics per model", ""]
    shared = ", ".join(f"`{b}`" for b in col.shared) or "none"
    lines.append(
        f"`hydra[<variant>]` is the Hydra of each variant. Baselines pooled once per seed "
        f"(the same model in every variant's run at a seed; latency averaged over those runs): "
        f"{shared}. `naive_pruned` and `control` depend on the variant and are listed per variant."
    )
    for b, seeds in sorted(col.unshared.items()):
        lines.append(
            f"\nNote: `{b}` differs between variants at seed(s) "
            f"{', '.join(str(s) for s in seeds)} (a variant overrides something it depends on), "
            "so it is listed per variant."
        )
    labels = col.labels()
    all_keys = {k for label in labels for m in col.series[label].values() for k in m}
    for split in SPLITS:
        metrics = _ordered_metrics(all_keys, split)
        if not metrics:
            continue
        lines += ["", f"### {split}", ""]
        rows = []
        for label in labels:
            cells = [_cell(col.stats(label, f"{split}.{m}")) for m in metrics]
            n = max(
                (st["n"] for m in metrics if (st := col.stats(label, f"{split}.{m}"))), default=0
            )
            rows.append([f"`{label}`", str(n), *cells])
        lines.append(_table(["model", "n", *[m + _arrow(m) for m in metrics]], rows))
    lines += ["", "### model", ""]
    rows = []
    for label in labels:
        lat = col.stats(label, "model.latency_ms")
        par = col.stats(label, "model.parameters")
        n = max(lat["n"] if lat else 0, par["n"] if par else 0)
        rows.append([f"`{label}`", str(n), _cell(lat, "latency_ms"), _cell(par, "parameters")])
    lines.append(_table(["model", "n", "latency_ms (lower better)", "parameters"], rows))
    return lines


def _ood_summary(col: _Collected) -> dict[str, Any]:
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


def _section_ood(col: _Collected, ood: Mapping[str, Any]) -> list[str]:
    lines = ["## 2. OOD detection per score", ""]
    if not ood["available"]:
        lines.append(
            "The per-score OOD table is unavailable: these evaluate.json files have no "
            "`ood_by_score` (written by an older pipeline). Section 1's near_ood/far_ood columns "
            "use the run's `evaluate.ood_score`."
        )
        return lines
    lines.append(
        "AUROC and FPR@95%TPR of each OOD score (OOD = positive class). `n/a (single model)`: the "
        "score needs members (mutual information, disagreement). `unavailable`: that model's "
        "evaluate.json has no `ood_by_score`."
    )
    scores_found = {
        score
        for e in ood["models"].values()
        if isinstance(e, Mapping)
        for by_score in e.values()
        for score in by_score
    }
    scores = [s for s in OOD_SCORE_ORDER if s in scores_found]
    scores += sorted(scores_found - set(scores))
    for split in OOD_SPLITS:
        for metric in ("auroc", "fpr_at_95_tpr"):
            lines += ["", f"### {split} {metric}{_arrow(metric)}", ""]
            rows = []
            for label, e in ood["models"].items():
                if not isinstance(e, Mapping):
                    rows.append([f"`{label}`", *["unavailable"] * len(scores)])
                    continue
                cells = []
                for score in scores:
                    by_score = e.get(split, {})
                    if score not in by_score:
                        cells.append("-")
                    elif by_score[score] is None:
                        cells.append("n/a (single model)")
                    else:
                        cells.append(_cell(by_score[score].get(metric)))
                rows.append([f"`{label}`", *cells])
            lines.append(_table(["model", *scores], rows))
    return lines


def _section_paired(col: _Collected, paired: Mapping[str, Any]) -> list[str]:
    lines = [
        "## 3. Paired differences: Hydra minus baselines",
        "",
        "Per seed, Hydra minus the baseline evaluated in the same run; the last row is the mean "
        "across seeds with its 95% interval. The per-seed marker is that run's paired bootstrap "
        "interval over the test examples (evaluate.json `bootstrap.<baseline>.calibrated`): "
        "`(b: better)` / `(b: worse)` when it excludes 0, `(b: n.s.)` when it contains 0, no "
        "marker when evaluate.json has none for the metric. The bootstrap measures test-set "
        "noise of one run; the across-seed interval measures training-seed noise.",
    ]
    if not paired:
        lines += ["", "No Hydra/baseline pair to compare (no single, deep_ensemble, mc_dropout)."]
    for v, by_base in paired.items():
        for b, per_metric in by_base.items():
            keys = [k for k in HEADLINE if k in per_metric]
            lines += ["", f"### `hydra[{v}]` - `{b}`", ""]
            rows = []
            for s in col.seeds:
                cells = []
                for k in keys:
                    val = next(
                        (r["value"] for r in per_metric[k]["per_seed"] if r["seed"] == s), None
                    )
                    boot = next((r for r in per_metric[k]["bootstrap"] if r["seed"] == s), None)
                    cell = "-" if val is None else f"{val:+.4f}"
                    if val is not None and boot is not None:
                        cell += f" (b: {boot['direction']})"
                    cells.append(cell)
                rows.append([f"seed {s}", *cells])
            rows.append(["**mean [95%]**", *[_diff_cell(per_metric[k]) for k in keys]])
            header = ["seed", *[k + _arrow(k.split(".", 1)[1]) for k in keys]]
            lines.append(_table(header, rows))
    return lines


def _section_pareto(pareto: Mapping[str, Any]) -> list[str]:
    lines = [
        "## 4. Cost vs uncertainty quality (Pareto)",
        "",
        "One point per model at its mean across seeds, error bars the 95% intervals; filled red "
        "points (joined by the dashed line) are the Pareto front: no other model is both at "
        "least as fast and at least as good.",
    ]
    for key, p in pareto.items():
        lines += [
            "",
            f"![latency vs {key}]({p['figure']})",
            "",
            f"Pareto front (latency vs {key}): "
            + (", ".join(f"`{f}`" for f in p["front"]) or "none"),
        ]
        if p["missing"]:
            lines.append(
                "Not plotted (no latency or metric): " + ", ".join(f"`{m}`" for m in p["missing"])
            )
    return lines


def _status(s: str) -> str:
    return {"not applicable": "n/a"}.get(s, s)


def _section_gates(
    point_gates: Sequence[Mapping[str, Any]],
    base: Mapping[str, Any],
    gates: Sequence[GateCheck] | None = None,
) -> list[str]:
    lines = ["## 5. Gates", ""]
    if gates is None:
        lines += ["### Hydra, per point (reports/gate.json)", ""]
    else:
        lines += [
            "Judged with the gates given to the report (`hydra-ens study --gates-from`), not the "
            "points' own: " + ", ".join(f"`{g.name}`" for g in gates) + ".",
            "",
            "### Hydra, per point",
            "",
        ]
    rows = [
        [f"`{g['variant']}`", str(g["seed"]), g["verdict"].upper(), ", ".join(g["failed"]) or "-"]
        for g in point_gates
    ]
    lines.append(_table(["variant", "seed", "verdict", "failed checks"], rows))
    lines += [
        "",
        "### Baselines as candidates",
        "",
        "The same checks (each point's `params.gates`, or the gates given to the report) with the "
        "baseline in Hydra's place: would "
        "the gates have let that model ship? `n/a`: `prod` comparisons (a study point has no "
        "prod model), a baseline compared with itself, and model-level checks (compile, latency "
        "and parameter thresholds of the Hydra artifact; always n/a, not listed). A "
        "`use_bootstrap_bound` check compares the point difference (the bootstrap "
        "in evaluate.json is Hydra minus each baseline).",
        "",
    ]
    rows = []
    for label, b in base.items():
        for r in b["rows"]:
            where = f" (run of `{r['in_run_of']}`)" if r["in_run_of"] else ""
            rows.append(
                [
                    f"`{label}`",
                    f"{r['seed']}{where}",
                    "PASSED" if r["passed"] else "FAILED",
                    ", ".join(r["failed"]) or "-",
                    ", ".join(r["not_applicable"]) or "-",
                ]
            )
    header = ["candidate", "seed", "verdict", "failed checks", "n/a (besides model-level)"]
    lines.append(_table(header, rows))
    lines.append("")
    for label, b in base.items():
        n_rows = len({r["seed"] for r in b["rows"]})
        caught = "; ".join(
            f"{name} (seed {', '.join(str(s) for s in seeds)})"
            for name, seeds in b["caught_by"].items()
        )
        lines.append(
            f"- `{label}` passes on {len(b['seeds_passed'])} of {n_rows} seeds"
            + (f"; caught by: {caught}" if caught else "; no check catches it")
        )
    return lines


def _section_recommendation(rec: Mapping[str, Any], beats: Mapping[str, Any]) -> list[str]:
    lines = ["## 6. Recommendation", "", rec["sentence"], ""]
    rows = [
        [
            f"`{r['variant']}`",
            "yes" if r["passes_every_seed"] else "no",
            "; ".join(f"seed {s}: {', '.join(f)}" for s, f in r["failing"].items()) or "-",
            _fmt(r["latency_ms"], "latency_ms"),
            _fmt(r["parameters"], "parameters"),
        ]
        for r in rec["variants"]
    ]
    lines.append(
        _table(["variant", "passes every seed", "failing", "latency_ms (mean)", "parameters"], rows)
    )
    lines += ["", "### Does any variant beat the single model?", ""]
    lines.append(
        "A variant beats the single model on a metric when the 95% interval of the mean "
        "(Hydra - single) difference across seeds excludes 0 in the good direction."
    )
    lines.append("")
    lines += [f"- {b['sentence']}" for b in beats.values()]
    return lines


# ---------------------------------------------------------------- entry point


def write_study_report(
    points: Sequence[PointResult],
    out_dir: str | os.PathLike[str],
    title: str,
    command: str | None = None,
    wall_seconds: float | None = None,
    variants: Mapping[str, Mapping[str, Any]] | None = None,
    gates: Sequence[GateCheck] | None = None,
) -> dict[str, Any]:
    """Write ``out_dir/study.md``, ``out_dir/study.json`` and ``out_dir/figures/*.png``
    atomically; returns the summary (the content of ``study.json``).

    ``points``: one :class:`PointResult` per (variant, seed), no duplicates, each evaluation with
    ``models.hydra``. ``variants``: optional variant name -> its params overrides (for the header).
    ``command`` / ``wall_seconds``: how the study was run, for the header. ``gates``: judge every
    point and baseline with these checks instead of each point's own (``reports/gate.json`` and
    ``params.gates``): what other gates would say on the same evidence.
    """
    _validate(points, title)
    if wall_seconds is not None and (not _number(wall_seconds) or wall_seconds < 0):
        raise ValueError(f"wall_seconds must be a non-negative number, got {wall_seconds!r}")
    if variants is not None and not isinstance(variants, Mapping):
        raise ValueError(
            f"variants must map variant name -> overrides, got {type(variants).__name__}"
        )
    col = _Collected(points)
    point_gates = [_point_gate(p, gates) for p in col.points]
    paired = _paired(col)
    beats = _beats_single(col, paired)
    rec = _recommend(col, point_gates)
    base_gates = _baseline_gates(col, gates)
    ood = _ood_summary(col)
    pareto, figures = _pareto(col)

    summary: dict[str, Any] = {
        "title": title,
        "command": command,
        "wall_seconds": wall_seconds,
        "seeds": col.seeds,
        "variants": {
            v: (dict(variants[v]) if variants and v in variants else None)
            for v in sorted(set(col.variants) | set(variants or {}))
        },
        "points": [{"variant": p.variant, "seed": p.seed} for p in col.points],
        "confidence": CONFIDENCE,
        "shared_baselines": col.shared,
        "unshared_baselines": {b: s for b, s in sorted(col.unshared.items())},
        "models": {
            label: {
                **col.meta[label],
                "metrics": {
                    k: col.stats(label, k)
                    for k in sorted({k for m in col.series[label].values() for k in m})
                    if not k.startswith("ood_by_score.")
                },
            }
            for label in col.labels()
        },
        "ood_by_score": ood,
        "paired": paired,
        "beats_single": beats,
        "pareto": pareto,
        "gates": {
            "points": point_gates,
            "baselines_as_candidates": base_gates,
            "checks": None if gates is None else [g.model_dump() for g in gates],
        },
        "recommendation": rec,
        "files": {"markdown": "study.md", "json": "study.json", "figures": sorted(figures)},
    }
    sections = [
        _header(col, title, command, wall_seconds, variants),
        _section_metrics(col),
        _section_ood(col, ood),
        _section_paired(col, paired),
        _section_pareto(pareto),
        _section_gates(point_gates, base_gates, gates),
        _section_recommendation(rec, beats),
    ]
    markdown = "\n\n".join("\n".join(s) for s in sections) + "\n"

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_write_dir(out / "figures") as tmp:
        for rel, data in figures.items():
            (tmp / Path(rel).name).write_bytes(data)
    text = json.dumps(summary, indent=2, sort_keys=True, allow_nan=False) + "\n"
    atomic_write_bytes(out / "study.json", text.encode(), keep_suffix=False)
    atomic_write_bytes(out / "study.md", markdown.encode(), keep_suffix=False)
    return json.loads(text)
