"""tasks.promote: promotion you can trust, on a synthetic workspace with real git and GTO (no
fine-tuning): the verdict is bound to what it judged, the bundle is what ships, versions are
reproducible commits, rollback, and failures that fail closed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import promotion_project as pp
import pytest
import torch
from tiny_models import make_members, member_plans

from hydra_ops.hydra.merge import merge_members
from hydra_ops.hydra.serialization import save_hydra
from tasks import bundle, gate
from tasks.gates.checks import evaluate_check
from tasks.params import GateCheck, resolve_params, write_params
from tasks.promote import promote, rollback
from tasks.release.bundle_format import verify_bundle
from tasks.release.model_registry import (
    VERSIONS_BRANCH,
    RegistryError,
    assignments,
    prod_metrics,
    prod_version,
    resolve_prod_dir,
    versions,
)
from tasks.serving.served import load_served

GATES = [
    {"metric": "accuracy", "split": "id_test", "threshold": 0.5},
    {"metric": "compile_max_abs_diff", "threshold": 1e-4},
]
#: Every gate list keeps the compile agreement checks (params validation refuses one without).
AGREEMENT = {"metric": "compile_argmax_agreement", "threshold": 1.0}


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, check=True, capture_output=True, text=True
    ).stdout


def _save_model(root: Path, seed: int) -> None:
    torch.manual_seed(seed)
    hydra = merge_members(make_members("bert", member_plans(2), fine_tuned=True))
    hydra.set_temperature(1.0 + seed)
    save_hydra(hydra, root / "models" / "hydra", metadata={"seed": seed})


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "tests@hydra-ens.invalid")
    git(root, "config", "user.name", "hydra-ens tests")
    write_params(resolve_params("quick", {"gates": [*GATES, AGREEMENT]}), root / "params.yaml")
    (root / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    pp.write(root / "data" / "prepared" / "manifest.json", {"synthetic": True})
    _save_model(root, 0)
    pp.write(root / "models" / "compiled" / "compiled.json", {"backend": "eager", "check": None})
    pp.write(root / "metrics" / "evaluate.json", pp.evaluation(0.95))
    git(root, "add", "params.yaml")
    git(root, "commit", "-q", "-m", "project")
    return root


def _cfg(root: Path):
    from tasks.params import load_params

    return load_params(root / "params.yaml")


def _stamp(root: Path) -> None:
    """What compile and evaluate record of the model there now (this project skips both)."""
    from tasks.release.custody import scored_record, source_record

    compiled = root / "models" / "compiled" / "compiled.json"
    pp.write(compiled, {**json.loads(compiled.read_text()), "source": source_record(root)})
    ev = root / "metrics" / "evaluate.json"
    pp.write(ev, {**json.loads(ev.read_text()), "scored": scored_record(_cfg(root), root)})


def _gate_and_bundle(root: Path) -> dict:
    """The gate and bundle stages, and the dvc.lock entries DVC would write for them (the
    promotion is checked against the lock it commits; a real ``dvc commit``:
    test_promotion_guarantees.py)."""
    import yaml

    from tasks.release.lineage import dvc_md5

    _stamp(root)
    verdict = gate.run(_cfg(root), root)
    bundle.run(_cfg(root), root)
    outs = {
        "evaluate": ["models/hydra", "models/compiled", "metrics/evaluate.json"],
        "gate": ["reports/gate.json"],
        "bundle": ["models/bundle"],
    }
    stages = {
        name: {
            "cmd": f"python -m tasks.{name}",
            "outs": [{"path": p, "md5": dvc_md5(root / p)} for p in paths],
        }
        for name, paths in outs.items()
    }
    (root / "dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": stages}))
    return verdict


def test_eager_compile_checks_are_not_applicable_never_passed(project):
    verdict = _gate_and_bundle(project)
    statuses = {c["metric"]: c["status"] for c in verdict["checks"]}
    assert statuses == {
        "accuracy": "passed",
        "compile_max_abs_diff": "not applicable",
        "compile_argmax_agreement": "not applicable",
    }
    assert verdict["passed"] and verdict["counts"]["not applicable"] == 2


@pytest.mark.parametrize(("precision", "tolerance"), [("fp32", 1e-4), ("bf16", 2e-2)])
def test_gate_json_shows_the_compile_tolerance_it_applied(project, precision, tolerance):
    gates = [
        {"metric": "compile_max_abs_diff", "threshold": "compile_tolerance"},  # the default
        {"metric": "compile_max_abs_diff", "threshold": 1e-4, "name": "pinned"},
        AGREEMENT,
    ]
    write_params(resolve_params("quick", {"gates": gates}), project / "params.yaml")
    ev = pp.evaluation(0.95)
    ev["models"]["hydra"] |= {
        "compile_backend": "export",
        "compile_max_abs_diff": 5e-3 if precision == "bf16" else 5e-5,
        "compile_precision": precision,
        "compile_tolerance": tolerance,
    }
    pp.write(project / "metrics" / "evaluate.json", ev)
    _stamp(project)
    gate.run(_cfg(project), project)
    report = json.loads((project / "reports" / "gate.json").read_text())
    by_name = {c["name"]: c for c in report["checks"]}
    followed = by_name["model.compile_max_abs_diff vs compile_tolerance"]
    assert followed["threshold"] == tolerance and followed["status"] == "passed"
    assert followed["threshold_from"] == f"compile tolerance for the shipped {precision}"
    assert by_name["pinned"]["threshold"] == 1e-4  # a number is applied as written
    assert by_name["pinned"]["status"] == ("failed" if precision == "bf16" else "passed")
    assert (
        f"<= {tolerance:g} (compile tolerance for the shipped {precision})"
        in (project / "reports" / "gate.md").read_text()
    )


def test_a_verdict_for_model_a_is_refused_with_model_b_on_disk(project):
    _gate_and_bundle(project)
    _save_model(project, 1)  # e.g. calibrate re-ran after the gate
    with pytest.raises(ValueError, match=r"stale.*models/hydra.*rerun") as err:
        promote(_cfg(project), project)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="stale"):  # forced or not
        promote(_cfg(project), project, force=True, reason="ship it anyway")
    assert versions(project, "hydra") == []


def test_a_verdict_is_refused_after_a_params_change_and_without_a_bundle(project):
    _gate_and_bundle(project)
    cfg = _cfg(project).model_copy(update={"seed": 7})
    write_params(cfg, project / "params.yaml")
    with pytest.raises(ValueError, match=r"stale.*params\.yaml"):
        promote(_cfg(project), project)


def test_an_edited_bundle_is_refused(project):
    _gate_and_bundle(project)
    config = project / "models" / "bundle" / "model" / "hydra.json"
    config.write_text(config.read_text().replace('"seed": 0', '"seed": 5'))
    with pytest.raises(ValueError, match=r"model/hydra\.json was modified"):
        promote(_cfg(project), project)
    with pytest.raises(ValueError, match="modified"):
        load_served(project / "models" / "bundle")


def test_force_overrides_a_failed_verdict_only_and_records_the_reason(project):
    pp.write(project / "metrics" / "evaluate.json", pp.evaluation(0.2))
    _gate_and_bundle(project)
    assert promote(_cfg(project), project) == {
        **promote(_cfg(project), project),
        "promoted": False,
        "why": "gate failed",
    }
    result = promote(_cfg(project), project, force=True, reason="hotfix, accepted risk")
    assert result["promoted"] and result["forced"]
    (record,) = versions(project, "hydra")
    assert record["fields"]["gate"] == "FAILED (forced)"
    assert record["fields"]["reason"] == "hotfix, accepted risk"


def test_two_passing_runs_at_one_code_commit_get_two_reproducible_versions(project):
    head, branch_before = (
        git(project, "rev-parse", "HEAD"),
        git(project, "branch", "--show-current"),
    )
    _gate_and_bundle(project)
    status_before = git(project, "status", "--porcelain")
    first = promote(_cfg(project), project)
    assert promote(_cfg(project), project)["why"] == "already in stage"
    _save_model(project, 1)
    pp.write(project / "metrics" / "evaluate.json", pp.evaluation(0.97))
    _gate_and_bundle(project)
    second = promote(_cfg(project), project)
    assert (first["version"], second["version"]) == ("v0.0.1", "v0.0.2")
    assert prod_version(project, "hydra", "prod")["version"] == "v0.0.2"
    # the user's branch, HEAD and working tree are untouched
    assert git(project, "rev-parse", "HEAD") == head
    assert git(project, "branch", "--show-current") == branch_before
    assert git(project, "status", "--porcelain") == status_before
    # each version's commit holds that run's params.yaml and dvc.lock, on the versions branch
    for v in versions(project, "hydra"):
        files = git(project, "ls-tree", "-r", "--name-only", v["commit"]).split()
        assert {"params.yaml", "dvc.lock"} <= set(files)
    log = git(project, "log", "--first-parent", "--format=%H", VERSIONS_BRANCH).split()
    assert [v["commit"] for v in versions(project, "hydra")][::-1] == log[:2]
    assert prod_metrics(project, "hydra", "prod")["calibrated"]["id_test"]["accuracy"] == 0.97


def test_rollback_moves_prod_back_and_needs_a_reason(project):
    _gate_and_bundle(project)
    promote(_cfg(project), project)
    first_bundle = verify_bundle(project / "models" / "bundle")["files"]
    _save_model(project, 1)
    _gate_and_bundle(project)
    promote(_cfg(project), project)
    with pytest.raises(ValueError, match="--reason"):
        rollback(_cfg(project), project, "v0.0.1", None)
    with pytest.raises(ValueError, match=r"no such version.*v0\.0\.1, v0\.0\.2"):
        rollback(_cfg(project), project, "v9.9.9", "typo")
    # the first bundle is gone from the workspace: it must come back from the DVC cache
    cache = project / ".dvc" / "cache" / "files" / "md5"
    md5 = versions(project, "hydra")[0]["fields"]["bundle_md5"]
    with pytest.raises(ValueError, match="not in the DVC cache"):
        rollback(_cfg(project), project, "v0.0.1", "regression in v0.0.2")
    _fill_cache_from_first_bundle(project, cache, md5)
    result = rollback(_cfg(project), project, "v0.0.1", "regression in v0.0.2")
    assert result["promoted"] and result["rollback_from"] == "v0.0.2"
    assert prod_version(project, "hydra", "prod")["version"] == "v0.0.1"
    served_dir, record = resolve_prod_dir(project, "hydra", "prod")
    assert record["version"] == "v0.0.1"
    assert verify_bundle(served_dir)["files"] == first_bundle
    assert "rollback from v0.0.2" in assignments(project, "hydra", "prod")[-1]["message"]


def _fill_cache_from_first_bundle(project: Path, cache: Path, md5: str) -> None:
    """Rebuild v0.0.1's bundle and put it in a DVC-layout cache, as `dvc commit` would."""
    import hashlib
    import shutil

    from tasks.release.lineage import dvc_md5

    _save_model(project, 0)
    pp.write(project / "metrics" / "evaluate.json", pp.evaluation(0.95))
    _gate_and_bundle(project)
    folder = project / "models" / "bundle"
    assert dvc_md5(folder) == md5
    entries = []
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest = hashlib.md5(f.read_bytes()).hexdigest()
        entries.append({"md5": digest, "relpath": f.relative_to(folder).as_posix()})
        (cache / digest[:2]).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, cache / digest[:2] / digest[2:])
    (cache / md5[:2]).mkdir(parents=True, exist_ok=True)
    (cache / md5[:2] / md5[2:]).write_text(json.dumps(entries, sort_keys=True))
    _save_model(project, 1)  # the workspace holds the second model again
    _gate_and_bundle(project)


def test_a_broken_registry_fails_the_prod_check_instead_of_skipping_it(project):
    cfg = _cfg(project).model_copy(
        update={
            "gates": [
                GateCheck(metric="accuracy", baseline="prod", tolerance=0.1),
                *(GateCheck(**g) for g in (GATES[1], AGREEMENT)),
            ]
        }
    )
    write_params(cfg, project / "params.yaml")
    # a stage tag that points at a commit holding no registered version
    git(project, "tag", "-a", "hydra#prod#1", "-m", "assign", "HEAD")
    with pytest.raises(RegistryError, match="holds no registered hydra version"):
        prod_version(project, "hydra", "prod")
    _stamp(project)
    verdict = gate.run(_cfg(project), project)
    check = verdict["checks"][0]
    assert check["status"] == "failed" and "registry unreadable" in check["note"]


def test_missing_comparisons_fail_unless_an_optional_prod_check(project):
    ev = pp.evaluation(0.95)
    for optional, status in ((False, "failed"), (True, "skipped")):
        check = GateCheck(metric="accuracy", baseline="prod", tolerance=0, optional=optional)
        assert evaluate_check(check, ev, prod=None)["status"] == status
        # a baseline the run did not build never turns into a skip, optional or not
        check = GateCheck(metric="accuracy", baseline="control", tolerance=0, optional=optional)
        record = evaluate_check(check, ev, prod=None)
        assert record["status"] == "failed" and "not built" in record["note"]


def test_a_model_level_metric_against_a_baseline_is_refused_at_validation():
    with pytest.raises(ValueError, match="model-level metric 'compile_max_abs_diff'"):
        GateCheck(metric="compile_max_abs_diff", baseline="single", tolerance=0.1)


def test_served_bundle_says_which_artifact_answered(project):
    _gate_and_bundle(project)
    served = load_served(project / "models" / "bundle")
    assert served.answered_by.startswith("eager")
    batch = {"input_ids": torch.randint(0, 50, (3, 7)), "attention_mask": torch.ones(3, 7).long()}
    assert served.member_logits(batch).shape[:2] == (3, 2)
    card = (project / "models" / "bundle" / "MODEL_CARD.md").read_text()
    for section in ("## Data", "## Metrics", "## Gates", "## Lineage", "hydra-ens predict"):
        assert section in card


def test_a_compiled_artifact_that_fails_at_run_time_hands_over_to_eager_loudly(project, caplog):
    _gate_and_bundle(project)
    served = load_served(project / "models" / "bundle")
    batch = {"input_ids": torch.randint(0, 50, (3, 7)), "attention_mask": torch.ones(3, 7).long()}
    eager = served.member_logits(batch)

    def broken(_batch):
        raise RuntimeError("kernel not built for this CPU")

    served._compiled = broken
    with caplog.at_level("WARNING", logger="hydra_ens"):
        answered = served.member_logits(batch)
    torch.testing.assert_close(answered, eager, rtol=0, atol=0)  # the gated eager model answered
    assert served.answered_by == "eager (compiled artifact failed here: RuntimeError)"
    assert "kernel not built for this CPU" in caplog.text


def test_a_reason_with_brackets_is_shown_as_written(project):
    """``--reason`` is the user's text, not console markup: ``[/x]`` ended ``promote`` and
    ``registry`` with a MarkupError traceback, and ``[v2]`` vanished from what they showed."""
    from typer.testing import CliRunner

    from flows.cli import app

    pp.write(project / "metrics" / "evaluate.json", pp.evaluation(0.2))
    _gate_and_bundle(project)
    reason = "hotfix [v2] [/x]"
    runner = CliRunner()
    res = runner.invoke(app, ["promote", "-C", str(project), "--force", "--reason", reason])
    assert res.exit_code == 0 and f"(forced: {reason})" in res.output, res.output
    assert versions(project, "hydra")[0]["fields"]["reason"] == reason
    for command in ("registry", "status"):
        res = runner.invoke(app, [command, "-C", str(project)], env={"COLUMNS": "200"})
        assert res.exit_code == 0 and reason in res.output, (command, res.output)
