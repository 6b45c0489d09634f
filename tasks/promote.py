"""Stage ``promote``: register the bundle (``models/bundle``) as a new version and assign ``prod``,
only if the gate verdict, computed again here, passed and every link from what was judged to
what ships holds (:func:`check_verdict`).

``reports/gate.json`` is not trusted: ``promote`` recomputes the verdict from
``metrics/evaluate.json`` and the gates in params (a ``prod`` comparison against the version the
verdict saw, refused once the stage moved), checks that the judged artifacts and params are still
what is on disk, that the bundle holds exactly what was judged (not what its own manifest says),
and that ``dvc.lock``, which the version commit takes, records all of it. The first broken link
is refused, forced or not, in one line saying what and what to run. ``--force --reason TEXT``
overrides a *failed* verdict only; the reason (one line, no control characters) is recorded in
the registry.

Every promoted bundle gets its own version on its own version commit
(:func:`tasks.release.model_registry. commit_run`), so runs that share a code commit (a nightly
schedule, a ``--set`` variant) each promote without a person; the same bundle promoted again reuses
its version. ``hydra-ens promote --version vX.Y.Z --reason TEXT`` moves the stage back to an earlier
version.

What ships is the verdict's candidate (:mod:`tasks.gates.candidates`: the cheapest passing one that
``promote.candidates`` allows; the Hydra by default): the recomputed verdict must name the same
one, the bundle must ship it and, for a candidate other than the Hydra, hold exactly the files
the judged evaluation scored for it (:func:`tasks.candidates.bundle.check_candidate`).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from tasks.candidates.bundle import check_candidate
from tasks.gates.verdict import compares_with_prod, decide, load_cost, prod_seen
from tasks.params.schema import PipelineConfig
from tasks.release.bundle_format import MANIFEST, verify_bundle
from tasks.release.custody import check_chain
from tasks.release.dvc_cache import bundle_available
from tasks.release.git_repo import ensure_git_identity
from tasks.release.lineage import (
    JUDGED,
    dvc_md5,
    judged_hashes,
    lock_break,
    stale_roles,
    stale_verdict_message,
)
from tasks.release.model_registry import (
    RECORD_FIELDS,
    assign,
    check_reason,
    prod_version,
    register,
    versions,
)
from tasks.runtime.layout import BUNDLE, REGISTRY, REPORTS
from tasks.runtime.outputs import load_evaluation, read_json, write_json
from tasks.runtime.stage import stage_main

#: The params view this stage validates ``params.yaml`` with (the sections it reads).
SCHEMA = PipelineConfig

log = logging.getLogger("hydra_ens")
EVALUATION = Path("metrics/evaluate.json")
#: Inputs of the verdict held to ``dvc.lock`` when they exist.
OPTIONAL_LOCKED = (Path("metrics/latency.json"), Path("metrics/cost.json"))


def _metrics_snapshot(root: Path, candidate: str = "hydra") -> dict[str, Any]:
    """The shipped candidate's metrics, recorded in the registry (what a ``prod`` check reads)."""
    entry = load_evaluation(root)["models"][candidate]
    skip = ("members", "verdicts", "verdict_fractions", "ood_thresholds")
    return {k: entry[k] for k in entry if k not in skip}


#: What ``promote`` holds to ``dvc.lock`` besides the judged artifacts: the verdict and the bundle.
LOCKED = (Path("reports/gate.json"), Path(BUNDLE))
RERUN = "rerun the gate: hydra-ens run (or dvc repro gate)"
REBUILD = "rebuild it: hydra-ens run (or dvc repro bundle)"


def _outcome(verdict: dict[str, Any]) -> tuple[Any, ...]:
    """What a recomputed verdict must repeat: the verdict, its failed checks, every check's
    status, the candidate it names and ships, and every candidate's verdict."""
    checks = [(str(c.get("name")), str(c.get("status"))) for c in verdict.get("checks") or []]
    judged = sorted(
        (str(n), str((j or {}).get("verdict")))
        for n, j in (verdict.get("candidates") or {}).items()
    )
    return (
        str(verdict.get("verdict")),
        list(verdict.get("failed") or []),
        checks,
        verdict.get("candidate"),
        verdict.get("ships"),
        judged,
    )


def recompute_verdict(cfg: PipelineConfig, root: Path, gate: dict[str, Any]) -> dict[str, Any]:
    """The verdict of the gates in params on ``metrics/evaluate.json``, computed again here
    (:func:`tasks.gates.verdict.decide`), after checking that the prod version a ``prod`` comparison
    saw still holds the stage and that ``gate``'s recorded outcome is this one (ValueError, one
    line, naming the broken link). Its ``passed`` is the one promotion acts on."""
    prod = None
    if compares_with_prod(cfg):
        saw = gate.get("prod_compared")
        if not isinstance(saw, dict) or not ({"version", "unreadable"} & set(saw)):
            raise ValueError(
                f"reports/gate.json does not name the prod version it compared with; {RERUN}"
            )
        prod, seen = prod_seen(cfg, root)
        if ("unreadable" in seen) != ("unreadable" in saw):
            raise ValueError(
                f"the registry cannot be read now: {seen['unreadable']}"
                if "unreadable" in seen
                else f"the registry could not be read when the gate ran; {RERUN}"
            )
        if "version" in saw and seen.get("version") != saw["version"]:
            raise ValueError(
                f"{cfg.promote.stage} moved since the gate compared with it: it saw "
                f"{saw['version'] or 'no version'}, now it is {seen['version'] or 'no version'}; "
                f"{RERUN}"
            )
    again = decide(cfg, load_evaluation(root), prod, load_cost(root))
    if _outcome(again) != _outcome(gate):
        said = _outcome(gate)[0]
        raise ValueError(
            f"reports/gate.json says {said!r}, but the gates in params.yaml on "
            f"metrics/evaluate.json give {again['verdict']!r}"
            + (f" (failed: {', '.join(again['failed'])})" if again["failed"] else "")
            + f"; the verdict was edited or written by other code: {RERUN}"
        )
    return again


def check_bundle(
    root: Path, gate: dict[str, Any], verdict: str, candidate: str = "hydra"
) -> dict[str, Any]:
    """``models/bundle``'s manifest, after checking the bundle against what was judged rather
    than against itself: its model and compiled folders hash to the judged md5s, its verdict and
    metrics are the workspace's, it ships the verdict's ``candidate`` (a candidate other than the
    Hydra: its ``candidate/`` files are the ones the judged evaluation scored), and it holds no
    file its manifest does not list."""
    directory = root / BUNDLE
    try:
        manifest = verify_bundle(directory)
    except ValueError as err:
        raise ValueError(f"{err}; {REBUILD}") from None
    recorded = gate["judged"]
    for sub, role in (("model", "model"), ("compiled", "compiled")):
        if dvc_md5(directory / sub) != recorded[role]["md5"]:
            raise ValueError(
                f"{BUNDLE}/{sub} is not the {recorded[role]['path']} the gate judged "
                f"({recorded[role]['md5'][:8]}); {REBUILD}"
            )
    for name, source in (("gate.json", REPORTS / "gate.json"), ("evaluate.json", EVALUATION)):
        if read_json(directory / name, "bundle") != read_json(root / source, name):
            raise ValueError(f"{BUNDLE}/{name} is not {source}; {REBUILD}")
    if manifest.get("judged") != recorded or manifest.get("verdict") != verdict:
        raise ValueError(f"{BUNDLE}/{MANIFEST} was built from another gate verdict; {REBUILD}")
    ships = manifest.get("candidate", "hydra")
    if ships != candidate:
        raise ValueError(
            f"{BUNDLE} ships {ships}, but the verdict's candidate is {candidate}; {REBUILD}"
        )
    if candidate != "hydra":
        try:
            check_candidate(directory, read_json(root / EVALUATION, "evaluate output"), candidate)
        except ValueError as err:
            raise ValueError(f"{err}; {REBUILD}") from None
    return manifest


def check_verdict(cfg: PipelineConfig, root: Path) -> dict[str, Any]:
    """The gate verdict recomputed, after checking every link from the judged artifacts to the
    bundle (ValueError, one line naming the first broken link):

    1. ``reports/gate.json`` exists and records what it judged;
    2. the judged artifacts and params are still what is on disk (:mod:`tasks.release.lineage`);
    3. the compiled artifact was compiled from the judged model, and evaluate scored exactly
       that artifact, model, data and params (:func:`tasks.release.custody.check_chain`);
    4. the verdict follows from ``metrics/evaluate.json`` and the gates in params, against the
       prod version it saw (:func:`recompute_verdict`);
    5. the bundle holds what was judged (:func:`check_bundle`);
    6. ``dvc.lock``, which the version commit takes, records all of it (:func:`lock_break`).
    """
    gate_path = root / REPORTS / "gate.json"
    if not gate_path.is_file():
        raise ValueError("no gate verdict (reports/gate.json); run the pipeline: hydra-ens run")
    gate = read_json(gate_path, "gate output")
    recorded = gate.get("judged")
    if not recorded:
        raise ValueError(
            "reports/gate.json records nothing it judged (written by an older release); "
            "rerun the gate: hydra-ens run (or dvc repro gate)"
        )
    current = judged_hashes(cfg, root)
    if stale := stale_roles(recorded, current):
        raise ValueError(stale_verdict_message(stale, recorded, current))
    check_chain(cfg, root, read_json(root / EVALUATION, "evaluate output"))
    verdict = recompute_verdict(cfg, root, gate)
    check_bundle(root, gate, verdict["verdict"], verdict.get("candidate", "hydra"))
    locked = [JUDGED[r] for r in JUDGED] + [p for p in OPTIONAL_LOCKED if (root / p).exists()]
    if broken := lock_break(root, [*locked, *LOCKED], skip_stages=("promote",)):
        raise ValueError(broken)
    return {**gate, **verdict}


def promote(
    cfg: PipelineConfig, root: Path, force: bool = False, reason: str | None = None
) -> dict[str, Any]:
    """Register + assign if the verdict passed (or ``force`` with a ``reason``); the record."""
    if force:
        reason = check_reason(reason)
    name, stage = cfg.promote.model_name, cfg.promote.stage
    gate = check_verdict(cfg, root)
    record: dict[str, Any] = {
        "model": name,
        "stage": stage,
        "candidate": gate.get("candidate", "hydra"),
        "gate": gate["verdict"],
        "failed_checks": gate["failed"],
    }
    if not gate["passed"] and not force:
        log.info("promote: gate FAILED (%s); not promoted", ", ".join(gate["failed"]))
        return {**record, "promoted": False, "why": "gate failed"}
    forced = force and not gate["passed"]
    if force and gate["passed"]:
        log.info("promote: the gate passed; --force is not needed (promoting as usual)")
    note = ensure_git_identity(root)
    if note:
        log.info("promote: %s", note)
    bundle_md5 = dvc_md5(root / BUNDLE)
    existing = next(
        (v for v in versions(root, name) if v["fields"].get("bundle_md5") == bundle_md5), None
    )
    current = prod_version(root, name, stage)
    if existing is not None and current is not None and current["version"] == existing["version"]:
        log.info("promote: this bundle is already %s %s (%s)", name, stage, existing["version"])
        return {
            **record,
            "promoted": False,
            "why": "already in stage",
            "version": existing["version"],
            "bundle_md5": bundle_md5,
        }
    if existing is not None:
        version = existing["version"]
        log.info("promote: this bundle is already registered as %s@%s", name, version)
    else:
        lines = [
            f"hydra-ens promotion of {BUNDLE}",
            f"bundle_md5: {bundle_md5}",
            f"model_md5: {gate['judged']['model']['md5']}",
            f"params_md5: {gate['judged']['params']['md5']}",
            f"verdict_md5: {dvc_md5(root / REPORTS / 'gate.json')}",
            f"gate: {'passed' if gate['passed'] else 'FAILED (forced)'}",
            f"candidate: {gate.get('candidate', 'hydra')}",
        ]
        if forced:
            lines.append(f"reason: {reason.strip()}")
            # check names come from params: one line, like the reason, or no record is written
            failed = check_reason(
                ", ".join(gate["failed"]), "failed checks", RECORD_FIELDS["failed_checks"][1]
            )
            lines.append(f"failed_checks: {failed}")
        snapshot = _metrics_snapshot(root, gate.get("candidate", "hydra"))
        lines.append(f"metrics: {json.dumps(snapshot, separators=(',', ':'))}")
        version, _ = register(root, name, "\n".join(lines))
    assign_msg = f"hydra-ens: {name} {version} -> {stage}" + (
        f" (forced past failed gate; reason: {reason.strip()})" if forced else ""
    )
    assign(root, name, stage, version, assign_msg)
    log.info(
        "promote: %s@%s -> %s%s",
        name,
        version,
        stage,
        f" (FORCED: {reason.strip()})" if forced else "",
    )
    return {
        **record,
        "promoted": True,
        "forced": forced,
        "reason": reason if forced else None,
        "version": version,
        "bundle_md5": bundle_md5,
    }


def rollback(cfg: PipelineConfig, root: Path, version: str, reason: str | None) -> dict[str, Any]:
    """Assign the stage to an earlier registered ``version`` (a recorded reason is required)."""
    reason = check_reason(reason)
    name, stage = cfg.promote.model_name, cfg.promote.stage
    known = {v["version"]: v for v in versions(root, name)}
    if version not in known:
        allowed = ", ".join(known) or "none registered yet"
        raise ValueError(f"--version {version!r}: no such version of {name}; registered: {allowed}")
    md5 = known[version]["fields"].get("bundle_md5")
    if not md5:
        raise ValueError(f"{name}@{version} was registered before bundles; it cannot be served")
    if not bundle_available(root, md5):
        raise ValueError(
            f"{name}@{version}'s bundle {md5} is not in the DVC cache or remote here; "
            f"run: git checkout {name}@{version} -- dvc.lock && dvc pull models/bundle"
        )
    current = prod_version(root, name, stage)
    if current is not None and current["version"] == version:
        return {
            "model": name,
            "stage": stage,
            "promoted": False,
            "why": "already in stage",
            "version": version,
        }
    note = ensure_git_identity(root)
    if note:
        log.info("promote: %s", note)
    previous = current["version"] if current else None
    assign(
        root,
        name,
        stage,
        version,
        f"hydra-ens: {name} {version} -> {stage} (rollback from {previous}; reason: "
        f"{reason.strip()})",
    )
    log.info("promote: %s@%s -> %s (rollback from %s)", name, version, stage, previous)
    return {
        "model": name,
        "stage": stage,
        "promoted": True,
        "rollback_from": previous,
        "reason": reason.strip(),
        "version": version,
        "bundle_md5": md5,
    }


def run(cfg: PipelineConfig, root: Path) -> dict[str, Any]:
    result = promote(cfg, root)
    write_json(root / REGISTRY / "promotion.json", result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tasks.promote")
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--reason", default=None)
    parser.add_argument("--version", default=None, help="move the stage back to this version")
    args = parser.parse_args()
    if args.version:
        stage_main(
            "promote", lambda cfg, root: rollback(cfg, root, args.version, args.reason), SCHEMA
        )
    elif args.force:
        stage_main("promote", lambda cfg, root: promote(cfg, root, True, args.reason), SCHEMA)
    else:
        stage_main("promote", run, SCHEMA)


if __name__ == "__main__":
    main()
