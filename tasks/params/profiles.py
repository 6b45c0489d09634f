"""Named profiles: overrides applied on top of the defaults (by :mod:`tasks.params.overrides`).

Their names are :data:`tasks.params.core.PROFILE_NAMES` (what a ``params.yaml`` may record); a
test holds the two equal."""

from __future__ import annotations

from typing import Any

#: Profiles: overrides applied on top of the defaults. ``quick`` is for tests and smoke runs;
#: ``study`` builds every baseline a study report compares.
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    # every baseline a study compares (the default run builds only what its gates read)
    "study": {
        "baselines": {"mc_dropout": {"enabled": True}},
        "members": {"finetune": {"controls": True}},
    },
    "quick": {
        "data": {"max_per_split": 160, "far_ood_size": 100},
        "model": {"max_length": 32},
        "finetune": {"epochs": 1, "batch_size": 16},
        "scoring": {"max_batches": 1, "batch_size": 16},
        # a smoke run goes down every path, the study's baselines included
        "baselines": {"deep_ensemble_size": 2, "mc_dropout": {"enabled": True, "samples": 4}},
        "members": {"finetune": {"epochs": 1, "controls": True}},
        "compile": {"backend": "eager"},
        "evaluate": {
            "bootstrap_samples": 100,
            "latency_batch": 8,
            "cost_rounds": 3,
        },
        # a smoke run (160 examples, 1 epoch) checks the Hydra's own path to a release; which
        # of two barely trained models is cheaper-and-passing says nothing there
        "promote": {"candidates": ["hydra"]},
    },
}
