"""The quick image pipeline end to end (digits + a tiny timm ViT, Taylor variant with member
fine-tuning) in ``runtime.precision: bf16``, killed in the middle of ``finetune_members`` (the
stage's own process training the members in turn, as the flow runs it with ``max_parallel: 1``)
and started again: the resumed run recomputes only the unfinished members, removes what the kill
left and leaves a ``dvc.lock`` consistent with its outputs, whose cached outputs, from the data to
the calibrated Hydra, hash exactly as those of a second, fresh project built without interruption
by ``dvc repro`` with its members built a process each (``python -m tasks.finetune_members
--member m``, what a mapped member task runs when ``max_parallel`` > 1).

The two projects' hardware probes read fake clocks that disagree (``fake_clock/``: bf16 5% faster
in the first, 5% slower in the second) and ``compile: auto`` measures both precisions of the
``export`` backend: the models, the compiled artifact included, are byte-identical, the gate's
verdict is the same, and only outputs that hold timings may differ: uncached metrics
(:data:`TIMING_OUTPUTS`) and, in the bundle, the gate's cost comparison of the candidates
(latency ratios measured by evaluate: :data:`BUNDLE_TIMING_FILES`).

bf16 (the quick profile passes with ``precision: bf16``) costs no extra run here: every
model-running stage of the flow runs in it, training included (an explicit ``bf16`` is honoured
without measuring, :func:`hydra_ops.models.runtime.resolve_precision`). The text pipeline
(``test_pipeline_text.py``) keeps the default ``auto``, which measures both precisions on a CPU
with native bf16 and keeps fp32 on one without."""

from __future__ import annotations

import hashlib
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
from test_pipeline_text import ALL_CLASSIFICATION, ALL_OOD, PASSING_GATES, cli, last_run

from flows import dvcops
from flows.pipeline import member_threads, member_waves
from flows.warm import warm_stages_of_this_process
from tasks.runtime.dvcfiles import cached_outputs, declared_outputs
from tasks.runtime.layout import STAGES

pytestmark = pytest.mark.slow

PARAMS = {
    "data": {"name": "digits"},
    "scoring": {"method": "taylor"},
    "members": {"finetune": {"max_parallel": 1}},
    "gates": PASSING_GATES,
    "runtime": {"precision": "bf16"},
    "compile": {"backend": "export", "precision": "auto"},
}
FAKE_CLOCK = Path(__file__).parent / "fake_clock"


def fake_clock(bf16_time: float) -> dict[str, str]:
    """The environment that makes a process's hardware probes read bf16 at ``bf16_time`` x fp32's
    time (``fake_clock/sitecustomize.py``)."""
    path = os.pathsep.join(p for p in (str(FAKE_CLOCK), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "HYDRA_ENS_TEST_BF16_TIME": str(bf16_time)}


#: The uncached outputs that hold timings (or what is drawn from them): the only outputs two
#: fresh projects of one commit may differ in.
TIMING_OUTPUTS = {
    "metrics/finetune_base.json",  # seconds per epoch
    "metrics/compile.json",  # build seconds, each candidate's timings
    "metrics/cost.json",  # latency rounds
    "metrics/latency.json",
    "metrics/key",  # each model's latency beside its quality
    "reports/evaluate.md",  # the latency column
    "reports/figures",  # the cost-vs-quality figure
    "reports/evaluate.html",
    "metrics/hydra.json",  # the Hydra's key numbers, its latency among them
    "reports/gate.json",  # the cost comparison of the candidates: latency ratios
    "reports/gate.md",
}
#: The bundle's files that carry the gate's cost comparison (each candidate's measured latency
#: ratio and the candidates cheaper than the Hydra by it): the gate report, the manifest and the
#: model card that hold or list it.
BUNDLE_TIMING_FILES = {"gate.json", "bundle.json", "MODEL_CARD.md"}
#: The gate report's fields drawn from latency.
GATE_COST_FIELDS = ("cheaper_passing",)
#: The stages that run a model, each logging ``rt.describe()`` when it runs.
MODEL_STAGES = (
    "finetune_base",
    "finetune_baselines",
    "baseline_logits",
    "score_heads",
    "finetune_members",
    "calibrate",
    "evaluate",
)
#: ``[stage] HH:MM:SS hydra_ens: runtime: device cpu (AVX512, 1 threads), precision bf16 (why)``
RUNTIME_LINE = re.compile(
    r"\[([\w ]+)\] [\d:]+ hydra_ens: runtime: device (\S+) .*, precision (\w+) \((.*)\)$"
)
#: What a kill between an atomic write's renames leaves next to outputs of stages that rerun after
#: the kill (finetune_members, merge, calibrate), planted before the resume: each must be removed.
PLANTED = ("models/.members.old-0a1b2c3d", "models/.merged.tmp-0a1b2c3d")
PLANTED_FILE = "metrics/.calibrate.json.0a1b2c3d.tmp"


def locked_md5s(root: Path) -> dict[str, str]:
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    return {o["path"]: o["md5"] for stage in lock.values() for o in stage.get("outs", [])}


def file_md5s(path: Path) -> dict[str, str]:
    """``{relative path: md5}`` of the files of an output (a file: one entry, ``.``)."""
    files = [path] if path.is_file() else sorted(f for f in path.rglob("*") if f.is_file())
    return {f.relative_to(path).as_posix(): hashlib.md5(f.read_bytes()).hexdigest() for f in files}


@pytest.fixture(scope="module")
def resumed(prefect_server, tmp_path_factory) -> dict:
    root = make_project(tmp_path_factory.mktemp("image") / "proj", PARAMS)
    members = root / "models" / "members"
    env = {**os.environ, "PREFECT_API_URL": prefect_server, **fake_clock(0.95)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", "-C", str(root)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 400
    while not (members / "member_0" / "done.json").is_file():
        assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
        assert time.monotonic() < deadline, "member_0 never finished"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the whole run: CLI, Prefect tasks, dvc, stage
    proc.wait(timeout=30)
    finished = {
        d.name: (d / "done.json").stat().st_mtime_ns
        for d in members.iterdir()
        if (d / "done.json").is_file()
    }
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    for rel in PLANTED:
        (root / rel).mkdir()
        (root / rel / "model.safetensors").write_bytes(b"half")
    (root / PLANTED_FILE).write_text("{")
    cli("run", "-C", str(root), env=fake_clock(0.95))
    return {"root": root, "finished_before": finished, "lock_at_kill": lock}


#: What the uninterrupted project builds: the bundle and everything upstream of it (``dvc repro``
#: runs it), the killed stage and compile's measured choice included; not the registration.
UNINTERRUPTED_TARGET = "bundle"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """A second fresh project with the same params: :data:`UNINTERRUPTED_TARGET` and its upstream
    built by ``dvc repro`` (no Prefect, no kill), its members first built one process each by
    :func:`flows.dvcops.run_member` (a mapped member task's process), so that the stage's own
    ``dvc repro`` only verifies them; its probes read the other fake clock."""
    root = make_project(tmp_path_factory.mktemp("image-again") / "proj", PARAMS)
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "HYDRA_ENS_TEST_BF16_TIME")}
    os.environ.update(fake_clock(1.05))  # the stage processes' environment (dvcops)
    try:
        dvcops.ensure_project(root)
        with warm_stages_of_this_process():  # as a run's stages are
            dvcops.dvc(root, "repro", "select_members")
            for member in range(3):
                assert dvcops.run_member(root, member, log=lambda _: None).returncode == 0
            dvcops.dvc(root, "repro", UNINTERRUPTED_TARGET)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return root


def test_kill_left_finetune_members_unlocked(resumed):
    assert "finetune_members" not in resumed["lock_at_kill"]
    assert "member_0" in resumed["finished_before"]
    assert len(resumed["finished_before"]) < 6  # 3 members + 3 controls: not all finished


def test_resume_recomputes_only_unfinished_members(resumed):
    root = resumed["root"]
    summary = last_run(root)
    assert summary["ran"][0] == "finetune_members"  # everything before it was up to date
    assert summary["ran"] == list(STAGES[STAGES.index("finetune_members") :])
    members = root / "models" / "members"
    for name, mtime in resumed["finished_before"].items():
        assert (members / name / "done.json").stat().st_mtime_ns == mtime, name
    index = json.loads((members / "index.json").read_text())
    assert sorted(index["units"]) == sorted(
        [f"member_{m}" for m in range(3)] + [f"control_{m}" for m in range(3)]
    )


def test_lock_is_consistent_with_outputs(resumed):
    root = resumed["root"]
    assert dvcops.stale_stages(root) == set()
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    assert set(lock) == set(STAGES)
    for stage in lock.values():
        for out in stage.get("outs", []):
            assert out["md5"], out


def test_resume_removed_what_the_kill_left(resumed):
    root = resumed["root"]
    assert [rel for rel in (*PLANTED, PLANTED_FILE) if (root / rel).exists()] == []
    hidden = [p.name for p in (root / "models" / "members").iterdir() if p.name.startswith(".")]
    assert hidden == []  # the killed unit's temp folder: removed by finalise


def test_same_params_same_cached_hashes(resumed, uninterrupted):
    """Same params, two fresh projects whose probes' clocks disagree, one of them killed
    mid-stage and resumed: every cached output the uninterrupted project built (the bundle and
    all upstream of it, the killed stage's members and the compiled artifact included) has the
    same md5 in both dvc.lock files, and both chose the same hardware."""
    a, b = resumed["root"], uninterrupted
    md5_a, md5_b = locked_md5s(a), locked_md5s(b)
    cached = set(cached_outputs(a)) & set(md5_b)
    models = ("base", "members", "merged", "hydra", "compiled", "bundle")
    assert {f"models/{m}" for m in models} <= cached
    choices = [yaml.safe_load((r / "hardware" / "choices.yaml").read_text()) for r in (a, b)]
    assert choices[0] == choices[1]
    assert choices[0]["compile"] == {"artifact": {"backend": "export", "precision": "fp32"}}
    assert cached <= set(md5_a)
    differ = sorted(p for p in cached if md5_a[p] != md5_b[p])
    detail = {}
    for p in differ:  # name the files that differ, for the failure message
        fa, fb = file_md5s(a / p), file_md5s(b / p)
        detail[p] = sorted(f for f in {*fa, *fb} if fa.get(f) != fb.get(f))
    assert set(differ) <= {"models/bundle"}, detail
    assert set(detail.get("models/bundle", [])) <= BUNDLE_TIMING_FILES, detail
    # the bundles' gate reports agree but for the cost comparison
    gates = [json.loads((r / "models" / "bundle" / "gate.json").read_text()) for r in (a, b)]
    for gate in gates:
        for field in GATE_COST_FIELDS:
            gate.pop(field, None)
        for verdict in gate["candidates"].values():
            verdict.pop("cost")
    assert gates[0] == gates[1]


def test_only_outputs_that_hold_timings_differ_and_the_verdict_is_the_same(resumed, uninterrupted):
    """The uncached outputs both projects wrote are the same bytes but for :data:`TIMING_OUTPUTS`;
    ``reports/gate.json`` among the same ones."""
    a, b = resumed["root"], uninterrupted
    uncached = {
        path
        for outs in declared_outputs(a).values()
        for path, opts in outs.items()
        if not opts.get("cache", True) and (b / path).exists()
    }
    assert "reports/gate.json" in uncached and "metrics/compile.json" in uncached
    differ = sorted(p for p in uncached if file_md5s(a / p) != file_md5s(b / p))
    assert set(differ) <= TIMING_OUTPUTS, differ
    verdicts = [json.loads((r / "reports" / "gate.json").read_text())["verdict"] for r in (a, b)]
    assert verdicts == ["passed", "passed"]


def test_image_report_and_promotion(resumed):
    root = resumed["root"]
    ev = json.loads((root / "metrics" / "evaluate.json").read_text())
    baselines = {"single", "naive_pruned", "deep_ensemble", "mc_dropout", "control"}
    assert set(ev["models"]) == {"hydra", *baselines}
    assert ev["variant"] == "taylor"
    for entry in ev["models"].values():
        assert set(entry["calibrated"]["id_test"]) >= set(ALL_CLASSIFICATION)
        assert set(entry["raw"]["far_ood"]) >= set(ALL_OOD)
    assert "control" in ev["bootstrap"]
    tags = git(root, "tag", "-l").split()
    assert "hydra@v0.0.1" in tags and "hydra#prod#1" in tags
    hydra_json = json.loads((root / "models" / "hydra" / "hydra.json").read_text())
    assert "timm" in json.dumps(hydra_json)


def test_bf16_reached_every_model_stage_and_the_gate_passed(resumed):
    """The killed run and the resumed one (their run logs) ran every model stage on the
    CPU in bf16, as configured (``emulated`` on a CPU without native bf16), and the gate passed."""
    root = resumed["root"]
    assert yaml.safe_load((root / "params.yaml").read_text())["runtime"]["precision"] == "bf16"
    summary = last_run(root)
    assert summary["gate"]["verdict"] == "passed" and summary["promotion"]["promoted"] is True
    logs = sorted((root / ".hydra-ens" / "logs").glob("run-*.log"))
    assert len(logs) == 2  # the killed run, the resumed run
    seen: dict[str, list[tuple[str, str, str]]] = {}
    for log in logs:
        for line in log.read_text().splitlines():
            if match := RUNTIME_LINE.search(line):
                stage, device, precision, why = match.groups()
                seen.setdefault(stage, []).append((device, precision, why))
    assert sorted(seen) == sorted(MODEL_STAGES), seen
    for stage, runs in seen.items():
        for device, precision, why in runs:
            assert (device, precision) == ("cpu", "bf16"), (stage, runs)
            assert why == "as configured" or why.startswith("as configured; emulated: "), why


def test_corrupted_checkpoint_gets_a_clear_error(resumed, tmp_path):
    from hydra_ops.models.checkpoints import load_member

    root = resumed["root"]
    member = root / "models" / "members" / "member_1"
    copy = tmp_path / "member_1"
    copy.mkdir()
    for f in member.iterdir():
        copy.joinpath(f.name).write_bytes(f.read_bytes())
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ValueError, match="truncated or tampered"):
        load_member(copy, root / "models" / "base")


def test_bad_params_stop_the_run_before_any_stage(tmp_path):
    root = make_project(tmp_path / "proj", {"data": {"name": "digits"}})
    res = cli("run", "-C", str(root), "--set", "members.num_members=0", code=2)
    assert "members.num_members" in res.output
    assert not (root / "dvc.lock").exists() and not (root / "data" / "prepared").exists()
    res = cli(
        "run", "-C", str(root), "--set", "data.name=folder", "--set", "data.path=/nope", code=2
    )
    assert "data.path" in res.output


@pytest.mark.parametrize(
    ("members", "parallel", "waves"),
    [(3, 1, []), (3, 2, [[0, 1], [2]]), (3, 3, [[0, 1, 2]]), (4, 8, [[0, 1, 2, 3]])],
)
def test_member_tasks_are_mapped_only_to_run_side_by_side(members, parallel, waves):
    assert member_waves(members, parallel) == waves


@pytest.mark.parametrize(
    ("side_by_side", "available", "threads"),
    [(1, 8, 8), (2, 8, 4), (3, 8, 2), (4, 2, 1), (2, 1, 1)],
)
def test_members_side_by_side_share_the_threads(side_by_side, available, threads):
    assert member_threads(side_by_side, available) == threads


def test_member_threads_default_to_the_stages_share(monkeypatch):
    monkeypatch.setenv("HYDRA_ENS_THREADS", "6")
    assert member_threads(2) == 3
    monkeypatch.delenv("HYDRA_ENS_THREADS")
    assert member_threads(1) == len(os.sched_getaffinity(0))
