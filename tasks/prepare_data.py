"""Stage ``prepare_data``: materialise the versioned splits under ``data/prepared``.

Splits (``hydra_ops.data``): ID train/val/test, shift (ID test with noise), near-OOD (held-out
classes), far-OOD (another source) and ``ood_val``, the circuit scorer's OOD validation set,
which is
built from ID validation data and is never an OOD test set. ``manifest.json`` holds the per-class
counts and a sha256 per file; ``metrics/data.json`` the counts.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hydra_ops.data import materialise_splits
from tasks.params.core import CoreConfig
from tasks.runtime.layout import DATA, METRICS
from tasks.runtime.outputs import write_json
from tasks.runtime.stage import stage_main

#: The params view this stage validates ``params.yaml`` with (the sections it reads).
SCHEMA = CoreConfig

log = logging.getLogger("hydra_ens")


def run(cfg: CoreConfig, root: Path) -> dict[str, Any]:
    # every later stage scores near-OOD: refuse data without it here, not after the fine-tunes
    manifest = materialise_splits(cfg.data, root / DATA, require=("near_ood",))
    counts = {name: info.count for name, info in manifest.splits.items()}
    log.info(
        "prepare_data: %s (%s), classes %s, counts %s",
        cfg.data.name,
        manifest.modality,
        manifest.classes,
        counts,
    )
    summary = {
        "source": cfg.data.name,
        "modality": manifest.modality,
        "num_classes": len(manifest.classes),
        "counts": counts,
        "ood_val": manifest.ood_val_provenance,
    }
    write_json(root / METRICS / "data.json", summary)
    return summary


def main() -> None:
    stage_main("prepare_data", run, SCHEMA)


if __name__ == "__main__":
    main()
