"""Calibrated uncertainty columns, OOD verdict thresholds, and the `hydra-ens predict` rows.

Hand-checkable numbers: two classes, member probabilities such as (0.8, 0.2), temperatures 0.5 / 2.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from hydra_ops.metrics import OOD_SCORE_KINDS, ood_scores
from hydra_ops.uq.calibrated import calibrated_ood_score, calibrated_uncertainty
from hydra_ops.uq.calibration import apply_temperature, ensemble_log_probs
from hydra_ops.uq.ood_thresholds import (
    VERDICTS,
    OodThresholds,
    empirical_quantile,
    fit_ood_thresholds,
    verdict_counts,
    verdicts,
)
from hydra_ops.uq.uncertainty import decompose
from tasks.params import ConfigError, resolve_params, validate_params
from tasks.predict import ROW_FIELDS, legend, rows_from_member_logits, validate_inputs

REPO = Path(__file__).resolve().parents[2]


def member_logits_of(*member_probs: tuple[float, ...]) -> torch.Tensor:
    """[1, M, C] logits whose softmaxes are exactly the given member probabilities."""
    return torch.tensor([member_probs], dtype=torch.float64).log()


def h(*p: float) -> float:
    return -sum(x * math.log(x) for x in p if x > 0)


def random_logits(n: int = 200, m: int = 4, c: int = 5, scale: float = 3.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, m, c, generator=g, dtype=torch.float64) * scale


# ---------------------------------------------------------------- calibrated columns
def test_prob_and_entropy_come_from_the_same_calibrated_distribution():
    # identical members (0.8, 0.2), T = 0.5: p_cal = (0.8^2, 0.2^2) / 0.68 = (16/17, 1/17)
    u = calibrated_uncertainty(member_logits_of((0.8, 0.2), (0.8, 0.2)), 0.5)
    assert u.predicted.tolist() == [0]
    assert u.prob.item() == pytest.approx(16 / 17, abs=1e-12)
    assert u.entropy.item() == pytest.approx(h(16 / 17, 1 / 17), abs=1e-12)  # 0.22372 nats
    assert u.entropy.item() == pytest.approx(0.22372, abs=1e-5)
    assert u.mutual_information.item() == pytest.approx(0.0, abs=1e-12)  # members agree exactly
    assert u.disagreement.item() == 0.0
    assert u.ood_score.item() == pytest.approx(-16 / 17, abs=1e-12)  # msp = -prob
    assert u.max_entropy == pytest.approx(math.log(2))


def test_confident_prediction_has_entropy_near_zero_and_bounded_by_ln_c():
    confident = torch.tensor([[[20.0, 0.0, 0.0]] * 3])
    u = calibrated_uncertainty(confident, 0.5)
    assert u.prob.item() > 1 - 1e-12 and u.entropy.item() < 1e-12
    x = random_logits()
    for t in (0.3, 0.5, 1.0, 2.0, 5.0):
        u = calibrated_uncertainty(x, t)
        assert torch.equal(u.prob, u.probs.max(dim=1).values)
        assert bool((u.entropy >= 0).all()) and bool((u.entropy <= math.log(5) + 1e-12).all())
        # consistent with prob: any distribution whose top probability is p has H >= h(p, 1 - p)
        assert bool(
            (u.entropy >= torch.tensor([h(p, 1 - p) for p in u.prob.tolist()]) - 1e-9).all()
        )


def test_opposed_members_split_entropy_into_expected_entropy_and_mutual_information():
    # members (0.8, 0.2) and (0.2, 0.8): pbar = (0.5, 0.5) = p_cal for every T, so q_m = p_m
    x = member_logits_of((0.8, 0.2), (0.2, 0.8))
    for t in (0.5, 1.0, 2.0):
        u = calibrated_uncertainty(x, t)
        assert u.prob.item() == pytest.approx(0.5)
        assert u.entropy.item() == pytest.approx(math.log(2))
        assert u.expected_entropy.item() == pytest.approx(h(0.8, 0.2))  # 0.5004
        assert u.mutual_information.item() == pytest.approx(math.log(2) - h(0.8, 0.2))  # 0.1927
        assert u.disagreement.item() == 0.5


def test_temperature_one_equals_the_classical_decomposition():
    x = random_logits(seed=1)
    u, d = calibrated_uncertainty(x, 1.0), decompose(x.softmax(-1))
    for key, ref in (
        ("entropy", "total_entropy"),
        ("expected_entropy", "expected_entropy"),
        ("mutual_information", "mutual_information"),
        ("disagreement", "disagreement"),
    ):
        torch.testing.assert_close(getattr(u, key), d[ref], atol=1e-9, rtol=0)


def test_mutual_information_is_the_mi_of_the_recalibrated_joint():
    """Independent float64 check: P(m, y) = p_cal(y) p_m(y) / (M pbar(y)); MI = I(Y; member)."""
    x = random_logits(n=50, m=3, c=4, seed=2)
    for t in (0.4, 2.5):
        u = calibrated_uncertainty(x, t)
        p = x.softmax(-1)
        pbar = p.mean(1)
        p_cal = torch.softmax(pbar.log() / t, dim=1)
        joint = p_cal[:, None, :] * p / (3 * pbar[:, None, :])
        assert torch.allclose(joint.sum((1, 2)), torch.ones(50, dtype=torch.float64))
        pm, py = joint.sum(2, keepdim=True), joint.sum(1, keepdim=True)
        mi = (joint * (joint / (pm * py)).log()).sum((1, 2))
        torch.testing.assert_close(u.mutual_information, mi, atol=1e-9, rtol=0)
        assert bool((u.mutual_information >= 0).all())
        assert bool((u.mutual_information <= u.entropy + 1e-12).all())
        assert bool((u.mutual_information <= math.log(3) + 1e-12).all())
        torch.testing.assert_close(u.expected_entropy + u.mutual_information, u.entropy)


def test_mutual_information_is_zero_for_identical_members_at_any_temperature():
    one = random_logits(n=20, m=1, c=4, seed=3)
    x = one.expand(20, 5, 4).clone()
    for t in (0.2, 1.0, 3.0):
        u = calibrated_uncertainty(x, t)
        assert u.mutual_information.abs().max().item() < 1e-10
        assert u.disagreement.max().item() == 0.0


def test_disagreement_counts_member_votes_against_the_prediction():
    # votes 0, 0, 1 -> the ensemble predicts 0; one member of three disagrees
    x = member_logits_of((0.9, 0.1), (0.7, 0.3), (0.4, 0.6))
    for t in (0.5, 2.0):
        u = calibrated_uncertainty(x, t)
        assert u.predicted.item() == 0 and u.disagreement.item() == pytest.approx(1 / 3)


@pytest.mark.parametrize("kind", OOD_SCORE_KINDS)
def test_ood_score_is_the_evaluate_stage_score(kind):
    x = random_logits(n=30, m=3, c=4, seed=4).float()
    t = 0.503
    # the formula tasks/evaluate.py used before it called calibrated_ood_score
    expected = ood_scores(
        apply_temperature(ensemble_log_probs(x), t),
        member_probs=x.softmax(-1),
        logits=x / t,
        kind=kind,
    )
    assert torch.equal(calibrated_ood_score(x, t, kind), expected)
    u = calibrated_uncertainty(x, t, kind)
    assert torch.equal(u.ood_score, expected) and u.ood_score_kind == kind
    if kind == "msp":
        assert torch.equal(u.ood_score, -u.prob)


def test_bad_arguments_name_the_argument():
    x = random_logits(n=2, m=2, c=3)
    with pytest.raises(ValueError, match="temperature"):
        calibrated_uncertainty(x, 0.0)
    with pytest.raises(ValueError, match="ood_score_kind"):
        calibrated_uncertainty(x, 1.0, "maxlogit")
    with pytest.raises(ValueError, match="member_logits"):
        calibrated_uncertainty(x[:, 0], 1.0)
    with pytest.raises(ValueError, match="member_logits"):
        calibrated_uncertainty(x.masked_fill(x > 0, float("nan")), 1.0)


# ---------------------------------------------------------------- thresholds and verdicts
def test_thresholds_are_the_quantiles_id_scores_stay_under():
    scores = torch.arange(1, 101, dtype=torch.float32)  # 1, 2, ..., 100 (shuffled below)
    scores = scores[torch.randperm(100, generator=torch.Generator().manual_seed(0))]
    th = fit_ood_thresholds(scores, score="msp")
    assert (th.uncertain, th.likely_ood) == (90.0, 95.0)
    assert (th.uncertain_quantile, th.likely_ood_quantile, th.n) == (0.9, 0.95, 100)
    assert (th.score, th.fitted_on) == ("msp", "val")
    # on the scores it was fitted on: 90 ok, 5 uncertain, 5 likely OOD
    assert verdict_counts(scores, th) == {"ok": 90, "uncertain": 5, "likely_ood": 5}
    th2 = fit_ood_thresholds(
        scores, score="energy", uncertain_quantile=0.5, likely_ood_quantile=0.8
    )
    assert (th2.uncertain, th2.likely_ood) == (50.0, 80.0)


def test_empirical_quantile_is_the_ceil_qn_th_smallest():
    s = torch.tensor([3.0, 1.0, 2.0, 4.0])
    assert empirical_quantile(s, 0.5) == 2.0  # ceil(2.0) = 2nd smallest
    assert empirical_quantile(s, 0.6) == 3.0  # ceil(2.4) = 3rd
    assert empirical_quantile(s, 0.01) == 1.0
    assert empirical_quantile(s, 0.99) == 4.0
    hundred = torch.arange(1, 101, dtype=torch.float64)
    assert empirical_quantile(hundred, 0.07) == 7.0  # 0.07 * 100 = 7.000000000000001 in floats


def test_verdict_boundaries_give_the_milder_verdict_on_equality():
    th = OodThresholds("msp", -0.9, -0.8, 0.9, 0.95, "val", 10)
    scores = torch.tensor([-0.95, -0.9, -0.89, -0.8, -0.79, 0.0], dtype=torch.float64)
    assert verdicts(scores, th) == [
        "ok",
        "ok",
        "uncertain",
        "uncertain",
        "likely_ood",
        "likely_ood",
    ]
    assert verdict_counts(scores[:2], th) == {"ok": 2, "uncertain": 0, "likely_ood": 0}
    # float32 scores compare with the float64 thresholds they were fitted from without round-off
    s32 = torch.tensor([0.1, 0.2, 0.3, 0.7], dtype=torch.float32)
    th32 = fit_ood_thresholds(s32, score="msp", uncertain_quantile=0.5, likely_ood_quantile=0.75)
    assert verdicts(s32, th32) == ["ok", "ok", "uncertain", "likely_ood"]


def test_threshold_fitting_rejects_bad_input():
    s = torch.rand(10)
    with pytest.raises(ValueError, match="uncertain_quantile must be < likely_ood_quantile"):
        fit_ood_thresholds(s, score="msp", uncertain_quantile=0.95, likely_ood_quantile=0.9)
    with pytest.raises(ValueError, match="likely_ood_quantile"):
        fit_ood_thresholds(s, score="msp", likely_ood_quantile=1.0)
    with pytest.raises(ValueError, match="id_scores"):
        fit_ood_thresholds(torch.tensor([]), score="msp")
    with pytest.raises(ValueError, match="id_scores"):
        fit_ood_thresholds(torch.tensor([0.1, float("nan")]), score="msp")


def test_thresholds_round_trip_through_metadata():
    th = fit_ood_thresholds(torch.linspace(-1, 0, 21), score="msp")
    meta = json.loads(json.dumps(th.to_metadata()))
    assert set(meta) == {
        "score",
        "uncertain",
        "likely_ood",
        "uncertain_quantile",
        "likely_ood_quantile",
        "fitted_on",
        "n",
    }
    assert OodThresholds.from_metadata(meta) == th
    with pytest.raises(ValueError, match="missing likely_ood"):
        OodThresholds.from_metadata({k: v for k, v in meta.items() if k != "likely_ood"})
    with pytest.raises(ValueError, match="must be <= likely_ood"):
        OodThresholds.from_metadata({**meta, "uncertain": 1.0})


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
    from tasks import calibrate, report, scorecard
    from tasks.layout import HYDRA, MERGED

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

    import tasks.predict
    import tasks.registry
    import tasks.served

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
    monkeypatch.setattr(tasks.registry, "resolve_prod_dir", lambda root, n, s: (root, prod))
    monkeypatch.setattr(tasks.served, "load_served", lambda d: served)
    monkeypatch.setattr(tasks.predict, "_batch", lambda cfg, inputs: {})
    return served


def test_predict_reads_temperature_thresholds_and_runtime_from_the_served_bundle(
    tmp_path, served_stub
):
    from tasks.predict import predict

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
