"""The member sections: ``scoring`` (head importance), ``members`` (selection and member
fine-tunes), ``merge``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_serializer

from tasks.params.base import Strict


class ScoringConfig(Strict):
    method: str = "taylor"
    """A scorer of ``hydra_ops.scoring.SCORERS`` (:mod:`tasks.params.names`). ``taylor``
    (default: its members are fine-tuned, ``members.finetune.enabled: auto``) won the three-seed
    text study (docs/study.md); ``circuit`` is the paper's search (members not fine-tuned)."""
    objective: str = "ood"
    """The circuit search's objective, one of ``hydra_ops.scoring.OBJECTIVES``."""
    max_batches: int | None = Field(default=4, ge=1)
    """Batches of ``batch_size`` per objective evaluation (circuit: layers x heads x M of them)
    or per gradient pass (taylor); ``None`` = the whole split."""
    batch_size: int = Field(default=32, ge=1)
    seed: int = 0
    search_trunk: bool = False
    """Circuit scorer with ``merge.shared_layers > 0``: also search the unpruned trunk's layers,
    so the later layers are chosen in the context of a pruned prefix (see docs/scoring.md)."""


class MemberFinetuneConfig(Strict):
    enabled: bool | Literal["auto"] = "auto"
    """``auto``: fine-tune members for the ``taylor`` variant only (the circuit variant skips)."""
    epochs: int = Field(default=1, ge=1)
    lr: float | None = Field(default=None, gt=0)
    """``None``: half of the base fine-tune's learning rate."""
    seed_offset: int = 100
    max_parallel: int = Field(default=1, ge=1)
    """Members fine-tuned at once, each in its own mapped Prefect task and process with its
    share of the threads (on a Dask cluster or a GPU with room for several); 1: the stage's own
    process trains them in turn, without a process per member."""
    data: str = "full"
    """One of ``hydra_ops.data.members.MEMBER_DATA_MODES``: each member's (and its control's)
    training data (:mod:`hydra_ops.data.members`): the whole split, a bootstrap resample per
    member, or one of M disjoint class-stratified shards."""
    objective: Literal["ce", "ncl"] = "ce"
    """``ncl``: cross-entropy plus ``ncl_strength`` times the negative-correlation penalty
    against the fine-tuned base's predictions (:mod:`hydra_ops.models.diversity_loss`)."""
    ncl_strength: float = Field(default=0.5, ge=0)
    """The penalty's weight (``objective: ncl`` only); docs/diversity.md has each one's cost."""
    controls: bool = False
    """Also build the ``control`` baseline: an unpruned copy of the base given each member's
    fine-tune (what separates pruning from extra training). Off in the default run, where no
    gate reads it; the ``study`` profile turns it on."""

    @model_serializer(mode="wrap")
    def _omit_off_mechanisms(self, handler: Any) -> dict[str, Any]:
        # the diversity mechanisms are left out of the dump while off, so default runs keep their
        # params.yaml and member unit fingerprints
        out = handler(self)
        if self.data == "full":
            out.pop("data", None)
        if self.objective == "ce":
            out.pop("objective", None)
            out.pop("ncl_strength", None)
        return out


class MembersConfig(Strict):
    num_members: int = Field(default=3, ge=1)
    heads_per_layer: Annotated[int, Field(ge=1)] | list[Annotated[int, Field(ge=1)]] | None = None
    """Heads each member keeps per pruned layer: one int for every member, or a list with one int
    per member (per-member pruning ratios); ``None`` = ``max(1, heads // num_members)``."""
    strategy: str | None = None
    """One of ``hydra_ops.heads.selection.STRATEGIES``; ``None`` = ``circuits`` for the circuit
    scorer, ``overlap_penalty`` otherwise."""
    temperature: float = Field(default=1.0, gt=0)
    overlap_penalty: float | None = Field(default=None, ge=0)
    """Overlap penalty of the ``overlap_penalty`` and ``circuits`` strategies (in units of a layer's
    score range); ``None`` = the strategy's default, ``hydra_ops.heads.selection.DEFAULT_PENALTIES``
    (1.0 for ``overlap_penalty``, 0.5 for ``circuits``, which applies it in the circuit search)."""
    seed: int = 0
    finetune: MemberFinetuneConfig = MemberFinetuneConfig()


class MergeConfig(Strict):
    mode: str = "stack"
    """One of ``hydra_ops.hydra.merge.MERGE_MODES``."""
    attention: str = "padded_bmm"
    """An implementation of ``hydra_ops.hydra.grouped.ATTENTION_IMPLEMENTATIONS``."""
    shared_layers: int | None = Field(default=None, ge=0)
    """Leading layers that keep every head and run once, shared by all members (the streams fork
    after them); ``None`` = half of the model's layers (``L // 2``), 0 = the paper's merge, every
    layer pruned per member. docs/pipeline.md has the measurements behind the default."""
