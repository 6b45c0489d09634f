"""The sections every stage reads (:class:`CoreConfig`): the data, the model and how it is trained,
scored, selected, merged, compiled, calibrated and evaluated, the values the stages derive from
several of them, and the checks across sections.

:class:`CoreConfig` is the params view of the stages that read no other section: ``baselines``,
``gates`` and ``promote`` are kept there as written (:data:`Unread`), and validated by the views
that read them (:class:`tasks.params.baselines.BaselinesStageConfig`,
:class:`tasks.params.schema.PipelineConfig`, the whole file, which the CLI checks before any stage
runs). So a stage's code deps hold only the schema of what it reads: an edit to the gates' schema
reruns no fine-tune.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    Field,
    PrivateAttr,
    ValidationInfo,
    model_validator,
)

from hydra_ops.adapters import FAMILIES, ModelFamily
from hydra_ops.data.spec import DataSpec, OODSource, near_ood_problem
from hydra_ops.models.shapes import model_folder_shape, read_model_folder
from tasks.params.base import ConfigError, Strict
from tasks.params.evaluation import CalibrateConfig, CompileConfig, EvaluateConfig
from tasks.params.members import MembersConfig, MergeConfig, ScoringConfig
from tasks.params.model import (
    FinetuneConfig,
    ModelConfig,
    RuntimeConfig,
    data_modality,
    resolve_family,
)

#: How far apart replicate seeds put their stage seeds (Deep Ensemble members use base + k and
#: member fine-tunes base + ``members.finetune.seed_offset`` + m, all well below it).
REPLICATE_STRIDE = 1000


#: The profiles' names (:data:`tasks.params.profiles.PROFILES` holds their overrides, which no stage
#: reads: ``params.yaml`` is resolved, so editing a profile reruns nothing).
PROFILE_NAMES = ("default", "study", "quick")


def _known_profile(value: str) -> str:
    if value not in PROFILE_NAMES:
        raise ValueError(f"unknown profile {value!r}; allowed: {', '.join(PROFILE_NAMES)}")
    return value


ProfileName = Annotated[str, AfterValidator(_known_profile)]
"""A name in :data:`PROFILE_NAMES`."""


#: A section this view does not read: kept as ``params.yaml`` holds it, unvalidated.
Unread = Any


class CoreConfig(Strict):
    """``params.yaml`` as the stages that read only its core sections see it."""

    profile: ProfileName = "default"
    """A name in :data:`PROFILE_NAMES` (the profile the file was resolved from)."""
    seed: int = Field(default=0, ge=0)
    """The replicate seed: it shifts every training and scoring seed (base fine-tune, Deep
    Ensemble members, head scoring, member selection, member fine-tunes) by
    ``REPLICATE_STRIDE * seed``, so replicates share no seed; the data split (``data.seed``) and
    the bootstrap stay fixed. ``hydra-ens study`` varies this one value per replicate."""
    data: DataSpec = DataSpec()
    model: ModelConfig = ModelConfig()
    finetune: FinetuneConfig = FinetuneConfig()
    baselines: Unread = None
    scoring: ScoringConfig = ScoringConfig()
    members: MembersConfig = MembersConfig()
    merge: MergeConfig = MergeConfig()
    compile: CompileConfig = CompileConfig()
    calibrate: CalibrateConfig = CalibrateConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    gates: Unread = None
    promote: Unread = None
    runtime: RuntimeConfig = RuntimeConfig()
    _root: Path | None = PrivateAttr(default=None)
    """The project folder relative paths are read from (validation context ``root``; None: the
    current folder, which is the project's in a stage)."""

    def __eq__(self, other: object) -> bool:
        """Equal params are equal configs, whichever folder they were read from (``_root``)."""
        if not isinstance(other, CoreConfig):
            return NotImplemented
        return self.__dict__ == other.__dict__

    def project_path(self, path: str) -> Path:
        """A ``data``/``model`` path of these params as the stages read it: a relative one is
        relative to the project folder, where ``dvc repro`` runs them, not to the folder of the
        process that reads the params (``hydra-ens status -C PROJECT``, a study's worker)."""
        return Path(path) if self._root is None else self._root / path

    @property
    def model_dir(self) -> str | None:
        """``model.path`` as a folder the process can open (:meth:`project_path`); None for the
        built-in model."""
        return None if self.model.path is None else str(self.project_path(self.model.path))

    @property
    def model_folder(self) -> str | None:
        """The folder the base is loaded from and whose tokenizer reads the text:
        :attr:`model_dir`, else the family's default folder (MiniLM-L6 for ``bert``,
        all-mpnet-base-v2 for ``mpnet``); None for a family built from scratch."""
        return self.model_dir or self.model_family.default_path()

    def _project_data(self) -> DataSpec:
        """``data`` with its paths made openable from this process (:meth:`project_path`), for
        the checks and derived values that look at the files."""
        if self._root is None:
            return self.data
        changes: dict[str, Any] = {}
        if self.data.path:
            changes["path"] = str(self.project_path(self.data.path))
        for key in ("near_ood", "far_ood", "ood_val"):
            value = getattr(self.data, key)
            if isinstance(value, OODSource):
                changes[key] = dataclasses.replace(value, path=str(self.project_path(value.path)))
        return dataclasses.replace(self.data, **changes)

    # ---- derived values every stage agrees on ----
    @property
    def replicate_offset(self) -> int:
        return REPLICATE_STRIDE * self.seed

    @property
    def finetune_seed(self) -> int:
        """Seed of the base fine-tune; Deep Ensemble members and member fine-tunes offset it."""
        return self.finetune.seed + self.replicate_offset

    @property
    def scoring_seed(self) -> int:
        return self.scoring.seed + self.replicate_offset

    @property
    def members_seed(self) -> int:
        return self.members.seed + self.replicate_offset

    @property
    def modality(self) -> str:
        return data_modality(self._project_data())

    @property
    def model_family(self) -> ModelFamily:
        """The base's registered family (:func:`tasks.params.model.resolve_family`:
        ``model.family``, or with ``auto`` the family ``model.path``'s ``config.json`` names, else
        the modality's default); ConfigError naming ``model.family`` / ``model.path`` when it
        cannot be found."""
        try:
            return resolve_family(self.model.family, self.model_dir, self.modality)
        except ValueError as err:
            key = "model.family" if self.model.family != "auto" else "model.path"
            raise ConfigError(f"{key}: {err}") from None

    @property
    def family(self) -> str:
        return self.model_family.name

    @property
    def model_shape(self) -> tuple[int, int]:
        """``(layers, heads per layer)`` of the base model: ``model.vit``'s for a family built
        from scratch, else that of the folder it loads (``model.path``, or the family's default
        folder: MiniLM-L6's (6, 12) for ``bert``), read from its ``config.json`` (ConfigError
        naming ``model.path`` when it cannot be read)."""
        family = self.model_family
        if not family.from_folder:
            return self.model.vit.depth, self.model.vit.num_heads
        try:
            return model_folder_shape(self.model_folder)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"model.path: {err}") from None

    @property
    def model_heads(self) -> int:
        return self.model_shape[1]

    @property
    def model_layers(self) -> int:
        return self.model_shape[0]

    @property
    def shared_layers(self) -> int:
        """``merge.shared_layers`` resolved: the unpruned trunk's depth."""
        if self.merge.shared_layers is not None:
            return self.merge.shared_layers
        return self.model_layers // 2

    @property
    def base_lr(self) -> float:
        if self.finetune.lr is not None:
            return self.finetune.lr
        return self.model_family.lr

    @property
    def member_lr(self) -> float:
        return self.members.finetune.lr or self.base_lr / 2

    @property
    def heads_per_member(self) -> int:
        """Heads per pruned layer of a member; with a per-member list, the largest."""
        return max(self.member_head_budgets, default=1)  # [] is refused by the cross-checks

    @property
    def member_head_budgets(self) -> list[int]:
        """Heads per pruned layer of each member (``members.heads_per_layer`` resolved)."""
        k = self.members.heads_per_layer
        if isinstance(k, list):
            return list(k)
        m = self.members.num_members
        return [k if k is not None else max(1, self.model_heads // m)] * m

    @property
    def strategy(self) -> str:
        if self.members.strategy is not None:
            return self.members.strategy
        return "circuits" if self.scoring.method == "circuit" else "overlap_penalty"

    @property
    def finetune_members(self) -> bool:
        enabled = self.members.finetune.enabled
        return self.scoring.method == "taylor" if enabled == "auto" else bool(enabled)

    def _checkpoint_problems(self, folder_readable: bool) -> list[tuple[str, str]]:
        """What keeps ``finetune.from_checkpoint`` from using ``model.path`` as the base."""
        if not self.finetune.from_checkpoint:
            return []
        key = "finetune.from_checkpoint"
        if self.model.path is None:
            return [(key, "needs model.path: the folder of your fine-tuned classifier")]
        if self.modality != "text":
            return [(key, "needs text data (a *ForSequenceClassification checkpoint)")]
        if not folder_readable:
            return []  # model.path's own problem is reported
        from hydra_ops.models.fine_tuned import checkpoint_labels

        try:
            checkpoint_labels(self.model_dir)
        except ValueError as err:
            return [("model.path", str(err))]
        return []

    @model_validator(mode="after")
    def _cross_checks(self, info: ValidationInfo) -> CoreConfig:
        self._root = (info.context or {}).get("root")
        problems: list[tuple[str, str]] = []
        family = self._family_problems(problems)
        if self.data.path and not self.project_path(self.data.path).exists():
            problems.append(("data.path", f"{self.data.path!r} does not exist"))
        else:  # evaluate, the gates and the baselines all score a near-OOD split
            near = near_ood_problem(self._project_data())
            if near is not None:
                problems.append(near)
        for key in ("near_ood", "far_ood", "ood_val"):
            value = getattr(self.data, key)
            if isinstance(value, OODSource) and not self.project_path(value.path).exists():
                problems.append((f"data.{key}.path", f"{value.path!r} does not exist"))
        path_missing = bool(self.model_dir) and not Path(self.model_dir).exists()
        shape_known = family is not None and not (family.from_folder and path_missing)
        if shape_known and family.from_folder:
            try:
                self.model_shape  # noqa: B018 (read for its check)
            except ConfigError as err:
                problems.append(("model.path", str(err).partition(": ")[2]))
                shape_known = False
        problems += self._checkpoint_problems(shape_known)
        vit = self.model.vit
        if family is not None and not family.from_folder:  # built from scratch: model.vit
            if vit.image_size % vit.patch_size:
                problems.append(("model.vit.patch_size", "must divide model.vit.image_size"))
            if vit.embed_dim % vit.num_heads:
                problems.append(("model.vit.num_heads", "must divide model.vit.embed_dim"))
            if self.finetune.random_shift >= vit.image_size:
                problems.append(
                    ("finetune.random_shift", f"must be < model.vit.image_size ({vit.image_size})")
                )
        elif self.finetune.random_shift:
            problems.append(("finetune.random_shift", "must be 0 for text data (it shifts images)"))
        if shape_known and self.heads_per_member > self.model_heads:
            problems.append(
                (
                    "members.heads_per_layer",
                    f"{self.heads_per_member} > the model's {self.model_heads} heads per layer",
                )
            )
        budgets = self.members.heads_per_layer
        if isinstance(budgets, list):
            if len(budgets) != self.members.num_members:
                problems.append(
                    (
                        "members.heads_per_layer",
                        f"has {len(budgets)} entries, one per member needs "
                        f"members.num_members = {self.members.num_members}",
                    )
                )
            elif len(set(budgets)) > 1 and self.strategy == "circuits":
                problems.append(
                    (
                        "members.heads_per_layer",
                        "per-member sizes need a strategy other than circuits",
                    )
                )
        if shape_known and self.shared_layers >= self.model_layers:
            problems.append(
                ("merge.shared_layers", f"must be < the model's {self.model_layers} layers")
            )
        if problems:
            raise ValueError("; ".join(f"@{k}: {m}" for k, m in problems))
        return self

    def _family_problems(self, problems: list[tuple[str, str]]) -> ModelFamily | None:
        """Append what is wrong with ``model.family`` / ``model.path`` to ``problems``; the base's
        family, or None when it cannot be known."""
        name, folder = self.model.family, self.model_dir
        if folder and not Path(folder).exists():
            problems.append(("model.path", f"{self.model.path!r} does not exist"))
            folder = None
        if name != "auto" and name not in FAMILIES:
            return None  # an unknown name: tasks.params.names reports it with the allowed ones
        found = None
        if folder and (name == "auto" or FAMILIES[name].from_folder):
            try:
                found = read_model_folder(folder)[1]
            except ValueError as err:
                problems.append(("model.path", str(err)))
                return None
        if name != "auto":
            family = FAMILIES[name]
        else:
            family = found or resolve_family(name, None, self.modality)
        if found is not None and found.name != family.name and family.from_folder:
            problems.append(
                ("model.path", f"holds a {found.name} model but model.family is {family.name!r}")
            )
            return None
        if family.modality != self.modality and name == "auto":
            problems.append(
                ("model.path", f"holds a {family.name} model, which needs {family.modality} data")
            )
            return None
        if family.modality != self.modality:
            article = "an" if family.modality == "image" else "a"
            problems.append(
                ("model.family", f"{family.name!r} needs {article} {family.modality} data.source")
            )
            return None
        if family.builder is None:
            problems.append(("model.family", f"{family.name!r} cannot be a pipeline base"))
            return None
        if family.from_folder and not self.model_dir and family.default_folder is None:
            problems.append(("model.path", f"model.family {family.name!r} needs a model folder"))
            return None
        return family
