"""The pipeline's parameters (``params.yaml``) as validated pydantic models, plus named profiles.

``params.yaml`` is the single, fully resolved configuration the DVC DAG runs on: every stage reads
it through :func:`load_params`, which validates it before anything runs. Profiles (``default``,
``quick``) are override dicts applied on top of the defaults by :func:`resolve_params`; the CLI
writes the resolved result to ``params.yaml`` so DVC tracks exactly the values a stage used.

Every validation problem becomes one line ``params.yaml: <dotted.key>: <what is wrong>`` in a
:class:`ConfigError` (a ``ValueError``).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from hydra_ops.atomic import atomic_write_bytes
from hydra_ops.data.spec import DataSpec, OODSource, near_ood_problem
from hydra_ops.shapes import VIT_DEFAULTS, text_model_shape

IMAGE_SOURCES = ("mnist5k", "digits", "fashion-mnist")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")

#: Metrics a gate may name. Classification metrics apply to ``id_test`` and ``shift``; OOD metrics
#: (OOD = positive class) to ``near_ood`` and ``far_ood``; the rest are model-level
#: (split ``model``).
CLASSIFICATION_METRICS = ("accuracy", "nll", "brier", "ece", "adaptive_ece", "aurc", "augrc")
OOD_METRICS = ("auroc", "aupr_in", "aupr_out", "fpr_at_95_tpr")
MODEL_METRICS = ("parameters", "latency_ms", "compile_max_abs_diff", "compile_argmax_agreement")
#: The checks of the shipped artifact against the eager model: no gate list may drop them.
COMPILE_CHECKS = ("compile_argmax_agreement", "compile_max_abs_diff")
METRICS = CLASSIFICATION_METRICS + OOD_METRICS + MODEL_METRICS
SPLITS = ("id_test", "shift", "near_ood", "far_ood", "model")
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
GREATER_IS_BETTER = {
    "accuracy": True,
    "nll": False,
    "brier": False,
    "ece": False,
    "adaptive_ece": False,
    "aurc": False,
    "augrc": False,
    "auroc": True,
    "aupr_in": True,
    "aupr_out": True,
    "fpr_at_95_tpr": False,
    "parameters": False,
    "latency_ms": False,
    "compile_max_abs_diff": False,
    "compile_argmax_agreement": True,
}

#: How far apart replicate seeds put their stage seeds (Deep Ensemble members use base + k and
#: member fine-tunes base + ``members.finetune.seed_offset`` + m, all well below it).
REPLICATE_STRIDE = 1000

#: Heads per layer / layers of the built-in text model (MiniLM-L6).
MINILM_LAYERS, MINILM_HEADS = 6, 12


def _text_model_shape(path: str | None) -> tuple[int, int]:
    """``(layers, heads per layer)`` of the text model: MiniLM-L6's without ``path``, else
    :func:`hydra_ops.shapes.text_model_shape` of its folder (ValueError, one line, no key)."""
    return (MINILM_LAYERS, MINILM_HEADS) if path is None else text_model_shape(path)


def data_modality(data: DataSpec) -> str:
    """``"image"`` for the built-in image sources and folders of images, else ``"text"``."""
    if data.name in IMAGE_SOURCES:
        return "image"
    if data.name == "folder" and data.path and Path(data.path).is_dir():
        for f in Path(data.path).rglob("*"):
            if f.is_file():
                return "image" if f.suffix.lower() in IMAGE_SUFFIXES else "text"
    return "text"


class ConfigError(ValueError):
    """A ``params.yaml`` problem; ``str(err)`` is one line per problem, each naming the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class VitConfig(_Strict):
    """The from-scratch ViT's shape; defaults: :data:`hydra_ops.models.VIT_DEFAULTS`."""

    image_size: int = Field(default=VIT_DEFAULTS.image_size, ge=4)
    patch_size: int = Field(default=VIT_DEFAULTS.patch_size, ge=1)
    embed_dim: int = Field(default=VIT_DEFAULTS.embed_dim, ge=8)
    depth: int = Field(default=VIT_DEFAULTS.depth, ge=1)
    num_heads: int = Field(default=VIT_DEFAULTS.num_heads, ge=1)
    mlp_ratio: float = Field(default=VIT_DEFAULTS.mlp_ratio, gt=0)


class ModelConfig(_Strict):
    family: Literal["auto", "bert", "timm_vit"] = "auto"
    path: str | None = None
    max_length: int = Field(default=64, ge=8, le=512)
    vit: VitConfig = VitConfig()


class FinetuneConfig(_Strict):
    epochs: int = Field(default=3, ge=1)
    batch_size: int = Field(default=16, ge=1)
    lr: float | None = Field(default=None, gt=0)
    """``None``: 5e-5 for MiniLM (fine-tuning), 1e-3 for the from-scratch timm ViT."""
    weight_decay: float = Field(default=0.01, ge=0)
    warmup_ratio: float = Field(default=0.1, ge=0, lt=1)
    seed: int = 0
    random_shift: int = Field(default=0, ge=0)
    """Image data only: translate each training image by up to this many pixels per axis (random
    per image and epoch, zero fill; :func:`hydra_ops.data.augment.random_shift`); 0 = off. Left
    out of the dump while 0, so text runs keep their ``params.yaml`` and unit fingerprints."""

    @model_serializer(mode="wrap")
    def _omit_off_shift(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        if self.random_shift == 0:
            out.pop("random_shift", None)
        return out


class McDropoutConfig(_Strict):
    """The MC Dropout baseline: the fine-tuned base, dropout on at inference, ``samples`` passes
    (:mod:`hydra_ops.mc_dropout`)."""

    enabled: bool = True
    samples: int = Field(default=8, ge=2)
    rate: float | None = Field(default=None, gt=0, lt=1)
    """``None``: the model's own dropout rates, or 0.1 everywhere when they are all 0."""
    seed: int = Field(default=0, ge=0)
    """Seed of the dropout masks (restarted per evaluated split: reruns give the same metrics)."""


class LoraEnsembleConfig(_Strict):
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


class BatchEnsembleConfig(_Strict):
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


class BaselinesConfig(_Strict):
    deep_ensemble_size: int | None = Field(default=None, ge=1)
    """Members of the Deep Ensemble baseline (the base is member 0); ``None``: M."""
    mc_dropout: McDropoutConfig = McDropoutConfig()
    lora_ensemble: LoraEnsembleConfig = LoraEnsembleConfig()
    batch_ensemble: BatchEnsembleConfig = BatchEnsembleConfig()


class ScoringConfig(_Strict):
    method: Literal["circuit", "taylor", "magnitude", "random"] = "taylor"
    """``taylor`` (default: its members are fine-tuned, ``members.finetune.enabled: auto``) won the
    three-seed text study (docs/study.md); ``circuit`` is the paper's search (members not
    fine-tuned)."""
    objective: Literal["nll", "ood", "avg"] = "ood"
    max_batches: int | None = Field(default=4, ge=1)
    """Batches of ``batch_size`` per objective evaluation (circuit: layers x heads x M of them)
    or per gradient pass (taylor); ``None`` = the whole split."""
    batch_size: int = Field(default=32, ge=1)
    seed: int = 0
    search_trunk: bool = False
    """Circuit scorer with ``merge.shared_layers > 0``: also search the unpruned trunk's layers,
    so the later layers are chosen in the context of a pruned prefix (see docs/scoring.md)."""


class MemberFinetuneConfig(_Strict):
    enabled: bool | Literal["auto"] = "auto"
    """``auto``: fine-tune members for the ``taylor`` variant only (the circuit variant skips)."""
    epochs: int = Field(default=1, ge=1)
    lr: float | None = Field(default=None, gt=0)
    """``None``: half of the base fine-tune's learning rate."""
    seed_offset: int = 100
    max_parallel: int = Field(default=1, ge=1)
    data: Literal["full", "bootstrap", "shards"] = "full"
    """Each member's (and its control's) training data (:mod:`hydra_ops.member_data`): the whole
    split, a bootstrap resample per member, or one of M disjoint class-stratified shards."""
    objective: Literal["ce", "ncl"] = "ce"
    """``ncl``: cross-entropy plus ``ncl_strength`` times the negative-correlation penalty
    against the fine-tuned base's predictions (:mod:`hydra_ops.diversity_loss`)."""
    ncl_strength: float = Field(default=0.5, ge=0)
    """The penalty's weight (``objective: ncl`` only); docs/diversity.md has each one's cost."""

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


class MembersConfig(_Strict):
    num_members: int = Field(default=3, ge=1)
    heads_per_layer: Annotated[int, Field(ge=1)] | list[Annotated[int, Field(ge=1)]] | None = None
    """Heads each member keeps per pruned layer: one int for every member, or a list with one int
    per member (per-member pruning ratios); ``None`` = ``max(1, heads // num_members)``."""
    strategy: Literal["topk", "gumbel_topk", "overlap_penalty", "circuits"] | None = None
    """``None`` = ``circuits`` for the circuit scorer, ``overlap_penalty`` otherwise."""
    temperature: float = Field(default=1.0, gt=0)
    overlap_penalty: float | None = Field(default=None, ge=0)
    """Overlap penalty of the ``overlap_penalty`` and ``circuits`` strategies (in units of a layer's
    score range); ``None`` = the strategy's default, ``hydra_ops.selection.DEFAULT_PENALTIES``
    (1.0 for ``overlap_penalty``, 0.5 for ``circuits``, which applies it in the circuit search)."""
    seed: int = 0
    finetune: MemberFinetuneConfig = MemberFinetuneConfig()


class MergeConfig(_Strict):
    mode: Literal["stack", "average"] = "stack"
    attention: Literal["padded_bmm", "member_gemm", "block_diagonal"] = "padded_bmm"
    shared_layers: int | None = Field(default=None, ge=0)
    """Leading layers that keep every head and run once, shared by all members (the streams fork
    after them); ``None`` = half of the model's layers (``L // 2``), 0 = the paper's merge, every
    layer pruned per member. docs/pipeline.md has the measurements behind the default."""


class CompileConfig(_Strict):
    backend: Literal["eager", "auto", "inductor", "export", "onnxruntime", "tensorrt"] = "auto"
    """``auto``: tensorrt on CUDA, else the fastest CPU backend measured here that agrees with
    eager (hydra_ops.compile); ``eager``: no compilation (the artifact records that)."""
    precision: Literal["fp32", "bf16", "fp16", "auto"] = "auto"
    """What the artifact computes in. ``auto`` (default): every precision the device runs fast is
    measured with every backend against the fp32 eager model and the fastest that agrees within
    ``tolerance(precision)`` and ``min_agreement`` ships (bf16 only on a CPU with
    avx512_bf16/amx_bf16 or a CUDA device with bf16, fp16 only on CUDA; otherwise fp32, with one
    log line saying why). The default gate ``compile_max_abs_diff <= compile_tolerance`` follows
    the shipped precision, and evaluate judges the Hydra at it."""
    tolerance_fp32: float = Field(default=1e-4, gt=0)
    """Max |dp| of ensemble probabilities vs the fp32 eager model for an fp32 artifact."""
    tolerance_low_precision: float = Field(default=2e-2, gt=0)
    """The same for a bf16/fp16 artifact."""
    min_agreement: float = Field(default=1.0, ge=0, le=1)
    """Minimum ensemble argmax agreement with the fp32 eager model."""
    check_examples: int = Field(default=64, ge=1)
    """Held-out examples per split (ID test, shift, near-OOD, far-OOD) compile's check compares
    with the eager model, text at several lengths (tasks.compile.check_batches)."""

    def tolerance(self, precision: str) -> float:
        """The max |dp| allowed for an artifact of ``precision`` (``fp32``/``bf16``/``fp16``)."""
        return self.tolerance_fp32 if precision == "fp32" else self.tolerance_low_precision


class CalibrateConfig(_Strict):
    """Quantiles of the ID validation OOD scores that become ``hydra-ens predict``'s verdict
    thresholds (``uncertain`` above the first, ``likely OOD`` above the second)."""

    uncertain_quantile: float = Field(default=0.90, gt=0, lt=1)
    likely_ood_quantile: float = Field(default=0.95, gt=0, lt=1)

    @model_validator(mode="after")
    def _ordered(self) -> CalibrateConfig:
        if not self.uncertain_quantile < self.likely_ood_quantile:
            raise ValueError(
                f"uncertain_quantile ({self.uncertain_quantile}) must be < likely_ood_quantile "
                f"({self.likely_ood_quantile})"
            )
        return self


class EvaluateConfig(_Strict):
    ood_score: Literal["msp", "entropy", "mutual_information", "energy"] = "msp"
    bootstrap_samples: int = Field(default=1000, ge=10)
    bootstrap_seed: int = 0
    bootstrap_raw: bool = False
    """Also bootstrap the raw (uncalibrated) differences (the calibrated ones always are)."""
    batch_size: int = Field(default=64, ge=1)
    latency_batch: int = Field(default=32, ge=1)
    latency_repeats: int = Field(default=5, ge=1)
    cost_rounds: int = Field(default=10, ge=1)
    """Interleaved timing rounds of every model in ``metrics/cost.json`` (:mod:`tasks.cost`)."""


class RuntimeConfig(_Strict):
    """Where and in which precision the model-running stages run (:mod:`hydra_ops.runtime`)."""

    device: str = "auto"
    """``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``."""
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """``auto``: each model stage measures (:mod:`tasks.precision`): fp32 where bf16 is not native
    (no ``amx_bf16`` / ``avx512_bf16``, CUDA < 8.0), else bf16 when a short probe on the stage's
    model and batch finds it faster by 15% (and, for inference, agreeing with fp32 within
    ``compile.tolerance_low_precision``); compile measures the precision it ships on its own.
    Pin ``fp32`` (or ``bf16``) to reproduce a version's weights on another machine."""

    @field_validator("device")
    @classmethod
    def _device_spec(cls, value: str) -> str:
        if not re.fullmatch(r"auto|cpu|cuda|cuda:\d+", value):
            raise ValueError(f"unknown device {value!r}; allowed: auto, cpu, cuda, cuda:N")
        return value


#: ``GateCheck.threshold`` value meaning "the compile stage's tolerance for the shipped precision".
COMPILE_TOLERANCE = "compile_tolerance"


class GateCheck(_Strict):
    """One check, modelled on MLflow's ``MetricThreshold``.

    The candidate is the Hydra model. ``threshold``: an absolute bound (candidate >= threshold when
    greater is better, else <=). ``baseline``: compare with a baseline's value; the candidate may be
    worse by at most ``tolerance`` or must be better by at least ``min_absolute_change`` (MLflow's
    meaning). ``use_bootstrap_bound``: compare the conservative end of the paired bootstrap interval
    of (candidate - baseline) instead of the point difference.

    ``threshold: compile_tolerance`` (metric ``compile_max_abs_diff`` only, an upper bound): the
    bound is the tolerance the compile stage applied to the artifact that ships, i.e.
    ``compile.tolerance_fp32`` for an fp32 artifact and ``compile.tolerance_low_precision`` for a
    bf16/fp16 one (evaluate records it as ``compile_tolerance``; ``reports/gate.json`` shows the
    number applied), so the gate judges the model at the precision it ships in. A number is
    applied as written, whatever the precision.
    """

    name: str | None = None
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
    """A check whose comparison cannot be made (no ``prod`` model yet, a baseline this variant
    does not build) is ``skipped`` only when optional; otherwise it fails with the reason."""
    any_of: str | None = None
    """A group name (:mod:`tasks.twin_gate`): each check of the group must pass its own rule (no
    worse than ``tolerance``), and the group fails unless the candidate is better than the
    baseline on at least one of its checks by a paired bootstrap interval that excludes zero.
    Left out of the dump while None."""

    @model_serializer(mode="wrap")
    def _omit_no_group(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        if self.any_of is None:
            out.pop("any_of", None)
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
        if (self.threshold is None) == (self.baseline is None):
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
            against = self.baseline or (
                self.threshold if isinstance(self.threshold, str) else f"{self.threshold:g}"
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


def default_gates() -> list[dict[str, Any]]:
    """The default gates (one seed's near-OOD AUROC varies by about 3 points). The last relative
    check is a strict improvement: the text study (3 seeds, docs/study.md) found the Hydra's shift
    NLL below the single model's on every seed (default Taylor variant 0.032-0.084, circuit
    0.028-0.064), and the single model as a candidate fails it by construction: a gate that the
    model it replaces would pass is no gate. The ``any_of`` groups (:mod:`tasks.twin_gate`) hold
    the Hydra against the two cheaper models its run builds, ``single`` and ``naive_pruned``: it
    must beat each on at least one uncertainty metric by a paired bootstrap interval that
    excludes zero."""
    return [
        {"metric": "accuracy", "split": "id_test", "baseline": "single", "tolerance": 0.01},
        {"metric": "nll", "split": "id_test", "baseline": "single", "tolerance": 0.02, **_SINGLE},
        {"metric": "ece", "split": "id_test", "baseline": "single", "tolerance": 0.015, **_SINGLE},
        {"metric": "auroc", "split": "near_ood", "baseline": "deep_ensemble", "tolerance": 0.015},
        {"metric": "auroc", "split": "far_ood", "threshold": 0.98},
        {"metric": "accuracy", "split": "shift", "baseline": "single", "tolerance": 0.02},
        {"metric": "nll", "split": "shift", "baseline": "single", "min_absolute_change": 0.01}
        | _SINGLE,
        # the Hydra against its naive pruned twin (the base with the same kept heads, no
        # fine-tune: cheaper, built by the same run): better on at least one uncertainty metric
        # by a paired bootstrap interval that excludes zero, no worse beyond tolerance on any
        *({**g, "baseline": "naive_pruned", "any_of": TWIN_GROUP} for g in _TWIN_CHECKS),
        {"metric": "compile_argmax_agreement", "threshold": 1.0},
        # the compile stage's tolerance for the precision that ships (1e-4 fp32, 2e-2 bf16/fp16)
        {"metric": "compile_max_abs_diff", "threshold": COMPILE_TOLERANCE},
    ]


#: The models a run builds and judges, by the names ``metrics/evaluate.json`` keys them with: the
#: Hydra and every baseline a gate may compare with (``prod`` is not a model of the run).
CANDIDATES = ("hydra", *(b for b in BASELINES if b != "prod"))


class PromoteConfig(_Strict):
    model_name: str = Field(default="hydra", pattern=r"^[a-z][a-z0-9-]*$")
    stage: str = Field(default="prod", pattern=r"^[a-z][a-z0-9-]*$")
    candidates: list[str] = Field(default_factory=lambda: ["hydra"])
    """The candidates (:data:`CANDIDATES`) allowed to ship: of those that pass the gates, the
    cheapest ships (:mod:`tasks.candidate_gate`). Every candidate is judged either way."""

    @field_validator("candidates")
    @classmethod
    def _known_candidates(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError(f"name at least one candidate; allowed: {', '.join(CANDIDATES)}")
        for name in value:
            if name not in CANDIDATES:
                raise ValueError(f"unknown candidate {name!r}; allowed: {', '.join(CANDIDATES)}")
        if len(set(value)) != len(value):
            raise ValueError(f"a candidate is named twice: {', '.join(value)}")
        return value


def _known_profile(value: str) -> str:
    if value not in PROFILES:
        raise ValueError(f"unknown profile {value!r}; allowed: {', '.join(PROFILES)}")
    return value


ProfileName = Annotated[str, AfterValidator(_known_profile)]
"""A name in :data:`PROFILES`."""


class PipelineConfig(_Strict):
    """Root of ``params.yaml``."""

    profile: ProfileName = "default"
    """A name in :data:`PROFILES` (the profile the file was resolved from)."""
    seed: int = Field(default=0, ge=0)
    """The replicate seed: it shifts every training and scoring seed (base fine-tune, Deep
    Ensemble members, head scoring, member selection, member fine-tunes) by
    ``REPLICATE_STRIDE * seed``, so replicates share no seed; the data split (``data.seed``) and
    the bootstrap stay fixed. ``hydra-ens study`` varies this one value per replicate."""
    data: DataSpec = DataSpec()
    model: ModelConfig = ModelConfig()
    finetune: FinetuneConfig = FinetuneConfig()
    baselines: BaselinesConfig = BaselinesConfig()
    scoring: ScoringConfig = ScoringConfig()
    members: MembersConfig = MembersConfig()
    merge: MergeConfig = MergeConfig()
    compile: CompileConfig = CompileConfig()
    calibrate: CalibrateConfig = CalibrateConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    gates: list[GateCheck] = Field(
        default_factory=lambda: [GateCheck(**g) for g in default_gates()]
    )
    promote: PromoteConfig = PromoteConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    _root: Path | None = PrivateAttr(default=None)
    """The project folder relative paths are read from (validation context ``root``; None: the
    current folder, which is the project's in a stage)."""

    def __eq__(self, other: object) -> bool:
        """Equal params are equal configs, whichever folder they were read from (``_root``)."""
        if not isinstance(other, PipelineConfig):
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
    def family(self) -> str:
        if self.model.family != "auto":
            return self.model.family
        return "timm_vit" if self.modality == "image" else "bert"

    @property
    def model_shape(self) -> tuple[int, int]:
        """``(layers, heads per layer)`` of the base model: ``model.vit``'s for the timm ViT,
        MiniLM-L6's (6, 12) for the default text model, else ``model.path``'s ``config.json``'s
        (ConfigError naming ``model.path`` when it cannot be read)."""
        if self.family == "timm_vit":
            return self.model.vit.depth, self.model.vit.num_heads
        try:
            return _text_model_shape(self.model_dir)
        except ValueError as err:
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
        return 1e-3 if self.family == "timm_vit" else 5e-5

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

    @property
    def deep_ensemble_size(self) -> int:
        return self.baselines.deep_ensemble_size or self.members.num_members

    @model_validator(mode="after")
    def _cross_checks(self, info: ValidationInfo) -> PipelineConfig:
        self._root = (info.context or {}).get("root")
        problems: list[tuple[str, str]] = []
        modality = self.modality
        if self.model.family == "bert" and modality == "image":
            problems.append(("model.family", "'bert' needs a text data.source"))
        if self.model.family == "timm_vit" and modality == "text":
            problems.append(("model.family", "'timm_vit' needs an image data.source"))
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
        shape_known = True
        if self.model_dir and not Path(self.model_dir).exists():
            problems.append(("model.path", f"{self.model.path!r} does not exist"))
            shape_known = self.family == "timm_vit"
        elif self.family != "timm_vit":
            try:
                _text_model_shape(self.model_dir)
            except ValueError as err:
                problems.append(("model.path", str(err)))
                shape_known = False
        vit = self.model.vit
        if self.family == "timm_vit":
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


#: Profiles: overrides applied on top of the defaults. ``quick`` is for tests and smoke runs.
PROFILES: dict[str, dict[str, Any]] = {
    "default": {},
    "quick": {
        "data": {"max_per_split": 160, "far_ood_size": 100},
        "model": {"max_length": 32},
        "finetune": {"epochs": 1, "batch_size": 16},
        "scoring": {"max_batches": 1, "batch_size": 16},
        "baselines": {"deep_ensemble_size": 2, "mc_dropout": {"samples": 4}},
        "members": {"finetune": {"epochs": 1}},
        "compile": {"backend": "eager"},
        "evaluate": {
            "bootstrap_samples": 100,
            "latency_repeats": 2,
            "latency_batch": 8,
            "cost_rounds": 3,
        },
    },
}


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Recursive dict merge; lists and scalars in ``override`` replace those in ``base``."""
    out = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


#: Lists a dotted key may index into before the raw mapping holds them (their defaults).
LIST_DEFAULTS: dict[str, Any] = {"gates": default_gates}

#: Fields of a gate derived from the others when not given (``GateCheck._check``).
_DERIVED_GATE_FIELDS = ("name", "greater_is_better")


def _list_index(items: list[Any], key: str, dotted: str, where: str) -> int:
    """``key`` as an index into ``items``; ConfigError naming ``dotted`` when it is not one."""
    allowed = f"0..{len(items) - 1}" if items else "none, it is empty"
    if not key.isdigit():
        raise ConfigError(
            f"params: {dotted}: {where} is a list, {key!r} is not an index (allowed: {allowed})"
        )
    index = int(key)
    if index >= len(items):
        raise ConfigError(
            f"params: {dotted}: index {index} is past the end of {where} "
            f"({len(items)} entries, allowed: {allowed})"
        )
    return index


def _drop_derived_gate_fields(gate: dict[str, Any]) -> None:
    """Forget the name/direction a gate holds at their derived values, so that editing the gate's
    metric or baseline derives them anew instead of keeping the old metric's."""
    try:
        auto = GateCheck(**{k: v for k, v in gate.items() if k not in _DERIVED_GATE_FIELDS})
    except (ValidationError, TypeError):
        return
    for key in _DERIVED_GATE_FIELDS:
        if key in gate and gate[key] == getattr(auto, key):
            del gate[key]


def set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    """``set_dotted(d, "a.b", 1)`` sets ``d["a"]["b"] = 1``, creating dicts on the way.

    An integer key indexes an existing list: ``gates.0.metric`` edits the first gate (the
    default gates when ``raw`` has none); an index past the end is a ConfigError. Editing a
    gate's field re-derives its ``name`` and ``greater_is_better`` unless they were set by hand.
    """
    keys = dotted.split(".")
    node: Any = raw
    where: list[str] = []
    for key in keys[:-1]:
        if isinstance(node, list):
            node = node[_list_index(node, key, dotted, ".".join(where))]
        else:
            if key not in node and not where and key in LIST_DEFAULTS:
                node[key] = copy.deepcopy(LIST_DEFAULTS[key]())
            node = node.setdefault(key, {})
        where.append(key)
        if not isinstance(node, dict | list):
            raise ConfigError(f"params: {dotted}: {'.'.join(where)!r} is not a section")
    last = keys[-1]
    if isinstance(node, list):
        node[_list_index(node, last, dotted, ".".join(where))] = value
        return
    if where and where[0] == "gates" and len(where) == 2 and last not in _DERIVED_GATE_FIELDS:
        _drop_derived_gate_fields(node)
    node[last] = value


def _section_model(annotation: Any) -> Any:
    """The pydantic model an annotation holds (``X``, ``X | None``, ``list[X]``), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        if (found := _section_model(arg)) is not None:
            return found
    return None


def _known_keys(model: Any, prefix: str = "") -> list[str]:
    """Every dotted key of ``model``'s sections (lists such as ``gates`` not entered)."""
    keys = []
    for name, field in model.model_fields.items():
        section = _section_model(field.annotation)
        inner = typing.get_origin(field.annotation) is not list
        keys += _known_keys(section, f"{prefix}{name}.") if section and inner else []
        keys.append(f"{prefix}{name}")
    return keys


def _leaves(value: Any, prefix: str) -> list[str]:
    if isinstance(value, Mapping) and value:
        return [leaf for k, v in value.items() for leaf in _leaves(v, f"{prefix}.{k}")]
    return [prefix]


def did_you_mean(loc: Sequence[Any], given: Any = None) -> str:
    """`` (did you mean 'epochs'?)`` for the unknown key at ``loc`` (a validation error's path)
    holding ``given``: a key of its own section spelt closely enough
    (:func:`difflib.get_close_matches`), else the keys anywhere whose last part is close to the
    last part of what was given (``train.epoch`` -> ``finetune.epochs``), else ``""``."""
    import difflib

    model: Any = PipelineConfig
    for part in loc[:-1]:
        if isinstance(part, int):  # an index into a list: the model is already its item's
            continue
        field = model.model_fields.get(part)
        model = _section_model(field.annotation) if field is not None else None
        if model is None:
            return ""
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1)
    if not close and not any(isinstance(p, int) for p in loc):
        known = _known_keys(PipelineConfig)
        by_leaf: dict[str, list[str]] = {}
        for key in known:
            by_leaf.setdefault(key.rsplit(".", 1)[-1], []).append(key)
        for leaf in _leaves(given, ".".join(str(p) for p in loc)):
            for name in difflib.get_close_matches(leaf.rsplit(".", 1)[-1], list(by_leaf), n=1):
                close += difflib.get_close_matches(leaf, by_leaf[name], n=3, cutoff=0)
    if not close:
        return ""
    return f" (did you mean {' or '.join(repr(c) for c in dict.fromkeys(close))}?)"


def _format_errors(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key" + did_you_mean(e["loc"], e.get("input"))
        elif (
            e["type"] != "value_error" and "input" in e and not isinstance(e["input"], dict | list)
        ):
            msg = f"{msg} (got {e['input']!r})"
        if "@" in msg and ": " in msg:  # cross-checks name their own keys
            for part in msg.split("; "):
                key, _, text = part.partition(": ")
                lines.append(f"{source}: {key.lstrip('@')}: {text}")
            continue
        named = re.search(r"needs '(\w+)'", msg)  # "data source 'csv' needs 'path'" -> data.path
        if named and e["type"] == "value_error":
            loc = f"{loc}.{named.group(1)}" if loc else named.group(1)
        lines.append(f"{source}: {loc or '<root>'}: {msg}")
    return "\n".join(lines)


def validate_params(
    raw: Mapping[str, Any] | None, source: str = "params.yaml", root: Path | None = None
) -> PipelineConfig:
    """Validate a raw params mapping; raise :class:`ConfigError` with one line per problem.
    ``root``: the project folder its relative paths are checked in (None: the current folder;
    :meth:`PipelineConfig.project_path`)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: <root>: must be a mapping, got {type(raw).__name__}")
    try:
        return PipelineConfig.model_validate(dict(raw), context={"root": root})
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None


def resolve_params(
    profile: str = "default",
    overrides: Mapping[str, Any] | None = None,
    sets: Mapping[str, Any] | None = None,
    root: Path | None = None,
) -> PipelineConfig:
    """Defaults, then the data source's defaults, then ``PROFILES[profile]``, then ``overrides``
    (a params file), then ``sets``; validated with relative paths checked in the project folder
    ``root`` (:func:`validate_params`).

    The source defaults (:data:`tasks.source_defaults.SOURCE_DEFAULTS`, e.g. the ViT shape and
    epochs of ``mnist5k``) are those of the ``data.name`` the later layers resolve to; every
    later layer wins over them, so ``--profile quick`` still shrinks an image run.
    """
    from tasks.source_defaults import source_defaults

    if profile not in PROFILES:
        raise ConfigError(f"profile: unknown profile {profile!r}; allowed: {', '.join(PROFILES)}")
    raw = deep_merge({"profile": profile}, PROFILES[profile])
    if overrides:
        raw = deep_merge(raw, overrides)
    for dotted, value in (sets or {}).items():
        set_dotted(raw, dotted, value)
    raw = deep_merge(source_defaults(raw), raw)
    return validate_params(raw, source="params", root=root)


def apply_sets(
    current: Mapping[str, Any], sets: Mapping[str, Any], root: Path | None = None
) -> PipelineConfig:
    """``--set`` values applied to a resolved params mapping (what ``hydra-ens run --set`` does),
    of the project in ``root`` (:func:`validate_params`).

    The values the mapping holds at its own resolved defaults follow the new resolution, so
    changing ``data.name`` swaps the source defaults (``mnist5k`` brings its ViT shape and
    epochs, a text source drops them); every value the user changed by hand is kept.
    """
    from tasks.source_defaults import source_defaults

    current_raw = to_raw(validate_params(current, source="params.yaml", root=root))
    profile, data = current_raw["profile"], current_raw["data"]
    # the file's own resolution: its profile and data section over the defaults
    reference = to_raw(resolve_params(profile, {"data": data}, root=root))
    # its data values at the source's defaults (e.g. fashion-mnist's max_per_split) follow too
    data_reference = deep_merge(
        deep_merge(DataSpec().to_dict(), source_defaults({"data": data}).get("data", {})),
        PROFILES[profile].get("data", {}),
    )
    changed = _changed(current_raw, reference) | {
        "data": _changed(data, data_reference) | {"name": data["name"]}
    }
    return resolve_params(profile, changed, sets, root=root)


def _changed(values: Mapping[str, Any], reference: Mapping[str, Any]) -> dict[str, Any]:
    """The leaves of ``values`` that differ from ``reference`` (lists compared whole)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        ref = reference.get(key)
        if isinstance(value, Mapping) and isinstance(ref, Mapping):
            inner = _changed(value, ref)
            if inner:
                out[key] = inner
        elif key not in reference or value != ref:
            out[key] = copy.deepcopy(value)
    return out


def read_yaml(path: str | os.PathLike[str]) -> Any:
    """The YAML document in ``path``; ConfigError (one line naming the file) when it is missing,
    not UTF-8 or not valid YAML."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: file not found")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); "
            "save it as UTF-8"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {str(err).splitlines()[0]}") from None


def load_params(path: str | os.PathLike[str] = "params.yaml") -> PipelineConfig:
    """Read and validate a params file; its relative paths are relative to its folder (the
    project's)."""
    return validate_params(read_yaml(path), source=Path(path).name, root=Path(path).parent)


def to_raw(cfg: PipelineConfig) -> dict[str, Any]:
    """Fully resolved plain-dict form (what ``params.yaml`` holds)."""
    return cfg.model_dump(mode="json")


def write_params(cfg: PipelineConfig, path: str | os.PathLike[str] = "params.yaml") -> Path:
    """Write the resolved config atomically, in a stable key order."""
    path = Path(path)
    text = (
        "# Resolved pipeline parameters (validated by tasks.params). Regenerate with\n"
        "# `hydra-ens run --profile NAME [--params FILE] [--set key=value]` or edit by hand.\n"
        + yaml.safe_dump(to_raw(cfg), sort_keys=False, default_flow_style=None, width=100)
    )
    atomic_write_bytes(path, text.encode(), keep_suffix=False)
    return path
