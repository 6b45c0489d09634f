"""Stage ``run_report`` (figures, the self-contained HTML page, the offline ``dvc plots show``
page) on a synthetic evaluation: member logits drawn at random with an ID signal, run through the
functions ``evaluate`` uses (metrics, plot rows, histograms, key metrics, the Markdown report), so
no model runs. The pages are opened in a real headless Chromium (Debian's package; ``make test``
installs it) whose every host name fails to resolve: every figure decodes, and ``dvc plots show``
draws one labelled series per model from its own inlined vega, where DVC's own page draws nothing.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, git

from tasks.params import resolve_params
from tasks.reports.key_metrics import (
    KEY_METRICS_DIR,
    KEYS,
    LATENCY_KEY,
    key_metrics,
    write_key_metrics,
)
from tasks.runtime.layout import METRICS, PLOTS, REPORTS
from tasks.runtime.outputs import LATENCY_FILE, write_json, write_text

BIN = Path(sys.executable).parent
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
#: What compile shipped, as ``compiled.json`` says (the Hydra is timed at its precision).
COMPILED = {"backend": "inductor", "precision": "bf16"}
FIGURES = ("reliability", "roc", "ood_score_histograms", "disagreement_histograms", "cost_quality")


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
    from tasks.evaluation.scorecard import ood_by_score, plot_rows, split_metrics
    from tasks.reports.evaluate_markdown import latency_setup, render_report
    from tasks.reports.score_histograms import score_histograms

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
    models["hydra"].update(
        compile_max_abs_diff=1e-3, compile_argmax_agreement=1.0, compile_backend="inductor"
    )
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
    write_key_metrics(root / METRICS, key_metrics(models, LATENCY))
    reliability, roc = plot_rows(cfg, outputs, temps, labels)
    write_json(root / PLOTS / "reliability.json", reliability)
    write_json(root / PLOTS / "roc.json", roc)
    write_json(
        root / PLOTS / "histograms.json", score_histograms(cfg.evaluate.ood_score, outputs, temps)
    )
    with_latency = {
        **result,
        "models": {n: {**e, "latency_ms": LATENCY[n]} for n, e in models.items()},
        "latency_setup": latency_setup(cfg, "cpu (AVX2, 2 threads)", "fp32", models, COMPILED),
    }
    write_text(root / REPORTS / "evaluate.md", render_report(with_latency))
    return result


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


needs_chromium = pytest.mark.skipif(
    chromium() is None,
    reason="chromium is not installed (`make test` installs Debian's package when run as root)",
)


def browser_dom(url: str, profile: Path) -> str:
    """The DOM of ``url`` after it loaded in headless Chromium, every host name unresolvable (no
    network: a page that needs a CDN stays blank), ``profile`` its own user-data folder."""
    result = subprocess.run(
        [
            chromium(),
            "--headless",
            "--disable-gpu",
            "--no-sandbox",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=15000",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk; fails on anything that is not a PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    from tasks import run_report

    root = tmp_path_factory.mktemp("run_report")
    write_evaluation(root)
    run_report.run(resolve_params("quick"), root)
    return root


def test_every_figure_is_a_small_png_of_its_own(project):
    files = sorted((project / "reports" / "figures").iterdir())
    assert [f.stem for f in files] == sorted(FIGURES)
    blobs = [f.read_bytes() for f in files]
    for f, data in zip(files, blobs, strict=True):
        width, height = png_size(data)
        assert 500 <= width <= 2000 and 300 <= height <= 1200, (f.name, width, height)
        assert len(data) < 250_000, (f.name, len(data))
    assert len(set(blobs)) == len(blobs)


def test_every_legend_names_every_model(project):
    from tasks.reports import figures

    rows = {
        p: json.loads((project / PLOTS / f"{p}.json").read_text()) for p in ("reliability", "roc")
    }
    hist = json.loads((project / PLOTS / "histograms.json").read_text())
    names = list(MEMBERS)

    def legend(texts) -> list[str]:
        return [t.get_text().split(" (")[0] for t in texts]

    fig = figures.reliability_figure(rows["reliability"], {n: 0.1 for n in names})
    assert legend(fig.axes[0].get_legend().get_texts()) == ["perfectly calibrated", *names]
    assert "hydra (ECE 0.100)" in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    fig = figures.roc_figure(rows["roc"])
    assert [a.get_title() for a in fig.axes] == ["near-OOD vs ID test", "far-OOD vs ID test"]
    for ax in fig.axes:
        assert legend(ax.get_legend().get_texts()) == ["chance", *names]
        assert len(ax.get_lines()) == 1 + len(names)
    fig = figures.histogram_figure(hist, "ood_score", "t")
    assert [a.get_title() for a in fig.axes if a.get_visible()] == names
    assert legend(fig.axes[0].get_legend().get_texts()) == ["ID test", "near-OOD", "far-OOD"]
    fig = figures.histogram_figure(hist, "disagreement", "t")
    ensembles = [n for n in names if MEMBERS[n] > 1]
    assert [a.get_title() for a in fig.axes if a.get_visible()] == ensembles
    points = {
        n: {"latency_ratio": LATENCY[n] / 10, "near_ood_auroc": 0.8, "shift_nll": 0.5}
        for n in names
    }
    fig = figures.cost_quality_figure(points)
    assert legend(fig.legends[0].get_texts()) == names
    assert all(ax.get_xscale() == "log" for ax in fig.axes)
    with pytest.raises(ValueError, match="no histogram rows for score 'nope'"):
        figures.histogram_figure(hist, "nope", "t")


def test_histograms_share_bins_and_each_split_sums_to_one(project):
    rows = json.loads((project / PLOTS / "histograms.json").read_text())
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["score"], r["split"]), []).append(r)
    sizes = {"id_test": SIZES["test"], "near_ood": SIZES["near_ood"], "far_ood": SIZES["far_ood"]}
    for (model, score, split), bins in groups.items():
        assert sum(b["count"] for b in bins) == sizes[split]
        assert abs(sum(b["fraction"] for b in bins) - 1.0) < 1e-9
        edges = [(b["lo"], b["hi"]) for b in bins]
        assert edges == [(b["lo"], b["hi"]) for b in groups[(model, score, "id_test")]]
        if score == "disagreement":  # one bin centred on each vote fraction k / M
            m = MEMBERS[model]
            assert [b["center"] for b in bins] == pytest.approx([k / m for k in range(m)])
    with_disagreement = {m for m, s, _ in groups if s == "disagreement"}
    assert with_disagreement == {n for n, m in MEMBERS.items() if m > 1}
    assert {m for m, s, _ in groups if s == "ood_score"} == set(MEMBERS)


def test_key_metrics_are_the_evaluations_numbers(project):
    ev = json.loads((project / METRICS / "evaluate.json").read_text())
    folder = project / METRICS / KEY_METRICS_DIR
    assert sorted(p.stem for p in folder.iterdir()) == sorted(MEMBERS)
    for name, entry in ev["models"].items():
        keys = json.loads((folder / f"{name}.json").read_text())
        assert list(keys) == [*KEYS, LATENCY_KEY]
        for key, (split, metric) in KEYS.items():
            assert keys[key] == round(entry["calibrated"][split][metric], 4)
        assert keys[LATENCY_KEY] == round(LATENCY[name] / LATENCY["single"], 3)
    hydra = json.loads((folder / "hydra.json").read_text())
    assert json.loads((project / METRICS / "hydra.json").read_text()) == hydra  # the DVC metrics
    assert "latency_x" not in key_metrics(ev["models"], {})["hydra"]  # nothing timed


def test_the_report_says_what_each_latency_timed(project):
    cfg = resolve_params("quick")
    md = (project / REPORTS / "evaluate.md").read_text()
    assert f"latency timed (batch {cfg.evaluate.latency_batch})" in md
    assert f"over a batch of {cfg.evaluate.latency_batch} ID-test examples, on cpu (AVX" in md
    timed = ("eager", "compiled")
    rows = {
        line.split(" | ")[0].strip("| "): line
        for line in md.splitlines()
        if any(f"| {t} " in line for t in timed)
    }
    # the Hydra's latency is what ships: the compiled artifact
    assert rows["hydra"].endswith("| compiled inductor bf16, 3 members in one pass |")
    assert rows["single"].endswith("| eager fp32 |")
    assert rows["deep_ensemble"].endswith("| eager fp32, 3 models in turn |")
    assert rows["mc_dropout"].endswith("| eager fp32, 4 passes in turn |")
    assert f"median of {cfg.evaluate.cost_rounds} interleaved timing rounds" in md
    assert "ran differently (compiled inductor bf16, eager fp32)" in md
    assert "ships compiled (inductor, bf16): its row times that artifact" in md


def test_the_html_page_is_self_contained(project):
    page = (project / REPORTS / "evaluate.html").read_text()
    assert "<script" not in page and "@import" not in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    srcs = re.findall(r'<img src="data:image/png;base64,([^"]+)"', page)
    figures = [(project / "reports" / "figures" / f"{n}.png").read_bytes() for n in FIGURES]
    assert [base64.b64decode(s) for s in srcs] == figures  # every figure, in page order
    assert page.count("<table>") >= 3 and "<td>hydra</td>" in page  # the Markdown tables


@needs_chromium
def test_chromium_decodes_every_figure_of_the_page_offline(project, tmp_path):
    check = (
        '<script>window.addEventListener("load", () => { const p = document.createElement("p");'
        ' p.id = "decoded"; p.textContent = [...document.images].map(i => i.complete ?'
        ' i.naturalWidth + "x" + i.naturalHeight : "pending").join(" ");'
        " document.body.append(p); });</script></body>"
    )
    page = (project / REPORTS / "evaluate.html").read_text().replace("</body>", check)
    (tmp_path / "page.html").write_text(page)
    dom = browser_dom((tmp_path / "page.html").as_uri(), tmp_path / "profile")
    decoded = re.search(r'<p id="decoded">([^<]*)</p>', dom)
    assert decoded, dom[-2000:]
    sizes = [png_size((project / "reports" / "figures" / f"{n}.png").read_bytes()) for n in FIGURES]
    assert decoded.group(1).split() == [f"{w}x{h}" for w, h in sizes]


@pytest.fixture(scope="module")
def dvc_project(project, tmp_path_factory) -> Path:
    """A DVC project holding the repo's dvc.yaml, its plot templates and the synthetic outputs."""
    from flows import dvcops

    root = tmp_path_factory.mktemp("dvc_plots")
    shutil.copy2(REPO / "dvc.yaml", root / "dvc.yaml")
    shutil.copytree(
        REPO / "tasks" / "reports" / "plot_templates",
        root / "tasks" / "reports" / "plot_templates",
    )
    for rel in ("plots", "metrics", "reports"):
        shutil.copytree(project / rel, root / rel)
    git(root, "init", "-q")
    dvcops.dvc(root, "init", "-q")
    return root


def legends(dom: str) -> list[tuple[str, list[str]]]:
    """(title, values) of every vega legend of an SVG-rendered page (from its aria labels)."""
    return [
        (title, values.split(", "))
        for title, values in re.findall(
            r"aria-label=\"Symbol legend titled '([^']+)' for [^\"]*? values?: ([^\"]+)\"", dom
        )
    ]


@needs_chromium
def test_dvc_plots_show_draws_one_series_per_model_offline(dvc_project, tmp_path):
    from flows import dvcops

    # DVC's own page: vega from a CDN, so with no network it draws nothing (what this test sees)
    dvcops.dvc(dvc_project, "plots", "show", "-o", str(tmp_path / "cdn"))
    cdn_dom = browser_dom((tmp_path / "cdn" / "index.html").as_uri(), tmp_path / "p1")
    assert "cdn.jsdelivr.net" in (tmp_path / "cdn" / "index.html").read_text()
    assert "<svg" not in cdn_dom and "<canvas" not in cdn_dom
    # the project's page (what `hydra-ens run` configures): vega inlined, one series per model
    assert any("plots.html_template" in a for a in dvcops.ensure_project(dvc_project))
    dvcops.dvc(dvc_project, "plots", "show", "-o", str(tmp_path / "offline"))
    html = (tmp_path / "offline" / "index.html").read_text()
    assert "cdn.jsdelivr.net" not in html and "<script src=" not in html
    dom = browser_dom((tmp_path / "offline" / "index.html").as_uri(), tmp_path / "p2")
    assert len(re.findall(r'<svg [^>]*class="marks"', dom)) == 3  # reliability, ROC, histograms
    found = legends(dom)
    by_model = [sorted(values) for title, values in found if title == "model"]
    assert by_model == [sorted(MEMBERS)] * 2  # reliability and ROC: one entry per model
    assert ("split", ["id_test", "near_ood", "far_ood"]) in found
    assert [v for t, v in found if t == "revision"] == [["workspace"]] * 2


def test_dvc_metrics_show_is_the_hydras_row_and_one_short_row_per_model(dvc_project):
    """``dvc metrics show``: the Hydra's key numbers (the one DVC metrics file); ``dvc metrics
    show metrics/key``: one row per model, the same columns."""
    from flows import dvcops

    header = ["Path", *sorted([*KEYS, LATENCY_KEY])]
    shown = dvcops.dvc(dvc_project, "metrics", "show").stdout.strip().splitlines()
    assert [line.split()[0] for line in shown] == ["Path", "metrics/hydra.json"]
    assert shown[0].split() == header and max(len(line) for line in shown) <= 110
    per_model = dvcops.dvc(dvc_project, "metrics", "show", "metrics/key").stdout
    rows = per_model.strip().splitlines()
    assert rows[0].split() == header and len(rows) == 1 + len(MEMBERS)
    assert {line.split()[0] for line in rows[1:]} == {
        f"metrics/key/{name}.json" for name in MEMBERS
    }
    hydra = [line.split() for line in rows if line.startswith("metrics/key/hydra.json")]
    assert hydra == [["metrics/key/hydra.json", *shown[1].split()[1:]]]
    assert max(len(line) for line in rows) <= 110
