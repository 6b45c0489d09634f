"""``hydra-ens predict``: the prod model, resolved through the registry, on texts or image files.

One row per input, every number from the ONE calibrated prediction the gates judged
(``hydra_ops.uq.calibrated.calibrated_uncertainty``) on inputs prepared with the bundle's own
preprocessing (:mod:`tasks.release.preprocessing`: tokenizer and ``max_length``, or image size,
channels and normalisation; a workspace ``params.yaml`` that disagrees is ignored, and every row
says which preprocessing and version answered): the predicted class, its probability, the
entropy of that prediction, the mutual information and member disagreement, the OOD score of the
evaluate stage, and a verdict (``ok`` / ``uncertain`` / ``likely_ood``) from the thresholds the
calibrate stage fitted on ID validation scores (``hydra_ops.uq.ood_thresholds``). The row schema
(:data:`SCHEMA_VERSION`, what ``--json`` prints) is documented in docs/pipeline.md, "predict".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from hydra_ops.uq.ood_thresholds import VERDICT_LABELS, OodThresholds, verdicts
from tasks.params.schema import PipelineConfig
from tasks.release.preprocessing import Preprocessing

SCHEMA_VERSION = 1
"""Version of the row schema; bumped when a field is removed, renamed or changes meaning."""

ROW_FIELDS = (
    "schema_version",
    "answered_by",
    "model_version",
    "input",
    "class",
    "class_index",
    "prob",
    "entropy",
    "max_entropy",
    "mutual_information",
    "disagreement",
    "ood_score",
    "ood_score_kind",
    "verdict",
    "preprocessing",
    "candidate",
    "unavailable",
)
"""Keys of every row, in order."""


def score_meaning(kind: str) -> str:
    """What the OOD score ``kind`` measures (always higher = more OOD): the ``meaning`` its
    criterion declares in ``hydra_ops.uq.ood_criteria.OOD_CRITERIA``."""
    from hydra_ops.uq.ood_criteria import OOD_CRITERIA

    return (OOD_CRITERIA.get(kind).meaning or "?") if kind in OOD_CRITERIA else "?"


def validate_inputs(inputs: Sequence[str] | None) -> list[str]:
    """The inputs as a list, or a one-line ValueError naming ``inputs`` (none, or a blank one)."""
    if not inputs:
        raise ValueError("inputs: give at least one text (or image file for image models)")
    for i, text in enumerate(inputs):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(
                f"inputs[{i}]: empty or whitespace-only input {text!r}; give a non-empty text "
                "(or image file)"
            )
    return list(inputs)


def rows_from_member_logits(
    inputs: Sequence[str],
    member_logits: torch.Tensor,
    *,
    temperature: float,
    class_names: Sequence[str] | None,
    thresholds: OodThresholds | None,
    default_score_kind: str = "msp",
    answered_by: str = "eager",
    model_version: str | None = None,
    preprocessing: str | None = None,
    candidate: str = "hydra",
    unavailable: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The rows of ``hydra-ens predict`` (pure: no model, no files).

    Args:
        inputs: the N inputs as given (texts or image paths), echoed in ``input``.
        member_logits: [N, M, C] member logits of those inputs.
        temperature: the model's calibration temperature ``T``.
        class_names: C names (``None``: ``"0"``, ``"1"``, ...).
        thresholds: the verdict thresholds stored in the model; their ``score`` is the score
            computed (verdicts are only meaningful on the score they were fitted on). ``None``
            (a model calibrated before thresholds existed): ``default_score_kind`` and verdict
            ``None``.
        default_score_kind: the score when ``thresholds`` is ``None``.
        answered_by: which runtime produced ``member_logits`` (``Served.answered_by``).
        model_version: the registry version (e.g. ``v0.0.3``), echoed.
        preprocessing: what made the model inputs (``Preprocessing.describe()`` of the bundle),
            echoed.
        candidate: the candidate that answers (``promote.candidates``; ``hydra`` by default),
            echoed.
        unavailable: ``{column: why}`` for the columns this model cannot give (a single model's
            ``mutual_information`` and ``disagreement``, a ``verdict`` without thresholds): they
            are ``None`` in every row and ``unavailable`` says why, never a made-up value.

    Returns:
        N dicts with the keys :data:`ROW_FIELDS` (types and units in docs/pipeline.md).
    """
    from hydra_ops.uq.calibrated import calibrated_uncertainty

    if member_logits.ndim != 3 or member_logits.shape[0] != len(inputs):
        raise ValueError(
            f"member_logits must have shape [{len(inputs)}, M, C] (one row per input), got "
            f"{tuple(member_logits.shape)}"
        )
    c = member_logits.shape[2]
    names = list(class_names) if class_names else [str(i) for i in range(c)]
    if len(names) != c:
        raise ValueError(f"class_names must have {c} names (the model's classes), got {len(names)}")
    kind = thresholds.score if thresholds is not None else default_score_kind
    missing = dict(unavailable or {})
    unknown = set(missing) - set(ROW_FIELDS)
    if unknown:
        raise ValueError(f"unavailable names no row column: {', '.join(sorted(unknown))}")
    unc = calibrated_uncertainty(member_logits, temperature, kind)
    found: list[str | None] = (
        list(verdicts(unc.ood_score, thresholds))
        if thresholds is not None
        else [None] * len(inputs)
    )
    rows = []
    for i, text in enumerate(inputs):
        k = int(unc.predicted[i])
        rows.append(
            {
                "schema_version": SCHEMA_VERSION,
                "answered_by": answered_by,
                "model_version": model_version,
                "input": text,
                "class": names[k],
                "class_index": k,
                "prob": float(unc.prob[i]),
                "entropy": float(unc.entropy[i]),
                "max_entropy": unc.max_entropy,
                "mutual_information": float(unc.mutual_information[i]),
                "disagreement": float(unc.disagreement[i]),
                "ood_score": float(unc.ood_score[i]),
                "ood_score_kind": kind,
                "verdict": found[i],
                "preprocessing": preprocessing,
                "candidate": candidate,
                "unavailable": dict(missing),
            }
        )
        rows[-1].update(dict.fromkeys(missing))
    return rows


def legend(
    num_classes: int, num_members: int, score_kind: str, thresholds: OodThresholds | None
) -> str:
    """One line under the table: units of every column and the verdict thresholds."""
    head = (
        f"entropy, MI (mutual_information): nats (max ln C = {math.log(num_classes):.3f} for these "
        f"{num_classes} classes); disagree(ment): fraction of the {num_members} members voting "
        f"for another class; ood_score: {score_kind} = {score_meaning(score_kind)}, "
        "higher = more OOD"
        + (" (in --json only: the table's prob says it); " if score_kind == "msp" else "; ")
    )
    if thresholds is None:
        return head + "verdict: n/a (this model stores no thresholds; re-run calibrate)"
    return head + (
        f"verdict: ok <= {thresholds.uncertain:.4g} < uncertain <= {thresholds.likely_ood:.4g} "
        f"< {VERDICT_LABELS['likely_ood']} ({thresholds.uncertain_quantile:.0%} / "
        f"{thresholds.likely_ood_quantile:.0%} of {thresholds.n} ID {thresholds.fitted_on} "
        "scores stay under each)"
    )


def _batch(preprocessing: Preprocessing, inputs: list[str]) -> dict[str, torch.Tensor]:
    """The batch of ``inputs`` made with the bundle's own preprocessing (its tokenizer and
    ``max_length``, or image size, channels and normalisation), never ``params.yaml``'s."""
    return preprocessing.batch(inputs)


def _member_logits(served: Any, batch: dict[str, torch.Tensor], runtime: Any) -> torch.Tensor:
    """``[B, M, C]`` from the bundle: a compiled artifact runs where it was built; the eager model
    runs on ``runtime`` (on the CPU in fp32 exactly as ``Served.member_logits``)."""
    from hydra_ops.models.inference import logits

    if runtime.is_default or not served.answered_by.startswith("eager"):
        return served.member_logits(batch)
    out = logits(served.hydra, [batch], device=runtime.device, precision=runtime.precision)
    served.answered_by = f"{served.answered_by} on {runtime.device} {runtime.precision}"
    return out


def predict(
    cfg: PipelineConfig, root: Path, inputs: list[str], device: str | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows for ``inputs`` from the model in ``cfg.promote.stage``, and the registry record with
    ``legend`` (the one-line units/thresholds text) added. ``device``: where the eager model runs
    (None: ``cfg.runtime.device``; precision: ``cfg.runtime.precision``, ``auto`` = fp32); a
    compiled artifact runs on the device it was compiled for."""
    from hydra_ops.models.runtime import Runtime
    from tasks.release.model_registry import resolve_prod_dir
    from tasks.serving.served import load_served

    inputs = validate_inputs(inputs)
    runtime = Runtime.from_spec(device or cfg.runtime.device, cfg.runtime.precision)
    bundle_dir, prod = resolve_prod_dir(root, cfg.promote.model_name, cfg.promote.stage)
    served = load_served(bundle_dir)
    stored = served.metadata.get("ood_thresholds")
    thresholds = OodThresholds.from_metadata(stored) if stored is not None else None
    member_logits = _member_logits(served, _batch(served.preprocessing, inputs), runtime)
    rows = rows_from_member_logits(
        inputs,
        member_logits,
        temperature=float(served.hydra.temperature),
        class_names=served.hydra.class_names,
        thresholds=thresholds,
        default_score_kind=cfg.evaluate.ood_score,
        answered_by=served.answered_by,
        model_version=prod.get("version"),
        preprocessing=served.preprocessing.describe(),
        candidate=getattr(served, "candidate", "hydra"),
        unavailable=getattr(served, "unavailable", None),
    )
    kind = rows[0]["ood_score_kind"]
    text = legend(member_logits.shape[2], member_logits.shape[1], kind, thresholds)
    return rows, {**prod, "legend": text}


def predict_here(
    root: Path, inputs: list[str], device: str | None = None
) -> tuple[list[dict[str, Any]], str, str]:
    """``hydra-ens predict`` without a running service: the rows of :func:`predict` for the
    project in ``root`` (its ``params.yaml``), the legend, and the table's title (model,
    version, stage, what answered, the preprocessing)."""
    from tasks.params.schema import load_params

    cfg = load_params(root / "params.yaml")
    rows, info = predict(cfg, root, inputs, device=device)
    title = (
        f"{cfg.promote.model_name} {info['version']} ({cfg.promote.stage}), answered by "
        f"{rows[0]['answered_by']}; preprocessing: {rows[0]['preprocessing']}"
    )
    return rows, info["legend"], title
