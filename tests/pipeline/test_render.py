"""flows.render: what the CLI prints."""

from __future__ import annotations


def test_the_prediction_table_shows_inputs_and_classes_as_written():
    """Inputs and class names are the user's text, not console markup: a news text's
    ``[removed]`` vanished from ``predict``'s table and ``[/x]`` ended it with a MarkupError."""
    from rich.console import Console

    from flows.render import prediction_table

    numbers = {"prob": 0.9, "entropy": 0.3, "mutual_information": 0.1, "disagreement": 0.0}
    rows = [
        {"input": "[removed] by the editor", "class": "[misc]", **numbers},
        {"input": "prices [/x] rose", "class": "business", **numbers},
    ]
    rows = [{**r, "ood_score": 0.5, "verdict": "ok"} for r in rows]
    console = Console(width=120, record=True)
    console.print(prediction_table(rows, "hydra v0.0.1 [prod]"))
    text = console.export_text()
    for shown in ("[removed] by the editor", "[misc]", "prices [/x] rose", "hydra v0.0.1 [prod]"):
        assert shown in text, text


def test_the_study_table_says_why_a_point_is_missing():
    """--report-only runs nothing, so its missing points are "not run", with or without --only;
    a run with --only misses only the points it did not select."""
    from rich.console import Console

    from flows.render import study_table

    summary = {
        "study": "s",
        "commit": "0123456789",
        "up_to_date": ["a-seed0"],
        "points": {},
        "failed": {},
        "missing": ["b-seed0"],
        "only": ["a-*"],
    }
    said = {}
    for report_only in (True, False):
        console = Console(width=120, record=True)
        console.print(study_table(summary, report_only))
        said[report_only] = console.export_text()
    assert "not run: --report-only" in said[True] and "--only)" not in said[True]
    assert "not selected by --only" in said[False] and "report-only" not in said[False]


def test_the_run_summary_says_which_check_failed_and_by_how_much():
    from rich.console import Console

    from flows.render import print_run_summary

    line = "far_ood.auroc vs deep_ensemble against deep_ensemble by 0.0210 (diff >= -0.015)"
    summary = {
        "stages": [],
        "seconds": 1.0,
        "gate": {
            "verdict": "failed",
            "failed": ["far_ood.auroc vs deep_ensemble"],
            "failures": [line],
        },
        "promotion": {"promoted": False, "why": "gate failed"},
    }
    console = Console(width=200, record=True)
    print_run_summary(console, summary, "log")
    assert f"failed: {line}" in console.export_text()


def _evaluation() -> dict:
    def entry(acc: float, latency_ms: float) -> dict:
        splits = {
            "id_test": {"accuracy": acc, "nll": 0.05, "ece": 0.02, "brier": 0.1},
            "shift": {"accuracy": acc - 0.1, "nll": 0.33, "ece": 0.06},
            "near_ood": {"auroc": 0.93, "aupr_in": 0.9, "aupr_out": 0.9, "fpr_at_95_tpr": 0.4},
            "far_ood": {"auroc": 0.9996, "aupr_in": 0.9, "aupr_out": 0.9, "fpr_at_95_tpr": 0.0},
        }
        return {"calibrated": splits, "raw": splits, "latency_ms": latency_ms}

    names = ("hydra", "single", "naive_pruned", "control", "deep_ensemble", "batch_ensemble")
    return {"models": {n: entry(0.98 + 0.001 * i, 100.0 + 10 * i) for i, n in enumerate(names)}}


def test_the_run_ends_with_the_numbers_that_decide_in_80_columns():
    """One row per model: ID accuracy and NLL, near- and far-OOD AUROC, shift NLL, the cost against
    the single model (the verdict's interval where it judged the model, else evaluate's latency
    ratio) and the gate's word; the other metrics stay in the report."""
    from rich.console import Console

    from flows.render import deciding_rows, deciding_table

    ev = _evaluation()
    verdict = {
        "ships": "naive_pruned",
        "candidates": {
            "hydra": {
                "verdict": "passed",
                "cost": {"ratio": 1.65, "ratio_low": 1.61, "ratio_high": 1.72},
            },
            "naive_pruned": {
                "verdict": "passed",
                "cost": {"ratio": 0.89, "ratio_low": 0.88, "ratio_high": 0.92},
            },
            "single": {
                "verdict": "failed",
                "cost": {"ratio": 1.0, "ratio_low": 1.0, "ratio_high": 1.0},
            },
        },
    }
    rows = deciding_rows(ev, verdict)
    assert [r["model"] for r in rows] == list(ev["models"])
    by = {r["model"]: r for r in rows}
    assert by["naive_pruned"]["gate"] == "ships" and by["single"]["gate"] == "failed"
    assert by["control"]["gate"] is None
    assert by["control"]["cost"]["ratio"] == 130.0 / 110.0  # evaluate's latency, not judged
    assert by["hydra"]["ID NLL"] == 0.05 and by["hydra"]["far AUROC"] == 0.9996
    console = Console(width=80, record=True)
    console.print(deciding_table(rows))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80, text
    assert "1.65 [1.61, 1.72]" in text and "ships" in text and "1.18" in text
    assert "aupr" not in text and "brier" not in text and "fpr" not in text
    for name in ev["models"]:
        assert name in text, text
    assert "0.9996" in text and "…" not in text  # nothing cut short
    # without a verdict (the gate did not run) every model still has its row
    assert all(r["gate"] is None for r in deciding_rows(ev))
