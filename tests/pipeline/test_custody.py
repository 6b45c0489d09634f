"""The chain of custody of the model side (one verdict per model, the compiled artifact scored,
the preprocessing in the bundle), on one tiny digits project
run stage by stage (an ``export`` artifact, so a compiled artifact really ships) and copied per
test; the text preprocessing on a prepared BBC News split and the bundled MiniLM tokenizer.

* Hole 2: ``compiled.json`` records the calibrated model it was compiled from, ``evaluate.json``
  what it scored; gate, bundle and a served bundle refuse a broken link in one line.
* Hole 8: evaluate scores the compiled artifact on every split beside the eager model; compile
  checks held-out examples of every split at several lengths; no gate list drops the compile
  checks.
* Hole 4: the bundle ships its preprocessing, and ``predict`` uses it, not ``params.yaml``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from tasks import bundle, gate
from tasks.params import ConfigError, resolve_params, validate_params, write_params
from tasks.release.bundle_format import MANIFEST
from tasks.runtime.layout import BUNDLE, COMPILED, HYDRA, METRICS

REPO = Path(__file__).resolve().parents[2]

SETS = {
    "data.name": "digits",
    "data.max_per_split": 32,
    "data.far_ood_size": 24,
    "baselines.mc_dropout.enabled": False,
    "scoring.method": "circuit",
    "members.num_members": 2,
    "runtime.device": "cpu",
    "compile.backend": "export",
    "compile.precision": "fp32",
    "compile.check_examples": 16,
    "evaluate.batch_size": 16,
}


def _cfg(**more):
    return resolve_params("quick", sets={**SETS, **more})


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """prepare_data .. evaluate of the tiny digits project (no gate, bundle or registry)."""
    from tasks import (
        baseline_logits,
        calibrate,
        evaluate,
        finetune_base,
        finetune_baselines,
        finetune_members,
        merge,
        prepare_data,
        score_heads,
        select_members,
    )
    from tasks import compile as compile_stage

    root = tmp_path_factory.mktemp("custody") / "proj"
    root.mkdir()
    cfg = _cfg()
    write_params(cfg, root / "params.yaml")
    for stage in (
        prepare_data,
        finetune_base,
        finetune_baselines,
        baseline_logits,
        score_heads,
        select_members,
        finetune_members,
        merge,
        calibrate,
        compile_stage,
        evaluate,
    ):
        stage.run(cfg, root)
    return root


@pytest.fixture
def project(built, tmp_path) -> Path:
    root = tmp_path / "proj"
    shutil.copytree(built, root)
    return root


def _one_line_error(fn, *args, match: str) -> str:
    with pytest.raises(ValueError, match=match) as err:
        fn(*args)
    assert "\n" not in str(err.value), str(err.value)
    return str(err.value)


# ---- one chain of custody --------------------------------------------------------------------
def test_compiled_and_evaluate_record_where_they_came_from(built):
    from tasks.release.custody import folder_sha256, scored_params_md5

    model = folder_sha256(built / HYDRA)
    compiled = json.loads((built / COMPILED / "compiled.json").read_text())
    assert compiled["source"] == {"path": "models/hydra", "sha256": model}
    assert set(model) == {"hydra.json", "model.safetensors"}
    scored = json.loads((built / METRICS / "evaluate.json").read_text())["scored"]
    assert scored["model"]["sha256"] == model
    assert scored["compiled"]["sha256"] == folder_sha256(built / COMPILED)
    assert {"compiled.json", "program.pt2"} <= set(scored["compiled"]["sha256"])
    assert len(scored["data"]["sha256"]) == 64 and scored["data"]["path"].endswith("manifest.json")
    assert scored["params"]["md5"] == scored_params_md5(_cfg())


def test_a_model_recalibrated_after_compile_and_evaluate_is_never_judged(project):
    """A broken chain: change params, merge and calibrate again, skip compile and evaluate,
    then gate and bundle: both refuse in one line naming the broken link."""
    from tasks import calibrate, merge
    from tasks import compile as compile_stage

    gate.run(_cfg(), project)  # a verdict on the old model, as a previous run left it
    changed = _cfg(**{"merge.mode": "average"})
    write_params(changed, project / "params.yaml")
    merge.run(changed, project)
    calibrate.run(changed, project)
    said = _one_line_error(
        gate.run, changed, project, match=r"models/compiled <- models/hydra: .*compiled from"
    )
    assert "another calibrated model" in said and "rerun compile and evaluate" in said
    assert "hydra.json" in said or "model.safetensors" in said
    with pytest.raises(ValueError, match="models/hydra"):
        bundle.run(changed, project)
    assert not (project / BUNDLE).exists()
    # compile again but still skip evaluate: the evaluation scored the old model and artifact
    compile_stage.run(changed, project)
    _one_line_error(
        gate.run, changed, project, match=r"metrics/evaluate\.json scored another models/hydra"
    )


def test_an_evaluation_under_other_params_is_never_judged(project):
    changed = _cfg(**{"evaluate.ood_score": "energy"})
    said = _one_line_error(gate.run, changed, project, match="scored another the params it reads")
    assert "evaluate" in said and "rerun evaluate" in said
    # a gate-only edit leaves the evaluation valid (DVC does not rerun evaluate for it)
    gates = [g.model_dump(mode="json") for g in _cfg().gates[-2:]]
    assert gate.run(_cfg(gates=gates), project)["num_checks"] == 2


def test_an_evaluation_without_a_scored_record_is_never_judged(project):
    path = project / METRICS / "evaluate.json"
    ev = json.loads(path.read_text())
    del ev["scored"]
    path.write_text(json.dumps(ev))
    _one_line_error(gate.run, _cfg(), project, match="records nothing it scored")


def test_a_served_bundle_checks_its_own_chain(project):
    from tasks.serving.served import load_served

    gate.run(_cfg(), project)
    bundle.run(_cfg(), project)
    folder = project / BUNDLE
    assert load_served(folder).answered_by.startswith("compiled export")
    # a compiled/ from another model, with bundle.json updated to vouch for it
    meta_path = folder / "compiled" / "compiled.json"
    meta = json.loads(meta_path.read_text())
    meta["source"]["sha256"]["model.safetensors"] = "0" * 64
    meta_path.write_text(json.dumps(meta))
    _revouch(folder)
    _one_line_error(load_served, folder, match=r"compiled/ <- model/: .*another calibrated model")


def _revouch(folder: Path) -> None:
    from hydra_ops.hashing import sha256_file

    manifest_path = folder / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["files"] = {rel: sha256_file(folder / rel) for rel in manifest["files"]}
    manifest_path.write_text(json.dumps(manifest))


def test_scored_params_are_the_params_evaluate_declares_in_dvc_yaml():
    from tasks.release.custody import SCORED_PARAMS

    declared = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["evaluate"]["params"]
    # the other entry is the hardware choices file (tasks.runtime.hardware), not params.yaml
    assert sorted(SCORED_PARAMS) == sorted(p for p in declared if isinstance(p, str))


# ---- the artifact that ships is the artifact that was scored --------------------------
def test_evaluate_scores_the_compiled_artifact_on_every_split(built):
    ev = json.loads((built / METRICS / "evaluate.json").read_text())
    hydra = ev["models"]["hydra"]
    assert hydra["scored_by"].startswith("compiled export (fp32 on cpu)")
    compared = hydra["compiled_vs_eager"]
    assert set(compared) == {"id_test", "shift", "near_ood", "far_ood"}
    for split, c in compared.items():
        key = "test" if split == "id_test" else split
        assert c["num_examples"] == ev["counts"][key]
        assert c["argmax_agreement"] == 1.0 and c["max_abs_diff_probs"] <= 1e-4, (split, c)
    assert hydra["compile_max_abs_diff"] >= max(c["max_abs_diff_probs"] for c in compared.values())


def test_compile_checks_held_out_examples_and_every_example_of_every_split(built):
    """A sample of each split at several lengths, and every example as evaluate batches it
    (``<split>/all``): what the gate judges is what compile checked."""
    from tasks.runtime.data import split

    check = json.loads((built / COMPILED / "compiled.json").read_text())["check"]
    splits = ("test", "shift", "near_ood", "far_ood")
    assert set(check["splits"]) == {*splits, *(f"{s}/all" for s in splits)}
    counts = {s: c["num_examples"] for s, c in check["splits"].items()}
    sizes = {f"{s}/all": len(split(built, s)) for s in splits}
    assert counts == {**dict.fromkeys(splits, 16), **sizes}, counts
    assert check["num_examples"] == 64 + sum(sizes.values()) and check["passed"]


def test_the_gate_judges_what_the_artifact_computes_not_the_eager_stand_in(project, monkeypatch):
    """An artifact that computes something else than its eager model: evaluate's Hydra metrics
    are the artifact's, the difference is reported per split, and the gate fails it."""
    import hydra_ops.compile as hc
    from tasks import evaluate

    real = hc.load_compiled

    def flipped(directory, device=None):
        artifact = real(directory, device)
        runner = artifact.runner
        return hc.CompiledArtifact(
            artifact.backend, artifact.directory, artifact.metadata, lambda *t: -runner(*t)
        )

    monkeypatch.setattr(hc, "load_compiled", flipped)
    before = json.loads((project / METRICS / "evaluate.json").read_text())["models"]["hydra"]
    after = evaluate.run(_cfg(), project)["models"]["hydra"]
    assert after["calibrated"]["id_test"] != before["calibrated"]["id_test"]
    assert all(c["argmax_agreement"] < 1.0 for c in after["compiled_vs_eager"].values())
    assert after["compile_argmax_agreement"] < 1.0 and after["compile_max_abs_diff"] > 1e-2
    verdict = gate.run(_cfg(), project)
    statuses = {c["metric"]: c["status"] for c in verdict["checks"]}
    assert statuses["compile_argmax_agreement"] == "failed"
    assert statuses["compile_max_abs_diff"] == "failed"


@pytest.mark.parametrize("dropped", ["compile_argmax_agreement", "compile_max_abs_diff"])
def test_a_gate_list_without_the_compile_checks_is_refused(dropped):
    gates = [g for g in resolve_params("quick").model_dump(mode="json")["gates"]]
    kept = [g for g in gates if g["metric"] != dropped]
    with pytest.raises(ConfigError) as err:
        validate_params({"gates": kept})
    (line,) = str(err.value).splitlines()
    assert line.startswith("params.yaml: gates: must keep the compile agreement checks")
    assert dropped in line
    with pytest.raises(ConfigError, match="compile agreement checks"):
        validate_params({"gates": []})


def test_check_batches_hold_out_every_split_at_several_lengths(tmp_path):
    """Text: the trace example is not checked again, every split gives held-out examples, and
    the dynamic sequence dimension is checked at several lengths (the defaults, 64 examples of
    batch size 64, left nothing held out at one length before)."""
    from tasks import prepare_data
    from tasks.compile import check_batches, check_lengths

    sets = {"data.max_per_split": 40, "data.far_ood_size": 24, "evaluate.batch_size": 8}
    cfg = resolve_params("quick", sets=sets)
    prepare_data.run(cfg, tmp_path)
    example, heldout = check_batches(cfg, tmp_path)
    assert example["input_ids"].shape[0] == 8
    assert set(heldout) == {"test", "shift", "near_ood", "far_ood"}
    lengths = {b["input_ids"].shape[1] for bs in heldout.values() for b in bs}
    assert len(lengths) >= 2 and max(lengths) <= cfg.model.max_length
    assert check_lengths(64) == (64, 32, 16) and check_lengths(8) == (8,)
    from tasks.runtime import data as prepared

    test_texts = prepared.split(tmp_path, "test").texts
    n_test = sum(b["input_ids"].shape[0] for b in heldout["test"])
    assert n_test == min(cfg.compile.check_examples, len(test_texts) - 8)


# ---- the bundle carries its preprocessing ---------------------------------------------
def test_the_bundle_ships_its_preprocessing_and_predict_uses_it(project, monkeypatch):
    import tasks.release.model_registry
    from tasks.serving.predict import predict

    gate.run(_cfg(), project)
    bundle.run(_cfg(), project)
    folder = project / BUNDLE
    record = json.loads((folder / "preprocessing.json").read_text())
    assert record["image_size"] == _cfg().model.vit.image_size and record["channels"] == 1
    assert record["normalisation"]["divide_by"] == 255.0
    assert "preprocessing.json" in json.loads((folder / MANIFEST).read_text())["files"]
    monkeypatch.setattr(
        tasks.release.model_registry,
        "resolve_prod_dir",
        lambda root, n, s: (folder, {"version": "v0.0.9"}),
    )
    image = _digit_png(project)
    rows, _ = predict(_cfg(), project, [str(image)])
    # a workspace whose params disagree (another image size, RGB) changes nothing
    other = _cfg(**{"model.vit.image_size": 32, "data.channels": 3})
    again, _ = predict(other, project, [str(image)])
    assert again == rows
    assert rows[0]["model_version"] == "v0.0.9"
    assert rows[0]["preprocessing"].startswith("bundle image preprocessing 16x16 grayscale")


def _digit_png(project: Path) -> Path:
    from PIL import Image

    from tasks.runtime import data as prepared

    pixels = prepared.split(project, "test").images[0]
    path = project / "digit.png"
    Image.fromarray(pixels).save(path)
    return path


def test_text_preprocessing_comes_from_the_bundle_not_params(tmp_path):
    from hydra_ops.data import text_tokenizer
    from hydra_ops.models.bundled import minilm_path
    from hydra_ops.models.factory import make_text_batches
    from tasks.release.preprocessing import load_preprocessing, write_preprocessing

    shipped = resolve_params("quick", sets={"model.max_length": 48})
    record = write_preprocessing(shipped, tmp_path)
    assert record["max_length"] == 48 and (tmp_path / "tokenizer").is_dir()
    texts = ["Shares rose on strong profits " * 10, "The band's new album"]
    pre = load_preprocessing(tmp_path)
    tokenizer = text_tokenizer(str(minilm_path()))
    expected = next(make_text_batches(texts, None, tokenizer, 48, batch_size=2))
    got = pre.batch(texts)
    assert got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0)
    assert got["input_ids"].shape[1] == 48  # not the workspace's quick max_length 32
    assert "max_length 48" in pre.describe()
    # a tokenizer file changed in the bundle is refused
    config = tmp_path / "tokenizer" / "tokenizer_config.json"
    config.write_text(config.read_text().replace('"do_lower_case": true', '"do_lower_case": false'))
    with pytest.raises(ValueError, match=r"tokenizer/ does not match the sha256"):
        load_preprocessing(tmp_path)
    (tmp_path / "preprocessing.json").unlink()
    with pytest.raises(ValueError, match="predates shipped preprocessing"):
        load_preprocessing(tmp_path)
