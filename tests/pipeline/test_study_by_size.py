"""The by-size comparison on the published text study (MiniLM-L6, ``taylor-half``) and a second
study derived from it here: its variant renamed, every difference shifted by :data:`SHIFT`, one
word changed and a larger model. Every table cell is the study.json's value at the decimals
printed and every word its claims'; the docs' claims test accepts the table; the figure is the
same bytes twice and draws the twin's edge alone; each bad input is one line."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from test_docs_claims import check_table

from benchmarks import by_size as cli
from flows.study.report.by_size import (
    BASELINES,
    COLUMNS,
    METRICS,
    by_size_figure,
    by_size_markdown,
    entry,
    legend_grid,
    task_table,
)

REAL = REPO / "docs" / "studies" / "text-evidence" / "study.json"
VARIANT, BIG = "taylor-half", "big-half"
SHIFT = 0.0123
BIG_PARAMS = 109_486_464.0
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CELL = re.compile(r"^([+-]\d+\.\d+) \[([+-]\d+\.\d+), ([+-]\d+\.\d+)\] (.+)$")
COST = re.compile(r"^(\d+\.\d+)x(?: \[(\d+\.\d+), (\d+\.\d+)\])?$")


def _real() -> dict[str, Any]:
    return json.loads(REAL.read_text())


def _derived(real: dict[str, Any]) -> dict[str, Any]:
    """The real study with ``taylor-half`` as ``big-half``: differences shifted by SHIFT, the
    twin's near-OOD word made ``better``, the Hydra's cost doubled, a larger single model."""
    d = copy.deepcopy(real)
    d["models"]["single"]["metrics"]["model.parameters"]["mean"] = BIG_PARAMS
    conf = d["confirmation"]
    for part in ("paired", "claims", "costs", "cost", "twin"):
        if isinstance(conf[part], dict) and VARIANT in conf[part]:
            conf[part] = {BIG: conf[part][VARIANT]}
    for by_metric in conf["paired"][BIG].values():
        for st in by_metric.values():
            st["mean"] += SHIFT
            st["low"] += SHIFT
            st["high"] += SHIFT
            for r in st["per_seed"]:
                r["value"] += SHIFT
    for family in conf["claims"][BIG].values():
        for t in family["tests"].values():
            for k in ("mean", "low", "high"):
                t[k] += SHIFT
    conf["claims"][BIG]["twin"]["tests"]["naive_pruned|near_ood.auroc"].update(
        rejected=True, word="better"
    )
    costs = {k.replace(VARIANT, BIG): v for k, v in conf["costs"][BIG].items()}
    for k in ("ratio", "ratio_low", "ratio_high"):
        costs[f"hydra[{BIG}]"][k] *= 2
    conf["costs"][BIG] = costs
    return d


@pytest.fixture(scope="module")
def reports() -> dict[str, dict[str, Any]]:
    real = _real()
    return {"text-evidence": real, "big-study": _derived(real)}


def _entries(reports: dict[str, dict[str, Any]]) -> list[Any]:
    return [
        entry("MPNet-base", reports["big-study"], "big-study", BIG),
        entry("MiniLM-L6", reports["text-evidence"], "text-evidence", VARIANT),
    ]


def _parse(table: str) -> tuple[dict[str, str], list[list[str]]]:
    lines = table.splitlines()
    args = dict(kv.split("=", 1) for kv in lines[0].removeprefix("<!-- claims ")[:-4].split())
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines[3:]]
    return args, rows


def _at(printed: str, value: float) -> bool:
    decimals = len(printed.split(".")[1])
    return abs(float(printed) - round(value, decimals)) < 10 ** -(decimals + 3)


def test_cells_are_the_study_values_and_words(reports: dict[str, dict[str, Any]]) -> None:
    args, rows = _parse(task_table("BBC News", _entries(reports)))
    assert args["studies"] == f"text-evidence:{VARIANT},big-study:{BIG}"  # by size
    assert args["cols"].split(",") == list(COLUMNS)
    assert len(rows) == 2 * len(BASELINES)
    expect = [("text-evidence", VARIANT, "MiniLM-L6"), ("big-study", BIG, "MPNet-base")]
    words = []
    for i, row in enumerate(rows):
        study, v, model = expect[i // len(BASELINES)]
        baseline = list(BASELINES)[i % len(BASELINES)]
        conf = reports[study]["confirmation"]
        cells = dict(zip(COLUMNS, row, strict=True))
        assert cells["model"] == model and cells["baseline"] == BASELINES[baseline]
        for key in METRICS:
            mean, low, high, word = CELL.match(cells[key]).groups()
            st = conf["paired"][v][baseline][key]
            assert _at(mean, st["mean"]) and _at(low, st["low"]) and _at(high, st["high"])
            family = conf["claims"][v]["twin" if baseline == "naive_pruned" else "baselines"]
            assert word == family["tests"][f"{baseline}|{key}"]["word"]
            words.append(word)
        label = f"naive_pruned[{v}]" if baseline == "naive_pruned" else baseline
        for col, lab in (("cost", label), ("hydra_cost", f"hydra[{v}]")):
            ratio, low, high = COST.match(cells[col]).groups()
            cost = conf["costs"][v][lab]
            assert _at(ratio, cost["ratio"])
            if baseline == "single" and col == "cost":
                assert low is None  # the single model is 1.00x at every seed
            else:
                assert _at(low, cost["ratio_low"]) and _at(high, cost["ratio_high"])
    assert [r[1] for r in rows] == ["22.7M"] * 3 + ["109.5M"] * 3
    # the real study's twin is better on ID NLL only; the derived one's word changed as made
    assert rows[2][5] == "-0.014 [-0.020, -0.008] better"
    assert rows[5][3] == "+0.014 [-0.016, +0.043] better"
    assert words.count("better") == 3


def test_the_docs_claims_test_accepts_the_table_and_catches_drift(
    reports: dict[str, dict[str, Any]],
) -> None:
    args, rows = _parse(task_table("BBC News", _entries(reports)))
    assert check_table("by_size.md", args, rows, reports.__getitem__) == []
    drifted = copy.deepcopy(rows)
    drifted[4][4] = drifted[4][4].replace("-0.", "-1.", 1)  # a shift NLL mean of MPNet-base
    assert len(check_table("by_size.md", args, drifted, reports.__getitem__)) == 1
    drifted = copy.deepcopy(rows)
    drifted[1][1] = "22.8M"
    assert len(check_table("by_size.md", args, drifted, reports.__getitem__)) == 1


def test_cli_writes_the_document_and_a_deterministic_figure(
    reports: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    for name, report in reports.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "study.json").write_text(json.dumps(report))
    argv = [
        "--task",
        "BBC News",
        f"MiniLM-L6={tmp_path / 'text-evidence' / 'study.json'}:{VARIANT}",
        f"MPNet-base={tmp_path / 'big-study' / 'study.json'}:{BIG}",
        "--task",
        "the same again",
        f"MiniLM-L6={tmp_path / 'text-evidence' / 'study.json'}:{VARIANT}",
    ]
    cli.main([*argv, "--out", str(tmp_path / "a")])
    cli.main([*argv, "--out", str(tmp_path / "b")])
    png = (tmp_path / "a" / "by_size.png").read_bytes()
    assert png.startswith(PNG_MAGIC)
    assert png == (tmp_path / "b" / "by_size.png").read_bytes()
    md = (tmp_path / "a" / "by_size.md").read_text()
    assert md == (tmp_path / "b" / "by_size.md").read_text()
    assert md.count("<!-- claims studies=") == 2
    assert "## BBC News" in md and "## the same again" in md
    assert md.rstrip().endswith("(by_size.png)")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["by_size.md", "by_size.png"]


def test_the_figure_draws_the_twin_edge_alone(reports: dict[str, dict[str, Any]]) -> None:
    tasks = {"BBC News": _entries(reports)}
    first = by_size_figure(tasks)
    assert first == by_size_figure(tasks)
    other = copy.deepcopy(reports)
    paired = other["big-study"]["confirmation"]["paired"][BIG]
    paired["single"]["near_ood.auroc"]["mean"] += 0.05  # not drawn
    assert by_size_figure({"BBC News": _entries(other)}) == first
    paired["naive_pruned"]["near_ood.auroc"]["mean"] += 0.05  # drawn
    assert by_size_figure({"BBC News": _entries(other)}) != first


@pytest.mark.parametrize(
    ("entries", "grid"), [(1, (1, 1)), (3, (1, 3)), (4, (2, 2)), (5, (2, 3)), (7, (3, 3))]
)
def test_a_wide_legend_wraps_into_even_rows(entries: int, grid: tuple[int, int]) -> None:
    assert legend_grid(entries) == grid
    rows, columns = grid
    assert rows * columns >= entries > (rows - 1) * columns


def test_a_legend_needs_an_entry() -> None:
    with pytest.raises(ValueError, match="needs an entry"):
        legend_grid(0)


def test_parameters_from_the_user_where_the_study_has_none(
    reports: dict[str, dict[str, Any]],
) -> None:
    bare = copy.deepcopy(reports["big-study"])
    del bare["models"]
    del bare["confirmation"]["costs"][BIG]["single"]["parameters"]
    with pytest.raises(ValueError, match="gives no parameter count: pass one for MPNet-base"):
        entry("MPNet-base", bare, "big-study", BIG)
    e = entry("MPNet-base", bare, "big-study", BIG, parameters=BIG_PARAMS)
    small = entry("MiniLM-L6", reports["text-evidence"], "text-evidence", VARIANT)
    args, rows = _parse(task_table("t", [small, e]))
    assert [r[1] for r in rows[3:]] == ["109.5M given"] * 3
    assert (
        check_table(
            "x",
            args,
            rows,
            {"text-evidence": reports["text-evidence"], "big-study": bare}.__getitem__,
        )
        == []
    )
    with pytest.raises(ValueError, match="1,000 parameters given, study 'text-evidence' has"):
        entry("MiniLM-L6", reports["text-evidence"], "text-evidence", VARIANT, parameters=1000)


def _with_seeds(report: dict[str, Any], variant: str, n: int) -> dict[str, Any]:
    d = copy.deepcopy(report)
    for by_metric in d["confirmation"]["paired"][variant].values():
        for st in by_metric.values():
            st["n"] = n
    return d


def _one_line(exc: pytest.ExceptionInfo[ValueError]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_bad_inputs_are_one_line_errors(reports: dict[str, dict[str, Any]]) -> None:
    real, big = reports["text-evidence"], reports["big-study"]
    no_conf = {**real, "confirmation": None}
    with pytest.raises(ValueError) as e:
        entry("MiniLM-L6", no_conf, "text-evidence", VARIANT)
    assert _one_line(e) == "study 'text-evidence' has no confirmation section (no confirm_seeds)"
    with pytest.raises(ValueError) as e:
        entry("MiniLM-L6", real, "text-evidence", "nope")
    assert _one_line(e).startswith("variant 'nope' is not in study 'text-evidence'")
    assert "taylor-half, taylor-s0" in _one_line(e)
    no_de = copy.deepcopy(big)
    del no_de["confirmation"]["paired"][BIG]["deep_ensemble"]
    with pytest.raises(ValueError) as e:
        entry("MPNet-base", no_de, "big-study", BIG)
    assert "no confirmation claim deep_ensemble|near_ood.auroc" in _one_line(e)

    small = entry("MiniLM-L6", real, "text-evidence", VARIANT)
    two = entry("MPNet-base", _with_seeds(big, BIG, 2), "big-study", BIG)
    with pytest.raises(ValueError) as e:
        task_table("BBC News", [small, two])
    assert "confirmation seed counts differ (MiniLM-L6 3, MPNet-base 2)" in _one_line(e)
    # different tasks may differ: they are different tables
    assert "## other" in by_size_markdown({"BBC News": [small], "other": [two]})
    one = entry("MPNet-base", _with_seeds(big, BIG, 1), "big-study", BIG)
    with pytest.raises(ValueError) as e:
        by_size_figure({"t": [one]})
    assert "1 confirmation seed with results, no interval" in _one_line(e)
    pinned = copy.deepcopy(big)
    pinned["confirmation"]["mark"] = "¹"
    with pytest.raises(ValueError) as e:
        task_table("t", [small, entry("MPNet-base", pinned, "big-study", BIG)])
    assert "pin the data split" in _one_line(e)
    with pytest.raises(ValueError) as e:
        task_table("t", [small, entry("MiniLM-L6", big, "big-study", BIG)])
    assert _one_line(e) == "task 't' names a model twice: MiniLM-L6, MiniLM-L6"


def test_cli_bad_arguments_exit_with_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for argv, said in (
        (["--task", "t", "MiniLM-L6"], "expected MODEL=STUDY_JSON:VARIANT, got 'MiniLM-L6'"),
        (["--task", "t", f"M={tmp_path}/none.json:v"], "cannot read"),
        (["--task", "t"], "task 't' names no MODEL=STUDY_JSON:VARIANT"),
        (["--task", "t", f"M={REAL}:v", "--params", "M=lots"], "--params expects MODEL=COUNT"),
        (
            ["--task", "t", f"M={REAL}:{VARIANT}", "--params", "N=1e8"],
            "--params names N, which no --task names",
        ),
    ):
        with pytest.raises(SystemExit) as e:
            cli.main([*argv, "--out", str(tmp_path / "out")])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err, err
    assert not (tmp_path / "out").exists()
