"""The entry point: :func:`write_study_report` writes ``study.md``, ``study.json`` and the
figures of a study's points, atomically."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flows.study.report import markdown
from flows.study.report.collect import Collected, is_number, ood_summary
from flows.study.report.figures import pareto_panels
from flows.study.report.gates import baseline_gates, point_gate
from flows.study.report.paired import (
    beats_single,
    beats_twin,
    paired_differences,
    worded_claims,
)
from flows.study.report.recommend import cost_of, recommend
from flows.study.report.results import PointResult, validate_points
from flows.study.report.stats import CONFIDENCE
from hydra_ops.atomic import atomic_write_bytes, atomic_write_dir
from tasks.params import GateCheck

#: The recommendation of a study of registered variants: none is chosen.
REGISTERED: dict[str, Any] = {
    "variant": None,
    "registered": True,
    "sentence": (
        "No choosing step: the variants were registered before any point ran and every seed "
        "is a confirmation seed; section 7 words each variant's comparisons on its own."
    ),
    "variants": [],
}


def write_study_report(
    points: Sequence[PointResult],
    out_dir: str | os.PathLike[str],
    title: str,
    command: str | None = None,
    wall_seconds: float | None = None,
    variants: Mapping[str, Mapping[str, Any]] | None = None,
    gates: Sequence[GateCheck] | None = None,
    confirm_seeds: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Write ``out_dir/study.md``, ``out_dir/study.json`` and ``out_dir/figures/*.png``
    atomically; returns the summary (the content of ``study.json``).

    ``points``: one :class:`PointResult` per (variant, seed), no duplicates, each evaluation with
    ``models.hydra``. ``variants``: optional variant name -> its params overrides (for the header).
    ``command`` / ``wall_seconds``: how the study was run, for the header. ``gates``: judge every
    point and baseline with these checks instead of each point's own (``reports/gate.json`` and
    ``params.gates``): what other gates would say on the same evidence. ``confirm_seeds``: the
    held-out seeds; their points never enter the choice (sections 1-6 read the other points) and
    are reported apart (section 7) for the chosen variant. Points at confirmation seeds only (a
    study of registered variants): sections 1-5 describe them, nothing is chosen
    (:data:`REGISTERED`), and section 7 words every variant's claims.
    """
    validate_points(points, title)
    if wall_seconds is not None and (not is_number(wall_seconds) or wall_seconds < 0):
        raise ValueError(f"wall_seconds must be a non-negative number, got {wall_seconds!r}")
    if variants is not None and not isinstance(variants, Mapping):
        raise ValueError(
            f"variants must map variant name -> overrides, got {type(variants).__name__}"
        )
    held_out = set(confirm_seeds or ())
    choosing = [p for p in points if p.seed not in held_out]
    registered = not choosing
    # registered variants (confirmation seeds only): sections 1-5 describe every point; nothing
    # is chosen, and section 7 words each variant's claims
    col = Collected(points if registered else choosing)
    point_gates = [point_gate(p, gates) for p in col.points]
    paired = paired_differences(col)
    beats = beats_single(col, paired)
    twin = beats_twin(col, paired)
    rec = REGISTERED if registered else recommend(col, point_gates, twin)
    confirm = None
    if held_out:
        confirm = confirmation(
            [p for p in points if p.seed in held_out], sorted(held_out), rec, gates
        )
    base_gates = baseline_gates(col, gates)
    ood = ood_summary(col)
    pareto, figures = pareto_panels(col)

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
        "beats_twin": twin,
        "split": col.split,
        "pareto": pareto,
        "gates": {
            "points": point_gates,
            "baselines_as_candidates": base_gates,
            "checks": None if gates is None else [g.model_dump() for g in gates],
        },
        "recommendation": rec,
        "confirmation": confirm,
        "files": {"markdown": "study.md", "json": "study.json", "figures": sorted(figures)},
    }
    sections = [
        markdown.header(col, title, command, wall_seconds, variants, sorted(held_out)),
        markdown.section_metrics(col),
        markdown.section_ood(col, ood),
        markdown.section_paired(col, paired),
        markdown.section_pareto(pareto),
        markdown.section_gates(point_gates, base_gates, gates),
        markdown.section_registered(rec)
        if registered
        else markdown.section_recommendation(rec, beats, twin),
        markdown.section_confirmation(confirm),
    ]
    study_md = "\n\n".join("\n".join(s) for s in sections) + "\n"

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_write_dir(out / "figures") as tmp:
        for rel, data in figures.items():
            (tmp / Path(rel).name).write_bytes(data)
    study_json = json.dumps(summary, indent=2, sort_keys=True, allow_nan=False) + "\n"
    atomic_write_bytes(out / "study.json", study_json.encode(), keep_suffix=False)
    atomic_write_bytes(out / "study.md", study_md.encode(), keep_suffix=False)
    return json.loads(study_json)


def confirmation(
    points: Sequence[PointResult],
    seeds: list[int],
    rec: Mapping[str, Any],
    gates: Sequence[GateCheck] | None,
) -> dict[str, Any]:
    """What the held-out ``seeds`` say, computed from their ``points`` alone: the gates of every
    point, and for every variant run on them (the chosen one first) the paired differences, the
    twin comparison, the claims worded by the corrected test
    (:func:`~flows.study.report.paired.worded_claims`), the Hydra's cost and every model's. Each
    variant's twin claim is its own Holm family (its
    :data:`~flows.study.report.paired.TWIN_METRICS`): a confirmation asks one question per
    variant, so a variant confirmed alongside others is not held to a larger family. It never
    feeds back into ``rec``."""
    chosen = rec.get("variant")
    out: dict[str, Any] = {
        "seeds": seeds,
        "variant": chosen,
        "registered": bool(rec.get("registered")),
        "points": [{"variant": p.variant, "seed": p.seed} for p in points],
        "gates": [],
        "paired": {},
        "twin": {"m": 0, "variants": {}},
        "cost": {},
        "costs": {},
        "claims": {},
        "mark": "",
        "split": "",
    }
    if not points:
        return out
    col = Collected(points)
    for v in sorted(col.variants, key=lambda v: (v != chosen, v)):
        one = Collected([p for p in points if p.variant == v])
        paired = paired_differences(one)
        twin = beats_twin(one, paired)
        out["paired"][v] = paired[v]
        out["twin"]["variants"][v] = twin["variants"][v]
        out["twin"]["m"] = twin["m"]
        out["cost"][v] = cost_of(one, f"hydra[{v}]")
        out["costs"][v] = {label: cost_of(one, label) for label in one.labels()}
        out["claims"][v] = worded_claims(paired[v])
    out.update(
        gates=[point_gate(p, gates) for p in sorted(points, key=lambda p: (p.variant, p.seed))],
        mark=col.mark,
        split=markdown.split_sentence(col),
    )
    return out
