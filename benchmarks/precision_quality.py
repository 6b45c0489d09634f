"""Quality of a Hydra served in bf16 / fp16 against the same Hydra in fp32, on a finished project.

The compile stage checks that a lower-precision artifact agrees with eager fp32 (max |dp|, argmax)
on a few held-out batches; this repeats that check over every evaluated example and measures what
the gates would see: NLL, ECE (ID test and shift) and near/far-OOD AUROC of the
calibrated Hydra at each precision, and the paired bootstrap interval of (precision - fp32) on the
same examples. The Hydra runs as a shipped lower-precision artifact computes: weights and inputs
cast to the precision (``tasks.candidates.compared``), the stored temperature and OOD score.

Usage, in a project after ``hydra-ens run`` (any machine: the numbers do not depend on its speed,
but bf16 kernels differ between CPU kinds and GPUs, so record which one)::

    python -m benchmarks.precision_quality --project . --precisions bf16 --out results.json
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from tasks.params import PipelineConfig

app = typer.Typer(add_completion=False)

CLASSIFICATION = (("test", "id_test"), ("shift", "shift"))
OOD = ("near_ood", "far_ood")
PROJECT_OPTION = typer.Option(Path("."), help="a project after `hydra-ens run`")
OUT_OPTION = typer.Option(None, help="write the result as JSON here")


def compare(
    project: Path,
    precisions: list[str],
    n_resamples: int = 1000,
    cfg: PipelineConfig | None = None,
) -> dict:
    """``{precision: {"compile_check": ..., metric: {difference, low, high, inside}}}``: the
    paired bootstrap of (precision - fp32) per metric (``inside``: the interval brackets 0), and
    :func:`hydra_ops.compile.compare_logits` (compile's own agreement check, at its default
    tolerance for the precision) over every evaluated example.
    ``cfg``: the project's params (default: its ``params.yaml``)."""
    import copy

    import torch

    from hydra_ops import metrics as hm
    from hydra_ops.compile import compare_logits, default_tolerance
    from hydra_ops.data import split_labels
    from hydra_ops.hydra.serialization import load_hydra
    from hydra_ops.metrics.bootstrap import paired_bootstrap, paired_bootstrap_ood
    from hydra_ops.models.runtime import Runtime
    from hydra_ops.uq.calibrated import calibrated_ood_score
    from hydra_ops.uq.calibration import ensemble_probs
    from tasks.candidates.baseline_models import eval_batches
    from tasks.candidates.compared import shipped_logits
    from tasks.params import load_params
    from tasks.runtime import data as prepared
    from tasks.runtime.layout import HYDRA

    cfg = cfg or load_params(project / "params.yaml")
    hydra = load_hydra(project / HYDRA)
    t = float(hydra.temperature)
    splits = ("test", "shift", *OOD)
    batches = {s: b for s, b in eval_batches(cfg, project).items() if s in splits}
    labels = {s: split_labels(prepared.split(project, s)) for s, _ in CLASSIFICATION}

    def outputs(precision: str) -> tuple[dict, dict]:
        """(member logits, calibrated probabilities) per split at ``precision``."""
        run = shipped_logits(copy.deepcopy(hydra), precision, Runtime())
        logits = {s: torch.cat([run(b) for b in bs]) for s, bs in batches.items()}
        probs = {s: ensemble_probs(lg, t) for s, lg in logits.items()}
        return logits, probs

    def score(member_logits: torch.Tensor) -> torch.Tensor:
        return calibrated_ood_score(member_logits, t, cfg.evaluate.ood_score)

    ref_logits, ref_probs = outputs("fp32")
    out: dict = {"temperature": t, "ood_score": cfg.evaluate.ood_score}
    for precision in precisions:
        low_logits, low_probs = outputs(precision)
        rows = {
            f"{key}.{metric}": paired_bootstrap(
                getattr(hm, metric),
                low_probs[split],
                ref_probs[split],
                labels[split],
                n_resamples=n_resamples,
            )
            for split, key in CLASSIFICATION
            for metric in ("nll", "ece", "accuracy")
        }
        for split in OOD:
            rows[f"{split}.auroc"] = paired_bootstrap_ood(
                hm.auroc,
                score(low_logits["test"]),
                score(low_logits[split]),
                score(ref_logits["test"]),
                score(ref_logits[split]),
                n_resamples=n_resamples,
            )
        # compile's own check of an artifact, over every evaluated example (raw probabilities)
        agreement = compare_logits(
            torch.cat([ref_logits[s] for s in splits]),
            torch.cat([low_logits[s] for s in splits]),
            default_tolerance(precision),
            min_agreement=1.0,
        )
        out[precision] = {"compile_check": agreement} | {
            k: {
                "difference": r.point_difference,
                "low": r.low,
                "high": r.high,
                "inside": r.low <= 0.0 <= r.high,
            }
            for k, r in rows.items()
        }
    return out


@app.command()
def main(
    project: Path = PROJECT_OPTION,
    precisions: str = typer.Option("bf16", help="comma list of bf16, fp16"),
    n_resamples: int = typer.Option(1000, help="paired bootstrap resamples"),
    out: Path | None = OUT_OPTION,
) -> None:
    """Print (and optionally write) the precision-vs-fp32 quality comparison."""
    chosen = [p.strip() for p in precisions.split(",") if p.strip()]
    bad = [p for p in chosen if p not in ("bf16", "fp16")]
    if bad or not chosen:
        raise typer.BadParameter(f"precisions: bf16 and/or fp16, got {precisions!r}")
    if not (project / "models" / "hydra").is_dir():
        raise typer.BadParameter(f"{project}: no models/hydra; run `hydra-ens run` there first")
    result = compare(project.resolve(), chosen, n_resamples)
    text = json.dumps(result, indent=2)
    if out:
        out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    app()
