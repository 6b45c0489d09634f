"""Stage ``run_report``: the run report a person looks at, drawn from what ``evaluate`` wrote (no
model runs here, no torch: editing a figure reruns this stage alone).

Outputs:

* ``reports/figures/*.png``: the reliability diagram, the near- and far-OOD ROC curves, the
  histograms of the OOD score and of member disagreement on ID test vs near-OOD vs far-OOD, and
  cost vs quality (:mod:`tasks.reports.figures`);
* ``reports/evaluate.html``: those figures and the tables of ``reports/evaluate.md`` in one
  self-contained page (:mod:`tasks.reports.html_report`), to open in a browser;
* ``reports/dvc_plots_template.html``: the page template that makes ``dvc plots show`` render
  offline (:mod:`tasks.reports.vega_offline`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.params.core import CoreConfig
from tasks.reports.html_report import Figure, render_html
from tasks.reports.key_metrics import LATENCY_KEY, REFERENCE, key_metrics
from tasks.runtime.layout import PLOTS, REPORTS
from tasks.runtime.outputs import load_evaluation, publish_dir, read_json, write_text
from tasks.runtime.stage import stage_main

#: The params view this stage validates ``params.yaml`` with (the sections it reads).
SCHEMA = CoreConfig

FIGURES = REPORTS / "figures"
HTML = REPORTS / "evaluate.html"
DVC_TEMPLATE = REPORTS / "dvc_plots_template.html"
HISTOGRAMS = PLOTS / "histograms.json"


#: ``name: caption`` of every figure, in page order (``{score}``: the OOD score's kind).
CAPTIONS = {
    "reliability": "Reliability diagram: accuracy against confidence on ID test, one curve per "
    "model (calibrated; the dashed diagonal is perfect calibration)",
    "roc": "ROC curves: near-OOD and far-OOD against ID test under the OOD score `{score}`, one "
    "curve per model (calibrated)",
    "ood_score_histograms": "OOD score histograms: `{score}` on ID test, near-OOD and far-OOD, "
    "per model (fraction of each split per bin; the less they overlap, the better the detector)",
    "disagreement_histograms": "Member disagreement histograms: the fraction of members voting "
    "against the ensemble's class, on ID test, near-OOD and far-OOD, per model with several "
    "members",
    "cost_quality": f"Cost vs quality: latency relative to {REFERENCE} (log scale) against "
    "near-OOD AUROC and shift NLL, one point per model (what the latency timed: the table's "
    "`latency timed` column)",
}


def build_figures(
    evaluation: dict[str, Any],
    reliability: list[dict[str, Any]],
    roc: list[dict[str, Any]],
    histograms: list[dict[str, Any]],
) -> list[Figure]:
    """Every figure of the report, in page order, as PNG. ``evaluation``: ``metrics/evaluate.json``
    with ``latency_ms`` merged in (:func:`tasks.runtime.outputs.load_evaluation`). No disagreement
    figure when no model has several members; no cost figure when nothing was timed."""
    from tasks.reports import figures as fig

    models = evaluation["models"]
    calibrated = {name: e["calibrated"] for name, e in models.items()}
    score = evaluation["ood_score"]
    drawn = {
        "reliability": lambda: fig.reliability_figure(
            reliability, {n: c["id_test"]["ece"] for n, c in calibrated.items()}
        ),
        "roc": lambda: fig.roc_figure(
            roc,
            {s: {n: c[s]["auroc"] for n, c in calibrated.items()} for s in ("near_ood", "far_ood")},
        ),
        "ood_score_histograms": lambda: fig.histogram_figure(
            histograms, "ood_score", f"OOD score `{score}` per split"
        ),
    }
    if any(r["score"] == "disagreement" for r in histograms):
        drawn["disagreement_histograms"] = lambda: fig.histogram_figure(
            histograms, "disagreement", "Member disagreement per split"
        )
    latency = {n: e["latency_ms"] for n, e in models.items() if e.get("latency_ms") is not None}
    points = {
        name: {
            "latency_ratio": k[LATENCY_KEY],
            "near_ood_auroc": k["near_auroc"],
            "shift_nll": k["shift_nll"],
        }
        for name, k in key_metrics(models, latency).items()
        if LATENCY_KEY in k
    }
    if points:
        drawn["cost_quality"] = lambda: fig.cost_quality_figure(points, REFERENCE)
    return [
        Figure(name, CAPTIONS[name].format(score=score), fig.png_bytes(drawn[name]()))
        for name in CAPTIONS
        if name in drawn
    ]


def artifact_markdown(root: Path) -> str | None:
    """Markdown for the Prefect artifact: where the HTML page is, then every figure of
    ``reports/figures`` inlined as a data URI (the artifact is then the report, with no file
    server); None before stage run_report ran."""
    from tasks.reports.html_report import data_uri

    pngs = {name: root / FIGURES / f"{name}.png" for name in CAPTIONS}
    pngs = {name: p for name, p in pngs.items() if p.is_file()}
    if not pngs:
        return None
    lines = [
        "# Run report",
        f"The self-contained page (figures and tables, opens offline): `{(root / HTML)}`; "
        "the tables alone: the `hydra-metrics` artifact.",
    ]
    for name, png in pngs.items():
        lines += [f"## {CAPTIONS[name].split(':')[0]}", f"![{name}]({data_uri(png.read_bytes())})"]
    return "\n\n".join(lines) + "\n"


def run(cfg: CoreConfig, root: Path) -> dict[str, Any]:
    from tasks.reports.vega_offline import page_template

    evaluation = load_evaluation(root)
    figures = build_figures(
        evaluation,
        read_json(root / PLOTS / "reliability.json", "evaluate output"),
        read_json(root / PLOTS / "roc.json", "evaluate output"),
        read_json(root / HISTOGRAMS, "evaluate output"),
    )
    with publish_dir(root / FIGURES) as tmp:
        for f in figures:
            (tmp / f"{f.name}.png").write_bytes(f.png)
    markdown = (root / REPORTS / "evaluate.md").read_text(encoding="utf-8")
    title = (
        f"Hydra Ensemble run report ({evaluation['variant']} variant, "
        f"M = {evaluation['num_members']})"
    )
    write_text(root / HTML, render_html(title, figures, markdown))
    write_text(root / DVC_TEMPLATE, page_template())
    return {"figures": [f.name for f in figures]}


def main() -> None:
    stage_main("run_report", run, SCHEMA)


if __name__ == "__main__":
    main()
