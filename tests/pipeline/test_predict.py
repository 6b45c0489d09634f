"""`hydra-ens predict` rows and legend, the calibrate stage's thresholds the evaluate stage reads,
and the CLI on empty input and on a served bundle."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from hydra_ops.uq.calibrated import calibrated_ood_score
from hydra_ops.uq.ood_thresholds import (
    VERDICTS,
    OodThresholds,
    fit_ood_thresholds,
)
from tasks.params import ConfigError, resolve_params, validate_params
from tasks.serving.predict import ROW_FIELDS, legend, rows_from_member_logits, validate_inputs

REPO = Path(__file__).resolve().parents[2]


def member_logits_of(*member_probs: tuple[float, ...]) -> torch.Tensor:
    """[1, M, C] logits whose softmaxes are exactly the given member probabilities."""
    return torch.tensor([member_probs], dtype=torch.float64).log()


def random_logits(n: int = 200, m: int = 4, c: int = 5, scale: float = 3.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, m, c, generator=g, dtype=torch.float64) * scale


# ---------------------------------------------------------------- predict rows
def thresholds_msp() -> OodThresholds:
    return OodThresholds("msp", -0.9, -0.6, 0.9, 0.95, "val", 100)


def test_rows_follow_the_documented_schema():
    x = torch.cat(
        [
            member_logits_of((0.8, 0.2), (0.8, 0.2)),  # p_cal = (16/17, 1/17): ok
            member_logits_of((0.8, 0.2), (0.2, 0.8)),  # p_cal = (0.5, 0.5): likely OOD
        ]
    ).float()
    rows = rows_from_member_logits(
        ["a", "b"],
        x,
        temperature=0.5,
        class_names=["pos", "neg"],
        thresholds=thresholds_msp(),
        answered_by="eager (requested)",
        model_version="v0.0.1",
    )
    assert [list(r) for r in rows] == [list(ROW_FIELDS)] * 2
    json.dumps(rows)  # JSON-serialisable as printed by --json
    a, b = rows
    assert (a["schema_version"], a["answered_by"], a["model_version"]) == (
        1,
        "eager (requested)",
        "v0.0.1",
    )
    assert (a["input"], a["class"], a["class_index"], a["verdict"]) == ("a", "pos", 0, "ok")
    assert a["prob"] == pytest.approx(16 / 17) and a["entropy"] == pytest.approx(0.22372, abs=1e-5)
    assert a["ood_score"] == pytest.approx(-16 / 17) and a["ood_score_kind"] == "msp"
    assert a["max_entropy"] == pytest.approx(math.log(2))
    assert a["mutual_information"] == pytest.approx(0.0, abs=1e-6) and a["disagreement"] == 0.0
    assert (b["prob"], b["verdict"], b["disagreement"]) == (pytest.approx(0.5), "likely_ood", 0.5)
    assert b["entropy"] == pytest.approx(math.log(2), abs=1e-6)


def test_rows_use_the_thresholds_score_and_have_no_verdict_without_thresholds():
    x = random_logits(n=3, m=3, c=4, seed=5).float()
    th = OodThresholds("energy", -5.0, -4.0, 0.9, 0.95, "val", 10)
    rows = rows_from_member_logits(
        list("xyz"), x, temperature=2.0, class_names=None, thresholds=th, default_score_kind="msp"
    )
    assert {r["ood_score_kind"] for r in rows} == {"energy"}
    energy = calibrated_ood_score(x, 2.0, "energy")
    assert [r["ood_score"] for r in rows] == pytest.approx(energy.tolist())
    assert all(r["class"] == str(r["class_index"]) for r in rows)
    bare = rows_from_member_logits(
        list("xyz"), x, temperature=2.0, class_names=None, thresholds=None, default_score_kind="msp"
    )
    assert {r["verdict"] for r in bare} == {None} and bare[0]["ood_score_kind"] == "msp"
    with pytest.raises(ValueError, match="member_logits"):
        rows_from_member_logits(["x"], x, temperature=1.0, class_names=None, thresholds=None)
    with pytest.raises(ValueError, match="class_names"):
        rows_from_member_logits(list("xyz"), x, temperature=1.0, class_names=["a"], thresholds=th)


@pytest.mark.parametrize("inputs", [[], None, [""], ["ok", "   "], ["\n\t"]])
def test_empty_input_is_refused_with_one_line(inputs):
    with pytest.raises(ValueError, match=r"^inputs") as err:
        validate_inputs(inputs)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("args", [[], ["   "], ["fine", ""]])
def test_cli_predict_refuses_empty_input_before_loading_anything(tmp_path, args):
    from typer.testing import CliRunner

    from flows.cli import app

    res = CliRunner().invoke(app, ["predict", "-C", str(tmp_path), *args])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "inputs" in lines[0], res.output


def test_legend_states_units_and_thresholds():
    text = legend(4, 3, "msp", thresholds_msp())
    assert "\n" not in text
    assert "nats" in text and "ln C = 1.386" in text and "4 classes" in text
    assert "higher = more OOD" in text and "-0.9" in text and "-0.6" in text
    assert "likely OOD" in text and "3 members" in text
    assert "n/a" in legend(4, 3, "msp", None)


# ---------------------------------------------------------------- params and stages
def test_calibrate_params_default_validate_and_are_tracked_by_dvc():
    for profile in ("default", "quick"):
        cfg = resolve_params(profile)
        assert (cfg.calibrate.uncertain_quantile, cfg.calibrate.likely_ood_quantile) == (0.9, 0.95)
    with pytest.raises(ConfigError, match=r"params.yaml: calibrate: uncertain_quantile"):
        validate_params({"calibrate": {"uncertain_quantile": 0.95, "likely_ood_quantile": 0.9}})
    with pytest.raises(ConfigError, match=r"calibrate.likely_ood_quantile"):
        validate_params({"calibrate": {"likely_ood_quantile": 1.0}})
    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["calibrate"]
    assert "calibrate" in stage["params"] and "evaluate.ood_score" in stage["params"]
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    assert raw["calibrate"] == {"uncertain_quantile": 0.9, "likely_ood_quantile": 0.95}


def test_calibrate_stage_stores_thresholds_the_evaluate_stage_reads(tmp_path, monkeypatch):
    from tiny_models import make_members, member_plans

    from hydra_ops.hydra.merge import merge_members
    from hydra_ops.hydra.serialization import read_hydra_config, save_hydra
    from tasks import calibrate
    from tasks.evaluation import scorecard
    from tasks.reports import evaluate_markdown as report
    from tasks.runtime.layout import HYDRA, MERGED

    save_hydra(
        merge_members(make_members("bert", member_plans(2), fine_tuned=True)), tmp_path / MERGED
    )
    g = torch.Generator().manual_seed(6)
    val_logits = torch.randn(40, 2, 3, generator=g) * 2
    labels = val_logits.mean(1).argmax(1)
    monkeypatch.setattr(calibrate, "split", lambda root, name: name)
    monkeypatch.setattr(calibrate, "batches", lambda cfg, data, bs, **kw: [])
    monkeypatch.setattr(calibrate, "logits", lambda hydra, batches, **kw: val_logits)
    monkeypatch.setattr(calibrate, "split_labels", lambda data: labels)
    monkeypatch.setattr(calibrate, "weights_hash", lambda d: "test")
    monkeypatch.setattr(calibrate, "stage_precisions", lambda cfg, root, rt: {})  # no base here
    # precision pinned: the stubbed split has no batches for auto's probe to time
    cfg = validate_params(
        {
            "calibrate": {"uncertain_quantile": 0.5, "likely_ood_quantile": 0.75},
            "runtime": {"precision": "fp32"},
        }
    )
    result = calibrate.run(cfg, tmp_path)

    hydra_json = read_hydra_config(tmp_path / HYDRA)
    stored = hydra_json["metadata"]["ood_thresholds"]
    assert stored == result["ood_thresholds"]
    t = hydra_json["temperature"]
    expected = fit_ood_thresholds(
        calibrated_ood_score(val_logits, t, "msp"),
        score="msp",
        uncertain_quantile=0.5,
        likely_ood_quantile=0.75,
    )
    assert stored == {**expected.to_metadata(), "fitted_on": "val", "n": 40}
    # evaluate's verdicts on the validation logits themselves reproduce the quantiles
    counts, fractions, used = scorecard.hydra_verdicts(
        tmp_path, {s: val_logits for s in ("test", "near_ood", "far_ood")}, t
    )
    assert used == stored
    assert counts["id_test"] == {"ok": 20, "uncertain": 10, "likely_ood": 10}
    assert fractions["far_ood"] == {"ok": 0.5, "uncertain": 0.25, "likely_ood": 0.25}
    table = report.verdict_table(
        {
            "models": {"hydra": {"verdicts": counts, "verdict_fractions": fractions}},
            "verdict_thresholds": used,
        }
    )
    assert "| id_test | 40 | 20 (50.0%) | 10 (25.0%) | 10 (25.0%) |" in table
    assert set(VERDICTS) == {"ok", "uncertain", "likely_ood"}


@pytest.fixture
def served_stub(monkeypatch):
    """`predict` wired to a stub bundle: two inputs, T = 0.5, msp thresholds in the metadata."""
    from types import SimpleNamespace

    import tasks.release.model_registry
    import tasks.serving.predict
    import tasks.serving.served

    logits = torch.cat(
        [member_logits_of((0.8, 0.2), (0.8, 0.2)), member_logits_of((0.8, 0.2), (0.2, 0.8))]
    ).float()
    served = SimpleNamespace(
        hydra=SimpleNamespace(temperature=torch.tensor(0.5), class_names=["pos", "neg"]),
        metadata={"ood_thresholds": thresholds_msp().to_metadata()},
        answered_by="eager (no compiled artifact)",
        member_logits=lambda batch: logits,
        preprocessing=SimpleNamespace(describe=lambda: "bundle tokenizer stub, max_length 8"),
    )
    prod = {"version": "v0.0.7", "tag": "hydra@v0.0.7"}
    monkeypatch.setattr(
        tasks.release.model_registry, "resolve_prod_dir", lambda root, n, s: (root, prod)
    )
    monkeypatch.setattr(tasks.serving.served, "load_served", lambda d: served)
    monkeypatch.setattr(tasks.serving.predict, "_batch", lambda cfg, inputs: {})
    return served


def test_predict_reads_temperature_thresholds_and_runtime_from_the_served_bundle(
    tmp_path, served_stub
):
    from tasks.serving.predict import predict

    rows, info = predict(resolve_params("quick"), tmp_path, ["good", "odd"])
    assert [r["verdict"] for r in rows] == ["ok", "likely_ood"]
    assert rows[0]["prob"] == pytest.approx(16 / 17) and rows[0]["class"] == "pos"
    assert {r["answered_by"] for r in rows} == {"eager (no compiled artifact)"}
    assert {r["model_version"] for r in rows} == {"v0.0.7"}
    assert "ln C = 0.693" in info["legend"] and "2 members" in info["legend"]
    served_stub.metadata.clear()  # a model calibrated before thresholds existed
    rows, info = predict(resolve_params("quick"), tmp_path, ["good", "odd"])
    assert [r["verdict"] for r in rows] == [None, None] and "n/a" in info["legend"]


def test_cli_predict_prints_the_table_with_a_legend_and_json_lines(tmp_path, served_stub):
    from typer.testing import CliRunner

    from flows.cli import app
    from tasks.params import write_params

    write_params(resolve_params("quick"), tmp_path / "params.yaml")
    runner = CliRunner()
    res = runner.invoke(app, ["predict", "-C", str(tmp_path), "good", "odd"])
    assert res.exit_code == 0, res.output
    assert "likely OOD" in res.output and "ok" in res.output and "v0.0.7" in res.output
    legend_lines = [line for line in res.output.splitlines() if line.startswith("entropy, MI")]
    legend = " ".join(res.output[res.output.index("entropy, MI") :].split())  # wrapped at spaces
    assert len(legend_lines) == 1 and "higher = more OOD" in legend
    assert max(map(len, res.output.splitlines())) <= 80  # the table and legend fit 80 columns
    res = runner.invoke(app, ["predict", "-C", str(tmp_path), "--json", "good", "odd"])
    rows = [json.loads(line) for line in res.output.strip().splitlines()]
    assert [list(r) for r in rows] == [list(ROW_FIELDS)] * 2
    assert [r["verdict"] for r in rows] == ["ok", "likely_ood"]
