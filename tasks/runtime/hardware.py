"""The hardware record: every choice ``auto`` makes from timing, made once per machine kind.

A project keeps one record per machine kind in ``hardware/<kind id>.json``
(:func:`hydra_ops.measurements.machine_kind`, :func:`~hydra_ops.measurements.kind_id`), tracked by
git next to ``dvc.lock``. It holds the machine kind, the decision rule
(:mod:`hydra_ops.margin`), the raw timings of every probe (``entries``: the training and
inference precision probes per model shape, compile's candidates) and ``choices``: what each
stage resolved its ``auto`` settings to on this kind. A stage that finds its measurement there
reuses it; only a workload never measured on this kind is measured (once; the decision rule keeps
timings within noise at the conservative default).

The stages read their choices as a DVC dependency: ``hardware/choices.yaml`` (:data:`CHOICES`)
holds, per stage of :data:`STAGES`, what that stage resolved (``params:`` of the stage in
``dvc.yaml``, so DVC records it in ``dvc.lock``). :func:`sync_choices`, called by the flow before
``dvc repro``, writes it from this kind's record (:data:`UNMEASURED` for a stage with no choice
yet); the stage writes its own entry as it resolves it (:func:`note_choice`). So a rerun, a
fresh clone or a study point on one machine kind finds the same choices and reruns nothing;
another kind writes other values, and the stages whose choices differ rerun.

``hydra-ens run --remeasure`` (:func:`forget`) drops this kind's measurements and choices: the
stages that make a choice rerun and measure again, and the run ends with one line per changed
choice (:func:`changed_choices`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hydra_ops.atomic import atomic_write_bytes
from hydra_ops.margin import DEFAULT_MARGIN, describe_rule
from hydra_ops.measurements import MeasurementCache, kind_id, machine_kind

log = logging.getLogger("hydra_ens")

#: The folder of the records (relative to the project root).
RECORD_DIR = Path("hardware")
#: What the stages depend on: this machine kind's choices, one key per stage.
CHOICES = RECORD_DIR / "choices.yaml"
#: The stages that resolve an ``auto`` setting by measuring (their key in :data:`CHOICES`).
STAGES = (
    "finetune_base",
    "finetune_baselines",
    "finetune_members",
    "baseline_logits",
    "calibrate",
    "compile",
    "evaluate",
)
#: A stage's value in :data:`CHOICES` before it resolved anything on this kind.
UNMEASURED = "unmeasured"
_HEADER = (
    "# Generated: the hardware choices each stage runs with on this machine kind (its record:\n"
    "# hardware/<kind>.json). Stages read their entry as a DVC params dependency. Do not edit;\n"
    "# `hydra-ens run --remeasure` measures them again.\n"
)


def record_path(root: Path, kind: Mapping[str, Any] | None = None) -> Path:
    """``hardware/<kind id>.json`` of ``kind`` (default: this machine's)."""
    return root / RECORD_DIR / f"{kind_id(kind or machine_kind())}.json"


def record(root: Path) -> MeasurementCache:
    """This machine kind's record (the measurement cache the probes read and fill)."""
    kind = machine_kind()
    header = {
        "kind_id": kind_id(kind),
        "machine": kind,
        "rule": {"margin": DEFAULT_MARGIN, "text": describe_rule(DEFAULT_MARGIN)},
    }
    return MeasurementCache(record_path(root, kind), header=header)


def _read_choices(root: Path) -> dict[str, Any]:
    path = root / CHOICES
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_choices(root: Path, choices: Mapping[str, Any]) -> None:
    text = _HEADER + yaml.safe_dump(dict(choices), sort_keys=True, default_flow_style=False)
    path = root / CHOICES
    if path.is_file() and path.read_text() == text:
        return  # unchanged: keep its mtime (dvc status)
    atomic_write_bytes(path, text.encode(), keep_suffix=False)


def note_choice(root: Path, stage: str, label: str, value: Any) -> None:
    """Record that ``stage`` resolved ``label`` to ``value`` (JSON-able) on this machine kind: in
    the record's ``choices`` and in :data:`CHOICES` (the stage's DVC dependency)."""
    if stage not in STAGES:
        raise ValueError(f"note_choice: {stage!r} is not one of {', '.join(STAGES)}")

    def change(data: dict[str, Any]) -> None:
        mine = data.setdefault("choices", {}).setdefault(stage, {})
        mine[label] = value
        current = _read_choices(root)
        current.setdefault("kind", kind_id(machine_kind()))
        entry = current.get(stage)
        current[stage] = {**(entry if isinstance(entry, dict) else {}), label: value}
        _write_choices(root, current)

    record(root).update(change)


def sync_choices(root: Path) -> dict[str, Any]:
    """Write :data:`CHOICES` from this machine kind's record (creating the record, with its
    machine and rule, when missing); returns the choices. Run before ``dvc repro``."""
    rec = record(root)
    out: dict[str, Any] = {}

    def change(data: dict[str, Any]) -> None:
        known = data.setdefault("choices", {})
        out.update(
            {"kind": rec.header["kind_id"]} | {s: known.get(s) or UNMEASURED for s in STAGES}
        )
        _write_choices(root, out)

    rec.update(change)
    return out


def forget(root: Path) -> dict[str, Any]:
    """Drop this machine kind's measurements and choices (``--remeasure``); returns the choices
    it held, for :func:`changed_choices` after the run."""
    old: dict[str, Any] = {}

    def change(data: dict[str, Any]) -> None:
        old.update(data.get("choices") or {})
        data["entries"] = {}
        data["choices"] = {}

    record(root).update(change)
    return old


def current_choices(root: Path) -> dict[str, Any]:
    """This machine kind's recorded choices (``{stage: {label: value}}``)."""
    return dict(record(root).read().get("choices") or {})


def changed_choices(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """One line per choice that differs between two ``{stage: {label: value}}`` maps."""
    lines = []
    for stage in sorted(set(before) | set(after)):
        old, new = before.get(stage) or {}, after.get(stage) or {}
        for label in sorted(set(old) | set(new)):
            if old.get(label) != new.get(label):
                was = show(old.get(label, UNMEASURED))
                lines.append(f"{stage} {label}: {was} -> {show(new.get(label, UNMEASURED))}")
    return lines


def show(value: Any) -> str:
    """A choice's value in words (``backend export, precision fp32`` for a mapping)."""
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {v}" for k, v in sorted(value.items()))
    return str(value)
