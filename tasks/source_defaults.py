"""Per-data-source defaults: what a built-in image source needs to train well on a CPU.

The pipeline's global defaults (``tasks/params.py``) are those of the default text run (BBC News +
MiniLM-L6 fine-tuning: 3 epochs, batch 16, lr 5e-5). A from-scratch timm ViT on ``mnist5k`` with
them (16x16 input, 3 epochs) reached only ~82% test accuracy, and its MSP ranked the far-OOD crops
as *more* in-distribution than the digits (far-OOD AUROC 0.34-0.50): an under-trained model, not
an impossible OOD set (the same crops score AUROC 0.96-0.99 once the model is trained).

:func:`tasks.params.resolve_params` layers these overrides just above the global defaults and
below everything a user chooses::

    global defaults < SOURCE_DEFAULTS[data.name] < PROFILES[profile] < params file < --set

``data.name`` is read from the merged profile / params file / ``--set`` values. A profile sits
above the source defaults so ``--profile quick`` still shrinks a run (1 epoch, batch 16,
``max_per_split`` 160); what it leaves from here (the ViT's shape, ``random_shift``) costs the
same per step as the global shape (16 tokens of the same width and depth).

Evidence (docs/data.md, "Image sources: defaults and evidence"; AMD EPYC, 2 cores with AVX-512,
torch 2.14 CPU, one thread, ``benchmarks``-style script driving ``hydra_ops`` directly; MSP
AUROCs, OOD positive; test = the 600-image ID test split of ``data.seed`` 0):

========================================  ==========  ========  ========  =========
mnist5k, training seeds 0/1/2             test acc    near AUC  far AUC   s/epoch
========================================  ==========  ========  ========  =========
global defaults (16px, 3 ep, batch 16)    .825        .62       .50       ~4
28px/patch 7, 20 ep, batch 32, no shift   .955 (s0)   .91       .94       ~3.4
the same + ``random_shift`` 1 (chosen)    .978/.977/.972  .92/.93/.90  .99/.99/.96  ~3.4
========================================  ==========  ========  ========  =========

Without augmentation the ViT memorises the 2,800 training digits (loss < 0.01) and stalls at
94-95.5%; a 1-pixel random translation is what lifts it past 97% (2 pixels, or a continuous
affine jitter, trained slower: 96-97%).
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
}


def source_defaults(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The overrides for the data source a raw (unvalidated) params mapping names.

    ``raw["data"]["name"]`` picks the entry (absent: the global default source, which has none);
    a malformed ``data`` section gets none here and its error from validation. Returns a copy.
    """
    data = raw.get("data")
    name = data.get("name") if isinstance(data, Mapping) else None
    return copy.deepcopy(SOURCE_DEFAULTS.get(name, {})) if isinstance(name, str) else {}
