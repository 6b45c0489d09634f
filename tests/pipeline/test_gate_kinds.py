"""The gate kinds registry (tasks.gates.kinds) and the recipe of CONTRIBUTING.md, "Adding a gate":
a toy kind, one class plus one registration, judged in a run's gate stage and seen in its
``reports/gate.json`` and ``reports/gate.md``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import promotion_project as pp
import pytest

from tasks import gate
from tasks.gates.kinds import GATE_KINDS, check_kinds
from tasks.gates.kinds.base import GateKind, margin, metric_value
from tasks.params import ConfigError, GateCheck, resolve_params


class RatioGate(GateKind):
    """Toy kind: the candidate's metric is at least ``threshold`` times the baseline's."""

    name = "ratio"
    needs_baseline = True

    @classmethod
    def validate(cls, check: GateCheck) -> str | None:
        if check.baseline is None or not isinstance(check.threshold, float):
            return "kind 'ratio' needs a 'baseline' and a numeric 'threshold' (the least ratio)"
        return None

    @classmethod
    def judge(
        cls,
        check: GateCheck,
        rec: dict[str, Any],
        ev: dict[str, Any],
        prod: dict[str, Any] | str | None,
        candidate: str,
    ) -> dict[str, Any]:
        base = metric_value(ev["models"][check.baseline], check)
        ratio = rec["value"] / base
        return {
            **rec,
            "baseline_value": base,
            "rule": f"ratio >= {check.threshold:g}",
            "margin": margin(ratio, check.threshold, True),
            "status": "passed" if ratio >= check.threshold else "failed",
        }


@pytest.fixture
def ratio_kind():
    GATE_KINDS.register("ratio", RatioGate)
    yield RatioGate
    GATE_KINDS.unregister("ratio")


COMPILE = [
    {"metric": "compile_max_abs_diff", "threshold": 1e-4},
    {"metric": "compile_argmax_agreement", "threshold": 1.0},
]


def test_the_builtin_kinds_are_registered_and_an_unknown_kind_is_one_line():
    assert GATE_KINDS.names()[:2] == ("threshold", "baseline")
    nope = {"kind": "nope", "metric": "accuracy", "threshold": 0.5}
    with pytest.raises(ConfigError) as err:
        check_kinds(resolve_params("quick", {"gates": [nope, *COMPILE]}))
    assert str(err.value) == (
        "params: gates.0: kind='nope' is unknown; registered: threshold, baseline"
    )


def test_a_kind_refuses_its_own_bad_params_in_one_line(ratio_kind):
    toy = {"kind": "ratio", "metric": "accuracy", "split": "id_test", "baseline": "single"}
    cfg = resolve_params("quick", {"gates": [toy, *COMPILE]})
    with pytest.raises(ConfigError) as err:
        check_kinds(cfg)
    assert str(err.value) == (
        "params: gates.0: kind 'ratio' needs a 'baseline' and a numeric 'threshold' "
        "(the least ratio)"
    )


@pytest.mark.parametrize(("ratio", "status"), [(1.05, "passed"), (1.2, "failed")])
def test_a_toy_kind_is_judged_in_a_run_and_seen_in_its_gate_report(
    ratio_kind, tmp_path: Path, ratio: float, status: str
):
    toy = {
        "kind": "ratio",
        "metric": "accuracy",
        "split": "id_test",
        "baseline": "single",
        "threshold": ratio,
    }
    root = pp.build(tmp_path / "proj", [toy, *COMPILE])
    pp.train(root, seed=0, acc=0.99)  # hydra 0.99, single 0.9: ratio 1.1
    verdict = gate.run(pp.cfg(root), root)
    stored = json.loads((root / "reports" / "gate.json").read_text())
    record = stored["checks"][0]
    assert record["name"] == "id_test.accuracy vs ratio" and record["status"] == status
    assert record["against"] == "single"
    assert record["rule"] == f"ratio >= {ratio:g}"
    assert record["margin"] == pytest.approx(0.99 / 0.9 - ratio)
    assert verdict["verdict"] == ("passed" if status == "passed" else "failed")
    md = (root / "reports" / "gate.md").read_text()
    assert f"| id_test.accuracy vs ratio | single | {status} |" in md
    if status == "failed":
        assert stored["failures"][0]["by"] == pytest.approx(ratio - 0.99 / 0.9)
        assert "- failed: id_test.accuracy vs ratio against single by 0.1000 (ratio >= 1.2)" in md


def test_run_refuses_a_check_of_an_unknown_kind_before_anything(tmp_path: Path):
    """The schema types ``kind`` as a string; ``hydra-ens run`` holds each check to its kind
    (:func:`tasks.gates.kinds.check_kinds`) before params.yaml is rewritten or any stage starts."""
    from typer.testing import CliRunner

    from flows.cli import app
    from tasks.params import write_params

    nope = {"kind": "nope", "metric": "accuracy", "threshold": 0.5}
    params = tmp_path / "params.yaml"
    write_params(resolve_params("quick", {"gates": [nope, *COMPILE]}), params)
    before = params.read_bytes()
    res = CliRunner().invoke(app, ["run", "-C", str(tmp_path), "--set", "seed=1"])
    said = " ".join(res.output.split())
    assert res.exit_code == 2, res.output
    assert "gates.0: kind='nope' is unknown; registered: threshold, baseline" in said
    assert params.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]
