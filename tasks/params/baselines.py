"""The ``baselines`` section (the Deep Ensemble, MC Dropout, LoRA-Ensemble and BatchEnsemble
baselines), the params view of the stages that build or score them
(:class:`BaselinesStageConfig`) and which baselines a run builds
(:meth:`~BaselinesStageConfig.built`).

The default run builds what its default gates and report read: ``single``, ``naive_pruned`` and
the Deep Ensemble. MC Dropout and the unpruned controls are switched on by one parameter each
(``baselines.mc_dropout.enabled``, ``members.finetune.controls``) or by the ``study`` profile."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tasks.params.base import Strict
from tasks.params.core import CoreConfig


class McDropoutConfig(Strict):
    """The MC Dropout baseline: the fine-tuned base, dropout on at inference, ``samples`` passes
    (:mod:`hydra_ops.models.mc_dropout`)."""

    enabled: bool = False
    """Off in the default run (no default gate reads it); the ``study`` profile turns it on."""
    samples: int = Field(default=8, ge=2)
    rate: float | None = Field(default=None, gt=0, lt=1)
    """``None``: the model's own dropout rates, or 0.1 everywhere when they are all 0."""
    seed: int = Field(default=0, ge=0)
    """Seed of the dropout masks (restarted per evaluated split: reruns give the same metrics)."""


class LoraEnsembleConfig(Strict):
    """The LoRA-Ensemble baseline (Mühlematter et al., 2024;
    :mod:`hydra_ops.baselines.lora_ensemble`): ``members`` LoRA adapters of rank ``rank`` on the
    fine-tuned base's attention projections, each with its own classifier, each trained
    ``epochs`` epochs with the base frozen."""

    enabled: bool = False
    """Off in the default run (its cost: docs/pipeline.md, "Efficient-ensemble baselines"); the
    study specs turn it on."""
    members: int | None = Field(default=None, ge=1)
    """``None``: M (``members.num_members``)."""
    rank: int = Field(default=8, ge=1)
    alpha: float = Field(default=16.0, gt=0)
    """LoRA scale numerator: the update is ``alpha / rank * B A``."""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the LoRA branch's input while training."""
    epochs: int = Field(default=1, ge=1)
    lr: float = Field(default=5e-4, gt=0)
    batched: bool = False
    """Run the members as one pass over the M stacked copies of a batch (``peft``'s mixed-adapter
    batches) instead of one pass per member: the same logits. Off: on 2 CPU cores the batched pass
    was 1.17x the member-by-member time on MiniLM-L6 and 0.91x [0.73, 1.03] on the image ViT
    (``benchmarks/efficient_baselines.py``, docs/benchmarks.md)."""
    seed: int = Field(default=0, ge=0)
    """Member i's adapter init and data order use ``seed + i`` (shifted per replicate)."""


class BatchEnsembleConfig(Strict):
    """The BatchEnsemble baseline (Wen et al., 2020; :mod:`hydra_ops.baselines.batch_ensemble`):
    ``members`` rank-1 fast weights on every linear layer of the fine-tuned base, which stays
    frozen; the fast weights train ``epochs`` epochs on the batch repeated per member."""

    enabled: bool = False
    """Off in the default run (its cost: docs/pipeline.md, "Efficient-ensemble baselines"); the
    study specs turn it on."""
    members: int | None = Field(default=None, ge=1)
    """``None``: M (``members.num_members``)."""
    init_std: float = Field(default=0.1, ge=0)
    """The fast weights start at ``N(1, init_std)`` (0: every member starts as the base)."""
    epochs: int = Field(default=1, ge=1)
    lr: float = Field(default=1e-3, gt=0)
    seed: int = Field(default=0, ge=0)
    """Seed of the fast weights' init and of the data order (shifted per replicate)."""


class BaselinesConfig(Strict):
    deep_ensemble: bool | Literal["auto"] = "auto"
    """Build the Deep Ensemble baseline. ``auto``: yes, except with
    ``finetune.from_checkpoint`` (there is no backbone to retrain with other seeds: the run
    compares with ``single`` and ``naive_pruned`` instead); ``true`` there is refused."""
    deep_ensemble_size: int | None = Field(default=None, ge=1)
    """Members of the Deep Ensemble baseline (the base is member 0); ``None``: M."""
    mc_dropout: McDropoutConfig = McDropoutConfig()
    lora_ensemble: LoraEnsembleConfig = LoraEnsembleConfig()
    batch_ensemble: BatchEnsembleConfig = BatchEnsembleConfig()


#: Why a baseline is not built, by name, given the params (:meth:`BaselinesStageConfig.built`).
NOT_BUILT_HINTS = {
    "deep_ensemble": "baselines.deep_ensemble is false, or finetune.from_checkpoint is set",
    "mc_dropout": "baselines.mc_dropout.enabled is false",
    "lora_ensemble": "baselines.lora_ensemble.enabled is false",
    "batch_ensemble": "baselines.batch_ensemble.enabled is false",
    "control": "members.finetune.controls is false, or the variant fine-tunes no members",
}


class BaselinesStageConfig(CoreConfig):
    """What ``finetune_baselines``, ``baseline_logits`` and ``evaluate`` read: the core sections
    and ``baselines`` (``gates`` and ``promote`` kept as written)."""

    baselines: BaselinesConfig = BaselinesConfig()  # type: ignore[assignment]

    @property
    def deep_ensemble_size(self) -> int:
        return self.baselines.deep_ensemble_size or self.members.num_members

    @property
    def builds_deep_ensemble(self) -> bool:
        if self.baselines.deep_ensemble == "auto":
            return not self.finetune.from_checkpoint
        return self.baselines.deep_ensemble

    @property
    def builds_control(self) -> bool:
        return self.members.finetune.controls and self.finetune_members

    def built(self) -> tuple[str, ...]:
        """The models this run builds and evaluates besides the Hydra, in report order."""
        b = self.baselines
        on = {
            "single": True,
            "naive_pruned": True,
            "deep_ensemble": self.builds_deep_ensemble,
            "mc_dropout": b.mc_dropout.enabled,
            "lora_ensemble": b.lora_ensemble.enabled,
            "batch_ensemble": b.batch_ensemble.enabled,
            "control": self.builds_control,
        }
        return tuple(name for name, yes in on.items() if yes)

    @model_validator(mode="after")
    def _deep_ensemble_needs_a_backbone(self) -> BaselinesStageConfig:
        if self.baselines.deep_ensemble is True and self.finetune.from_checkpoint:
            raise ValueError(
                "@baselines.deep_ensemble: true needs a backbone to retrain with other seeds, and "
                "finetune.from_checkpoint starts from a fine-tuned classifier (set it to auto)"
            )
        return self
