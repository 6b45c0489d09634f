"""Stage ``bundle``: the one folder that ships, ``models/bundle`` (DVC-cached, what ``promote``
registers; its layout and :func:`~tasks.release.bundle_format.verify_bundle` are
:mod:`tasks.release.bundle_format`).

The stage refuses a verdict that does not match the workspace (it was written for another model,
evaluation or params). The card is :func:`tasks.reports.model_card.render_card`; loading a bundle
back to serve it (every file verified first) is :func:`tasks.serving.served.load_served`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra_ops.atomic import copy_tree_linked
from hydra_ops.hashing import sha256_file
from tasks.candidates.bundle import write_candidate
from tasks.params.schema import PipelineConfig
from tasks.release.bundle_format import CARD, FORMAT, MANIFEST
from tasks.release.custody import check_chain
from tasks.release.lineage import judged_hashes, stale_roles, stale_verdict_message
from tasks.release.preprocessing import write_preprocessing
from tasks.reports.model_card import render_card
from tasks.runtime.dvcfiles import cached_outputs, locked_outs
from tasks.runtime.layout import BUNDLE, COMPILED, DATA, HYDRA, METRICS, REPORTS
from tasks.runtime.outputs import publish_dir, read_json, write_json, write_text
from tasks.runtime.stage import stage_main

#: The params view this stage validates ``params.yaml`` with (the sections it reads).
SCHEMA = PipelineConfig

log = logging.getLogger("hydra_ens")


def _lineage(root: Path) -> dict[str, Any]:
    """Every cached output's md5 from ``dvc.lock`` (what the bundle was built from), by path (the
    lock lists stages in the order they last ran: a resumed run orders them otherwise)."""
    cached = cached_outputs(root)  # uncached metrics hold run facts (timings)
    locked = locked_outs(root)
    return {path: locked[path] for path in sorted(locked) if locked[path] and path in cached}


def run(cfg: PipelineConfig, root: Path) -> dict[str, Any]:
    gate = read_json(root / REPORTS / "gate.json", "gate output")
    recorded = gate.get("judged")
    current = judged_hashes(cfg, root)
    if not recorded:
        raise ValueError("reports/gate.json records nothing it judged; rerun: dvc repro gate")
    if stale := stale_roles(recorded, current):
        raise ValueError(stale_verdict_message(stale, recorded, current))
    ev = read_json(root / METRICS / "evaluate.json", "evaluate output")
    check_chain(cfg, root, ev)  # compiled <- models/hydra, evaluate.json <- what is there now
    # the facts the card needs; the format is checked where the model is loaded (load_hydra)
    hydra_cfg = read_json(root / HYDRA / "hydra.json", "calibrated model")
    compiled = read_json(root / COMPILED / "compiled.json", "compile output")
    data_manifest = root / DATA / "manifest.json"
    # the verdict names the candidate (promote recomputes it and refuses another)
    candidate = gate.get("candidate", "hydra")
    with publish_dir(root / BUNDLE) as tmp:
        copy_tree_linked(root / HYDRA, tmp / "model")
        copy_tree_linked(root / COMPILED, tmp / "compiled")
        if candidate != "hydra":
            write_candidate(root, ev, candidate, tmp)
        write_preprocessing(cfg, tmp)
        write_json(tmp / "gate.json", gate)
        write_json(tmp / "evaluate.json", ev)
        facts = {
            "model_name": cfg.promote.model_name,
            "verdict": gate["verdict"],
            "candidate": candidate,
            "judged": recorded,
            # of the model that answers predict: the Hydra, or the candidate that ships
            **(
                {
                    "temperature": hydra_cfg["temperature"],
                    "ood_thresholds": hydra_cfg.get("metadata", {}).get("ood_thresholds"),
                }
                if candidate == "hydra"
                else {
                    "temperature": ev["models"][candidate]["temperature"],
                    "ood_thresholds": ev["models"][candidate].get("ood_thresholds"),
                }
            ),
            "compiled_backend": compiled["backend"],
            "data_manifest_sha256": sha256_file(data_manifest) if data_manifest.is_file() else None,
            "lineage": _lineage(root),
        }
        write_text(tmp / CARD, render_card(cfg, facts, ev, gate, hydra_cfg, compiled))
        files = {
            p.relative_to(tmp).as_posix(): sha256_file(p)
            for p in sorted(tmp.rglob("*"))
            if p.is_file()
        }
        write_json(tmp / MANIFEST, {"format": FORMAT, **facts, "files": files})
    log.info(
        "bundle: %s (%d files, gate %s, ships %s, compiled backend %s)",
        BUNDLE,
        len(files) + 1,
        gate["verdict"],
        candidate,
        compiled["backend"],
    )
    return facts


def main() -> None:
    stage_main("bundle", run, SCHEMA)


if __name__ == "__main__":
    main()
