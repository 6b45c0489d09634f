"""The pipeline's parameters (``params.yaml``) as validated pydantic models, plus named profiles.

``params.yaml`` is the single, fully resolved configuration the DVC DAG runs on: every stage reads
it through :func:`~tasks.params.schema.load_params`, which validates it before anything runs.
Profiles (``default``, ``quick``) are override dicts applied on top of the defaults by
:func:`~tasks.params.overrides.resolve_params`; the CLI writes the resolved result to
``params.yaml`` so DVC tracks exactly the values a stage used.

Every validation problem becomes one line ``params.yaml: <dotted.key>: <what is wrong>`` in a
:class:`~tasks.params.base.ConfigError` (a ``ValueError``).

One module per job; a stage's code deps (``dvc.yaml``, :mod:`tasks.runtime.stage_deps`) hold only
the modules it imports:

* :mod:`~tasks.params.base`: ``ConfigError`` and the strict base model;
* the sections' schemas: :mod:`~tasks.params.model` (``model``, ``finetune``, ``runtime``),
  :mod:`~tasks.params.members` (``scoring``, ``members``, ``merge``),
  :mod:`~tasks.params.evaluation` (``compile``, ``calibrate``, ``evaluate``),
  :mod:`~tasks.params.baselines`, :mod:`~tasks.params.gates` (with the metric names of
  :mod:`~tasks.params.metrics`), :mod:`~tasks.params.promote`;
* the params views a stage validates ``params.yaml`` with, each typing the sections it reads and
  keeping the others as written: :class:`~tasks.params.core.CoreConfig` (``data`` to
  ``evaluate``: derived values, cross-checks),
  :class:`~tasks.params.baselines.BaselinesStageConfig` (+ ``baselines``) and
  :class:`~tasks.params.schema.PipelineConfig` (the whole file: the CLI, the flow, gate, bundle,
  promote);
* :mod:`~tasks.params.files`: reading, validating (with a view) and writing a params file;
* :mod:`~tasks.params.profiles`, :mod:`~tasks.params.overrides`: profiles, params files and
  ``--set`` over the defaults (the CLI's and the study's; no stage imports them);
* :mod:`~tasks.params.names`: the built-in names (scorers, backends, ...) checked against the
  library's registries (the CLI's preflight; no stage imports it).

The names below are importable from ``tasks.params`` too, each loaded from its module on first
use (``from tasks.params import PipelineConfig`` imports only what ``schema`` needs).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ConfigError": "tasks.params.base",
    "Strict": "tasks.params.base",
    "resolve_family": "tasks.params.model",
    "data_modality": "tasks.params.model",
    "VitConfig": "tasks.params.model",
    "ModelConfig": "tasks.params.model",
    "FinetuneConfig": "tasks.params.model",
    "RuntimeConfig": "tasks.params.model",
    "ScoringConfig": "tasks.params.members",
    "MemberFinetuneConfig": "tasks.params.members",
    "MembersConfig": "tasks.params.members",
    "MergeConfig": "tasks.params.members",
    "CompileConfig": "tasks.params.evaluation",
    "CalibrateConfig": "tasks.params.evaluation",
    "EvaluateConfig": "tasks.params.evaluation",
    "REPLICATE_STRIDE": "tasks.params.core",
    "PROFILE_NAMES": "tasks.params.core",
    "ProfileName": "tasks.params.core",
    "Unread": "tasks.params.core",
    "CoreConfig": "tasks.params.core",
    "McDropoutConfig": "tasks.params.baselines",
    "BaselinesConfig": "tasks.params.baselines",
    "LoraEnsembleConfig": "tasks.params.baselines",
    "BatchEnsembleConfig": "tasks.params.baselines",
    "BaselinesStageConfig": "tasks.params.baselines",
    "CLASSIFICATION_METRICS": "tasks.params.metrics",
    "OOD_METRICS": "tasks.params.metrics",
    "MODEL_METRICS": "tasks.params.metrics",
    "COMPILE_CHECKS": "tasks.params.metrics",
    "METRICS": "tasks.params.metrics",
    "GREATER_IS_BETTER": "tasks.params.metrics",
    "SPLITS": "tasks.params.gates",
    "BASELINES": "tasks.params.gates",
    "COMPILE_TOLERANCE": "tasks.params.gates",
    "GateCheck": "tasks.params.gates",
    "TWIN_GROUP": "tasks.params.gates",
    "default_gates": "tasks.params.gates",
    "PromoteConfig": "tasks.params.promote",
    "CANDIDATES": "tasks.params.gates",
    "PipelineConfig": "tasks.params.schema",
    "validate_params": "tasks.params.schema",
    "load_params": "tasks.params.schema",
    "PROFILES": "tasks.params.profiles",
    "Params": "tasks.params.files",
    "did_you_mean": "tasks.params.files",
    "validate_as": "tasks.params.files",
    "read_yaml": "tasks.params.files",
    "load_as": "tasks.params.files",
    "to_raw": "tasks.params.files",
    "write_params": "tasks.params.files",
    "deep_merge": "tasks.params.overrides",
    "LIST_DEFAULTS": "tasks.params.overrides",
    "set_dotted": "tasks.params.overrides",
    "resolve_params": "tasks.params.overrides",
    "apply_sets": "tasks.params.overrides",
    "parse_sets": "tasks.params.overrides",
    "read_gates": "tasks.params.overrides",
    "REGISTRY_KEYS": "tasks.params.names",
    "allowed_names": "tasks.params.names",
    "check_names": "tasks.params.names",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'tasks.params' has no attribute {name!r}")
