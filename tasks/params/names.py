"""The built-in names ``params.yaml`` may hold, read from the library's registries.

The schema types these keys as plain strings: the names live in :mod:`hydra_ops` (a scorer in
``SCORERS``, a backend in ``BACKEND_REGISTRY``, an attention implementation in
``ATTENTION_IMPLEMENTATIONS``, ...), and repeating them as ``Literal`` s went stale whenever the
library gained one. The registries import torch, so this check is no part of the schema every
stage imports (gate, bundle and promote import no torch, and a stage's code deps would hold every
registry): the CLI runs it before anything is written
(:func:`tasks.runtime.preflight.check_runs_here`), and a stage that resolves a name refuses an
unknown one through the registry itself.

A value at its schema default is not looked up (``tests/pipeline/test_params_names.py`` holds
every default to its registry), so a run on the defaults imports no registry.
"""

from __future__ import annotations

from collections.abc import Callable

from tasks.params.base import ConfigError
from tasks.params.schema import PipelineConfig


def _families() -> tuple[str, ...]:
    from hydra_ops.adapters import FAMILIES

    return ("auto", *(name for name, family in FAMILIES.items() if family.builder))


def _scorers() -> tuple[str, ...]:
    from hydra_ops.scoring import SCORERS

    return tuple(SCORERS)


def _objectives() -> tuple[str, ...]:
    from hydra_ops.scoring import OBJECTIVES

    return tuple(OBJECTIVES)


def _strategies() -> tuple[str, ...]:
    from hydra_ops.heads.selection import STRATEGIES

    return tuple(STRATEGIES)


def _member_data() -> tuple[str, ...]:
    from hydra_ops.data.members import MEMBER_DATA_MODES

    return tuple(MEMBER_DATA_MODES)


def _merge_modes() -> tuple[str, ...]:
    from hydra_ops.hydra.merge import MERGE_MODES

    return tuple(MERGE_MODES)


def _attention() -> tuple[str, ...]:
    from hydra_ops.hydra.grouped import ATTENTION_IMPLEMENTATIONS

    return tuple(ATTENTION_IMPLEMENTATIONS)


def _ood_scores() -> tuple[str, ...]:
    from hydra_ops.uq.ood_criteria import OOD_CRITERIA

    return tuple(OOD_CRITERIA)


def _backends() -> tuple[str, ...]:
    from hydra_ops.compile.backends import BACKEND_REGISTRY

    # auto: measure them (hydra_ops.compile.auto); eager: compile nothing
    return ("auto", "eager", *BACKEND_REGISTRY)


#: ``dotted key -> (what a name there is, the registry's names)``.
REGISTRY_KEYS: dict[str, tuple[str, Callable[[], tuple[str, ...]]]] = {
    "model.family": ("model family", _families),
    "scoring.method": ("scorer", _scorers),
    "scoring.objective": ("circuit objective", _objectives),
    "members.strategy": ("selection strategy", _strategies),
    "members.finetune.data": ("member data mode", _member_data),
    "merge.mode": ("merge mode", _merge_modes),
    "merge.attention": ("attention implementation", _attention),
    "compile.backend": ("compile backend", _backends),
    "evaluate.ood_score": ("OOD score", _ood_scores),
}


def allowed_names(key: str) -> tuple[str, ...]:
    """The names the registry behind ``key`` (a key of :data:`REGISTRY_KEYS`) holds."""
    return REGISTRY_KEYS[key][1]()


def _value(cfg: PipelineConfig, key: str) -> tuple[object, object]:
    """``(value, schema default)`` of the dotted ``key`` in ``cfg``."""
    *sections, leaf = key.split(".")
    node: object = cfg
    for part in sections:
        node = getattr(node, part)
    return getattr(node, leaf), type(node).model_fields[leaf].default  # type: ignore[attr-defined]


def check_names(cfg: PipelineConfig, source: str = "params") -> None:
    """ConfigError, one line per key, for a name no registry holds (``source: key: unknown
    scorer 'x'; allowed: ...``). A value at its schema default (or None, where that means the
    derived default) is not looked up."""
    problems = []
    for key, (what, names) in REGISTRY_KEYS.items():
        value, default = _value(cfg, key)
        if value is None or value == default:
            continue
        allowed = names()
        if value not in allowed:
            problems.append(
                f"{source}: {key}: unknown {what} {value!r}; allowed: {', '.join(allowed)}"
            )
    if problems:
        raise ConfigError("\n".join(problems))
