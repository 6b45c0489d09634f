"""The quick text pipeline end to end (MiniLM on BBC News, circuit variant), in a temp git repo with
real DVC, real GTO and a real ephemeral Prefect server. One project is shared by the tests of this
module, which run in order: first run, no-op rerun, gate change, param change, forced promotion,
registry round trip, serve.

The project is the quick profile with smaller splits and two MC Dropout samples (:data:`PARAMS`):
nothing asserted here depends on the data size, and MiniLM's ``evaluate`` (MC Dropout above all),
run twice, was the suite's largest cost."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, git, make_project

from tasks.runtime.layout import STAGES

pytestmark = pytest.mark.slow

PASSING_GATES = [
    {"metric": "accuracy", "split": "id_test", "threshold": 0.0},
    {"metric": "auroc", "split": "near_ood", "baseline": "deep_ensemble", "tolerance": 1.0},
    {"metric": "nll", "split": "id_test", "baseline": "prod", "tolerance": 100.0, "optional": True},
    {"metric": "compile_argmax_agreement", "threshold": 1.0},
    {"metric": "compile_max_abs_diff", "threshold": "compile_tolerance"},
]
FAILING_GATES = [
    {"metric": "accuracy", "split": "id_test", "threshold": 1.5},
    *PASSING_GATES[-2:],  # the compile checks cannot be dropped
]
#: The project's params over the quick profile (160 examples per split, 100 far-OOD, 4 samples).
#: The circuit variant (no member fine-tunes); the image module runs the default, Taylor.
PARAMS = {
    "scoring": {"method": "circuit"},
    "gates": PASSING_GATES,
    "data": {"max_per_split": 64, "far_ood_size": 64},
    "baselines": {"mc_dropout": {"samples": 2}},
}

ALL_CLASSIFICATION = ("accuracy", "nll", "brier", "ece", "adaptive_ece", "aurc", "augrc")
ALL_OOD = ("auroc", "aupr_in", "aupr_out", "fpr_at_95_tpr")


def cli(
    *args: str, code: int | None = 0, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run ``hydra-ens ARGS`` as a real process against the session's Prefect server (``env``:
    variables added to this process's).

    (In-process ``CliRunner`` runs break on the second flow run: Prefect's console log handler
    keeps the first run's captured, since closed, stream.)
    """
    from prefect.settings import PREFECT_API_URL

    env = {**os.environ, **(env or {})}
    if PREFECT_API_URL.value():
        env["PREFECT_API_URL"] = PREFECT_API_URL.value()
    result = subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    result.output = result.stdout + result.stderr
    if code is not None:
        assert result.returncode == code, result.output[-4000:]
    return result


def last_run(root: Path) -> dict:
    return json.loads((root / ".hydra-ens" / "last_run.json").read_text())


def tags(root: Path) -> list[str]:
    return sorted(git(root, "tag", "-l").split())


@pytest.fixture(scope="module")
def project(prefect_server, tmp_path_factory) -> Path:
    root = make_project(tmp_path_factory.mktemp("text") / "proj", PARAMS)
    cli("run", "-C", str(root))
    return root


def test_first_run_runs_every_stage_and_promotes(project):
    summary = last_run(project)
    assert summary["ran"] == list(STAGES)
    # every stage was forked from the run's warm process, none started fresh
    assert summary["warm_stages"] == f"warm stages: {len(STAGES)} forked"
    assert summary["gate"]["verdict"] == "passed"
    assert summary["promotion"]["promoted"] is True
    assert tags(project) == ["hydra#prod#1", "hydra@v0.0.1"]
    # the run ends with the numbers that decide, one row per model, the gate's word for each
    rows = {r["model"]: r for r in summary["models"]}
    assert set(rows) == {"hydra", "single", "naive_pruned", "deep_ensemble", "mc_dropout"}
    assert [n for n, r in rows.items() if r["gate"] == "ships"] == [summary["gate"]["ships"]]
    assert rows["single"]["cost"]["ratio"] == pytest.approx(1.0, abs=1e-6)
    assert summary["push"] == "pushed" and (project / ".dvc-remote" / "files").is_dir()
    # the version's commit holds this run's params and lock; the user's branch gained only the
    # DVC set-up (so that a clone of it is a DVC repository)
    files = git(project, "ls-tree", "-r", "--name-only", "hydra@v0.0.1").split()
    assert {"params.yaml", "dvc.lock", ".dvc/config"} <= set(files)
    assert git(project, "rev-list", "--count", "main").strip() == "2"
    setup = git(project, "show", "--name-only", "--format=", "main").split()
    assert set(setup) == {".dvc/config", ".dvc/.gitignore"}, setup
    bundle = project / "models" / "bundle"
    assert {"MODEL_CARD.md", "bundle.json", "gate.json", "evaluate.json"} <= {
        p.name for p in bundle.iterdir()
    }


def test_dvc_lock_lists_every_artifact_with_a_hash(project):
    lock = yaml.safe_load((project / "dvc.lock").read_text())["stages"]
    declared = yaml.safe_load((project / "dvc.yaml").read_text())["stages"]
    assert list(declared) == list(STAGES)
    assert set(lock) == set(STAGES)
    for name, stage in declared.items():
        outs = []
        for key in ("outs", "metrics", "plots"):
            for item in stage.get(key, []):
                outs.append(next(iter(item)) if isinstance(item, dict) else item)
        locked = {o["path"]: o for o in lock[name].get("outs", [])}
        for out in outs:
            assert out in locked, (name, out)
            assert len(locked[out]["md5"].removesuffix(".dir")) == 32, (name, out)
        for dep in lock[name].get("deps", []):
            assert dep.get("md5"), (name, dep["path"])


def test_report_has_every_metric(project):
    ev = json.loads((project / "metrics" / "evaluate.json").read_text())
    assert set(ev["models"]) == {"hydra", "single", "naive_pruned", "deep_ensemble", "mc_dropout"}
    for entry in ev["models"].values():
        for variant in ("raw", "calibrated"):
            for split in ("id_test", "shift"):
                assert set(entry[variant][split]) >= set(ALL_CLASSIFICATION)
            for split in ("near_ood", "far_ood"):
                assert set(entry[variant][split]) >= set(ALL_OOD)
        assert entry["parameters"] > 0 and entry["temperature"] > 0
    latency = json.loads((project / "metrics" / "latency.json").read_text())
    assert set(latency) == set(ev["models"]) and min(latency.values()) > 0
    assert set(ev["bootstrap"]) == {"single", "naive_pruned", "deep_ensemble", "mc_dropout"}
    interval = ev["bootstrap"]["single"]["calibrated"]["near_ood"]["auroc"]
    assert interval["low"] <= interval["difference"] <= interval["high"]
    assert "word-shuffled" in ev["ood_validation_set"]
    report = (project / "reports" / "evaluate.md").read_text()
    for metric in ALL_CLASSIFICATION + ALL_OOD + ("parameters", "latency_ms"):
        assert metric in report
    for model in ev["models"]:
        assert f"| {model} |" in report
    gate = json.loads((project / "reports" / "gate.json").read_text())
    # the quick profile ships the eager model: the compile check is not applicable, not passed
    statuses = [c["status"] for c in gate["checks"]]
    assert statuses == ["passed", "passed", "skipped", "not applicable", "not applicable"]
    for plot in ("reliability.json", "roc.json", "histograms.json"):
        assert json.loads((project / "plots" / plot).read_text())
    # stage run_report: the figures, the page, the key numbers DVC shows as metrics
    assert sorted(p.stem for p in (project / "metrics" / "key").iterdir()) == sorted(ev["models"])
    figures = {p.name for p in (project / "reports" / "figures").iterdir()}
    assert {"reliability.png", "roc.png", "cost_quality.png"} <= figures
    assert "data:image/png;base64," in (project / "reports" / "evaluate.html").read_text()
    assert "html_template" in (project / ".dvc" / "config").read_text()


def test_status_and_predict_use_the_registry(project):
    out = cli("status", "-C", str(project)).output
    assert "v0.0.1" in out and "stale" not in out
    res = cli(
        "predict",
        "-C",
        str(project),
        "--json",
        "Shares rose on strong profits",
        "The band's new album",
    )
    rows = [json.loads(line) for line in res.output.strip().splitlines()]
    assert len(rows) == 2
    classes = {"business", "entertainment", "politics", "sports"}
    for row in rows:
        assert row["class"] in classes and 0 < row["prob"] <= 1
        assert row["entropy"] >= row["mutual_information"] >= 0
        assert 0 <= row["disagreement"] <= 1
    table = cli("predict", "-C", str(project), "Prices [/x] rose", "[removed] news").output
    assert "[/x]" in table and "[removed]" in table and "Traceback" not in table, table


def test_promote_after_a_calibrate_rerun_without_the_gate_is_refused(project):
    from tasks.params import load_params, write_params
    from tasks.release.lineage import dvc_md5

    params = project / "params.yaml"
    original, model_md5 = params.read_text(), dvc_md5(project / "models" / "hydra")
    cfg = load_params(params)
    changed = cfg.calibrate.model_copy(update={"uncertain_quantile": 0.8})
    write_params(cfg.model_copy(update={"calibrate": changed}), params)
    try:
        cli("stage", "calibrate", "-C", str(project))  # calibrate alone, no gate after it
        assert dvc_md5(project / "models" / "hydra") != model_md5
        res = cli("promote", "-C", str(project), code=1)
        assert (
            "stale" in res.output and "models/hydra" in res.output and "Traceback" not in res.output
        )
    finally:
        params.write_text(original)
        cli("stage", "calibrate", "-C", str(project))
    assert dvc_md5(project / "models" / "hydra") == model_md5  # deterministic: back as it was


def test_second_run_recomputes_nothing(project):
    weights = project / "models" / "hydra" / "model.safetensors"
    lock_before, data = (project / "dvc.lock").read_bytes(), weights.read_bytes()
    mtime = weights.stat().st_mtime_ns
    cli("run", "-C", str(project))
    assert last_run(project)["ran"] == []
    assert (project / "dvc.lock").read_bytes() == lock_before
    # nothing rewrote it: the same file, or (cache.type hardlink) DVC linked the copy the last
    # calibrate rerun left to the cache's identical object
    assert weights.read_bytes() == data
    assert weights.stat().st_mtime_ns == mtime or weights.stat().st_nlink > 1


def test_failing_gate_blocks_promotion(project):
    before = tags(project)
    res = cli("run", "-C", str(project), "--set", f"gates={json.dumps(FAILING_GATES)}", code=3)
    summary = last_run(project)
    assert summary["ran"] == ["gate", "bundle", "promote"]  # only the stages downstream
    assert summary["gate"]["verdict"] == "failed"
    assert json.loads((project / "registry" / "promotion.json").read_text())["promoted"] is False
    assert tags(project) == before
    assert "FAILED" in res.output


def test_param_change_reruns_only_downstream_stages(project):
    """An evaluate param: the ten stages above it are up to date (the gates above still fail)."""
    cli("run", "-C", str(project), "--set", "evaluate.bootstrap_seed=1", code=3)
    assert last_run(project)["ran"] == list(STAGES[STAGES.index("evaluate") :])


def test_force_needs_reason_and_records_it(project):
    before = tags(project)
    res = cli("promote", "-C", str(project), "--force", code=2)
    assert "--reason" in res.output
    assert tags(project) == before
    # a new model at the same code commit: no manual commit needed, it gets its own version
    cli("promote", "-C", str(project), "--force", "--reason", "hotfix approved by QA")
    # the version, v0.0.1 unassigned from prod (GTO's `#prod!#N`), v0.0.2 assigned
    added = sorted(set(tags(project)) - set(before))
    assigned = [t for t in added if re.fullmatch(r"hydra#prod#\d+", t)]
    assert len(added) == 3 and "hydra@v0.0.2" in added and len(assigned) == 1
    assert [t for t in added if re.fullmatch(r"hydra#prod!#\d+", t)]
    for tag in (*assigned, "hydra@v0.0.2"):
        message = git(project, "for-each-ref", f"refs/tags/{tag}", "--format=%(contents)")
        assert "hotfix approved by QA" in message
    assert "forced past failed gate" in git(
        project, "for-each-ref", f"refs/tags/{assigned[0]}", "--format=%(contents)"
    )
    assert "v0.0.2" in cli("status", "-C", str(project)).output
    listing = cli("registry", "-C", str(project)).output
    assert "v0.0.1" in listing and "v0.0.2" in listing and "hotfix approved by QA" in listing


def test_a_new_clone_checks_out_a_version_and_pulls_it_byte_for_byte(project, tmp_path):
    from tasks.release.dvc_cache import resolve_bundle_dir
    from tasks.release.model_registry import parse_message

    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(project), str(clone)], check=True)
    git(clone, "checkout", "-q", "hydra@v0.0.1")
    dvc = [str(Path(sys.executable).parent / "dvc")]
    remote = str(project / ".dvc-remote")
    subprocess.run(
        [*dvc, "remote", "modify", "--local", "local", "url", remote], cwd=clone, check=True
    )
    subprocess.run([*dvc, "pull", "-q", "models/bundle"], cwd=clone, check=True, timeout=300)
    fields = parse_message(
        git(project, "for-each-ref", "refs/tags/hydra@v0.0.1", "--format=%(contents)")
    )
    original = resolve_bundle_dir(project, {"fields": fields, "tag": "hydra@v0.0.1"})
    pulled = clone / "models" / "bundle"
    names = sorted(p.relative_to(original) for p in original.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(pulled) for p in pulled.rglob("*") if p.is_file())
    for name in names:
        assert (original / name).read_bytes() == (pulled / name).read_bytes(), name


def test_rollback_serves_the_earlier_version(project):
    res = cli("promote", "-C", str(project), "--version", "v0.0.1", code=2)
    assert "--reason" in res.output
    cli("promote", "-C", str(project), "--version", "v0.0.1", "--reason", "v0.0.2 regressed")
    assert "v0.0.1" in cli("status", "-C", str(project)).output
    res = cli("predict", "-C", str(project), "--json", "Shares rose on strong profits")
    row = json.loads(res.output.strip().splitlines()[-1])
    assert row["model_version"] == "v0.0.1" and row["answered_by"].startswith("eager")


def test_serve_runs_a_triggered_deployment(project, prefect_server):
    """`hydra-ens serve --cron` against the 127.0.0.1 server; one triggered run completes."""
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    assert "127.0.0.1" in prefect_server
    # the runner looks for scheduled runs every second (Prefect's default: 10 s)
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "serve",
            "-C",
            str(project),
            "--cron",
            "0 3 * * *",
            "--name",
            "nightly",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        run = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                run = run_deployment("hydra-pipeline/nightly", timeout=180, poll_interval=1)
                break
            except ObjectNotFound:  # deployment not registered yet
                if proc.poll() is not None:
                    break
                time.sleep(2)
        if run is None:
            proc.terminate()
            output = proc.communicate(timeout=30)[0]
            raise AssertionError(f"the served deployment never appeared; serve said:\n{output}")
        assert run.state.is_completed(), run.state
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
