"""The ``promote`` section: the registered model's name, the stage a passing version takes and the
candidates allowed to ship."""

from __future__ import annotations

from pydantic import Field, field_validator

from tasks.params.base import Strict
from tasks.params.gates import CANDIDATES

#: Candidates judged like every other but with no export to ship (:mod:`tasks.candidates.export`
#: has no recipe for them): ``promote.candidates`` refuses them.
JUDGED_ONLY = ("lora_ensemble", "batch_ensemble")
SHIPPABLE = tuple(c for c in CANDIDATES if c not in JUDGED_ONLY)


class PromoteConfig(Strict):
    model_name: str = Field(default="hydra", pattern=r"^[a-z][a-z0-9-]*$")
    stage: str = Field(default="prod", pattern=r"^[a-z][a-z0-9-]*$")
    candidates: list[str] = Field(default_factory=lambda: ["hydra", "naive_pruned"])
    """The candidates (:data:`CANDIDATES`) allowed to ship: of those that pass the gates, the
    cheapest ships (:mod:`tasks.gates.candidates`). Every candidate is judged either way. The
    default allows the Hydra's naive pruned twin: on the text study's held-out confirmation
    seeds (docs/study.md) the default Hydra passed the gates on 1 of 3 seeds and matched its
    twin on near-OOD AUROC and shift NLL (it beat it on ID NLL alone, by 0.014) at 1.64x the
    single model's cost against the twin's 0.88x, so a run ships the twin whenever it passes the
    same gates. ``[hydra]`` ships the Hydra or nothing."""

    @field_validator("candidates")
    @classmethod
    def _known_candidates(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError(f"name at least one candidate; allowed: {', '.join(SHIPPABLE)}")
        for name in value:
            if name in JUDGED_ONLY:
                raise ValueError(
                    f"{name!r} is judged but cannot ship (no export yet); allowed: "
                    + ", ".join(SHIPPABLE)
                )
            if name not in CANDIDATES:
                raise ValueError(f"unknown candidate {name!r}; allowed: {', '.join(SHIPPABLE)}")
        if len(set(value)) != len(value):
            raise ValueError(f"a candidate is named twice: {', '.join(value)}")
        return value
