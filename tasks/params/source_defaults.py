"""Per-data-source defaults: what a built-in image source needs to train well on a CPU.

The pipeline's global defaults (``tasks/params.py``) are those of the default text run (BBC News +
MiniLM-L6 fine-tuning: 3 epochs, batch 16, lr 5e-5). A from-scratch timm ViT on ``mnist5k`` with
them (16x16 input, 3 epochs) reached only ~82% test accuracy, and its MSP ranked the far-OOD crops
as *more* in-distribution than the digits (far-OOD AUROC 0.34-0.50): an under-trained model, not
an impossible OOD set (the same crops score AUROC 0.94-0.99 once the model is trained).

:func:`tasks.params.resolve_params` layers these overrides just above the global defaults and
below everything a user chooses::

    global defaults < SOURCE_DEFAULTS[data.name] < PROFILES[profile] < params file < --set

``data.name`` is read from the merged profile / params file / ``--set`` values. A profile sits
above the source defaults so ``--profile quick`` still shrinks a run (1 epoch, batch 16,
``max_per_split`` 160); what it leaves from here (the ViT's shape, ``random_shift``) costs the
same per step as the global shape (16 tokens of the same width and depth).

Evidence (full table and method: docs/data.md, "Image sources: defaults and evidence"; AMD EPYC
with AVX-512, 2 shared cores, torch 2.14 CPU, one thread; MSP AUROC with OOD positive; ``mnist5k``
ID test = 600 digits 0-7, ``digits`` ID test = 215):

* ``mnist5k`` with the global defaults (16px, 3 epochs, batch 16): test accuracy .825, near-OOD
  AUROC .62, far-OOD .50. With 28px / patch 7, batch 32, 20 epochs, no augmentation: .955 (the
  ViT memorises the 2,800 training digits and stalls at 92-95.5% over 10-20 epochs, batch
  16-64, lr 5e-4 to 3e-3, width 96-128, depth 4-6). Adding ``random_shift: 1`` (chosen):
  .978 / .977 / .972 / .967 / .977 over training seeds 0, 1, 2, 1000, 2000 (mean .974),
  near-OOD .92 / .93 / .90 / .89 / .90, far-OOD .99 / .99 / .96 / .96 / .94; 2-4 s per epoch
  on one thread. Tried and not better: 2-px shifts, continuous affine jitter, 15/25/30 epochs,
  lr 7e-4 / 2e-3, batch 64, weight decay 0.05 / 0.1, mlp ratio 4, depth 6, width 192, 4x4
  patches (49 tokens, 2-3x slower). One full pipeline run (seed 0): single .978, Deep Ensemble
  .980, Hydra .970; near-OOD AUROC .83-.95 and far-OOD .96-.99 for every model.
* ``fashion-mnist`` (9 classes, ``shirt`` held out; docs/data.md, "The harder sources"): the
  mnist5k shape (28px / patch 7, ``random_shift: 1``) at batch 64 for 10 epochs on 15,000 of the
  56,700 training images (the ``max_per_split`` cap, 90/5/5 splits): test accuracy .915, shift
  .890 (3,150 test images, seed 0); 124 s of CPU time to prepare the data and train, one
  thread (the wall time, 21 minutes on the shared machine at load average ~20, says nothing), so
  the three base trainings of a full run cost about 6 of its minutes. The Hydra shares 3 of the
  4 layers (``merge.shared_layers: 3``, one pruned layer): in the fashion-mnist study
  (docs/study.md; chosen on seeds 10, 11 and 0-2, confirmed on 3-5, each seed its own split) it
  costs 1.20x the single model against 1.33x for a trunk of 2, with fewer FLOPs and parameters,
  and it is closer to the single model on the metrics the gates watch most (confirmation seeds,
  Hydra minus single: near-OOD AUROC -0.004 against -0.013, shift NLL +0.012 against +0.022, ID
  NLL +0.008 against +0.015), farther on ID ECE (+0.006 against +0.003) and far-OOD AUROC
  (+0.013 against +0.033). Neither beats the single model there: no Hydra earns its cost on this
  task.
* ``brown-genres`` has no entry: the text defaults apply (MiniLM-L6, 4 of 12 heads kept in layers
  3-5, a shared trunk of 3). The brown-genres study (docs/study.md; three variants on choosing
  seeds 0-2 and confirmation seeds 3-5, each its own split) found no variant better: on the
  confirmation seeds the 2-heads form (1.46x single, inside the default's 1.56x [1.30, 1.83])
  and the every-layer form (2.37x) beat the single model on no metric and are worse on ID NLL.
* ``digits`` with the global defaults: accuracy .679, far-OOD AUROC .10 (under-trained, as
  above); 30 epochs at batch 32: .981 / .981 (seeds 0, 1), near-OOD .88 / .87, far-OOD .95 / .91.
  A 1-px shift of the 2x-upsampled 8x8 digits did not help (.977 / .986, far-OOD .93 / .81).
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
        # the cheapest Hydra of the fashion-mnist study (docstring: what it trades)
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
