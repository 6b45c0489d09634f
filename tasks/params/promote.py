"""The ``promote`` section: the registered model's name and the stage a passing version takes."""

from __future__ import annotations

from pydantic import Field

from tasks.params.base import Strict


class PromoteConfig(Strict):
    model_name: str = Field(default="hydra", pattern=r"^[a-z][a-z0-9-]*$")
    stage: str = Field(default="prod", pattern=r"^[a-z][a-z0-9-]*$")
