"""Every candidate a run builds is judged by the same gate checks, and the cheapest passing one
that ``promote.candidates`` allows ships.

A real project (:mod:`promotion_project`: git, DVC, GTO; the model stages replaced by a stand-in)
whose stand-in builds a tiny BERT base on the MiniLM tokenizer's ids, its naive pruned model (the
base with one plan's heads kept) and a tiny Hydra, and writes the evaluation evaluate would: the
Hydra and the naive pruned model pass the gates, the single model fails the strict improvement on
itself, and the naive pruned model is the cheapest (``metrics/cost.json``). The real gate, bundle,
promote and predict code run on it.
"""

from __future__ import annotations

import json
from pathlib import Path

import promotion_project as pp
import pytest
import torch
from tiny_models import make_members, member_plans, tiny_model

from hydra_ops.heads.plans import save_plans
from hydra_ops.hydra.merge import merge_members
from hydra_ops.hydra.serialization import save_hydra
from hydra_ops.models.checkpoints import load_pruned, save_model
from hydra_ops.models.inference import logits
from tasks import gate
from tasks.candidates.export import export_record, naive_pruned_export
from tasks.gates.candidates import applicability, cheaper, cheapest, gate_summary
from tasks.params import ConfigError, GateCheck, resolve_params, validate_params
from tasks.params.promote import SHIPPABLE
from tasks.promote import promote
from tasks.release.custody import scored_record, source_record
from tasks.serving.predict import ROW_FIELDS
from tasks.serving.predict import predict as local_predict

TOKENIZER_SHAPE = {"vocab_size": 30522, "max_position_embeddings": 64}
TEXTS = ["Shares rose on strong profits", "The band's new album"]
CLASSES = ["business", "entertainment", "sport"]
GATES = [
    {"metric": "accuracy", "split": "id_test", "threshold": 0.5},
    {"metric": "nll", "split": "id_test", "baseline": "single", "tolerance": 0.02},
    {"metric": "nll", "split": "shift", "baseline": "single", "min_absolute_change": 0.01},
    {"metric": "nll", "split": "id_test", "baseline": "naive_pruned", "tolerance": 0.02}
    | {"any_of": "beats naive_pruned"},
    {"metric": "compile_max_abs_diff", "threshold": 1e-4},
    {"metric": "compile_argmax_agreement", "threshold": 1.0},
]
#: (id_test.nll, shift.nll) per model; the Hydra beats its twin on ID NLL by an interval.
NLL = {"hydra": (0.25, 0.33), "single": (0.40, 0.38), "naive_pruned": (0.32, 0.335)}
#: latency ratio to single [95%], FLOPs: the naive pruned model is the cheapest.
COST = {
    "hydra": (1.5, 1.4, 1.6, 3e6),
    "single": (1.0, 0.95, 1.05, 2e6),
    "naive_pruned": (0.6, 0.55, 0.65, 1e6),
}


def _entry(name: str) -> dict:
    nll, shift = NLL[name]
    metrics = {
        "id_test": {"accuracy": 0.9, "nll": nll, "ece": 0.02},
        "shift": {"accuracy": 0.85, "nll": shift},
        "near_ood": {"auroc": 0.8},
        "far_ood": {"auroc": 0.9},
    }
    return {
        "members": 2 if name == "hydra" else 1,
        "temperature": 1.5,
        "parameters": 10,
        "calibrated": metrics,
    }


def _interval(diff: float) -> dict:
    return {"difference": diff, "low": diff - 0.03, "high": diff + 0.03, "mean": diff}


def _train(root: Path) -> None:
    """The stand-in's outputs: base, naive plan, Hydra, compile record, evaluation, cost."""
    base = tiny_model("bert", 0, **TOKENIZER_SHAPE)
    save_model(base, root / "models" / "base")
    save_plans(root / "artifacts" / "plans" / "naive_plan.json", member_plans(1))
    torch.manual_seed(0)
    members = make_members("bert", member_plans(2), fine_tuned=True, **TOKENIZER_SHAPE)
    save_hydra(merge_members(members, class_names=CLASSES), root / "models" / "hydra")
    pp.write(root / "data" / "prepared" / "manifest.json", {"source": "stand-in"})
    compiled = {"backend": "eager", "check": None, "source": source_record(root)}
    pp.write(root / "models" / "compiled" / "compiled.json", compiled)
    models = {n: _entry(n) for n in NLL}
    models["hydra"] |= {"compile_backend": "eager", "compile_max_abs_diff": None}
    models["naive_pruned"]["ood_thresholds"] = None  # its msp thresholds: see predict's verdict

    def boot(a: str, b: str) -> dict:
        d = NLL[a][0] - NLL[b][0], NLL[a][1] - NLL[b][1]
        split = {"id_test": {"nll": _interval(d[0])}, "shift": {"nll": _interval(d[1])}}
        return {"calibrated": split}

    scored = scored_record(pp.cfg(root), root)
    scored["candidates"] = {"naive_pruned": export_record(root, naive_pruned_export(), CLASSES)}
    ev = {
        "models": models,
        "bootstrap": {b: boot("hydra", b) for b in ("single", "naive_pruned")},
        "candidate_bootstrap": {
            "single": {"naive_pruned": boot("single", "naive_pruned")},
            "naive_pruned": {"single": boot("naive_pruned", "single")},
        },
        "counts": {"test": 4},
        "scored": scored,
    }
    pp.write(root / "metrics" / "evaluate.json", ev)
    cost = {
        n: {
            "ratio": r,
            "ratio_low": lo,
            "ratio_high": hi,
            "flops": f,
            "flops_ratio": f / 2e6,
            "parameters": 10,
            "median_ms": 1.0,
        }
        for n, (r, lo, hi, f) in COST.items()
    }
    pp.write(root / "metrics" / "cost.json", {"reference": "single", "models": cost})


def _set_candidates(root: Path, names: list[str]) -> None:
    overrides = {"gates": GATES, "promote": {"candidates": names}}
    pp.write_params(resolve_params("quick", overrides), root / "params.yaml")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """One project for the module (its tests run in order, in one worker: each sets
    ``promote.candidates`` and reruns the gate itself)."""
    root = pp.build(tmp_path_factory.mktemp("candidates") / "proj", gates=GATES)
    # the stand-in also writes metrics/cost.json (evaluate's), which promote holds to dvc.lock
    dvc_yaml = root / "dvc.yaml"
    evaluation = "      - metrics/evaluate.json: {cache: false}\n"
    dvc_yaml.write_text(
        dvc_yaml.read_text().replace(
            evaluation, evaluation + evaluation.replace("evaluate", "cost")
        )
    )
    pp.git(root, "commit", "-qam", "the stand-in writes cost.json")
    _train(root)
    return root


def test_every_candidate_is_judged_and_the_summary_names_a_cheaper_one(project):
    from flows.cli import console
    from flows.render import print_run_summary

    _set_candidates(project, ["hydra"])

    verdict = gate.run(pp.cfg(project), project)
    assert (verdict["verdict"], verdict["ships"], verdict["candidate"]) == (
        "passed",
        "hydra",
        "hydra",
    )
    judged = verdict["candidates"]
    assert {n: j["verdict"] for n, j in judged.items()} == {
        "hydra": "passed",
        "single": "failed",
        "naive_pruned": "passed",
    }
    assert verdict["cheaper_passing"] == ["naive_pruned"]
    # the single model: the strict improvement on itself fails, said why; its self-comparison and
    # the compile checks do not apply, each with its reason, never a silent pass
    single = {c["name"]: c for c in judged["single"]["checks"]}
    assert single["shift.nll vs single"]["status"] == "failed"
    assert "no model makes one" in single["shift.nll vs single"]["note"]
    assert single["id_test.nll vs single"]["status"] == "not applicable"
    assert single["model.compile_argmax_agreement vs 1"]["status"] == "not applicable"
    # the naive pruned model: its twin group is against itself (not applicable, said why); the
    # checks against the single model read its own paired interval (candidate - single)
    twin = {c["name"]: c for c in judged["naive_pruned"]["checks"]}
    assert twin["id_test.nll vs naive_pruned"]["status"] == "not applicable"
    assert "this candidate" in twin["id_test.nll vs naive_pruned"]["note"]
    assert twin["shift.nll vs single"]["status"] == "passed"
    hydra_twin = {c["name"]: c for c in judged["hydra"]["checks"]}["id_test.nll vs naive_pruned"]
    assert hydra_twin["better"] and hydra_twin["status"] == "passed"
    assert judged["naive_pruned"]["cost"]["ratio"] == 0.6
    report = (project / "reports" / "gate.md").read_text()
    assert "| naive_pruned (ships) |" not in report and "| naive_pruned | passed | 0.60x" in report
    assert "a model against itself" in report
    # the run's summary line says a cheaper candidate passes
    summary = {"stages": [], "seconds": 1.0, "gate": gate_summary(verdict), "promotion": {}}
    with console.capture() as captured:
        print_run_summary(console, summary, "run.log")
    line = next(x for x in captured.get().splitlines() if x.startswith("gate:"))
    assert "PASSED" in line and "cheaper candidate passes the same checks: naive_pruned" in line
    assert "0.60x" in line and "promote.candidates" in line


def test_an_allowed_cheaper_candidate_ships_and_answers_predict(project):
    _set_candidates(project, ["hydra", "naive_pruned"])
    pp.gate_and_bundle(project)
    gate_json = json.loads((project / "reports" / "gate.json").read_text())
    assert (gate_json["ships"], gate_json["verdict"]) == ("naive_pruned", "passed")
    bundled = project / "models" / "bundle"
    assert json.loads((bundled / "bundle.json").read_text())["candidate"] == "naive_pruned"
    assert "ships `naive_pruned`, not the Hydra" in (bundled / "MODEL_CARD.md").read_text()
    record = promote(pp.cfg(project), project)
    assert record["promoted"] and record["candidate"] == "naive_pruned"
    rows, _ = local_predict(pp.cfg(project), project, TEXTS)
    assert all(list(r) == list(ROW_FIELDS) for r in rows)
    assert {r["candidate"] for r in rows} == {"naive_pruned"}
    assert all(r["answered_by"].startswith("naive_pruned") for r in rows)
    # what one model cannot give is marked, not made up
    for r in rows:
        assert r["mutual_information"] is None and r["disagreement"] is None
        assert r["verdict"] is None
        assert set(r["unavailable"]) == {"mutual_information", "disagreement", "verdict"}
    # the numbers are the naive pruned model's own: the base pruned to the plan, at its T
    from tasks.release.preprocessing import load_preprocessing

    model = load_pruned(project / "models" / "base", member_plans(1)[0])
    batch = load_preprocessing(bundled).batch(TEXTS)
    probs = torch.softmax(logits(model, [batch]) / 1.5, dim=-1)
    assert torch.allclose(torch.tensor([r["prob"] for r in rows]), probs.max(-1).values, atol=1e-6)
    assert [r["class"] for r in rows] == [CLASSES[i] for i in probs.argmax(-1).tolist()]


def test_a_candidate_bundle_keeps_the_chain_of_custody(project):
    from hydra_ops.hashing import sha256_file
    from tasks.serving.served import load_served

    _set_candidates(project, ["naive_pruned"])
    pp.gate_and_bundle(project)
    bundled = project / "models" / "bundle"
    # an edited candidate file, with the bundle's own manifest updated to match, is refused: the
    # bundled evaluation (bound to the verdict) holds the hashes of what was scored
    weights = bundled / "candidate" / "base" / "model.safetensors"
    tampered = weights.read_bytes()[:-4] + b"\0\0\0\0"
    weights.unlink()  # a new file: the DVC cache the bundle may link to stays intact
    weights.write_bytes(tampered)
    manifest = json.loads((bundled / "bundle.json").read_text())
    manifest["files"]["candidate/base/model.safetensors"] = sha256_file(weights)
    (bundled / "bundle.json").unlink()
    (bundled / "bundle.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=r"candidate/base/model\.safetensors is changed"):
        load_served(bundled)
    with pytest.raises(ValueError, match="changed since evaluate scored it"):
        promote(pp.cfg(project), project)
    # a verdict for another promote.candidates is stale: params changed since the gate
    pp.gate_and_bundle(project)
    _set_candidates(project, ["hydra"])
    with pytest.raises(ValueError, match=r"params\.yaml \("):
        promote(pp.cfg(project), project)


def test_applicability_of_each_check_to_each_candidate():
    strict = GateCheck(metric="nll", split="shift", baseline="single", min_absolute_change=0.01)
    twin = GateCheck(metric="nll", baseline="naive_pruned", tolerance=0.02, any_of="beats twin")
    plain = GateCheck(metric="ece", baseline="deep_ensemble", tolerance=0.01)
    compiled = GateCheck(metric="compile_argmax_agreement", threshold=1.0)
    for check in (strict, twin, plain, compiled):
        assert applicability(check, "hydra") is None  # the Hydra: every check, as written
    assert applicability(strict, "single")[0] == "failed"
    assert applicability(twin, "naive_pruned")[0] == "not applicable"
    assert applicability(plain, "deep_ensemble")[0] == "not applicable"
    assert applicability(compiled, "control")[0] == "not applicable"
    assert applicability(plain, "naive_pruned") is None and applicability(twin, "single") is None


def test_cost_ties_inside_the_interval_fall_to_flops_then_parameters():
    fast = {"ratio": 0.50, "ratio_low": 0.45, "ratio_high": 0.70, "flops": 9.0, "parameters": 5}
    lean = {"ratio": 0.60, "ratio_low": 0.55, "ratio_high": 0.65, "flops": 3.0, "parameters": 9}
    slow = {"ratio": 1.50, "ratio_low": 1.40, "ratio_high": 1.60, "flops": 1.0, "parameters": 1}
    assert cheapest({"fast": fast, "lean": lean, "slow": slow}) == "lean"  # a tie: fewer FLOPs
    assert cheaper(lean, slow) and not cheaper(slow, lean)  # a gap beyond both intervals
    unmeasured = {"parameters": 3}
    assert cheapest({"a": {"parameters": 4}, "b": unmeasured}) == "b"
    assert cheapest({}) is None


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (["hydra", "naive"], "unknown candidate 'naive'; allowed: " + ", ".join(SHIPPABLE)),
        (["hydra", "lora_ensemble"], "'lora_ensemble' is judged but cannot ship (no export yet)"),
        ([], "name at least one candidate"),
        (["hydra", "hydra"], "a candidate is named twice"),
    ],
)
def test_promote_candidates_is_validated_in_one_line(value, words):
    with pytest.raises(ConfigError) as err:
        validate_params({"promote": {"candidates": value}})
    msg = str(err.value)
    assert len(msg.splitlines()) == 1 and msg.startswith("params.yaml: promote.candidates: ")
    assert words in msg
    assert resolve_params("quick").promote.candidates == ["hydra"]
    assert resolve_params("default").promote.candidates == ["hydra", "naive_pruned"]
