"""Profiles, params files and ``--set KEY=VALUE`` over the defaults: what ``hydra-ens run`` and a
study resolve ``params.yaml`` from (no stage imports this)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hydra_ops.data.spec import DataSpec
from tasks.params.base import ConfigError
from tasks.params.files import to_raw
from tasks.params.gates import GateCheck, default_gates
from tasks.params.profiles import PROFILES
from tasks.params.schema import PipelineConfig, validate_params


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Recursive dict merge; lists and scalars in ``override`` replace those in ``base``."""
    out = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


#: Lists a dotted key may index into before the raw mapping holds them (their defaults).
LIST_DEFAULTS: dict[str, Any] = {"gates": default_gates}

#: Fields of a gate derived from the others when not given (``GateCheck._check``).
_DERIVED_GATE_FIELDS = ("name", "greater_is_better")


def _list_index(items: list[Any], key: str, dotted: str, where: str) -> int:
    """``key`` as an index into ``items``; ConfigError naming ``dotted`` when it is not one."""
    allowed = f"0..{len(items) - 1}" if items else "none, it is empty"
    if not key.isdigit():
        raise ConfigError(
            f"params: {dotted}: {where} is a list, {key!r} is not an index (allowed: {allowed})"
        )
    index = int(key)
    if index >= len(items):
        raise ConfigError(
            f"params: {dotted}: index {index} is past the end of {where} "
            f"({len(items)} entries, allowed: {allowed})"
        )
    return index


def _drop_derived_gate_fields(gate: dict[str, Any]) -> None:
    """Forget the name/direction a gate holds at their derived values, so that editing the gate's
    metric or baseline derives them anew instead of keeping the old metric's."""
    try:
        auto = GateCheck(**{k: v for k, v in gate.items() if k not in _DERIVED_GATE_FIELDS})
    except (ValidationError, TypeError):
        return
    for key in _DERIVED_GATE_FIELDS:
        if key in gate and gate[key] == getattr(auto, key):
            del gate[key]


def set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    """``set_dotted(d, "a.b", 1)`` sets ``d["a"]["b"] = 1``, creating dicts on the way.

    An integer key indexes an existing list: ``gates.0.metric`` edits the first gate (the
    default gates when ``raw`` has none); an index past the end is a ConfigError. Editing a
    gate's field re-derives its ``name`` and ``greater_is_better`` unless they were set by hand.
    """
    keys = dotted.split(".")
    node: Any = raw
    where: list[str] = []
    for key in keys[:-1]:
        if isinstance(node, list):
            node = node[_list_index(node, key, dotted, ".".join(where))]
        else:
            if key not in node and not where and key in LIST_DEFAULTS:
                node[key] = copy.deepcopy(LIST_DEFAULTS[key]())
            node = node.setdefault(key, {})
        where.append(key)
        if not isinstance(node, dict | list):
            raise ConfigError(f"params: {dotted}: {'.'.join(where)!r} is not a section")
    last = keys[-1]
    if isinstance(node, list):
        node[_list_index(node, last, dotted, ".".join(where))] = value
        return
    if where and where[0] == "gates" and len(where) == 2 and last not in _DERIVED_GATE_FIELDS:
        _drop_derived_gate_fields(node)
    node[last] = value


def resolve_params(
    profile: str = "default",
    overrides: Mapping[str, Any] | None = None,
    sets: Mapping[str, Any] | None = None,
    root: Path | None = None,
) -> PipelineConfig:
    """Defaults, then the data source's defaults, then ``PROFILES[profile]``, then ``overrides``
    (a params file), then ``sets``; validated with relative paths checked in the project folder
    ``root`` (:func:`validate_params`).

    The source defaults (:data:`tasks.params.source_defaults.SOURCE_DEFAULTS`, e.g. the ViT shape
    and epochs of ``mnist5k``) are those of the ``data.name`` the later layers resolve to; every
    later layer wins over them, so ``--profile quick`` still shrinks an image run.
    """
    from tasks.params.source_defaults import source_defaults

    if profile not in PROFILES:
        raise ConfigError(f"profile: unknown profile {profile!r}; allowed: {', '.join(PROFILES)}")
    raw = deep_merge({"profile": profile}, PROFILES[profile])
    if overrides:
        raw = deep_merge(raw, overrides)
    for dotted, value in (sets or {}).items():
        set_dotted(raw, dotted, value)
    raw = deep_merge(source_defaults(raw), raw)
    return validate_params(raw, source="params", root=root)


def apply_sets(
    current: Mapping[str, Any], sets: Mapping[str, Any], root: Path | None = None
) -> PipelineConfig:
    """``--set`` values applied to a resolved params mapping (what ``hydra-ens run --set`` does),
    of the project in ``root`` (:func:`validate_params`).

    The values the mapping holds at its own resolved defaults follow the new resolution, so
    changing ``data.name`` swaps the source defaults (``mnist5k`` brings its ViT shape and
    epochs, a text source drops them); every value the user changed by hand is kept.
    """
    from tasks.params.source_defaults import source_defaults

    current_raw = to_raw(validate_params(current, source="params.yaml", root=root))
    profile, data = current_raw["profile"], current_raw["data"]
    # the file's own resolution: its profile and data section over the defaults
    reference = to_raw(resolve_params(profile, {"data": data}, root=root))
    # its data values at the source's defaults (e.g. fashion-mnist's max_per_split) follow too
    data_reference = deep_merge(
        deep_merge(DataSpec().to_dict(), source_defaults({"data": data}).get("data", {})),
        PROFILES[profile].get("data", {}),
    )
    changed = _changed(current_raw, reference) | {
        "data": _changed(data, data_reference) | {"name": data["name"]}
    }
    return resolve_params(profile, changed, sets, root=root)


def _changed(values: Mapping[str, Any], reference: Mapping[str, Any]) -> dict[str, Any]:
    """The leaves of ``values`` that differ from ``reference`` (lists compared whole)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        ref = reference.get(key)
        if isinstance(value, Mapping) and isinstance(ref, Mapping):
            inner = _changed(value, ref)
            if inner:
                out[key] = inner
        elif key not in reference or value != ref:
            out[key] = copy.deepcopy(value)
    return out


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` items as ``{dotted key: YAML value}``; ConfigError (one line naming
    the item) when one is not ``KEY=VALUE`` or its value is not YAML."""
    import yaml

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE (e.g. members.num_members=3)")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as err:
            context, problem = getattr(err, "context", None), getattr(err, "problem", None)
            why = ": ".join(filter(None, (context, problem))) or str(err).splitlines()[0]
            raise ConfigError(f"--set {item!r}: value is not valid YAML ({why})") from None
    return out


def read_gates(path: Path) -> list[dict[str, Any]]:
    """The ``gates`` list of a YAML file (a params.yaml), every check validated (``hydra-ens study
    --gates-from``); ConfigError, one line naming the file and the first bad check, otherwise."""
    import yaml

    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(
            f"--gates-from {path}: cannot read it ({str(err).splitlines()[0]})"
        ) from None
    gates = raw.get("gates") if isinstance(raw, dict) else None
    if not isinstance(gates, list) or not gates:
        raise ConfigError(f"--gates-from {path}: no `gates:` list in it")
    for i, g in enumerate(gates):
        try:
            GateCheck.model_validate(g)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            raise ConfigError(f"--gates-from {path}: gates[{i}].{where}: {first['msg']}") from None
    return gates
