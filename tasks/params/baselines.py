"""The ``baselines`` section (the Deep Ensemble and MC Dropout baselines) and the params view of
the stages that build or score them (:class:`BaselinesStageConfig`)."""

from __future__ import annotations

from pydantic import Field

from tasks.params.base import Strict
from tasks.params.core import CoreConfig


class McDropoutConfig(Strict):
    """The MC Dropout baseline: the fine-tuned base, dropout on at inference, ``samples`` passes
    (:mod:`hydra_ops.mc_dropout`)."""

    enabled: bool = True
    samples: int = Field(default=8, ge=2)
    rate: float | None = Field(default=None, gt=0, lt=1)
    """``None``: the model's own dropout rates, or 0.1 everywhere when they are all 0."""
    seed: int = Field(default=0, ge=0)
    """Seed of the dropout masks (restarted per evaluated split: reruns give the same metrics)."""


class BaselinesConfig(Strict):
    deep_ensemble_size: int | None = Field(default=None, ge=1)
    """Members of the Deep Ensemble baseline (the base is member 0); ``None``: M."""
    mc_dropout: McDropoutConfig = McDropoutConfig()


class BaselinesStageConfig(CoreConfig):
    """What ``finetune_baselines``, ``baseline_logits`` and ``evaluate`` read: the core sections
    and ``baselines`` (``gates`` and ``promote`` kept as written)."""

    baselines: BaselinesConfig = BaselinesConfig()  # type: ignore[assignment]

    @property
    def deep_ensemble_size(self) -> int:
        return self.baselines.deep_ensemble_size or self.members.num_members
