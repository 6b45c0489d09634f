"""Reading, validating and writing ``params.yaml``: every problem one line naming its key.

Validation takes the schema (the params view) to validate with: the whole file
(:class:`tasks.params.schema.PipelineConfig`, :func:`tasks.params.schema.validate_params`) or a
stage's view (:class:`tasks.params.core.CoreConfig`, ...), so that this module imports no section.
"""

from __future__ import annotations

import os
import re
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from hydra_ops.atomic import atomic_write_bytes
from tasks.params.base import ConfigError

Params = TypeVar("Params", bound=BaseModel)


def _section_model(annotation: Any) -> Any:
    """The pydantic model an annotation holds (``X``, ``X | None``, ``list[X]``), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if (found := _section_model(arg)) is not None:
            return found
    return None


def _known_keys(model: Any, prefix: str = "") -> list[str]:
    """Every dotted key of ``model``'s sections (lists such as ``gates`` not entered)."""
    keys = []
    for name, field in model.model_fields.items():
        section = _section_model(field.annotation)
        inner = typing.get_origin(field.annotation) is not list
        keys += _known_keys(section, f"{prefix}{name}.") if section and inner else []
        keys.append(f"{prefix}{name}")
    return keys


def _leaves(value: Any, prefix: str) -> list[str]:
    if isinstance(value, Mapping) and value:
        return [leaf for k, v in value.items() for leaf in _leaves(v, f"{prefix}.{k}")]
    return [prefix]


def did_you_mean(schema: type[BaseModel], loc: Sequence[Any], given: Any = None) -> str:
    """`` (did you mean 'epochs'?)`` for the unknown key at ``loc`` (a validation error's path in
    ``schema``) holding ``given``: a key of its own section spelt closely enough
    (:func:`difflib.get_close_matches`), else the keys anywhere whose last part is close to the
    last part of what was given (``train.epoch`` -> ``finetune.epochs``), else ``""``."""
    import difflib

    model: Any = schema
    for part in loc[:-1]:
        if isinstance(part, int):  # an index into a list: the model is already its item's
            continue
        field = model.model_fields.get(part)
        model = _section_model(field.annotation) if field is not None else None
        if model is None:
            return ""
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1)
    if not close and not any(isinstance(p, int) for p in loc):
        known = _known_keys(schema)
        by_leaf: dict[str, list[str]] = {}
        for key in known:
            by_leaf.setdefault(key.rsplit(".", 1)[-1], []).append(key)
        for leaf in _leaves(given, ".".join(str(p) for p in loc)):
            for name in difflib.get_close_matches(leaf.rsplit(".", 1)[-1], list(by_leaf), n=1):
                close += difflib.get_close_matches(leaf, by_leaf[name], n=3, cutoff=0)
    if not close:
        return ""
    return f" (did you mean {' or '.join(repr(c) for c in dict.fromkeys(close))}?)"


def _format_errors(schema: type[BaseModel], err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key" + did_you_mean(schema, e["loc"], e.get("input"))
        elif (
            e["type"] != "value_error" and "input" in e and not isinstance(e["input"], dict | list)
        ):
            msg = f"{msg} (got {e['input']!r})"
        if "@" in msg and ": " in msg:  # cross-checks name their own keys
            for part in msg.split("; "):
                key, _, text = part.partition(": ")
                lines.append(f"{source}: {key.lstrip('@')}: {text}")
            continue
        named = re.search(r"needs '(\w+)'", msg)  # "data source 'csv' needs 'path'" -> data.path
        if named and e["type"] == "value_error":
            loc = f"{loc}.{named.group(1)}" if loc else named.group(1)
        lines.append(f"{source}: {loc or '<root>'}: {msg}")
    return "\n".join(lines)


def validate_as(
    schema: type[Params],
    raw: Mapping[str, Any] | None,
    source: str = "params.yaml",
    root: Path | None = None,
) -> Params:
    """Validate a raw params mapping with ``schema``; raise :class:`ConfigError` with one line per
    problem. ``root``: the project folder its relative paths are checked in (None: the current
    folder; :meth:`tasks.params.core.CoreConfig.project_path`)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: <root>: must be a mapping, got {type(raw).__name__}")
    try:
        return schema.model_validate(dict(raw), context={"root": root})
    except ValidationError as err:
        raise ConfigError(_format_errors(schema, err, source)) from None


def read_yaml(path: str | os.PathLike[str]) -> Any:
    """The YAML document in ``path``; ConfigError (one line naming the file) when it is missing,
    not UTF-8 or not valid YAML."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); "
            "save it as UTF-8"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {str(err).splitlines()[0]}") from None


def load_as(schema: type[Params], path: str | os.PathLike[str] = "params.yaml") -> Params:
    """Read a params file and validate it with ``schema``; its relative paths are relative to its
    folder (the project's)."""
    return validate_as(schema, read_yaml(path), source=Path(path).name, root=Path(path).parent)


def to_raw(cfg: BaseModel) -> dict[str, Any]:
    """Fully resolved plain-dict form (what ``params.yaml`` holds)."""
    return cfg.model_dump(mode="json")


def write_params(cfg: BaseModel, path: str | os.PathLike[str] = "params.yaml") -> Path:
    """Write the resolved config atomically, in a stable key order."""
    path = Path(path)
    text = (
        "# Resolved pipeline parameters (validated by tasks.params). Regenerate with\n"
        "# `hydra-ens run --profile NAME [--params FILE] [--set key=value]` or edit by hand.\n"
        + yaml.safe_dump(to_raw(cfg), sort_keys=False, default_flow_style=None, width=100)
    )
    atomic_write_bytes(path, text.encode(), keep_suffix=False)
    return path
