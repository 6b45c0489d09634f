"""Stage ``report`` (figures, the self-contained HTML page, the offline ``dvc plots show`` page) on
a synthetic evaluation: member logits drawn at random with an ID signal, run through the same
functions ``evaluate`` uses (metrics, plot rows, histograms, key metrics, the Markdown report), so
no model runs. The pages are checked in a real headless Chromium with no network: every figure
decodes, every DVC plot draws one labelled series per model."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tasks.common import LATENCY_FILE, METRICS, PLOTS, REPORTS, write_json, write_text
from tasks.key_metrics import KEY_METRICS_FILE, key_metrics
from tasks.params import resolve_params

#: The synthetic models and their members (Hydra, the baselines).
MEMBERS = {"hydra": 3, "single": 1, "naive_pruned": 1, "deep_ensemble": 3, "mc_dropout": 4}
LATENCY = {
    "hydra": 12.0,
    "single": 10.0,
    "naive_pruned": 7.5,
    "deep_ensemble": 30.0,
    "mc_dropout": 40.0,
}
SIZES = {"val": 96, "test": 96, "shift": 96, "near_ood": 80, "far_ood": 64}
CLASSES = 4
FIGURES = ("reliability", "roc", "ood_score_histograms", "disagreement_histograms", "cost_quality")


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def synthetic_outputs() -> tuple[dict, dict]:
    """``{model: {split: [N, M, C] member logits}}`` and the labels of the ID splits: each model
    puts a margin on the true class of ID examples (a sharper one for the ensembles), none on OOD
    ones, and its members differ by noise."""
    g = torch.Generator().manual_seed(0)
    labels = {
        s: torch.randint(0, CLASSES, (SIZES[s],), generator=g) for s in ("val", "test", "shift")
    }
    outputs: dict[str, dict[str, torch.Tensor]] = {}
    for i, (name, m) in enumerate(MEMBERS.items()):
        outputs[name] = {}
        for split, n in SIZES.items():
            shared = torch.randn(n, 1, CLASSES, generator=g)
            if split in labels:
                margin = 2.0 + 0.3 * i - (0.8 if split == "shift" else 0.0)
                shared[torch.arange(n), 0, labels[split]] += margin
            noise = (1.5 if split == "far_ood" else 0.6) * torch.randn(n, m, CLASSES, generator=g)
            outputs[name][split] = shared + noise
    return outputs, labels


def write_evaluation(root: Path) -> dict:
    """What ``evaluate`` writes, from :func:`synthetic_outputs`; returns the evaluation."""
    from tasks.report import render_report
    from tasks.score_histograms import score_histograms
    from tasks.scorecard import ood_by_score, plot_rows, split_metrics

    cfg = resolve_params("quick")
    outputs, labels = synthetic_outputs()
    temps = {name: 1.0 + 0.1 * i for i, name in enumerate(outputs)}
    models = {
        name: {
            "members": MEMBERS[name],
            "temperature": temps[name],
            "parameters": 1000 * (i + 1),
            "calibrated": split_metrics(cfg, out, labels, temps[name]),
            "raw": split_metrics(cfg, out, labels, 1.0),
            "ood_by_score": ood_by_score(out, temps[name], MEMBERS[name]),
        }
        for i, (name, out) in enumerate(outputs.items())
    }
    models["hydra"].update(compile_max_abs_diff=None, compile_backend="eager")
    result = {
        "variant": "taylor",
        "num_members": 3,
        "ood_score": cfg.evaluate.ood_score,
        "ood_validation_set": "synthetic",
        "counts": SIZES,
        "models": models,
        "bootstrap": {},
    }
    write_json(root / METRICS / "evaluate.json", result)
    write_json(root / METRICS / LATENCY_FILE, LATENCY)
    write_json(root / METRICS / KEY_METRICS_FILE, key_metrics(models, LATENCY))
    reliability, roc = plot_rows(cfg, outputs, temps, labels)
    write_json(root / PLOTS / "reliability.json", reliability)
    write_json(root / PLOTS / "roc.json", roc)
    write_json(
        root / PLOTS / "histograms.json", score_histograms(cfg.evaluate.ood_score, outputs, temps)
    )
    with_latency = {
        **result,
        "models": {n: {**e, "latency_ms": LATENCY[n]} for n, e in models.items()},
    }
    write_text(root / REPORTS / "evaluate.md", render_report(with_latency))
    return result


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    from tasks import run_report

    root = tmp_path_factory.mktemp("run_report")
    write_evaluation(root)
    run_report.run(resolve_params("quick"), root)
    return root
