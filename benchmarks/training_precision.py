"""What bf16 training changes in quality: the same models of two finished projects, one trained in
fp32 (A) and one in bf16 (B), scored on the same examples at fp32 inference.

Both projects must hold the same prepared data (equal manifests, so every split file has the same
sha256; refused otherwise). Models compared, where both projects have them: ``single`` (the
fine-tuned base), ``deep_ensemble`` (the base plus ``models/baselines``) and ``hydra`` (the eager
calibrated Hydra of ``models/hydra`` at its stored temperature, not the compiled artifact). Each
project's models run on the CPU in fp32 (no autocast, whatever ``runtime.precision`` its stages
used), on its own batches of ``evaluate.batch_size`` (its ``params.yaml``), so only the training
differs. ``single`` and ``deep_ensemble`` get the temperature ``evaluate`` fits on ``val``.

Reported per model: the calibrated metrics the default gates watch (accuracy, NLL, ECE on ID test
and shift; AUROC on near- and far-OOD, ID test as negatives, score ``evaluate.ood_score`` of A's
params) for A and B, and the paired bootstrap interval of B - A
(:func:`tasks.evaluation.scorecard.paired_intervals`: A and B share every resample's indices; ID
test / shift examples resampled with replacement, OOD metrics resample ID and OOD examples
independently of each other). The intervals cover the sampling of test examples within one data
split and one training seed: they say nothing about how another seed or split would move either
model.

Usage, with two finished ``hydra-ens run`` projects on the same data::

    python -m benchmarks.training_precision --fp32 A --bf16 B \\
        --json results.json --markdown results.md
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from tasks.params import PipelineConfig

app = typer.Typer(add_completion=False)

MODELS = ("single", "deep_ensemble", "hydra")
#: (split key, metric) pairs of the default gates, in table order.
WATCHED = (
    ("id_test", "accuracy"),
    ("id_test", "nll"),
    ("id_test", "ece"),
    ("shift", "accuracy"),
    ("shift", "nll"),
    ("shift", "ece"),
    ("near_ood", "auroc"),
    ("far_ood", "auroc"),
)
SPLITS = ("val", "test", "shift", "near_ood", "far_ood")


def check_same_data(a: Path, b: Path) -> None:
    """ValueError (one line) unless ``a`` and ``b`` hold the same prepared data manifest."""
    from tasks.runtime import data as prepared

    if prepared.manifest(a) != prepared.manifest(b):
        raise ValueError(
            f"{a} and {b} hold different prepared data (data/prepared/manifest.json differs): "
            "the models would not be scored on the same examples"
        )


def trained_precisions(root: Path) -> dict[str, Any]:
    """What identifies each model and the precision its training recorded: ``base`` and every
    Deep Ensemble unit (``checkpoint.json``), the Hydra (``hydra.json``'s ``metadata.precisions``,
    per fine-tuning stage; None where not recorded), each with its weights' sha256."""
    from hydra_ops.hydra.serialization import read_hydra_config
    from hydra_ops.models.checkpoints import read_checkpoint_metadata
    from tasks.runtime.layout import BASE, BASELINES, HYDRA
    from tasks.runtime.outputs import read_json

    def record(directory: Path) -> dict[str, Any]:
        meta = read_checkpoint_metadata(directory)
        runtime = meta.get("metadata", {}).get("runtime", {})
        return {"precision": runtime.get("precision"), "weights_sha256": meta["weights_sha256"]}

    units = read_json(root / BASELINES / "index.json", "finetune_baselines output")["units"]
    out: dict[str, Any] = {
        "base": record(root / BASE),
        # the Deep Ensemble's seeds; the efficient baselines' units keep no checkpoint.json
        "baselines": {u: record(root / BASELINES / u) for u in units if u.startswith("seed_")},
    }
    if (root / HYDRA).is_dir():
        config = read_hydra_config(root / HYDRA)
        out["hydra"] = {
            "precisions": config.get("metadata", {}).get("precisions"),
            "weights_sha256": config.get("weights_sha256"),
        }
    return out


def fp32_outputs(cfg: PipelineConfig, root: Path) -> dict[str, dict[str, Any]]:
    """``{model: {"outputs": {split: [N, M, C] member logits}, "temperature": float}}`` of the
    project at ``root``, every model on the CPU in fp32 (module docstring)."""
    from hydra_ops.data import split_labels
    from hydra_ops.hydra.serialization import load_hydra
    from hydra_ops.models.inference import logits as run_logits
    from hydra_ops.models.runtime import Runtime
    from hydra_ops.uq.calibration import ensemble_log_probs, fit_temperature
    from tasks.candidates.baseline_models import eval_batches, seed_baselines
    from tasks.runtime import data as prepared
    from tasks.runtime.layout import HYDRA

    fp32 = Runtime()
    batches = {s: b for s, b in eval_batches(cfg, root, fp32).items() if s in SPLITS}
    val_labels = split_labels(prepared.split(root, "val"))
    result: dict[str, dict[str, Any]] = {}
    for cand in seed_baselines(cfg, root, fp32):
        if cand.name not in MODELS:
            continue
        outputs = {s: cand.member_logits(b) for s, b in batches.items()}
        t = fit_temperature(ensemble_log_probs(outputs["val"]), val_labels)
        result[cand.name] = {"outputs": outputs, "temperature": float(t)}
    if (root / HYDRA).is_dir():
        hydra = load_hydra(root / HYDRA)
        outputs = {s: run_logits(hydra, b, device=fp32.device) for s, b in batches.items()}
        result["hydra"] = {"outputs": outputs, "temperature": float(hydra.temperature)}
    return result


def compare(
    fp32_root: Path,
    bf16_root: Path,
    n_resamples: int = 1000,
    cfgs: tuple[PipelineConfig, PipelineConfig] | None = None,
) -> dict[str, Any]:
    """The comparison of the module docstring as a JSON-able dict: ``models[name][key]`` for
    ``key`` ``"<split>.<metric>"`` of :data:`WATCHED` holds ``fp32``, ``bf16`` (the metric of A
    and B) and ``difference``, ``low``, ``high`` (B - A, its 95% paired bootstrap interval).
    ``cfgs``: the two projects' params (default: their ``params.yaml``); A's ``evaluate``
    section sets the OOD score and the bootstrap seed. ValueError on different data."""
    from hydra_ops.data import split_labels
    from tasks.evaluation.scorecard import paired_intervals, split_metrics
    from tasks.params import load_params
    from tasks.runtime import data as prepared

    check_same_data(fp32_root, bf16_root)
    cfg_a, cfg_b = cfgs or (load_params(r / "params.yaml") for r in (fp32_root, bf16_root))
    scoring = cfg_a.model_copy(
        update={"evaluate": cfg_a.evaluate.model_copy(update={"bootstrap_samples": n_resamples})}
    )
    labels = {s: split_labels(prepared.split(fp32_root, s)) for s in ("test", "shift")}
    a = fp32_outputs(cfg_a, fp32_root)
    b = fp32_outputs(cfg_b, bf16_root)

    models: dict[str, Any] = {}
    for name in (m for m in MODELS if m in a and m in b):
        ta, tb = a[name]["temperature"], b[name]["temperature"]
        metrics_a = split_metrics(scoring, a[name]["outputs"], labels, ta)
        metrics_b = split_metrics(scoring, b[name]["outputs"], labels, tb)
        intervals = paired_intervals(
            scoring, b[name]["outputs"], a[name]["outputs"], labels, tb, ta
        )
        models[name] = {"temperature": {"fp32": ta, "bf16": tb}} | {
            f"{split}.{metric}": {
                "fp32": metrics_a[split][metric],
                "bf16": metrics_b[split][metric],
                **{k: intervals[split][metric][k] for k in ("difference", "low", "high")},
            }
            for split, metric in WATCHED
        }
    test = a[next(iter(a))]["outputs"]
    return {
        "inference": "cpu/fp32",
        "ood_score": scoring.evaluate.ood_score,
        "n_resamples": n_resamples,
        "bootstrap_seed": scoring.evaluate.bootstrap_seed,
        "confidence": 0.95,
        "counts": {s: int(t.shape[0]) for s, t in test.items()},
        "trained": {"fp32": trained_precisions(fp32_root), "bf16": trained_precisions(bf16_root)},
        "skipped": [m for m in MODELS if m not in models],
        "models": models,
    }


def markdown(result: dict[str, Any]) -> str:
    """The result as a Markdown table: one row per model and watched metric."""
    rows = [
        "| model | metric | A: fp32-trained | B: bf16-trained | B - A [95% paired bootstrap] |",
        "|---|---|---|---|---|",
    ]
    for name, entry in result["models"].items():
        for split, metric in WATCHED:
            r = entry[f"{split}.{metric}"]
            rows.append(
                f"| {name} | {split} {metric} | {r['fp32']:.4f} | {r['bf16']:.4f} | "
                f"{r['difference']:+.4f} [{r['low']:+.4f}, {r['high']:+.4f}] |"
            )
    return "\n".join(rows) + "\n"


FP32_OPTION = typer.Option(..., "--fp32", help="finished project A, trained in fp32")
BF16_OPTION = typer.Option(..., "--bf16", help="finished project B, trained in bf16")
JSON_OPTION = typer.Option(None, "--json", help="write the result as JSON here")
MD_OPTION = typer.Option(None, "--markdown", help="write the Markdown table here")


@app.command()
def main(
    fp32: Path = FP32_OPTION,
    bf16: Path = BF16_OPTION,
    n_resamples: int = typer.Option(1000, help="paired bootstrap resamples"),
    json_out: Path | None = JSON_OPTION,
    md_out: Path | None = MD_OPTION,
) -> None:
    """Print (and optionally write) the bf16-vs-fp32 training comparison."""
    from tasks.runtime.layout import BASE
    from tasks.runtime.outputs import write_json, write_text

    for project in (fp32, bf16):
        if not (project / BASE).is_dir():
            raise typer.BadParameter(f"{project}: no {BASE}; run `hydra-ens run` there first")
    try:
        result = compare(fp32.resolve(), bf16.resolve(), n_resamples)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    table = markdown(result)
    if json_out:
        write_json(json_out, result)
    if md_out:
        write_text(md_out, table)
    print(table, end="")


if __name__ == "__main__":
    app()
