"""``hydra-ens study`` end to end on real components: a Dask scheduler and two workers started as
separate processes on 127.0.0.1, real git, DVC experiments and remote, a real Prefect server.

The project's DAG is the stub in ``study_stub/`` (the pipeline's stage names, a few lines each), so
a point takes seconds; what is under test is the engine: points as DVC experiments, the shared
upstream computed once per seed, a killed worker, a failing point, and reruns.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import commit_project, git, kill_group

from flows.study.spec import SHARED_STAGES
from tasks.params import TWIN_GROUP, default_gates

STUB = Path(__file__).parent / "study_stub"
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.timeout(600)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stub_project(dest: Path) -> Path:
    from tasks.params import resolve_params, write_params

    dest.mkdir(parents=True)
    for name in ("dvc.yaml", "stub.py", "evaluate_template.json"):
        shutil.copy2(STUB / name, dest / name)
    write_params(resolve_params("quick"), dest / "params.yaml")
    (dest / ".gitignore").write_text(".hydra-ens/\n.prefect/\n.dvc-remote/\n__pycache__/\n")
    commit_project(dest, "stub project")
    return dest


def _spec(path: Path, variants: dict, confirm: tuple[int, ...] = ()) -> Path:
    spec = {"name": "tiny", "profile": "quick", "variants": variants, "seeds": [0, 1]}
    if confirm:
        spec["confirm_seeds"] = list(confirm)
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, prefect_server):
    """A scheduler and two workers (own process groups, own scratch folders, stub score_heads
    slowed to 4 s so a worker can be killed mid-point)."""
    base = tmp_path_factory.mktemp("dask")
    port = _free_port()
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "STUB_SLOW_SECONDS": "4"}
    procs = {
        "scheduler": subprocess.Popen(
            [
                BIN / "dask",
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-dashboard",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    }
    address = f"tcp://127.0.0.1:{port}"
    for name in ("a", "b"):
        (base / name).mkdir()
        procs[name] = subprocess.Popen(
            [
                BIN / "dask",
                "worker",
                address,
                "--nthreads",
                "1",
                "--nworkers",
                "1",
                "--host",
                "127.0.0.1",
                "--no-dashboard",
                "--name",
                name,
            ],
            env={**env, "HYDRA_ENS_STUDY_SCRATCH": str(base / name)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    from distributed import Client

    with Client(address, timeout=60) as client:
        client.wait_for_workers(2, timeout=120)
    yield {"address": address, "procs": procs, "scratch": base, "env": env}
    for proc in procs.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _study(project: Path, spec: Path, env: dict, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [BIN / "hydra-ens", "study", str(spec), "-C", str(project), *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _summary(project: Path) -> dict:
    return json.loads((project / ".hydra-ens/studies/tiny/last_study.json").read_text())


@pytest.fixture(scope="module")
def first_study(tmp_path_factory, cluster):
    """2 variants x 2 seeds on the external cluster; ``taylor`` fails at seed 1 (a real error);
    the worker running the first point is killed mid-point."""
    root = tmp_path_factory.mktemp("study")
    project = _stub_project(root / "proj")
    spec = _spec(
        root / "spec.yaml",
        {
            "circuit": {"scoring.method": "circuit"},
            "taylor": {"scoring.method": "taylor", "evaluate.cost_rounds": 13},
        },
    )
    proc = _study(project, spec, cluster["env"], "--cluster", cluster["address"])
    killed = None
    deadline = time.monotonic() + 300
    while killed is None and time.monotonic() < deadline and proc.poll() is None:
        for name in ("a", "b"):
            clones = [p for p in (cluster["scratch"] / name).glob("tiny-*-seed*")]
            if any((c / "artifacts").exists() or (c / "dvc.lock").exists() for c in clones):
                os.killpg(cluster["procs"][name].pid, signal.SIGKILL)
                killed = (name, [c.name for c in clones])
                break
        time.sleep(0.2)
    out, _ = proc.communicate(timeout=400)
    return {
        "project": project,
        "spec": spec,
        "rc": proc.returncode,
        "out": out,
        "killed": killed,
        "root": root,
    }


def test_a_killed_worker_and_a_failing_point_leave_the_other_points_complete(first_study):
    s = first_study
    assert s["killed"] is not None, s["out"][-3000:]
    summary = _summary(s["project"])
    # the point on the killed worker was rerun on the other one; the failing point is reported
    assert sorted(summary["ran"]) == ["circuit-seed0", "circuit-seed1", "taylor-seed0"]
    assert list(summary["failed"]) == ["taylor-seed1"]
    assert "stub was asked to fail" in summary["failed"]["taylor-seed1"]
    assert s["rc"] == 1, s["out"][-3000:]
    assert "taylor-seed1" in s["out"] and "failed" in s["out"]
    from flows.study.points import experiment_refs
    from flows.study.report.results import POINT_FILES

    commit = git(s["project"], "rev-parse", "HEAD").strip()
    refs = experiment_refs(s["project"], commit)
    assert sorted(refs) == ["circuit-seed0", "circuit-seed1", "taylor-seed0"]
    for sha in refs.values():  # nothing half-written: every recorded point is complete
        for rel in POINT_FILES.values():
            git(s["project"], "cat-file", "-e", f"{sha}:{rel}")


def test_the_shared_upstream_ran_once_per_seed_and_was_reused(first_study):
    summary = _summary(first_study["project"])
    assert len(summary["upstreams"]) == 2  # seeds 0 and 1; both variants share them
    assert all("seconds" in u for u in summary["upstreams"].values())
    for name in summary["ran"]:
        point = summary["points"][name]
        assert point["reused_upstream"], name
        assert not set(SHARED_STAGES) & set(point["ran"])
        assert {"score_heads", "evaluate", "gate"} <= set(point["ran"])
    assert summary["reuse"]["saved_seconds"] > 0


def test_dvc_exp_show_lists_every_point_with_params_and_metrics(first_study):
    project = first_study["project"]
    r = subprocess.run(
        [BIN / "dvc", "exp", "show", "--json"], cwd=project, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    shown = {}
    for baseline in json.loads(r.stdout):
        for exp in baseline.get("experiments") or []:
            for rev in exp.get("revs") or []:
                shown[exp.get("name") or rev.get("name")] = rev["data"]
    assert {"circuit-seed0", "circuit-seed1", "taylor-seed0"} <= set(shown)
    data = shown["circuit-seed1"]
    assert data["params"]["params.yaml"]["data"]["seed"] == 1
    # the stub pipeline (tests/pipeline/study_stub) declares evaluate.json as its DVC metric
    metrics = data["metrics"]["metrics/evaluate.json"]["data"]
    assert 0 < metrics["models"]["hydra"]["calibrated"]["id_test"]["accuracy"] <= 1


def test_the_report_has_every_metric_with_intervals(first_study):
    report = first_study["project"] / "reports/studies/tiny"
    md = (report / "study.md").read_text()
    summary = json.loads((report / "study.json").read_text())
    assert "hydra[circuit]" in md and "deep_ensemble" in md
    assert md.count("[") > 40  # mean [low, high] cells
    assert (report / "figures").is_dir() and any((report / "figures").glob("*.png"))
    assert summary  # the numbers behind the Markdown


def test_report_only_runs_nothing_and_lists_what_is_missing(first_study, cluster):
    """Before the rerun below: taylor-seed1 failed, so it is missing; nothing runs."""
    s = first_study
    report = s["project"] / "reports/studies/tiny/study.md"
    report.unlink()
    env = {k: v for k, v in cluster["env"].items() if k != "STUB_SLOW_SECONDS"}
    proc = _study(s["project"], s["spec"], env, "--report-only")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    summary = _summary(s["project"])
    assert summary["ran"] == [] and summary["upstreams"] == {}
    assert summary["missing"] == ["taylor-seed1"]
    assert sorted(summary["up_to_date"]) == ["circuit-seed0", "circuit-seed1", "taylor-seed0"]
    assert "taylor-seed1" in out and "missing" in out
    assert "hydra[taylor]" in report.read_text()


def test_a_rerun_recomputes_only_stale_points_then_nothing(first_study, cluster):
    s = first_study
    # the failing override removed: the taylor points are stale (seed 0) or missing (seed 1);
    # a held-out confirmation seed 2 is new for both variants; this run uses the default local
    # cluster: the same flow, another cluster; --only leaves circuit-seed2 for the next run
    _spec(
        s["spec"],
        {"circuit": {"scoring.method": "circuit"}, "taylor": {"scoring.method": "taylor"}},
        confirm=(2,),
    )
    env = {k: v for k, v in cluster["env"].items() if k != "STUB_SLOW_SECONDS"}
    env["HYDRA_ENS_STUDY_SCRATCH"] = str(s["root"] / "local-scratch")
    bundle = s["root"] / "points.bundle"
    args = ("--workers", "2", "--only", "taylor-*", "--bundle", str(bundle))
    proc = _study(s["project"], s["spec"], env, *args)
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out[-3000:]
    summary = _summary(s["project"])
    assert sorted(summary["ran"]) == ["taylor-seed0", "taylor-seed1", "taylor-seed2"]
    # the bundle was rewritten as points finished: it ends with every point of the commit
    assert out.count("bundle: ") >= 3 and "bundle: 5 points" in out
    heads = git(s["project"], "bundle", "list-heads", str(bundle))
    names = sorted(line.rsplit("/", 1)[1] for line in heads.splitlines() if "refs/exps/" in line)
    assert names == sorted(["circuit-seed0", "circuit-seed1", *summary["ran"]])
    assert sorted(summary["up_to_date"]) == ["circuit-seed0", "circuit-seed1"]
    assert summary["missing"] == ["circuit-seed2"] and summary["only"] == ["taylor-*"]
    assert "(not selected by --only)" in out and "not run: --report-only" not in out
    # seeds 0 and 1 reuse their upstreams; the confirmation seed's is new
    reused = sorted(bool(u.get("reused_from_earlier")) for u in summary["upstreams"].values())
    assert reused == [False, True, True]

    # the point left out runs now (its seed's upstream stored by the run above), and the report
    # is re-judged with gates that hold each Hydra against its twin
    gates = [{"metric": "accuracy", "split": "id_test", "threshold": 0.0}]
    gates += [g for g in default_gates() if g.get("any_of") == TWIN_GROUP]
    (s["root"] / "gates.yaml").write_text(yaml.safe_dump({"gates": gates}))
    args = ("--workers", "1", "--gates-from", str(s["root"] / "gates.yaml"))
    proc = _study(s["project"], s["spec"], env, *args)
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out[-3000:]
    summary = _summary(s["project"])
    assert summary["ran"] == ["circuit-seed2"] and len(summary["up_to_date"]) == 5
    assert summary["missing"] == []
    assert [u["reused_from_earlier"] for u in summary["upstreams"].values()] == [True]


def _exp_file(project: Path, name: str, rel: str) -> str:
    from flows.study.points import experiment_refs

    commit = git(project, "rev-parse", "HEAD").strip()
    return git(project, "show", f"{experiment_refs(project, commit)[name]}:{rel}")


def test_each_seed_drew_its_own_split(first_study):
    """The replicate seed draws the data split: the prepare_data output of a seed (its md5 in
    the point's dvc.lock) is the same for both variants and differs between seeds."""
    project = first_study["project"]
    md5 = {}
    for v in ("circuit", "taylor"):
        for seed in (0, 1, 2):
            lock = yaml.safe_load(_exp_file(project, f"{v}-seed{seed}", "dvc.lock"))
            outs = lock["stages"]["prepare_data"]["outs"]
            md5[(v, seed)] = next(o["md5"] for o in outs if o["path"] == "data/prepared")
    assert all(md5[("circuit", s)] == md5[("taylor", s)] for s in (0, 1, 2))
    assert len({md5[("circuit", s)] for s in (0, 1, 2)}) == 3


def test_the_report_holds_each_hydra_against_its_twin_with_costs_and_confirmation(first_study):
    """The stub's ``circuit`` Hydra is separably better than its twin at seeds 0 and 1 (not at
    the held-out seed 2); ``taylor``'s twin is the Hydra itself."""
    project = first_study["project"]
    report = project / "reports/studies/tiny"
    summary = json.loads((report / "study.json").read_text())
    md = (report / "study.md").read_text()
    # paired rows against the twin and the control of the same variant
    for v in ("circuit", "taylor"):
        assert {"naive_pruned", "control"} <= set(summary["paired"][v])
        assert f"### `hydra[{v}]` - `naive_pruned`" in md and f"### `hydra[{v}]` - `control`" in md
    assert summary["split"]["per_seed"] and summary["split"]["data_seeds"] == [0, 1]
    # cost: ratios to the point's single model with within-point intervals, one process a point
    pids = set()
    for name in ("circuit-seed0", "taylor-seed1"):
        cost = json.loads(_exp_file(project, name, "metrics/cost.json"))
        evaluation = json.loads(_exp_file(project, name, "metrics/evaluate.json"))
        assert set(cost["models"]) == set(evaluation["models"]) and cost["reference"] == "single"
        pids.add(cost["pid"])
        for e in cost["models"].values():
            assert e["ratio_low"] <= e["ratio"] <= e["ratio_high"] and e["flops"] > 0
    assert len(pids) == 2  # each point timed its models in its own process
    hydra = summary["models"]["hydra[circuit]"]["metrics"]
    assert hydra["model.cost_ratio"]["n"] == 2 and hydra["model.cost_ratio"]["low"] is not None
    assert hydra["model.cost_ratio_low"]["mean"] <= hydra["model.cost_ratio"]["mean"]
    # the recommendation refuses the Hydra its twin matches
    twin = summary["beats_twin"]["variants"]
    assert twin["circuit"]["beats"] and not twin["taylor"]["beats"]
    rec = summary["recommendation"]
    assert rec["variant"] == "circuit", rec["sentence"]
    taylor = next(r for r in rec["variants"] if r["variant"] == "taylor")
    assert taylor["beats_twin"] is False and not taylor["passes_every_seed"]
    assert "`hydra[taylor]` does not beat its naive pruned twin" in md
    # the confirmation seed is reported apart and never entered the choice
    assert summary["seeds"] == [0, 1]
    assert all(set(r["seeds_passed"]) <= {0, 1} for r in rec["variants"])
    conf = summary["confirmation"]
    assert conf["seeds"] == [2] and conf["variant"] == "circuit"
    gates = {(g["variant"], g["seed"]): g["passed"] for g in conf["gates"]}
    assert gates == {("circuit", 2): False, ("taylor", 2): False}  # the twin catches both there
    main, held = md.split("## 7. Confirmation on held-out seeds")
    assert "| `circuit` | 2 | FAILED |" in held and "| `circuit` | 2 |" not in main


def test_at_a_new_commit_the_upstream_starts_from_the_earlier_one(first_study, cluster):
    """A commit that changes what only evaluate reads: the point reruns from evaluate on, its
    upstream is laid down from the earlier commit's and recomputes none of the shared stages."""
    s = first_study
    template = s["project"] / "evaluate_template.json"
    template.write_text(template.read_text() + "\n")
    git(s["project"], "commit", "-q", "-am", "evaluate input changed")
    spec = _spec(s["root"] / "one.yaml", {"circuit": {"scoring.method": "circuit"}})
    spec.write_text(spec.read_text().replace("- 1\n", ""))  # seed 0 alone
    env = {k: v for k, v in cluster["env"].items() if k != "STUB_SLOW_SECONDS"}
    env["HYDRA_ENS_STUDY_SCRATCH"] = str(s["root"] / "local-scratch")
    proc = _study(s["project"], spec, env, "--workers", "1")
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out[-3000:]
    summary = _summary(s["project"])
    assert summary["ran"] == ["circuit-seed0"]
    (upstream,) = summary["upstreams"].values()
    assert upstream["seeded_from"] and upstream["ran"] == []
    assert {"evaluate", "gate"} <= set(summary["points"]["circuit-seed0"]["ran"])
    assert not set(SHARED_STAGES) & set(summary["points"]["circuit-seed0"]["ran"])


def _refused(project: Path, spec: Path, *args: str) -> list[str]:
    """``hydra-ens study`` that must refuse before running anything: exit 2; its stderr lines."""
    r = subprocess.run(
        [BIN / "hydra-ens", "study", str(spec), "-C", str(project), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr[-2000:]
    return [ln for ln in r.stderr.splitlines() if ln.strip()]


def test_a_bundle_path_in_a_missing_folder_is_one_line_and_runs_nothing(tmp_path):
    project = _stub_project(tmp_path / "proj")
    spec = _spec(tmp_path / "spec.yaml", {"circuit": {"scoring.method": "circuit"}})
    args = ["--bundle", str(tmp_path / "nowhere" / "points.bundle")]
    lines = _refused(project, spec, *args)
    assert len(lines) == 1 and "--bundle" in lines[0] and "does not exist" in lines[0], lines
    assert not (project / ".hydra-ens/studies").exists()


def test_a_bad_spec_is_one_line_and_runs_nothing(tmp_path):
    project = _stub_project(tmp_path / "proj")
    spec = _spec(tmp_path / "spec.yaml", {"bad": {"members.num_members": 0}})
    lines = _refused(project, spec)
    assert len(lines) == 1 and "variant bad" in lines[0] and "members.num_members" in lines[0]
    assert not (project / ".hydra-ens/studies").exists()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("seed: 0\n", "no `gates:` list"),
        ("gates:\n- {name: x, metric: auroc, split: nowhere, threshold: 0.9}\n", "gates[0]"),
    ],
)
def test_bad_gates_for_the_report_are_one_line(tmp_path, text, said):
    project = _stub_project(tmp_path / "proj")
    spec = _spec(tmp_path / "spec.yaml", {"circuit": {"scoring.method": "circuit"}})
    (tmp_path / "gates.yaml").write_text(text)
    args = ["--report-only", "--gates-from", str(tmp_path / "gates.yaml")]
    lines = _refused(project, spec, *args)
    assert len(lines) == 1 and "--gates-from" in lines[0] and said in lines[0], lines


def test_ctrl_c_during_a_local_study_is_one_line_and_stops_every_worker(tmp_path, prefect_server):
    """Ctrl-C (SIGINT to the terminal's process group) while points run on the local workers:
    exit 130 within seconds with the CLI's one line, no worker traceback on the terminal (the
    workers lead their own process groups, :mod:`flows.study.worker_preload`), no process left."""
    import psutil

    from flows.interrupts import INTERRUPTED_STUDY

    project = _stub_project(tmp_path / "proj")
    spec = _spec(tmp_path / "spec.yaml", {"circuit": {"scoring.method": "circuit"}})
    env = {**os.environ, "PREFECT_API_URL": prefect_server, "STUB_SLOW_SECONDS": "120"}
    env["HYDRA_ENS_STUDY_SCRATCH"] = str(tmp_path / "scratch")
    proc = subprocess.Popen(
        [BIN / "hydra-ens", "study", str(spec), "-C", str(project), "--workers", "2"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a shell job has
    )

    def descendants() -> list[psutil.Process]:
        try:
            return psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    try:
        deadline = time.monotonic() + 240
        while not any("score_heads" in _cmdline(p) for p in descendants()):
            assert proc.poll() is None, proc.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "no point reached score_heads"
            time.sleep(0.3)
        procs = descendants()
        workers = [p for p in procs if "multiprocessing-fork" in _cmdline(p)]
        assert workers and all(os.getpgid(p.pid) == p.pid for p in _alive(workers))
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        kill_group(proc)
    assert proc.returncode == 130, out[-4000:]
    assert took < 20, took
    assert out.rstrip().endswith(f"error: {INTERRUPTED_STUDY}"), out[-4000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-4000:]
    assert not _alive(procs, wait=5.0)


def _cmdline(proc) -> str:
    """The command line of a ``psutil.Process``, "" once it has ended (points start and end
    short-lived processes all the time)."""
    import psutil

    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def _alive(procs, wait: float = 0.0) -> list:
    """The processes of ``procs`` still running (an ended one not yet reaped counts as ended)
    after waiting up to ``wait`` s for them to end."""
    import psutil

    def running(p) -> bool:
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.monotonic() + wait
    while (left := [p for p in procs if running(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def test_the_default_remote_is_read_whole_under_a_long_path(tmp_path):
    """``dvc remote list`` wraps a long URL onto a second line (it read as no URL at all, and
    ``study`` failed with an IndexError); the URL comes whole from ``dvc config``, resolved."""
    from flows import dvcops
    from flows.study.flow import StudyError, default_remote

    project = tmp_path / ("a-project-folder-with-a-long-name-" * 4) / "proj"
    project.mkdir(parents=True)
    (project / "dvc.yaml").write_text("stages: {}\n")
    git(project, "init", "-q")
    dvcops.dvc(project, "init", "-q")
    with pytest.raises(StudyError, match="no default DVC remote"):
        default_remote(project)
    dvcops.ensure_project(project)
    assert default_remote(project) == str(project / dvcops.REMOTE_DIR)
    dvcops.dvc(project, "remote", "add", "-d", "-f", "s3", "s3://bucket/some/prefix")
    assert default_remote(project) == "s3://bucket/some/prefix"


def test_a_study_runs_in_a_non_ascii_project_with_relative_data_git_url_and_remote(
    tmp_path, prefect_server
):
    """A project under ``données é/`` with its data at a relative ``data.path``, ``--git-url``
    and ``--dvc-remote`` (``dépôt``) relative to the caller's folder: every point runs, its
    outputs land in that remote and its experiment comes back from that git URL. (DVC writes
    its config as ASCII: ``dvc remote add`` of a non-ASCII remote in a worker's clone failed;
    relative locations were read from the clone; ``data.path`` was checked in the caller's and
    the worker's current folder.)"""
    project = _stub_project(tmp_path / "données é" / "proj")
    rows = "".join(f"text {i},{'abc'[i % 3]}\n" for i in range(30))
    (project / "data.csv").write_text("text,label\n" + rows)
    git(project, "add", "data.csv")
    git(project, "commit", "-q", "-m", "data")
    git(tmp_path, "clone", "-q", "--bare", str(project), "server.git")
    data = {"data.name": "csv", "data.path": "data.csv", "data.near_ood_classes": ["c"]}
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        yaml.safe_dump({"name": "tiny", "profile": "quick", "variants": {"c": data}, "seeds": [0]})
    )
    env = {**os.environ, "PREFECT_API_URL": prefect_server}
    env["HYDRA_ENS_STUDY_SCRATCH"] = str(tmp_path / "scratch")
    args = ["--workers", "1", "--git-url", "server.git", "--dvc-remote", "dépôt"]
    proc = subprocess.run(
        [BIN / "hydra-ens", "study", "spec.yaml", "-C", str(project), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert _summary(project)["ran"] == ["c-seed0"], out[-4000:]
    assert any((tmp_path / "dépôt").rglob("*")), "no output reached the relative --dvc-remote"
    assert "c-seed0" in git(project, "for-each-ref", "refs/exps")
