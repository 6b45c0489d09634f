"""The one reader of the project's DVC files: ``dvc.yaml`` (what each stage declares) and
``dvc.lock`` (what each stage last recorded), and the project's DVC remote folder.

Everything in :mod:`tasks` and :mod:`flows` that needs a stage's outputs or a locked md5 reads
them here; only :mod:`tasks.runtime.stage_deps` writes ``dvc.yaml`` (its generated code deps).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: The project's own DVC remote, beside ``.dvc/`` (``flows.dvcops.ensure_project`` adds it as
#: remote ``local``; the registry looks for bundles there too).
REMOTE_DIR = ".dvc-remote"


def _stages(path: Path, what: str) -> dict[str, Any]:
    """The ``stages`` mapping of a DVC YAML file (``{}`` when there is none; ValueError, one line
    naming the file, when it is unreadable)."""
    import yaml

    if not path.is_file():
        return {}
    try:
        # libyaml's parser when PyYAML has it: a lock of a whole run parses ~7x faster
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        stages = (yaml.load(path.read_text(), Loader=loader) or {}).get("stages") or {}
    except yaml.YAMLError as err:
        raise ValueError(f"{what} is unreadable: {str(err).splitlines()[0]}") from None
    if not isinstance(stages, dict):
        raise ValueError(f"{what} is unreadable: its stages are not a mapping")
    return stages


def read_dvc_yaml(root: Path) -> dict[str, Any]:
    """``dvc.yaml``'s ``stages`` (``{}`` when there is none; ValueError when unreadable)."""
    return _stages(Path(root) / "dvc.yaml", "dvc.yaml")


def read_lock(root: Path) -> dict[str, Any]:
    """``dvc.lock``'s ``stages`` (``{}`` when there is none; ValueError when unreadable)."""
    return _stages(Path(root) / "dvc.lock", "dvc.lock")


def declared_outputs(root: Path) -> dict[str, dict[str, dict[str, Any]]]:
    """``{stage: {path: options}}`` of every ``outs``/``metrics``/``plots`` entry in
    ``root/dvc.yaml`` (empty when there is none)."""
    declared: dict[str, dict[str, dict[str, Any]]] = {}
    for name, stage in read_dvc_yaml(root).items():
        declared[name] = {}
        for key in ("outs", "metrics", "plots"):
            for entry in stage.get(key) or []:
                items = {entry: {}} if isinstance(entry, str) else entry
                declared[name].update({path: opts or {} for path, opts in items.items()})
    return declared


def stage_outputs(stage: str, root: Path) -> list[Path]:
    """Every path ``stage`` declares in ``root/dvc.yaml`` (``outs``, ``metrics``, ``plots``);
    empty when there is no ``dvc.yaml``. ValueError naming the declared stages if unknown."""
    declared = declared_outputs(root)
    if declared and stage not in declared:
        raise ValueError(
            f"stage {stage!r} is not in {Path(root) / 'dvc.yaml'}; declared: {', '.join(declared)}"
        )
    return [Path(root) / path for path in declared.get(stage, {})]


def cached_outputs(root: Path) -> dict[str, str]:
    """``{path: stage}`` of the outputs DVC caches (declared without ``cache: false``): what must
    hash the same for the same params and code. Uncached metrics may hold run facts (timings)."""
    return {
        path: stage
        for stage, outs in declared_outputs(root).items()
        for path, opts in outs.items()
        if opts.get("cache", True)
    }


def locked_outs(root: Path, stage: str | None = None) -> dict[str, str | None]:
    """``{path: md5}`` of the outputs ``dvc.lock`` records, of ``stage`` or of every stage
    (``{}`` when there is no lock)."""
    stages = read_lock(root)
    chosen = [stages.get(stage) or {}] if stage is not None else list(stages.values())
    return {
        out["path"]: out.get("md5") for entry in chosen for out in (entry or {}).get("outs") or []
    }
