"""What every params section shares: the error type and the strict base model."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A ``params.yaml`` problem; ``str(err)`` is one line per problem, each naming the key."""


class Strict(BaseModel):
    """A params model that refuses unknown keys and validates its defaults too."""

    model_config = ConfigDict(extra="forbid", validate_default=True)
