"""Stage ``bundle``: the one folder that ships, and loading it back to serve predictions.

``models/bundle`` (DVC-cached, what ``promote`` registers)::

    model/        the calibrated model (models/hydra: model.safetensors + hydra.json; the
                  temperature and the OOD verdict thresholds are in hydra.json)
    compiled/     its compiled artifact (backend, precision, device, versions, the agreement
                  check in compiled.json; only compiled.json when the backend is eager)
    preprocessing.json, tokenizer/
                  how inputs become model inputs (max_length and the tokenizer, or image size,
                  channels, normalisation): what ``predict`` uses (:mod:`tasks.preprocessing`)
    gate.json     the gate verdict, with the hashes of what it judged
    evaluate.json the metrics of Hydra and every baseline, with paired-bootstrap intervals
    MODEL_CARD.md what the model is, data, metrics vs baselines, gates, lineage, how to call it
    candidate/    only when the verdict's candidate is not the Hydra (``promote.candidates``):
                  that model's scored files and ``candidate.json`` (:mod:`tasks.candidate_bundle`);
                  ``predict`` answers with it, ``model/`` and ``compiled/`` stay as judged
    bundle.json   the sha256 of every file above, the verdict's hashes, the candidate it ships,
                  the lineage

The stage refuses a verdict that does not match the workspace (it was written for another model,
evaluation or params). The card is :func:`tasks.model_card.render_card`; loading a bundle back to
serve it (every file verified first) is :func:`tasks.served.load_served`.
"""

from __future__ import annotations

import logging
from pathlib import Path, PurePosixPath
from typing import Any

from hydra_ops.atomic import copy_tree_linked
from hydra_ops.hashing import sha256_file
from tasks.candidate_bundle import write_candidate
from tasks.custody import check_chain
from tasks.dvcfiles import cached_outputs, locked_outs
from tasks.layout import BUNDLE, COMPILED, DATA, HYDRA, METRICS, REPORTS
from tasks.lineage import judged_hashes, stale_roles
from tasks.model_card import render_card
from tasks.outputs import publish_dir, read_json, write_json, write_text
from tasks.params.schema import PipelineConfig
from tasks.preprocessing import write_preprocessing
from tasks.stage import stage_main

#: The params view this stage validates ``params.yaml`` with (the sections it reads).
SCHEMA = PipelineConfig

log = logging.getLogger("hydra_ens")

FORMAT = "hydra-ens-bundle/1"
MANIFEST = "bundle.json"
CARD = "MODEL_CARD.md"


def stale_verdict_message(stale: list[str], recorded: dict, current: dict) -> str:
    """One line: which judged artifacts changed since the verdict, and what to run."""
    parts = [
        f"{current[r]['path']} ({str((recorded.get(r) or {}).get('md5'))[:8]} -> "
        f"{current[r]['md5'][:8]})"
        for r in stale
    ]
    return (
        "the gate verdict (reports/gate.json) is stale: changed since it was written: "
        + ", ".join(parts)
        + "; rerun the gate on what is there now: hydra-ens run (or dvc repro gate)"
    )


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


def verify_bundle(directory: Path, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """``bundle.json`` after checking every file it lists but ``skip``, and that the folder holds
    no file it does not list (ValueError naming the first change). This checks the bundle
    against its own manifest only: where a bundle's origin matters, its folder md5 is checked
    against what was judged (``promote``) or registered (:func:`tasks.registry.
    resolve_bundle_dir`)."""
    manifest = read_json(directory / MANIFEST, "bundle")
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{directory / MANIFEST}: format must be {FORMAT!r}")
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(isinstance(d, str) for d in files.values()):
        raise ValueError(f"{directory / MANIFEST}: its files are not a mapping of sha256s")
    listed = {*files, MANIFEST}
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory).as_posix()
        if not path.is_dir() and rel not in listed:
            raise ValueError(f"bundle {directory}: {rel} is not listed in {MANIFEST}")
    for rel, digest in files.items():
        pure = PurePosixPath(rel)
        if pure.is_absolute() or ".." in pure.parts:
            raise ValueError(f"{directory / MANIFEST}: unsafe path {rel[:60]!r}")
        if rel in skip:
            continue
        path = directory / rel
        if not path.is_file():
            raise ValueError(f"bundle {directory}: {rel} is missing")
        if sha256_file(path) != digest:
            raise ValueError(f"bundle {directory}: {rel} was modified (sha256 does not match)")
    return manifest


def main() -> None:
    stage_main("bundle", run, SCHEMA)


if __name__ == "__main__":
    main()
