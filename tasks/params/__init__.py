"""The pipeline's parameters (``params.yaml``) as validated pydantic models, plus named profiles.

``params.yaml`` is the single, fully resolved configuration the DVC DAG runs on: every stage reads
it through :func:`~tasks.params.files.load_params`, which validates it before anything runs.
Profiles (``default``, ``quick``) are override dicts applied on top of the defaults by
:func:`~tasks.params.overrides.resolve_params`; the CLI writes the resolved result to
``params.yaml`` so DVC tracks exactly the values a stage used.

Every validation problem becomes one line ``params.yaml: <dotted.key>: <what is wrong>`` in a
:class:`~tasks.params.base.ConfigError` (a ``ValueError``).

One module per job; a stage's code deps (``dvc.yaml``, :mod:`tasks.stage_deps`) hold only the
modules it imports:

* :mod:`~tasks.params.base`: ``ConfigError`` and the strict base model;
* :mod:`~tasks.params.model`, :mod:`~tasks.params.members`, :mod:`~tasks.params.evaluation`,
  :mod:`~tasks.params.gates`: the sections' schemas;
* :mod:`~tasks.params.schema`: the root :class:`PipelineConfig` (derived values, cross-checks);
* :mod:`~tasks.params.profiles`: the profiles' overrides;
* :mod:`~tasks.params.files`: reading, validating and writing a params file;
* :mod:`~tasks.params.overrides`: profiles, params files and ``--set`` over the defaults (the
  CLI's and the study's; no stage imports it).

The names below are importable from ``tasks.params`` too, each loaded from its module on first
use (``from tasks.params import PipelineConfig`` imports only what ``schema`` needs).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ConfigError": "tasks.params.base",
    "_Strict": "tasks.params.base",
    "IMAGE_SOURCES": "tasks.params.model",
    "IMAGE_SUFFIXES": "tasks.params.model",
    "MINILM_LAYERS": "tasks.params.model",
    "MINILM_HEADS": "tasks.params.model",
    "data_modality": "tasks.params.model",
    "VitConfig": "tasks.params.model",
    "ModelConfig": "tasks.params.model",
    "FinetuneConfig": "tasks.params.model",
    "RuntimeConfig": "tasks.params.model",
    "ScoringConfig": "tasks.params.members",
    "MemberFinetuneConfig": "tasks.params.members",
    "MembersConfig": "tasks.params.members",
    "MergeConfig": "tasks.params.members",
    "McDropoutConfig": "tasks.params.evaluation",
    "BaselinesConfig": "tasks.params.evaluation",
    "CompileConfig": "tasks.params.evaluation",
    "CalibrateConfig": "tasks.params.evaluation",
    "EvaluateConfig": "tasks.params.evaluation",
    "PromoteConfig": "tasks.params.evaluation",
    "CLASSIFICATION_METRICS": "tasks.params.gates",
    "OOD_METRICS": "tasks.params.gates",
    "MODEL_METRICS": "tasks.params.gates",
    "COMPILE_CHECKS": "tasks.params.gates",
    "METRICS": "tasks.params.gates",
    "SPLITS": "tasks.params.gates",
    "BASELINES": "tasks.params.gates",
    "GREATER_IS_BETTER": "tasks.params.gates",
    "COMPILE_TOLERANCE": "tasks.params.gates",
    "GateCheck": "tasks.params.gates",
    "TWIN_GROUP": "tasks.params.gates",
    "default_gates": "tasks.params.gates",
    "PROFILES": "tasks.params.profiles",
    "REPLICATE_STRIDE": "tasks.params.schema",
    "ProfileName": "tasks.params.schema",
    "PipelineConfig": "tasks.params.schema",
    "did_you_mean": "tasks.params.files",
    "validate_params": "tasks.params.files",
    "read_yaml": "tasks.params.files",
    "load_params": "tasks.params.files",
    "to_raw": "tasks.params.files",
    "write_params": "tasks.params.files",
    "deep_merge": "tasks.params.overrides",
    "LIST_DEFAULTS": "tasks.params.overrides",
    "set_dotted": "tasks.params.overrides",
    "resolve_params": "tasks.params.overrides",
    "apply_sets": "tasks.params.overrides",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'tasks.params' has no attribute {name!r}")
