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
