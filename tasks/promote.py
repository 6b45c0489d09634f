"""Stage ``promote``: register ``models/hydra`` in the GTO registry and assign stage ``prod``,
only if every gate passed (``reports/gate.json``).

``hydra-ens promote --force --reason TEXT`` promotes past a failed gate; the reason is recorded in
both tags' messages. A forced promotion is recorded only in the registry (the tags), not in
``registry/promotion.json``, which stays the DVC stage's own output. Promoting a model that is
already in the stage (same content hash) is a no-op. GTO tags the current git commit and keeps one
version per commit, so the project must have a commit, and a model that differs from the one
already registered at this commit is refused until the project is committed (its params.yaml and
dvc.lock then describe the new version).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from hydra_ops.config import PipelineConfig
from tasks.common import (
    HYDRA,
    METRICS,
    REGISTRY,
    REPORTS,
    dir_sha256,
    read_json,
    stage_main,
    write_json,
)
from tasks.registry import (
    ensure_git_identity,
    has_commit,
    locked_md5,
    parse_message,
    prod_version,
    tag_message,
)

log = logging.getLogger("hydra_ens")


def _metrics_snapshot(root: Path) -> dict[str, Any]:
    ev = read_json(root / METRICS / "evaluate.json", "evaluate output")
    hydra = ev["models"]["hydra"]
    return {k: hydra[k] for k in hydra if k != "members"}


def promote(
    cfg: PipelineConfig, root: Path, force: bool = False, reason: str | None = None
) -> dict[str, Any]:
    """Register + assign if the gate passed (or ``force`` with a ``reason``); returns the record."""
    import gto.api
    import gto.exceptions

    if force and not (reason and reason.strip()):
        raise ValueError("--force needs --reason TEXT (the reason is recorded in the registry)")
    name, stage = cfg.promote.model_name, cfg.promote.stage
    gate = read_json(root / REPORTS / "gate.json", "gate output")
    record: dict[str, Any] = {
        "model": name,
        "stage": stage,
        "gate": gate["verdict"],
        "failed_checks": gate["failed"],
    }
    if not gate["passed"] and not force:
        log.info("promote: gate FAILED (%s); not promoted", ", ".join(gate["failed"]))
        return {**record, "promoted": False, "why": "gate failed"}
    if not has_commit(root):
        raise ValueError(
            "promote: the git repo has no commit for GTO to tag; commit the project first "
            "(git add -A && git commit -m ...)"
        )
    note = ensure_git_identity(root)
    if note:
        log.info("promote: %s", note)
    sha = dir_sha256(root / HYDRA)
    current = prod_version(root, name, stage)
    if current is not None and current["fields"].get("sha256") == sha and not force:
        log.info("promote: this model is already %s %s (%s)", name, stage, current["version"])
        return {
            **record,
            "promoted": False,
            "why": "already in stage",
            "version": current["version"],
            "sha256": sha,
        }
    md5 = locked_md5(root, HYDRA)
    lines = [
        f"hydra-ens promotion of {HYDRA}",
        f"dvc_md5: {md5}",
        f"sha256: {sha}",
        f"gate: {'passed' if gate['passed'] else 'FAILED (forced)'}",
    ]
    if force:
        lines.append(f"reason: {reason.strip()}")
        if gate["failed"]:
            lines.append(f"failed_checks: {', '.join(gate['failed'])}")
    lines.append(f"metrics: {json.dumps(_metrics_snapshot(root), separators=(',', ':'))}")
    message = "\n".join(lines)
    try:
        reg = gto.api.register(str(root), name, ref="HEAD", message=message)
        version = getattr(reg, "version", None) or str(reg)
    except gto.exceptions.VersionExistsForCommit as err:
        # GTO keeps one version per commit, and a version's tag message says which model it is:
        # reuse the version only if it is this very model
        version = str(err).split("version '")[-1].rstrip("'")
        registered = parse_message(tag_message(root, f"{name}@{version}"))
        if registered.get("sha256") != sha:
            raise ValueError(
                f"promote: {name}@{version} is already registered at this git commit for a "
                "different model (GTO keeps one version per commit); commit the project "
                "(git add params.yaml dvc.lock && git commit -m ...) and promote again"
            ) from None
        log.info("promote: %s is already registered at this commit as %s", name, version)
    assign_msg = f"hydra-ens: {name} {version} -> {stage}" + (
        f" (forced past failed gate; reason: {reason.strip()})" if force else ""
    )
    # force: a forced promotion always leaves its own tag (with the reason), even when this
    # version already holds the stage
    try:
        gto.api.assign(str(root), name, stage, version=version, message=assign_msg, force=force)
    except gto.exceptions.GTOException as err:
        raise ValueError(f"promote: the registry (GTO) refused the assignment: {err}") from None
    log.info(
        "promote: registered %s@%s and assigned stage %s%s",
        name,
        version,
        stage,
        " (FORCED: " + reason.strip() + ")" if force else "",
    )
    return {
        **record,
        "promoted": True,
        "forced": force,
        "reason": reason,
        "version": version,
        "dvc_md5": md5,
        "sha256": sha,
    }


def run(cfg: PipelineConfig, root: Path) -> dict[str, Any]:
    result = promote(cfg, root)
    write_json(root / REGISTRY / "promotion.json", result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tasks.promote")
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--reason", default=None)
    args = parser.parse_args()
    if args.force:
        stage_main("promote", lambda cfg, root: promote(cfg, root, True, args.reason))
    else:
        stage_main("promote", run)


if __name__ == "__main__":
    main()
