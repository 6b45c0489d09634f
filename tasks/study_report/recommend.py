"""The recommendation: the cheapest variant that passes the gates on every seed."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tasks.study_report.collect import Collected


def recommend(col: Collected, gates: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The cheapest variant (mean Hydra latency, then parameters) whose points pass their gates on
    every seed, with one row per variant; when none does, ``variant`` is None and ``best`` the
    variant passing the most seeds. ``gates``: the per-point verdicts of
    :func:`~tasks.study_report.gates.point_gate`."""
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
