"""The recommendation: the cheapest variant that passes the gates on every seed and whose Hydra
beats its own naive pruned twin across seeds; otherwise, in words, that the pruned model is
enough and what it costs.

Cost is the Hydra's within-point ratio to the single model (``model.cost_ratio``,
:mod:`tasks.evaluation.cost`) averaged over seeds. Two variants whose ratios differ by less than the
larger half-width of their intervals (across seeds; the mean within-point interval with one seed)
are tied on cost; a tie is broken by FLOPs, then parameters.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from flows.study.report.collect import Collected


def cost_of(col: Collected, label: str) -> dict[str, Any]:
    """The cost of ``label``: ratio to single (mean across seeds with its interval and the mean
    within-point interval), FLOPs, parameters; None where unknown."""
    ratio = col.stats(label, "model.cost_ratio")
    lows = col.stats(label, "model.cost_ratio_low")
    highs = col.stats(label, "model.cost_ratio_high")
    flops = col.stats(label, "model.flops")
    par = col.stats(label, "model.parameters")
    lat = col.stats(label, "model.latency_ms")
    half = None
    if ratio is not None and ratio["low"] is not None:
        half = (ratio["high"] - ratio["low"]) / 2
    elif lows is not None and highs is not None:
        half = (highs["mean"] - lows["mean"]) / 2
    return {
        "ratio": ratio["mean"] if ratio else None,
        "ratio_low": ratio["low"] if ratio else None,
        "ratio_high": ratio["high"] if ratio else None,
        "within_low": lows["mean"] if lows else None,
        "within_high": highs["mean"] if highs else None,
        "half_width": half,
        "flops": flops["mean"] if flops else None,
        "parameters": par["mean"] if par else None,
        "latency_ms": lat["mean"] if lat else None,
    }


def _num(v: float | None) -> float:
    return math.inf if v is None else v


def cheapest(rows: Sequence[Mapping[str, Any]]) -> tuple[Mapping[str, Any], list[str]]:
    """The cheapest of ``rows`` (each with ``variant`` and ``cost``) and the variants tied with it
    on the cost ratio: the lowest ratio first, then every row whose ratio is within the larger
    half-width of the two intervals is a tie, broken by FLOPs, then parameters, then name."""
    by_ratio = sorted(rows, key=lambda r: (_num(r["cost"]["ratio"]), r["variant"]))
    first = by_ratio[0]["cost"]
    tied = []
    for r in by_ratio:
        c = r["cost"]
        if c["ratio"] is None or first["ratio"] is None:
            same = c["ratio"] is None and first["ratio"] is None
        else:
            half = max(c["half_width"] or 0.0, first["half_width"] or 0.0)
            same = c["ratio"] - first["ratio"] <= half
        if same:
            tied.append(r)
    best = sorted(
        tied,
        key=lambda r: (_num(r["cost"]["flops"]), _num(r["cost"]["parameters"]), r["variant"]),
    )[0]
    return best, [r["variant"] for r in tied if r is not best]


def ratio_text(cost: Mapping[str, Any]) -> str:
    """``1.43x single [1.30, 1.56]`` (the interval across seeds, else within the point)."""
    if cost["ratio"] is None:
        return "cost unknown"
    lo, hi = cost["ratio_low"], cost["ratio_high"]
    if lo is None:
        lo, hi = cost["within_low"], cost["within_high"]
    interval = "" if lo is None else f" [{max(lo, 0.0):.2f}, {hi:.2f}]"
    flops = "" if cost["flops"] is None else f", {cost['flops']:.3g} FLOPs"
    par = "" if cost["parameters"] is None else f", {cost['parameters']:,.0f} parameters"
    return f"{cost['ratio']:.2f}x single{interval}{flops}{par}"


def recommend(
    col: Collected, gates: Sequence[Mapping[str, Any]], twin: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """One row per variant (gates on every seed, beats its twin, cost) and the choice.

    ``gates``: the per-point verdicts of :func:`~flows.study.report.gates.point_gate`; ``twin``:
    :func:`~flows.study.report.paired.beats_twin` (None: not required). ``variant`` is the
    recommended one or None; then ``pruned_enough`` names the naive pruned model that does the
    job when every variant passing the gates fails to beat its twin, and ``best`` the variant
    passing the most seeds when none passes every seed."""
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
        cost = cost_of(col, f"hydra[{v}]")
        beats = None if twin is None else twin["variants"].get(v, {}).get("beats", False)
        rows.append(
            {
                "variant": v,
                "passes_every_seed": not failing,
                "beats_twin": beats,
                "seeds_passed": [s for s in col.seeds if s not in failing],
                "failing": {str(s): f for s, f in sorted(failing.items())},
                "cost": cost,
                "twin_cost": cost_of(col, f"naive_pruned[{v}]"),
                "latency_ms": cost["latency_ms"],
                "parameters": cost["parameters"],
            }
        )
    n = len(col.seeds)
    seeds = f"{n} seed{'s' if n != 1 else ''}"
    passing = [r for r in rows if r["passes_every_seed"]]
    eligible = [r for r in passing if r["beats_twin"] is not False]
    if eligible:
        best, tied = cheapest(eligible)
        sentence = (
            f"Recommended: `{best['variant']}`, the cheapest variant that passes the gates on "
            f"every seed ({seeds})"
            + (" and whose Hydra beats its naive pruned twin across seeds" if twin else "")
            + f"; Hydra cost {ratio_text(best['cost'])}."
        )
        if tied:
            sentence += (
                " Tied on cost (inside the ratio's interval), broken by FLOPs then parameters: "
                + ", ".join(f"`{t}`" for t in tied)
                + "."
            )
        others = [r["variant"] for r in eligible if r is not best and r["variant"] not in tied]
        if others:
            sentence += " Also eligible (costlier): " + ", ".join(f"`{o}`" for o in others) + "."
        return {"variant": best["variant"], "sentence": sentence, "variants": rows}
    if passing:  # the gates pass, but no Hydra is separable from its cheaper twin
        twin_rows = [{"variant": r["variant"], "cost": r["twin_cost"]} for r in passing]
        pruned, _ = cheapest(twin_rows)
        hydra = next(r for r in passing if r["variant"] == pruned["variant"])
        sentence = (
            "No variant recommended: no variant that passes the gates on every seed "
            f"({', '.join('`' + r['variant'] + '`' for r in passing)}) has a Hydra that beats its "
            "naive pruned twin across seeds, so the pruned model is enough: "
            f"`naive_pruned[{pruned['variant']}]` (the base with the same kept heads, no "
            f"fine-tune) costs {ratio_text(pruned['cost'])}, against "
            f"{ratio_text(hydra['cost'])} for `hydra[{pruned['variant']}]`."
        )
        return {
            "variant": None,
            "pruned_enough": f"naive_pruned[{pruned['variant']}]",
            "sentence": sentence,
            "variants": rows,
        }
    best = sorted(
        rows,
        key=lambda r: (
            -len(r["seeds_passed"]),
            sum(len(f) for f in r["failing"].values()),
            _num(r["cost"]["ratio"]),
            _num(r["cost"]["flops"]),
            _num(r["parameters"]),
            r["variant"],
        ),
    )[0]
    fails = "; ".join(f"seed {s}: {', '.join(f)}" for s, f in best["failing"].items())
    sentence = (
        "No variant passes the gates on every seed. The best is "
        f"`{best['variant']}` (passes {len(best['seeds_passed'])} of {n} seeds); it fails on "
        f"{fails}."
    )
    return {"variant": None, "best": best["variant"], "sentence": sentence, "variants": rows}
