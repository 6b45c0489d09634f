"""The ``gates`` section: :class:`GateCheck` and the default gates (the metric names:
:mod:`tasks.params.metrics`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_serializer, model_validator

from tasks.params.base import Strict
from tasks.params.metrics import (
    CLASSIFICATION_METRICS,
    GREATER_IS_BETTER,
    METRICS,
    MODEL_METRICS,
    OOD_METRICS,
)

#: Where a gate's metric is read (``model``: model-level metrics).
SPLITS = ("id_test", "shift", "near_ood", "far_ood", "model")
#: The models a gate may compare the Hydra with.
BASELINES = (
    "single",
    "naive_pruned",
    "deep_ensemble",
    "mc_dropout",
    "lora_ensemble",
    "batch_ensemble",
    "control",
    "prod",
)
#: The models a run builds and judges, by the names ``metrics/evaluate.json`` keys them with: the
#: Hydra and every baseline a gate may compare with (``prod`` is not a model of the run).
CANDIDATES = ("hydra", *(b for b in BASELINES if b != "prod"))


#: ``GateCheck.threshold`` value meaning "the compile stage's tolerance for the shipped precision".
COMPILE_TOLERANCE = "compile_tolerance"


class GateCheck(Strict):
    """One check, modelled on MLflow's ``MetricThreshold``.

    The candidate is the Hydra model (every candidate, :mod:`tasks.gates.candidates`). ``kind``: the
    gate kind that judges it (:mod:`tasks.gates.kinds`). ``threshold``: an absolute bound the user
    opts into (candidate >= threshold when greater is better, else <=). ``baseline``: compare
    with a model the run built; the candidate may be worse by at most ``tolerance`` or must be
    better by at least ``min_absolute_change`` (MLflow's meaning). ``use_bootstrap_bound``:
    compare the conservative end of the paired bootstrap interval of (candidate - baseline)
    instead of the point difference.

    ``threshold: compile_tolerance`` (metric ``compile_max_abs_diff`` only, an upper bound): the
    bound is the tolerance the compile stage applied to the artifact that ships, i.e.
    ``compile.tolerance_fp32`` for an fp32 artifact and ``compile.tolerance_low_precision`` for a
    bf16/fp16 one (evaluate records it as ``compile_tolerance``; ``reports/gate.json`` shows the
    number applied), so the gate judges the model at the precision it ships in. A number is
    applied as written, whatever the precision.
    """

    name: str | None = None
    kind: str | None = None
    """The gate kind that judges the check (:data:`tasks.gates.kinds.GATE_KINDS`, which
    :func:`tasks.gates.kinds.check_kinds` holds it to); None: ``threshold`` when a threshold is
    given, else ``baseline``. Left out of the dump while None."""
    metric: str
    split: Literal[SPLITS] = "id_test"  # type: ignore[valid-type]
    threshold: float | Literal["compile_tolerance"] | None = None
    baseline: Literal[BASELINES] | None = None  # type: ignore[valid-type]
    tolerance: float | None = Field(default=None, ge=0)
    min_absolute_change: float | None = None
    greater_is_better: bool | None = None
    calibrated: bool = True
    use_bootstrap_bound: bool = False
    optional: bool = False
    """A ``prod`` comparison while no model holds the stage is ``skipped`` only when optional;
    otherwise it fails with the reason. A baseline the run does not build is refused when the
    whole file is validated (:class:`tasks.params.schema.PipelineConfig`), optional or not."""
    any_of: str | None = None
    """A group name (:mod:`tasks.gates.twin`): each check of the group must pass its own rule (no
    worse than ``tolerance``), and the group fails unless the candidate is better than the
    baseline on at least one of its checks by a paired bootstrap interval that excludes zero.
    Left out of the dump while None."""

    @model_serializer(mode="wrap")
    def _omit_no_group(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        if self.any_of is None:
            out.pop("any_of", None)
        if self.kind is None:
            out.pop("kind", None)
        return out

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, value: str) -> str:
        if value not in METRICS:
            raise ValueError(f"unknown metric {value!r}; allowed: {', '.join(METRICS)}")
        return value

    @field_validator("threshold", mode="before")
    @classmethod
    def _threshold_value(cls, value: Any) -> Any:
        # one error line for a bad string, not one per member of the union
        if isinstance(value, str) and value != COMPILE_TOLERANCE:
            try:
                return float(value)
            except ValueError:
                raise ValueError(
                    f"must be a number or {COMPILE_TOLERANCE!r}, got {value!r}"
                ) from None
        return value

    @model_validator(mode="after")
    def _check(self) -> GateCheck:
        # another kind checks its own fields (tasks.gates.kinds.check_kinds)
        builtin = self.kind in (None, "threshold", "baseline")
        if builtin and (self.threshold is None) == (self.baseline is None):
            raise ValueError("give exactly one of 'threshold' or 'baseline'")
        if self.baseline is None and (
            self.tolerance is not None or self.min_absolute_change is not None
        ):
            raise ValueError("'tolerance'/'min_absolute_change' need a 'baseline'")
        if self.tolerance is not None and self.min_absolute_change is not None:
            raise ValueError("give at most one of 'tolerance' or 'min_absolute_change'")
        if self.use_bootstrap_bound and self.baseline in (None, "prod"):
            raise ValueError("'use_bootstrap_bound' needs a baseline other than 'prod'")
        if self.any_of is not None and self.baseline in (None, "prod"):
            raise ValueError("'any_of' needs a baseline other than 'prod'")
        if self.threshold == COMPILE_TOLERANCE:
            if self.metric != "compile_max_abs_diff":
                raise ValueError(
                    f"threshold {COMPILE_TOLERANCE!r} applies only to metric "
                    f"'compile_max_abs_diff', got {self.metric!r}"
                )
            if self.greater_is_better:
                raise ValueError(
                    f"threshold {COMPILE_TOLERANCE!r} is an upper bound: "
                    "greater_is_better must be false"
                )
        if self.metric in MODEL_METRICS and self.baseline is not None:
            raise ValueError(
                f"model-level metric {self.metric!r} is judged against a 'threshold', not a "
                f"baseline (got baseline {self.baseline!r})"
            )
        if self.metric in MODEL_METRICS and self.split != "model":
            object.__setattr__(self, "split", "model")
        if self.metric in OOD_METRICS and self.split not in ("near_ood", "far_ood"):
            raise ValueError(f"OOD metric {self.metric!r} needs split near_ood or far_ood")
        if self.metric in CLASSIFICATION_METRICS and self.split not in ("id_test", "shift"):
            raise ValueError(f"metric {self.metric!r} needs split id_test or shift")
        if self.greater_is_better is None:
            object.__setattr__(self, "greater_is_better", GREATER_IS_BETTER[self.metric])
        if self.name is None:
            against = self.kind if not builtin else None
            against = (
                against
                or self.baseline
                or (self.threshold if isinstance(self.threshold, str) else f"{self.threshold:g}")
            )
            object.__setattr__(self, "name", f"{self.split}.{self.metric} vs {against}")
        return self


#: The ``any_of`` group of the default gates that holds the Hydra against its naive pruned twin.
TWIN_GROUP = "beats naive_pruned"
_TWIN_CHECKS = (
    {"metric": "nll", "split": "id_test", "tolerance": 0.02},
    {"metric": "ece", "split": "id_test", "tolerance": 0.015},
    {"metric": "auroc", "split": "near_ood", "tolerance": 0.015},
    {"metric": "nll", "split": "shift", "tolerance": 0.02},
)
#: The single model's uncertainty checks form a group too: the gates never pass a Hydra that the
#: evidence of its own run cannot separate from a cheaper model that run built.
_SINGLE = {"any_of": "beats single"}
#: What the default run builds besides the Hydra (:meth:`BaselinesStageConfig.built`).
DEFAULT_BUILT = ("single", "naive_pruned", "deep_ensemble")


def default_gates(built: tuple[str, ...] | list[str] = DEFAULT_BUILT) -> list[dict[str, Any]]:
    """The default gates of a run that builds the models ``built``: every check compares the
    candidate with a model of the same run, so they mean the same on every task and on a
    user's data; no absolute bound on a quality metric (a user opts into one with a
    ``threshold`` check). The OOD checks compare with the Deep Ensemble when the run builds it,
    else with the single model. The ``any_of`` groups (:mod:`tasks.gates.twin`) hold the
    candidate against the two cheaper models every run builds, ``single`` and ``naive_pruned``:
    it must beat each on at least one uncertainty metric by a paired bootstrap interval that
    excludes zero, and be no worse beyond tolerance on any. The shift-NLL check asks for a
    strict improvement, which the single model as a candidate fails by construction (the
    evidence for these tolerances: docs/study.md)."""
    ood = "deep_ensemble" if "deep_ensemble" in built else "single"
    return [
        {"metric": "accuracy", "split": "id_test", "baseline": "single", "tolerance": 0.01},
        {"metric": "nll", "split": "id_test", "baseline": "single", "tolerance": 0.02, **_SINGLE},
        {"metric": "ece", "split": "id_test", "baseline": "single", "tolerance": 0.015, **_SINGLE},
        {"metric": "auroc", "split": "near_ood", "baseline": ood, "tolerance": 0.015},
        {"metric": "auroc", "split": "far_ood", "baseline": ood, "tolerance": 0.015},
        {"metric": "accuracy", "split": "shift", "baseline": "single", "tolerance": 0.02},
        {"metric": "nll", "split": "shift", "baseline": "single", "min_absolute_change": 0.01}
        | _SINGLE,
        # the Hydra against its naive pruned twin (the base with the same kept heads, no
        # fine-tune: cheaper, built by the same run)
        *({**g, "baseline": "naive_pruned", "any_of": TWIN_GROUP} for g in _TWIN_CHECKS),
        {"metric": "compile_argmax_agreement", "threshold": 1.0},
        # the compile stage's tolerance for the precision that ships (1e-4 fp32, 2e-2 bf16/fp16)
        {"metric": "compile_max_abs_diff", "threshold": COMPILE_TOLERANCE},
    ]
