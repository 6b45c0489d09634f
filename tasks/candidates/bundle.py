"""A bundle's ``candidate/`` folder: the model that ships when it is not the Hydra.

``bundle`` writes it (:func:`write_candidate`) for the candidate the verdict names: a copy of the
files the candidate was scored from (``scored.candidates[name]`` of ``metrics/evaluate.json``,
:mod:`tasks.candidates.export`) and ``candidate.json``, which holds nothing that evaluate.json does
not (:func:`description`: name, recipe, temperature, class names, verdict thresholds, and which
``predict`` columns it cannot give). :func:`check_candidate` holds the folder to that evaluation
(``promote`` with the workspace's, :func:`tasks.serving.served.load_served` with the bundled one)
and
:func:`tasks.candidates.serving.load_candidate` rebuilds the model from it: no file the
evaluation did not hash is read.
The bundle keeps ``model/`` and ``compiled/`` (the Hydra the candidate was judged beside), so the
chain of custody of :mod:`tasks.release.custody` is checked as for any bundle.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra_ops.atomic import copy_tree_linked, link_or_copy
from hydra_ops.hashing import sha256_file
from tasks.candidates.export import DESCRIPTION, FOLDER, source_hashes
from tasks.runtime.outputs import read_json, write_json


def export_of(ev: Mapping[str, Any], name: str) -> dict[str, Any]:
    """``scored.candidates[name]`` of an evaluation (ValueError when it records none)."""
    found = ((ev.get("scored") or {}).get("candidates") or {}).get(name)
    if not isinstance(found, dict) or not isinstance(found.get("sha256"), dict):
        raise ValueError(
            f"metrics/evaluate.json records no export of {name!r} (how it ships and the hashes "
            "of its files): it cannot ship; rerun evaluate: hydra-ens run"
        )
    return found


def unavailable_columns(members: int, thresholds: Mapping[str, Any] | None) -> dict[str, str]:
    """The ``predict`` columns a candidate of ``members`` members cannot give, with why."""
    out: dict[str, str] = {}
    if members == 1:
        why = "one model: no members to disagree"
        out |= {"mutual_information": why, "disagreement": why}
    if thresholds is None:
        out["verdict"] = "no verdict thresholds: its OOD score is 0 for every input (one model)"
    return out


def description(ev: Mapping[str, Any], name: str) -> dict[str, Any]:
    """``candidate.json``: everything in it comes from the evaluation ``ev``."""
    export, entry = export_of(ev, name), ev["models"][name]
    thresholds = entry.get("ood_thresholds")
    return {
        "name": name,
        "recipe": export["recipe"],
        "members": entry["members"],
        "temperature": entry["temperature"],
        "class_names": export["class_names"],
        "ood_thresholds": thresholds,
        "unavailable": unavailable_columns(int(entry["members"]), thresholds),
    }


def write_candidate(root: Path, ev: Mapping[str, Any], name: str, bundle_tmp: Path) -> None:
    """Copy ``name``'s scored files into ``bundle_tmp/candidate`` and write its description;
    ValueError when the workspace's files are no longer the ones evaluate scored."""
    export = export_of(ev, name)
    if source_hashes(root, export["sources"]) != export["sha256"]:
        raise ValueError(
            f"{name}'s files ({', '.join(export['sources'].values())}) changed since evaluate "
            "scored them; rerun evaluate: hydra-ens run"
        )
    out = bundle_tmp / FOLDER
    out.mkdir()
    for bundled, rel in export["sources"].items():
        src = Path(root) / rel
        if src.is_dir():
            copy_tree_linked(src, out / bundled)
        else:
            link_or_copy(src, out / bundled)
    write_json(out / DESCRIPTION, description(ev, name))
    check_candidate(bundle_tmp, ev, name)


def check_candidate(directory: Path, ev: Mapping[str, Any], name: str) -> None:
    """Refuse a bundle whose ``candidate/`` is not exactly the files evaluation ``ev`` scored for
    ``name`` and the description it implies (one-line ValueError naming the first change)."""
    folder = Path(directory) / FOLDER
    if not (folder / DESCRIPTION).is_file():
        raise ValueError(f"bundle {directory}: it ships {name} but has no {FOLDER}/{DESCRIPTION}")
    if read_json(folder / DESCRIPTION, "bundled candidate") != description(ev, name):
        raise ValueError(
            f"bundle {directory}: {FOLDER}/{DESCRIPTION} is not what the evaluation says of {name}"
        )
    held = {
        p.relative_to(folder).as_posix(): sha256_file(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p != folder / DESCRIPTION
    }
    scored = export_of(ev, name)["sha256"]
    for rel in sorted(set(held) | set(scored)):
        if held.get(rel) != scored.get(rel):
            what = "missing" if rel not in held else "not a file evaluate scored"
            if rel in held and rel in scored:
                what = "changed since evaluate scored it (sha256)"
            raise ValueError(f"bundle {directory}: {FOLDER}/{rel} is {what}")
