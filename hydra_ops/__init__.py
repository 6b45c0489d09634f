"""hydra_ops: Hydra Ensembles in pure PyTorch.

M members cut from one fine-tuned transformer by pruning different attention heads, fused into one
network whose attention runs as grouped (block-diagonal) projections: one forward pass, M
predictions. This package imports neither Prefect nor DVC.

Packages by job, imports pointing one way (docs/architecture.md): ``adapters`` (model
families), ``uq`` (uncertainty, OOD scores, calibration), ``heads`` (head plans, gates, surgery,
selection), ``metrics``, ``scoring`` (head importance), ``models`` (build, train, run, save a
classifier), ``data``, ``hydra`` (the merged model and its saved form), ``compile``, ``perf``;
the top-level modules (``atomic``, ``hashing``, ``messages``, ``registry``, ``versions``,
``measurements``, ``margin``) are the foundation they share.

The public API is re-exported here and imported lazily (``import hydra_ops`` is cheap):

* models and heads: :func:`get_adapter`, :func:`head_gates`, :func:`prune_heads`, :class:`HeadPlan`
* importance and members: :func:`score_heads`, :class:`HeadScores`, :func:`select_members`
* the merge: :func:`merge_members`, :class:`HydraEnsemble`, :func:`save_hydra`, :func:`load_hydra`
* uncertainty: :mod:`hydra_ops.metrics`, :func:`fit_temperature`, :func:`paired_bootstrap`
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "get_adapter": "hydra_ops.adapters",
    "FAMILIES": "hydra_ops.adapters",
    "head_gates": "hydra_ops.heads.gating",
    "HeadPlan": "hydra_ops.heads.plans",
    "plan_overlap": "hydra_ops.heads.plans",
    "prune_heads": "hydra_ops.heads.surgery",
    "score_heads": "hydra_ops.scoring",
    "HeadScores": "hydra_ops.scoring",
    "select_members": "hydra_ops.heads.selection",
    "merge_members": "hydra_ops.hydra.merge",
    "HydraEnsemble": "hydra_ops.hydra.merge",
    "save_hydra": "hydra_ops.hydra.serialization",
    "load_hydra": "hydra_ops.hydra.serialization",
    "fit_temperature": "hydra_ops.uq.calibration",
    "paired_bootstrap": "hydra_ops.metrics.bootstrap",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hydra_ops' has no attribute {name!r}")
