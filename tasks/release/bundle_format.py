"""The bundle that ships (written by stage ``bundle``, registered by ``promote``, served by
:func:`tasks.serving.served.load_served`), and its check against its own manifest.

``models/bundle`` (DVC-cached, what ``promote`` registers)::

    model/        the calibrated model (models/hydra: model.safetensors + hydra.json; the
                  temperature and the OOD verdict thresholds are in hydra.json)
    compiled/     its compiled artifact (backend, precision, device, versions, the agreement
                  check in compiled.json; only compiled.json when the backend is eager)
    preprocessing.json, tokenizer/
                  how inputs become model inputs (max_length and the tokenizer, or image size,
                  channels, normalisation): what ``predict`` uses
                  (:mod:`tasks.release.preprocessing`)
    gate.json     the gate verdict, with the hashes of what it judged
    evaluate.json the metrics of Hydra and every baseline, with paired-bootstrap intervals
    MODEL_CARD.md what the model is, data, metrics vs baselines, gates, lineage, how to call it
    candidate/    only when the verdict's candidate is not the Hydra (``promote.candidates``):
                  that model's scored files and ``candidate.json`` (:mod:`tasks.candidates.bundle`);
                  ``predict`` answers with it, ``model/`` and ``compiled/`` stay as judged
    bundle.json   the sha256 of every file above, the verdict's hashes, the candidate it ships,
                  the lineage
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from hydra_ops.hashing import sha256_file
from tasks.runtime.outputs import read_json

FORMAT = "hydra-ens-bundle/1"
MANIFEST = "bundle.json"
CARD = "MODEL_CARD.md"


def verify_bundle(directory: Path, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """``bundle.json`` after checking every file it lists but ``skip``, and that the folder holds
    no file it does not list (ValueError naming the first change). This checks the bundle
    against its own manifest only: where a bundle's origin matters, its folder md5 is checked
    against what was judged (``promote``) or registered (:func:`tasks.release.dvc_cache.
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
