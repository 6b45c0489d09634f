"""A study: named variants x seeds, each (variant, seed) point a full pipeline run.

``SPEC.yaml``::

    name: text-default            # names the experiments and the report folder
    profile: default              # a profile of tasks.params (default | study | quick)
    params: base.yaml             # optional: a params file merged over the profile
    sets: {evaluate.bootstrap_samples: 1000}   # optional: overrides every point shares
    variants:                     # name -> dotted overrides (what --set takes)
      circuit-s0: {scoring.method: circuit, merge.shared_layers: 0}
      taylor-half: {scoring.method: taylor, merge.shared_layers: null}
    seeds: [0, 1, 2]              # the replicate seed (params ``seed``) of each point
    confirm_seeds: [3, 4]         # optional: held-out seeds, never used for choosing

A point's params are the profile, then ``params``, then ``sets``, then its variant's overrides,
then ``seed``; every point is validated when the spec is loaded, so a bad override fails before
anything runs, in one line naming the variant.

The replicate seed also draws the point's data split: ``data.seed`` follows ``seed`` (train /
val / test membership, the shift corruption, the far-OOD sample), so the across-seed intervals
cover split and training noise together. A spec that pins ``data.seed`` (in ``params``, ``sets``
or a variant's overrides) keeps that one split under every seed; the report then says that its
intervals are conditional on one split.

``confirm_seeds`` are run like ``seeds`` (every variant), but the report chooses its variant on
``seeds`` alone and reports the chosen variant and the gates on the confirmation seeds apart.
A spec with ``confirm_seeds`` and no ``seeds`` registers its variants in advance: there is no
choosing step, and the report gives every variant's claims on the confirmation seeds.

Points that agree on every param of the *shared* stages (data, base fine-tune, Deep Ensemble)
share one upstream: :func:`upstream_key` names it.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from tasks.params import (
    ConfigError,
    PipelineConfig,
    ProfileName,
    Strict,
    read_yaml,
    resolve_params,
    to_raw,
)
from tasks.runtime.resumable import fingerprint

#: The stages every point of one seed computes identically; a study runs them once per
#: :func:`upstream_key` and the points reuse their outputs through the DVC remote.
SHARED_STAGES = ("prepare_data", "finetune_base", "finetune_baselines", "baseline_logits")
#: What a point runs: the DAG up to the verdict (points are evidence, not releases: no bundle or
#: promotion).
POINT_TARGET = "gate"
_NAME = r"^[a-z0-9][a-z0-9_-]{0,40}$"


class StudySpec(Strict):
    name: str = Field(pattern=_NAME)
    profile: ProfileName = "default"
    params: str | None = None
    """A params file (relative to the spec) merged over the profile."""
    sets: dict[str, Any] = Field(default_factory=dict)
    variants: dict[str, dict[str, Any]] = Field(min_length=1)
    seeds: list[int] = Field(default_factory=list)
    """The choosing seeds; empty in a study of registered variants (confirmation seeds only)."""
    confirm_seeds: list[int] = Field(default_factory=list)
    """Held-out replicate seeds: run, reported apart, never used to choose the variant."""

    @field_validator("variants")
    @classmethod
    def _variant_names(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name, overrides in value.items():
            if not re.match(_NAME, name):
                raise ValueError(f"{name!r} must match {_NAME} (it names a git ref)")
            if not isinstance(overrides, dict):
                raise ValueError(f"{name}: overrides must be a mapping of dotted keys")
            if "seed" in overrides:
                raise ValueError(f"{name}: 'seed' is the study's seeds list, not a variant key")
        return value

    @field_validator("seeds", "confirm_seeds")
    @classmethod
    def _distinct_seeds(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value) or (value and min(value) < 0):
            raise ValueError("seeds must be distinct integers >= 0")
        return value

    @model_validator(mode="after")
    def _held_out(self) -> StudySpec:
        if not self.seeds and not self.confirm_seeds:
            raise ValueError("name seeds, confirm_seeds or both: a study needs a seed")
        both = sorted(set(self.seeds) & set(self.confirm_seeds))
        if both:
            raise ValueError(f"confirm_seeds must not repeat seeds: {both} are in both")
        return self

    @property
    def registered(self) -> bool:
        """Whether the variants were fixed before any point ran: confirmation seeds only."""
        return not self.seeds

    @property
    def all_seeds(self) -> list[int]:
        """The choosing seeds, then the confirmation seeds."""
        return [*self.seeds, *self.confirm_seeds]


@dataclass(frozen=True)
class StudyPoint:
    """One (variant, seed) run: ``name`` is its DVC experiment name, ``params`` its resolved
    ``params.yaml`` (a plain dict), ``upstream`` the key of the shared work it reuses."""

    variant: str
    seed: int
    name: str
    params: dict[str, Any]
    upstream: str


def point_name(variant: str, seed: int) -> str:
    return f"{variant}-seed{seed}"


def load_study(path: str | os.PathLike[str]) -> StudySpec:
    """Read and validate ``SPEC.yaml``; :class:`ConfigError` (one line per problem) if bad."""
    path = Path(path)
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: <root>: must be a mapping")
    try:
        spec = StudySpec.model_validate(raw)
    except ValidationError as err:
        lines = [
            f"{path.name}: {'.'.join(str(p) for p in e['loc']) or '<root>'}: "
            f"{e['msg'].removeprefix('Value error, ')}"
            for e in err.errors()
        ]
        raise ConfigError("; ".join(lines)) from None
    if spec.params is not None and not (path.parent / spec.params).is_file():
        raise ConfigError(f"{path.name}: params: {spec.params!r} not found next to the spec")
    return spec


def shared_param_keys(dvc_yaml: Path) -> list[str]:
    """The params (dotted keys of ``params.yaml``) the shared stages depend on, from dvc.yaml."""
    stages = (yaml.safe_load(dvc_yaml.read_text()) or {}).get("stages") or {}
    keys: set[str] = set()
    for stage in SHARED_STAGES:
        if stage not in stages:
            raise ConfigError(f"{dvc_yaml}: no stage {stage!r} (a study needs the whole DAG)")
        for entry in stages[stage].get("params") or []:
            if isinstance(entry, str):
                keys.add(entry)
            elif "params.yaml" in entry:  # an empty list means every param
                keys.update(entry["params.yaml"] or [""])
    return sorted(keys)


def pins_data_seed(overrides: dict[str, Any] | None) -> bool:
    """Whether ``overrides`` (dotted keys, or nested mappings as a params file holds them) set
    ``data.seed``."""
    if not overrides:
        return False
    if "data.seed" in overrides:
        return True
    data = overrides.get("data")
    return isinstance(data, dict) and "seed" in data


def _dotted(raw: dict[str, Any], key: str) -> Any:
    value: Any = raw
    for part in key.split(".") if key else []:
        value = value.get(part) if isinstance(value, dict) else None
    return value


def reusable_stages(lock: dict[str, Any], params: dict[str, Any]) -> list[str]:
    """The stages of a stored ``dvc.lock`` (``{stage: entry}``) whose recorded params equal those
    of ``params``: what an earlier upstream (another commit, another set of shared stages) can
    give this one. Their code and data deps DVC checks itself when they are laid down."""
    same = []
    for stage, entry in lock.items():
        recorded = (entry.get("params") or {}).get("params.yaml") or {}
        canon = lambda v: json.dumps(v, sort_keys=True)  # noqa: E731
        if all(canon(v) == canon(_dotted(params, k)) for k, v in recorded.items()):
            same.append(stage)
    return same


def upstream_key(params: dict[str, Any], keys: list[str]) -> str:
    """Names the shared work of ``params``: equal for points whose shared stages agree."""
    return fingerprint({k: _dotted(params, k) for k in keys})[:16]


def study_points(spec: StudySpec, spec_dir: Path, dvc_yaml: Path) -> list[StudyPoint]:
    """Every point of ``spec`` (its ``seeds``, then its ``confirm_seeds``), validated (relative
    paths in the project of ``dvc_yaml``), in (variant, seed) order. ``data.seed`` follows the
    replicate seed unless the spec pins it (:func:`pins_data_seed`)."""
    base = read_yaml(spec_dir / spec.params) if spec.params else None
    if base is not None and not isinstance(base, dict):
        raise ConfigError(f"{spec.params}: <root>: must be a mapping")
    keys = shared_param_keys(dvc_yaml)
    points = []
    pinned = pins_data_seed(base) or pins_data_seed(spec.sets)
    for variant, overrides in spec.variants.items():
        for seed in spec.all_seeds:
            split = {} if pinned or pins_data_seed(overrides) else {"data.seed": seed}
            sets = {**split, **spec.sets, **overrides, "seed": seed}
            try:
                cfg: PipelineConfig = resolve_params(spec.profile, base, sets, dvc_yaml.parent)
            except ConfigError as err:
                raise ConfigError(f"variant {variant}: {err}") from None
            raw = to_raw(cfg)
            points.append(
                StudyPoint(variant, seed, point_name(variant, seed), raw, upstream_key(raw, keys))
            )
    return points


def select_points(points: list[StudyPoint], only: list[str]) -> list[StudyPoint]:
    """The ``points`` whose names match one of the shell patterns ``only`` (all of them when
    ``only`` is empty), e.g. ``taylor-half-seed[345]``; ConfigError (one line) for a pattern that
    matches no point, so a typo never runs an empty study."""
    unmatched = [pat for pat in only if not any(fnmatch.fnmatchcase(p.name, pat) for p in points)]
    if unmatched:
        names = ", ".join(p.name for p in points[:4])
        raise ConfigError(
            f"--only {unmatched[0]!r} matches no point of the study (its points are named "
            f"<variant>-seed<k>: {names}{', ...' if len(points) > 4 else ''})"
        )
    if not only:
        return points
    return [p for p in points if any(fnmatch.fnmatchcase(p.name, pat) for pat in only)]


def check_study(
    spec: Path, root: Path, gates_from: Path | None, only: list[str] | None = None
) -> list[dict] | None:
    """ConfigError (one line) unless every point of the study ``spec`` resolves and names what the
    library has, and every pattern of ``only`` names a point (:func:`select_points`); the
    ``gates`` of ``gates_from`` (validated), if given."""
    from tasks.gates.kinds import check_kinds
    from tasks.params.overrides import read_gates
    from tasks.params.schema import validate_params
    from tasks.runtime.preflight import check_names

    points = study_points(load_study(spec), spec.resolve().parent, root / "dvc.yaml")
    select_points(points, only or [])
    for point in points:
        cfg = validate_params(point.params, "params", root)
        check_names(cfg)
        check_kinds(cfg)
    return read_gates(gates_from) if gates_from else None
