"""Gate kinds: how one check of ``params.yaml``'s ``gates:`` is judged, one module per kind.

A check's kind is ``GateCheck.kind``, or when it is left out ``threshold`` (an absolute bound the
user opts into) or ``baseline`` (a comparison with a model the run built, or ``prod``). Each kind
is a :class:`~tasks.gate_kinds.base.GateKind` subclass in its own module, registered once below;
:func:`tasks.gate_kinds.judge.evaluate_check` judges any check through the registry. This module
imports no kind (the params schema checks ``kind`` names against it). Adding a kind:
CONTRIBUTING.md, "Adding a gate".
"""

from __future__ import annotations

from typing import Any

from hydra_ops.registry import Registry

#: Every gate kind, by the name ``GateCheck.kind`` gives (lazy: imported when first judged); an
#: entry is a :class:`~tasks.gate_kinds.base.GateKind` subclass.
GATE_KINDS: Registry[Any] = Registry("gate kind", package=__name__)
GATE_KINDS.register_lazy("threshold", ".threshold:ThresholdGate")
GATE_KINDS.register_lazy("baseline", ".baseline:BaselineGate")
