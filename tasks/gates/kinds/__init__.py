"""Gate kinds: how one check of ``params.yaml``'s ``gates:`` is judged, one module per kind.

A check's kind is ``GateCheck.kind``, or when it is left out ``threshold`` (an absolute bound the
user opts into) or ``baseline`` (a comparison with a model the run built, or ``prod``). Each kind
is a :class:`~tasks.gates.kinds.base.GateKind` subclass in its own module, registered once below;
:func:`tasks.gates.kinds.judge.evaluate_check` judges any check through the registry. This module
imports no kind. The params schema types ``kind`` as a plain string (as it does the library's
registry names, :mod:`tasks.params.names`): :func:`check_kinds` holds each check to its kind
before anything is written (``hydra-ens run``, ``stage``, ``study``) and again in the ``gate``
stage. Adding a kind: CONTRIBUTING.md, "Adding a gate".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hydra_ops.registry import Registry
from tasks.params.base import ConfigError

if TYPE_CHECKING:
    from tasks.params.schema import PipelineConfig

#: Every gate kind, by the name ``GateCheck.kind`` gives (lazy: imported when first judged); an
#: entry is a :class:`~tasks.gates.kinds.base.GateKind` subclass.
GATE_KINDS: Registry[Any] = Registry("gate kind", package=__name__)
GATE_KINDS.register_lazy("threshold", ".threshold:ThresholdGate")
GATE_KINDS.register_lazy("baseline", ".baseline:BaselineGate")

#: The kinds whose fields ``GateCheck`` itself checks (one of ``threshold`` or ``baseline``).
BUILTIN = (None, "threshold", "baseline")


def check_kinds(cfg: PipelineConfig) -> None:
    """ConfigError (one line, each problem as ``gates.<i>: ...``) when a check names a kind that
    is not registered or gives fields its kind refuses (:meth:`GateKind.validate`)."""
    problems = []
    for i, gate in enumerate(cfg.gates):
        if gate.kind in BUILTIN:
            continue
        if gate.kind not in GATE_KINDS:
            problems.append(f"gates.{i}: {GATE_KINDS.unknown(gate.kind, 'kind')}")
        elif problem := GATE_KINDS.get(gate.kind).validate(gate):
            problems.append(f"gates.{i}: {problem}")
    if problems:
        raise ConfigError(f"params: {'; '.join(problems)}")
