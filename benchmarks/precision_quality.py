"""Quality of a Hydra served in bf16 / fp16 against the same Hydra in fp32, on a finished project.

The compile stage checks that a lower-precision artifact agrees with eager fp32 (max |dp|, argmax);
this measures what the gates would see: NLL, ECE (ID test and shift) and near/far-OOD AUROC of the
calibrated Hydra at each precision, and the paired bootstrap interval of (precision - fp32) on the
same examples. The Hydra runs as a shipped lower-precision artifact computes: weights and inputs
cast to the precision (``tasks.candidates``), the stored temperature and OOD score.

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


def _logits(hydra, batches: dict, precision: str) -> dict:
    import torch

    from hydra_ops.compile import DTYPES, cast_batch
    from hydra_ops.inference import logits

    model = hydra if precision == "fp32" else hydra.to(DTYPES[precision])
    with torch.no_grad():
        return {
            s: logits(model, [cast_batch(b, precision) for b in bs], device="cpu")
            for s, bs in batches.items()
        }


def compare(
    project: Path,
    precisions: list[str],
    n_resamples: int = 1000,
    cfg: PipelineConfig | None = None,
) -> dict:
    """``{precision: {"max_abs_dp": float, metric: {difference, low, high, inside}}}``: the
    paired bootstrap of (precision - fp32) per metric; ``inside``: the interval brackets 0.
    ``cfg``: the project's params (default: its ``params.yaml``)."""
    import copy

    from hydra_ops import metrics as hm
    from hydra_ops.bootstrap import paired_bootstrap, paired_bootstrap_ood
    from hydra_ops.calibration import apply_temperature, ensemble_log_probs
    from hydra_ops.data import split_labels
    from hydra_ops.serialization import load_hydra
    from hydra_ops.uncertainty import calibrated_ood_score
    from tasks import data as prepared
    from tasks.baseline_models import eval_batches
    from tasks.common import HYDRA
    from tasks.params import load_params

    cfg = cfg or load_params(project / "params.yaml")
    hydra = load_hydra(project / HYDRA)
    t = float(hydra.temperature)
    batches = {s: b for s, b in eval_batches(cfg, project).items() if s in ("test", "shift", *OOD)}
    labels = {s: split_labels(prepared.split(project, s)) for s, _ in CLASSIFICATION}
    ref = _logits(hydra, batches, "fp32")
    out: dict = {"temperature": t, "ood_score": cfg.evaluate.ood_score}
    for precision in precisions:
        low = _logits(copy.deepcopy(hydra), batches, precision)
        rows = {}
        for split, key in CLASSIFICATION:
            pa = apply_temperature(ensemble_log_probs(low[split]), t)
            pb = apply_temperature(ensemble_log_probs(ref[split]), t)
            for metric in ("nll", "ece", "accuracy"):
                r = paired_bootstrap(
                    getattr(hm, metric), pa, pb, labels[split], n_resamples=n_resamples
                )
                rows[f"{key}.{metric}"] = r
        score = lambda lg: calibrated_ood_score(lg, t, cfg.evaluate.ood_score)  # noqa: E731
        for split in OOD:
            r = paired_bootstrap_ood(
                hm.auroc,
                score(low["test"]),
                score(low[split]),
                score(ref["test"]),
                score(ref[split]),
                n_resamples=n_resamples,
            )
            rows[f"{split}.auroc"] = r
        max_dp = max(
            (
                apply_temperature(ensemble_log_probs(low[s]), t).exp()
                - apply_temperature(ensemble_log_probs(ref[s]), t).exp()
            )
            .abs()
            .max()
            .item()
            for s in batches
        )
        out[precision] = {
            "max_abs_dp": max_dp,
            **{
                k: {
                    "difference": r.point_difference,
                    "low": r.low,
                    "high": r.high,
                    "inside": r.low <= 0.0 <= r.high,
                }
                for k, r in rows.items()
            },
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
