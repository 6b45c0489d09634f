"""The whole of ``params.yaml`` (:class:`PipelineConfig`): every section validated, as the CLI,
the flow, the study and the stages that read the gates or ``promote`` (gate, bundle, promote)
see it; :func:`validate_params` and :func:`load_params` read it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from tasks.params.baselines import NOT_BUILT_HINTS, BaselinesStageConfig
from tasks.params.files import load_as, validate_as
from tasks.params.gates import GateCheck, default_gates
from tasks.params.metrics import COMPILE_CHECKS
from tasks.params.promote import PromoteConfig


class PipelineConfig(BaselinesStageConfig):
    """Root of ``params.yaml``: every section."""

    gates: list[GateCheck] = Field(  # type: ignore[assignment]
        default_factory=lambda: [GateCheck(**g) for g in default_gates()]
    )
    promote: PromoteConfig = PromoteConfig()  # type: ignore[assignment]

    @field_validator("gates")
    @classmethod
    def _keeps_compile_checks(cls, gates: list[GateCheck]) -> list[GateCheck]:
        # the artifact that ships must be judged against the eager model it came from
        missing = [m for m in COMPILE_CHECKS if not any(g.metric == m for g in gates)]
        if missing:
            raise ValueError(
                f"must keep the compile agreement checks, missing {', '.join(missing)} "
                "(e.g. {metric: compile_argmax_agreement, threshold: 1.0} and {metric: "
                "compile_max_abs_diff, threshold: compile_tolerance})"
            )
        return gates

    @model_validator(mode="after")
    def _gates_judge_what_the_run_builds(self) -> PipelineConfig:
        """Left out, the gates are the defaults for the baselines this run builds; given, each
        check's baseline must be one the run builds (a check never passes for want of its
        baseline). A check of another kind is held to that kind by
        :func:`tasks.gates.kinds.check_kinds`."""
        built = self.built()
        if "gates" not in self.model_fields_set:
            self.gates = [GateCheck(**g) for g in default_gates(built)]
            return self
        problems = []
        for i, gate in enumerate(self.gates):
            if gate.baseline not in (None, "prod", *built):
                problems.append(
                    f"@gates.{i}: baseline {gate.baseline!r} is not built by this run "
                    f"({NOT_BUILT_HINTS[gate.baseline]}): build it or drop the check"
                )
        if problems:
            raise ValueError("; ".join(problems))
        return self


def validate_params(
    raw: Mapping[str, Any] | None, source: str = "params.yaml", root: Path | None = None
) -> PipelineConfig:
    """Validate a raw params mapping; raise :class:`~tasks.params.base.ConfigError` with one line
    per problem. ``root``: the project folder its relative paths are checked in (None: the
    current folder; :meth:`~tasks.params.core.CoreConfig.project_path`)."""
    return validate_as(PipelineConfig, raw, source, root)


def load_params(path: str | os.PathLike[str] = "params.yaml") -> PipelineConfig:
    """Read and validate a params file; its relative paths are relative to its folder (the
    project's)."""
    return load_as(PipelineConfig, path)
