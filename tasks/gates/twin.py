"""``any_of`` gate groups: the candidate must be *separably* better than a cheaper baseline.

A group is the gate checks that share ``GateCheck.any_of`` (e.g. the default
``"beats naive_pruned"``: ID NLL, ID ECE, near-OOD AUROC and shift NLL against the Hydra's naive
pruned twin). Each check of a group is judged on its own rule first (the candidate no worse than
``tolerance``, or better by ``min_absolute_change``); the group then also needs the candidate to be
better than the baseline on at least one of its checks by a paired bootstrap interval of
(candidate - baseline) that excludes zero (evaluate.json ``bootstrap``, the test-set resampling
of one run). When none is, every check of the group that passed its own rule fails with the
reason: a Hydra that the evidence cannot separate from a cheaper model the same run built does
not pass.

A zero-width interval (identical models) excludes nothing: ``low < 0 < high`` on the good side,
strictly, is what "better" means.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tasks.params.gates import GateCheck


def paired_interval(
    check: GateCheck, ev: Mapping[str, Any], candidate: str = "hydra"
) -> Mapping[str, Any] | None:
    """The paired bootstrap interval of (``candidate`` - ``check.baseline``) on ``check``'s split
    and metric, from ``metrics/evaluate.json``: ``bootstrap`` for the Hydra,
    ``candidate_bootstrap[candidate]`` for any other candidate; None when it was not computed."""
    variant = "calibrated" if check.calibrated else "raw"
    if candidate == "hydra":
        by_baseline = ev.get("bootstrap") or {}
    else:
        by_baseline = (ev.get("candidate_bootstrap") or {}).get(candidate) or {}
    boot = (by_baseline.get(check.baseline) or {}).get(variant) or {}
    return (boot.get(check.split) or {}).get(check.metric)


def separation(
    check: GateCheck,
    ev: Mapping[str, Any],
    record: Mapping[str, Any],
    point: bool = False,
    candidate: str = "hydra",
) -> float | None:
    """How far the interval of (candidate - baseline) lies past zero on the good side (its near
    end; the point difference with ``point``): positive when separably better, else the
    shortfall as a negative number; None when there is no interval (or difference)."""
    gib = bool(check.greater_is_better)
    if point:
        diff = record.get("difference")
        return None if diff is None else (diff if gib else -diff)
    interval = paired_interval(check, ev, candidate)
    if interval is None:
        return None
    return float(interval["low"]) if gib else -float(interval["high"])


def separably_better(
    check: GateCheck,
    ev: Mapping[str, Any],
    record: Mapping[str, Any],
    point: bool = False,
    candidate: str = "hydra",
) -> tuple[bool, str]:
    """``(better, evidence)``: whether the paired bootstrap interval of (candidate - baseline)
    on ``check``'s metric excludes zero on the good side. ``point``: judge the point difference
    of ``record`` instead (no bootstrap of this candidate exists, e.g. a baseline judged as the
    candidate in a study report)."""
    gib = bool(check.greater_is_better)
    if point:
        diff = record.get("difference")
        if diff is None:
            return False, "no difference"
        return (diff > 0 if gib else diff < 0), f"point difference {diff:+.4f}"
    interval = paired_interval(check, ev, candidate)
    if interval is None:
        return False, "no bootstrap interval"
    lo, hi = float(interval["low"]), float(interval["high"])
    return (lo > 0 if gib else hi < 0), f"bootstrap [{lo:+.4f}, {hi:+.4f}]"


def resolve_any_of(
    checks: Sequence[GateCheck],
    records: Sequence[dict[str, Any]],
    ev: Mapping[str, Any],
    point: bool = False,
    candidate: str = "hydra",
) -> list[dict[str, Any]]:
    """The records of ``checks`` (one each, in order, from ``tasks.gates.checks.evaluate_check``)
    with every ``any_of`` group resolved: each record of a group gains ``any_of``, ``better`` and
    ``evidence``; a group with no separably better member fails every member that passed (its
    ``margin`` then: :func:`separation`, how far its interval is from excluding zero).
    ``point``, ``candidate``: see :func:`separably_better`. Records of checks without a group,
    and ``not applicable`` records (:mod:`tasks.gates.candidates`), are unchanged."""
    out = [dict(r) for r in records]
    groups: dict[str, list[int]] = {}
    for i, check in enumerate(checks):
        if check.any_of is not None and out[i].get("status") != "not applicable":
            groups.setdefault(check.any_of, []).append(i)
    for group, members in groups.items():
        for i in members:
            better, evidence = separably_better(checks[i], ev, out[i], point, candidate)
            out[i].update(any_of=group, better=better, evidence=evidence)
        if any(out[i]["better"] for i in members):
            continue
        names = ", ".join(f"{checks[i].split}.{checks[i].metric}" for i in members)
        why = (
            f"any_of {group!r}: better than {checks[members[0]].baseline} on none of {names} "
            "by an interval that excludes zero"
        )
        for i in members:
            if out[i].get("status") == "passed":
                rule = f"{out[i].get('rule', '')}; any_of {group!r}: none separably better"
                short = separation(checks[i], ev, out[i], point, candidate)
                out[i].update(status="failed", note=why, rule=rule.lstrip("; "), margin=short)
    return out
