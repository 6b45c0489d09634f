"""Per-data-source defaults: what a built-in image source needs to train well on a CPU.

:func:`tasks.params.resolve_params` layers these overrides just above the global defaults and
below everything a user chooses::

    global defaults < SOURCE_DEFAULTS[data.name] < PROFILES[profile] < params file < --set

``data.name`` is read from the merged profile / params file / ``--set`` values. A profile sits
above the source defaults, so ``--profile quick`` still shrinks a run (1 epoch, batch 16,
``max_per_split`` 160). A source without an entry (``bbc-news``, ``brown-genres``, the user's)
runs on the global defaults.

Why each value (the measurements and the studies they come from): docs/data.md, "Image sources:
defaults and evidence".
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

#: ``data.name`` -> overrides of the global defaults (same nesting as ``params.yaml``).
SOURCE_DEFAULTS: dict[str, dict[str, Any]] = {
    "mnist5k": {
        # native 28x28, 7x7 patches: 16 tokens, the cost of the global 16px / patch-4 shape
        "model": {"vit": {"image_size": 28, "patch_size": 7}},
        "finetune": {"epochs": 20, "batch_size": 32, "random_shift": 1},
    },
    "digits": {
        # 8x8 digits upsampled to the global 16px / patch 4 shape; ~1,000 training images
        "finetune": {"epochs": 30, "batch_size": 32},
    },
    "fashion-mnist": {
        # 63,000 ID images: 90/5/5 splits, then at most 15,000 per split (stratified) keep a
        # full run near 20 minutes on 2 cores; test 3,150, near-OOD 7,000 shirts
        "data": {"train_frac": 0.9, "val_frac": 0.05, "test_frac": 0.05, "max_per_split": 15000},
        "model": {"vit": {"image_size": 28, "patch_size": 7}},
        "finetune": {"epochs": 10, "batch_size": 64, "random_shift": 1},
        # the cheapest Hydra of the fashion-mnist study (docs/study.md)
        "merge": {"shared_layers": 3},
    },
}


def source_defaults(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The overrides for the data source a raw (unvalidated) params mapping names.

    ``raw["data"]["name"]`` picks the entry (absent: the global default source, which has none);
    a malformed ``data`` section gets none here and its error from validation. Returns a copy.
    """
    data = raw.get("data")
    name = data.get("name") if isinstance(data, Mapping) else None
    return copy.deepcopy(SOURCE_DEFAULTS.get(name, {})) if isinstance(name, str) else {}
