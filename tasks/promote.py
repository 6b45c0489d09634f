"""Stage ``promote``: register the bundle (``models/bundle``) as a new version and assign ``prod``,
only if its gate verdict passed and still describes what is on disk.

Before anything is registered, the hashes the verdict recorded (the model, its compiled artifact,
the evaluation, the params: :mod:`tasks.lineage`) are recomputed from the workspace and compared
with ``reports/gate.json`` and the bundle's own record. A stale or missing verdict is refused,
forced or not, with one line saying what changed and what to run. ``--force --reason TEXT``
overrides a *failed* verdict only; the reason is recorded in the registry.

Every promoted bundle gets its own version on its own version commit (:func:`tasks.registry.
commit_run`), so runs that share a code commit (a nightly schedule, a ``--set`` variant) each
promote without a person; the same bundle promoted again reuses its version.
``hydra-ens promote --version vX.Y.Z --reason TEXT`` moves the stage back to an earlier version.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from tasks.bundle import MANIFEST, stale_verdict_message, verify_bundle
from tasks.common import (
    BUNDLE,
    REGISTRY,
    REPORTS,
    load_evaluation,
    read_json,
    stage_main,
    write_json,
)
from tasks.lineage import dvc_md5, judged_hashes, stale_roles
from tasks.params import PipelineConfig
from tasks.registry import (
    assign,
    bundle_available,
    ensure_git_identity,
    prod_version,
    register,
    versions,
)

log = logging.getLogger("hydra_ens")


def _metrics_snapshot(root: Path) -> dict[str, Any]:
    hydra = load_evaluation(root)["models"]["hydra"]
    return {k: hydra[k] for k in hydra if k not in ("members", "verdicts", "verdict_fractions")}


def check_verdict(cfg: PipelineConfig, root: Path) -> dict[str, Any]:
    """The gate verdict, after checking it describes the workspace and the bundle (ValueError)."""
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
    try:
        manifest = verify_bundle(root / BUNDLE)
    except ValueError as err:
        raise ValueError(f"{err}; rebuild it: hydra-ens run (or dvc repro bundle)") from None
    if manifest.get("judged") != recorded or manifest.get("verdict") != gate["verdict"]:
        raise ValueError(
            f"{BUNDLE}/{MANIFEST} was built from another gate verdict; rebuild it: "
            "hydra-ens run (or dvc repro bundle)"
        )
    return gate


def promote(
    cfg: PipelineConfig, root: Path, force: bool = False, reason: str | None = None
) -> dict[str, Any]:
    """Register + assign if the verdict passed (or ``force`` with a ``reason``); the record."""
    if force and not (reason and reason.strip()):
        raise ValueError("--force needs --reason TEXT (the reason is recorded in the registry)")
    name, stage = cfg.promote.model_name, cfg.promote.stage
    gate = check_verdict(cfg, root)
    record: dict[str, Any] = {
        "model": name,
        "stage": stage,
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
            f"gate: {'passed' if gate['passed'] else 'FAILED (forced)'}",
        ]
        if forced:
            lines.append(f"reason: {reason.strip()}")
            lines.append(f"failed_checks: {', '.join(gate['failed'])}")
        lines.append(f"metrics: {json.dumps(_metrics_snapshot(root), separators=(',', ':'))}")
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
    if not (reason and reason.strip()):
        raise ValueError("--version needs --reason TEXT (the reason is recorded in the registry)")
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
        stage_main("promote", lambda cfg, root: rollback(cfg, root, args.version, args.reason))
    elif args.force:
        stage_main("promote", lambda cfg, root: promote(cfg, root, True, args.reason))
    else:
        stage_main("promote", run)


if __name__ == "__main__":
    main()
