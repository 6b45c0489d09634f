"""The study results the README and docs print are the study reports' own numbers and words.

A results table is anchored by a comment naming its study, variant, rows (baselines) and columns
(metrics, or ``cost``)::

    <!-- claims study=S variant=V rows=single,naive_pruned cols=shift.nll,cost -->
    | Hydra minus | shift NLL | its cost |
    |---|---|---|
    | single model | -0.074 [-0.142, -0.005] no detectable difference | 1.00x |

A table of several studies side by side (``python -m benchmarks.by_size``) names them in
order, ``studies=S1:V1,S2:V2``; its rows are each study's ``rows`` in turn and its columns exactly
``cols``, among them the labels ``model`` and ``baseline`` (not checked), ``parameters`` (the
single model's count, ``22.7M``; ``given`` after it where the study.json has none) and
``hydra_cost`` (the Hydra's cost).

A cost in prose is anchored by ``<!-- cost study=S variant=V model=M -->1.64x [1.55, 1.72]``.
Each number must equal the confirmation seeds' value in ``docs/studies/<study>/study.json`` (its
``confirmation`` section: computed from the held-out seeds alone) at the decimals printed, and each
word the one the report's Holm-corrected test gives (``confirmation.claims``). A cost anchored
with ``seeds=choosing`` is the choosing seeds' (the report's ``models`` section)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from conftest import REPO

from flows.study.report.by_size import single_parameters

#: The docs, and the by-size tables written next to the studies (``benchmarks/by_size.py``).
DOCS = [
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    *sorted((REPO / "docs" / "studies").glob("*/by_size.md")),
]
TABLE = re.compile(r"<!-- claims (?P<args>[^>]*?) -->\n(?P<table>(?:\|.*\n)+)")
COST = re.compile(r"<!-- cost (?P<args>[^>]*?) -->(?P<text>[^\s,;)]+(?: \[[^\]]*\])?)")
NUMBER = r"([+-]?\d+\.\d+)"
DIFF = re.compile(rf"^{NUMBER} \[{NUMBER}, {NUMBER}\] (better|worse|no detectable difference)$")
RATIO = re.compile(rf"^{NUMBER}x(?: \[{NUMBER}, {NUMBER}\])?$")
#: The README's results: one table per task, each from its study's confirmation seeds.
README_STUDIES = {"text-evidence", "brown-genres", "fashion-mnist"}


def _args(text: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in text.split())


def _report(study: str) -> dict[str, Any]:
    return json.loads((REPO / "docs" / "studies" / study / "study.json").read_text())


def _confirmation(study: str) -> dict[str, Any]:
    return _report(study)["confirmation"]


def _choosing_cost(study: str, label: str) -> dict[str, Any]:
    """A model's cost ratio over the choosing seeds (the report's sections 1-6)."""
    report = json.loads((REPO / "docs" / "studies" / study / "study.json").read_text())
    st = report["models"][label]["metrics"]["model.cost_ratio"]
    return {"ratio": st["mean"], "ratio_low": st["low"], "ratio_high": st["high"]}


def _studies(args: dict[str, str]) -> list[tuple[str, str]]:
    """The (study, variant) pairs an anchor names, in order."""
    if "studies" in args:
        return [tuple(sv.split(":", 1)) for sv in args["studies"].split(",")]  # type: ignore[misc]
    return [(args["study"], args["variant"])]


def _label(baseline: str, variant: str) -> str:
    """The study report's model label: the twin, control and Hydra depend on the variant."""
    return (
        f"{baseline}[{variant}]" if baseline in ("naive_pruned", "control", "hydra") else baseline
    )


def _same(printed: str, value: float) -> bool:
    """``printed`` is ``value`` rounded to the decimals it shows (``-0.000`` and ``+0.000`` are
    both zero)."""
    decimals = len(printed.split(".")[1])
    return float(printed) == pytest.approx(round(value, decimals), abs=10 ** -(decimals + 3))


def _check_cost(where: str, text: str, cost: dict[str, Any]) -> list[str]:
    found = RATIO.match(text.strip())
    if found is None:
        return [f"{where}: {text!r} is not a cost ratio"]
    ratio, low, high = found.groups()
    bad = [] if _same(ratio, cost["ratio"]) else [f"{where}: {ratio} != {cost['ratio']:.4f}"]
    if low is not None and not (_same(low, cost["ratio_low"]) and _same(high, cost["ratio_high"])):
        bad.append(f"{where}: [{low}, {high}] != [{cost['ratio_low']}, {cost['ratio_high']}]")
    return bad


def _check_diff(where: str, text: str, test: dict[str, Any]) -> list[str]:
    found = DIFF.match(text.strip())
    if found is None:
        return [f"{where}: {text!r} is not 'mean [low, high] word'"]
    mean, low, high, word = found.groups()
    bad = []
    for name, printed in (("mean", mean), ("low", low), ("high", high)):
        if not _same(printed, test[name]):
            bad.append(f"{where}: {name} {printed} != {test[name]:.4f}")
    if word != test["word"]:
        bad.append(f"{where}: says {word!r}, the corrected test says {test['word']!r}")
    return bad


def _check_parameters(where: str, text: str, report: dict[str, Any], variant: str) -> list[str]:
    found = re.match(rf"^{NUMBER}M( given)?$", text.strip())
    count = single_parameters(report, variant)
    if found is None:
        return [f"{where}: {text!r} is not a parameter count like 22.7M"]
    if count is None:
        return [] if found.group(2) else [f"{where}: the study has no count; mark it 'given'"]
    if found.group(2) or not _same(found.group(1), count / 1e6):
        return [f"{where}: {text!r} != the study's {count / 1e6:.4f}M"]
    return []


def check_table(
    doc: str,
    args: dict[str, str],
    rows: list[list[str]],
    report_of: Callable[[str], dict[str, Any]] = _report,
) -> list[str]:
    """What in one anchored table differs from its study.json files (``report_of(study)``)."""
    pairs = _studies(args)
    baselines, cols = args["rows"].split(","), args["cols"].split(",")
    several = "studies" in args
    if len(rows) != len(pairs) * len(baselines):
        return [f"{doc}: {len(rows)} rows, the anchor names {len(pairs)} x {baselines}"]
    bad: list[str] = []
    for i, (study, v) in enumerate(pairs):
        report = report_of(study)
        conf = report["confirmation"]
        claims = conf["claims"][v]
        block = rows[i * len(baselines) : (i + 1) * len(baselines)]
        for baseline, row in zip(baselines, block, strict=True):
            cells = row if several else row[1:]
            if len(cells) != len(cols):
                bad.append(f"{doc}: {row} has not the {len(cols)} columns {cols}")
                continue
            for col, cell in zip(cols, cells, strict=True):
                where = f"{doc} {study} {v} {baseline} {col}"
                if col in ("model", "baseline"):
                    continue
                if col == "parameters":
                    bad += _check_parameters(where, cell, report, v)
                elif col in ("cost", "hydra_cost"):
                    label = _label("hydra" if col == "hydra_cost" else baseline, v)
                    bad += _check_cost(where, cell, conf["costs"][v][label])
                else:
                    family = claims["twin" if baseline == "naive_pruned" else "baselines"]
                    bad += _check_diff(where, cell, family["tests"][f"{baseline}|{col}"])
    return bad


def _anchored_tables() -> list[tuple[str, dict[str, str], list[list[str]]]]:
    out = []
    for doc in DOCS:
        for m in TABLE.finditer(doc.read_text()):
            lines = m.group("table").strip().splitlines()
            rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines[2:]]
            out.append((doc.relative_to(REPO).as_posix(), _args(m.group("args")), rows))
    return out


def test_the_readme_prints_every_task_from_its_confirmation_seeds() -> None:
    studies = {
        a["study"] for doc, a, _ in _anchored_tables() if doc == "README.md" and "study" in a
    }
    assert studies == README_STUDIES


@pytest.mark.parametrize("doc", [d.relative_to(REPO).as_posix() for d in DOCS])
def test_anchored_tables_print_the_reports_numbers_and_words(doc: str) -> None:
    bad: list[str] = []
    for where_doc, args, rows in _anchored_tables():
        if where_doc == doc:
            bad += check_table(doc, args, rows)
    for m in COST.finditer((REPO / doc).read_text()):
        a = _args(m.group("args"))
        label = _label(a["model"], a["variant"])
        if a.get("seeds") == "choosing":
            cost = _choosing_cost(a["study"], label)
        else:
            cost = _confirmation(a["study"])["costs"][a["variant"]][label]
        bad += _check_cost(f"{doc} cost {a}", m.group("text"), cost)
    assert not bad, "\n".join(bad)


def test_a_drifted_number_or_word_is_caught() -> None:
    """The checks fail on a number off by one in its last printed digit and on a word the
    corrected test does not give."""
    test = {"mean": 0.0671, "low": 0.0001, "high": 0.1340, "word": "no detectable difference"}
    assert _check_diff("x", "+0.067 [+0.000, +0.134] no detectable difference", test) == []
    assert _check_diff("x", "+0.068 [+0.000, +0.134] no detectable difference", test)
    assert _check_diff("x", "+0.067 [+0.000, +0.134] better", test)
    cost = {"ratio": 0.829, "ratio_low": 0.714, "ratio_high": 0.944}
    assert _check_cost("x", "0.83x [0.71, 0.94]", cost) == []
    assert _check_cost("x", "0.88x [0.71, 0.94]", cost)


def test_every_anchor_names_a_published_study() -> None:
    for _, args, _ in _anchored_tables():
        for study, _variant in _studies(args):
            assert (REPO / "docs" / "studies" / study / "study.json").is_file(), args
