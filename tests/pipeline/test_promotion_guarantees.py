"""What promotion guarantees, one test per attack on the release path, tried as written.

Every attack ends in a one-line refusal that names the broken link, with the registry (its tags)
and what ``predict`` would serve (the version in ``prod``) unchanged. One small real project
(:mod:`promotion_project`: git, DVC with a local remote, GTO; a stand-in for the model stages)
is built and run once for the module (``hydra@v0.0.1`` in ``prod``); each test works on a copy.

A verdict judging one model and shipping another, preprocessing shipped in the bundle and the
compiled artifact scored are built and tested with the compile, evaluate and
predict stages; ``promote`` reads evaluate's ``scored`` record where it is present
(:func:`tasks.release.custody.check_chain`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import promotion_project as pp
import pytest
from typer.testing import CliRunner

from tasks import gate
from tasks.gates.checks import NO_CHECK
from tasks.gates.verdict import decide, prod_seen
from tasks.params import ConfigError, GateCheck, write_params
from tasks.release.dvc_cache import resolve_bundle_dir
from tasks.release.model_registry import (
    RECORD_HEADER,
    RegistryError,
    prod_version,
    resolve_prod_dir,
    versions,
)

GTO = str(Path(sys.executable).parent / "gto")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    root = pp.build(tmp_path_factory.mktemp("guarantees") / "proj")
    assert pp.run(root, seed=0)["version"] == "v0.0.1"
    return root


@pytest.fixture
def project(base, tmp_path) -> Path:
    """A copy of the promoted project (its registry, cache and lock), for one attack."""
    copy = tmp_path / "proj"
    shutil.copytree(base, copy, symlinks=True)
    return copy


def state(root: Path) -> tuple[list[str], str | None]:
    """What must not move: the registry's tags and the version ``predict`` serves."""
    prod = prod_version(root, "hydra", "prod")
    return sorted(pp.git(root, "tag", "-l").split()), prod and prod["version"]


def cli(*args: str):
    return CliRunner().invoke(app(), list(args), env={"COLUMNS": "80"})


def app():
    from flows.cli import app

    return app


def refused(root: Path, *args: str, code: int = 1) -> str:
    """``hydra-ens promote ARGS`` in ``root``: exit ``code`` and one line; returns it."""
    res = cli("promote", "-C", str(root), *args)
    assert res.exit_code == code, res.output
    line = res.output.strip()
    assert line.startswith("error: ") and "\n" not in line, res.output
    return line


# 1. A hand-edited verdict does not promote; `hydra-ens stage` is held to `hydra-ens run`'s checks
def test_1_a_hand_edited_verdict_is_recomputed_and_refused(project):
    before = state(project)
    pp.train(project, seed=2, acc=0.2)
    assert pp.gate_and_bundle(project)["verdict"] == "failed"
    path = project / "reports" / "gate.json"
    verdict = json.loads(path.read_text())
    verdict |= {"passed": True, "verdict": "passed", "failed": []}
    for check in verdict["checks"]:
        check["status"] = "passed" if check["status"] == "failed" else check["status"]
    path.write_text(json.dumps(verdict))
    cwd = os.getcwd()
    try:
        assert cli("stage", "bundle", "-C", str(project)).exit_code == 0
    finally:
        os.chdir(cwd)
    line = refused(project)
    assert "reports/gate.json says 'passed'" in line and "give 'failed'" in line
    assert state(project) == before


def test_1_stages_run_outside_dvc_do_not_promote(project):
    before = state(project)
    pp.train(project, seed=2)
    gate.run(pp.cfg(project), project)  # hydra-ens stage gate; stage bundle: not in dvc.lock
    from tasks import bundle

    bundle.run(pp.cfg(project), project)
    line = refused(project)
    assert "not what dvc.lock records" in line and "hydra-ens run" in line
    assert state(project) == before


# 3. bundle.json does not vouch for itself
def test_3_an_edited_bundle_with_its_manifest_updated_is_refused(project):
    from hydra_ops.hashing import sha256_file
    from tasks.release.lineage import dvc_md5

    before = state(project)
    pp.train(project, seed=2)
    pp.gate_and_bundle(project)
    folder = project / "models" / "bundle"
    config = folder / "model" / "hydra.json"
    config.chmod(0o644)
    config.write_text(config.read_text().replace('"seed": 2', '"seed": 9'))
    manifest = json.loads((folder / "bundle.json").read_text())
    manifest["files"]["model/hydra.json"] = sha256_file(config)
    (folder / "bundle.json").chmod(0o644)
    (folder / "bundle.json").write_text(json.dumps(manifest))
    line = refused(project)
    assert "models/bundle/model is not the models/hydra the gate judged" in line
    assert state(project) == before
    # predict serves the registered bundle (rebuilt from the cache), not the edited one
    served, record = resolve_prod_dir(project, "hydra", "prod")
    assert served != folder and dvc_md5(served) == record["fields"]["bundle_md5"]


def test_3_a_file_the_manifest_does_not_list_is_refused(project):
    from tasks.serving.served import load_served

    before = state(project)
    pp.train(project, seed=2)
    pp.gate_and_bundle(project)
    (project / "models" / "bundle" / "model" / "tokenizer.json").write_text("{}")
    assert "tokenizer.json is not listed in bundle.json" in refused(project)
    with pytest.raises(ValueError, match=r"is not listed in bundle\.json"):
        load_served(project / "models" / "bundle")
    assert state(project) == before


# 5. A verdict against prod is tied to the prod it saw
def test_5_prod_moved_since_the_verdict(project, tmp_path):
    pp.train(project, seed=2)
    verdict = pp.gate_and_bundle(project)  # run A: compared with v0.0.1
    assert verdict["prod_compared"]["version"] == "v0.0.1"
    saved = tmp_path / "run_a"  # run A's workspace, put aside while run B runs
    for rel in ("models", "metrics", "reports"):
        shutil.copytree(project / rel, saved / rel)
    shutil.copy2(project / "dvc.lock", saved / "dvc.lock")
    assert pp.run(project, seed=3)["version"] == "v0.0.2"  # run B promotes
    before = state(project)
    for rel in ("models", "metrics", "reports"):
        shutil.rmtree(project / rel)
        shutil.copytree(saved / rel, project / rel)
    shutil.copy2(saved / "dvc.lock", project / "dvc.lock")
    line = refused(project)
    assert "prod moved since the gate compared with it: it saw v0.0.1, now it is v0.0.2" in line
    assert state(project) == before == (before[0], "v0.0.2")


# 6. The registry fails closed
def gto_prod(root: Path) -> str | None:
    out = subprocess.run(
        [GTO, "show", "--json"], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    return (json.loads(out).get("hydra") or {}).get("stage", {}).get("prod")


def test_6_the_stage_is_read_exactly_as_gto_show_reads_it(project):
    from tasks.promote import rollback

    def ours() -> str | None:
        prod = prod_version(project, "hydra", "prod")
        return prod and prod["version"]

    assert ours() == gto_prod(project) == "v0.0.1"
    pp.run(project, seed=3)
    assert ours() == gto_prod(project) == "v0.0.2"
    rollback(pp.cfg(project), project, "v0.0.1", "v0.0.2 regressed")
    assert ours() == gto_prod(project) == "v0.0.1"
    gto = {"cwd": project, "check": True, "capture_output": True}
    # GTO orders tags by their whole-second tag time: a tag written by hand in the same second as
    # the last one may be read before it (ours wait the same way, tasks.release.model_registry)
    tick = lambda: time.sleep(1.1)  # noqa: E731
    tick()
    subprocess.run([GTO, "deprecate", "hydra", "v0.0.2"], **gto)  # deregisters v0.0.2
    assert ours() == gto_prod(project) == "v0.0.1"
    # GTO's own deprecation of the assignment (a hydra#prod!#N tag)
    tick()
    subprocess.run([GTO, "deprecate", "hydra", "v0.0.1", "prod"], **gto)
    assert ours() == gto_prod(project) is None
    res = cli("predict", "-C", str(project), "Shares rose")
    assert res.exit_code == 1 and "no model 'hydra' in stage 'prod'" in res.output
    rollback(pp.cfg(project), project, "v0.0.1", "back after the review")
    assert ours() == gto_prod(project) == "v0.0.1"
    tick()
    subprocess.run([GTO, "deprecate", "hydra"], **gto)  # the whole artifact
    assert ours() == gto_prod(project) is None


def test_6_a_line_break_in_reason_cannot_rewrite_the_record(project):
    pp.train(project, seed=2, acc=0.2)
    pp.gate_and_bundle(project)
    before = state(project)
    other = versions(project, "hydra")[0]["fields"]["bundle_md5"]
    injected = f"ok\ngate: passed\nbundle_md5: {other}"
    line = refused(project, "--force", "--reason", injected)
    assert "line breaks and control characters are not allowed" in line
    assert state(project) == before


def test_6_every_field_read_back_from_a_tag_is_validated(project):
    head = pp.git(project, "rev-parse", "HEAD").strip()
    for message, why in (
        ("bundle_md5: 0123456789abcdef0123456789abcdef.dir\ngate: passed\ngate: passed", "twice"),
        ("bundle_md5: ../../../etc/passwd\ngate: passed", "not a valid bundle_md5"),
    ):
        pp.git(
            project, "tag", "-f", "-a", "hydra@v0.0.9", "-m", f"{RECORD_HEADER}\n{message}", head
        )
        with pytest.raises(RegistryError, match=rf"hydra@v0\.0\.9: .*{why}"):
            versions(project, "hydra")
        res = cli("registry", "-C", str(project))
        assert res.exit_code == 1 and "hydra@v0.0.9" in res.output, res.output


# 7. A bundle rebuilt from the DVC cache or a remote is verified
def test_7_a_corrupt_cache_object_is_refused_not_served(project):
    from tasks.release.lineage import file_md5

    record = prod_version(project, "hydra", "prod")
    shutil.rmtree(project / "models" / "bundle")  # not in the workspace: rebuilt from the cache
    weights = next(
        p
        for p in (project / ".dvc" / "cache" / "files" / "md5").rglob("*")
        if p.is_file() and p.stat().st_size > 10_000
    )
    digest = file_md5(weights)
    weights.chmod(0o644)
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(ValueError, match="corrupt in the DVC cache"):
        resolve_bundle_dir(project, record)
    assert digest != file_md5(weights)
    with pytest.raises(ValueError, match="not a DVC md5"):
        resolve_bundle_dir(project, {"tag": "x", "fields": {"bundle_md5": "../../x.dir"}})


# 9. A version restores from a new clone with the commands the README prints
def restore(origin: Path, version: str, dest: Path, env: dict[str, str] | None = None) -> Path:
    """README: ``git clone PROJECT copy && cd copy && git checkout hydra@VERSION && dvc pull
    models/bundle``; the pulled bundle compared byte for byte with the registered one."""
    pp.git(dest.parent, "clone", "-q", str(origin), str(dest))
    pp.git(dest, "checkout", "-q", f"hydra@{version}")
    pp.dvc(dest, "pull", "-q", "models/bundle", env=env)
    record = {v["version"]: v for v in versions(origin, "hydra")}[version]
    original, pulled = resolve_bundle_dir(origin, record), dest / "models" / "bundle"
    names = sorted(p.relative_to(original) for p in original.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(pulled) for p in pulled.rglob("*") if p.is_file())
    for name in names:
        assert (original / name).read_bytes() == (pulled / name).read_bytes(), name
    return pulled


def test_9_a_version_restores_from_a_new_clone_with_a_local_remote(base, tmp_path):
    from flows.dvcops import push

    assert pp.git(base, "status", "--porcelain", "--", ".dvc", ".dvcignore") == ""
    assert push(base) == "pushed"
    restore(base, "v0.0.1", tmp_path / "copy")
    main = tmp_path / "main"  # main itself is a DVC repository (its set-up was committed)
    pp.git(tmp_path, "clone", "-q", str(base), str(main))
    assert str(base / ".dvc-remote") in pp.dvc(main, "remote", "list")


def test_9_a_version_restores_from_a_new_clone_with_an_s3_remote(project, tmp_path):
    import socket

    import boto3
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    try:
        endpoint = f"http://127.0.0.1:{port}"
        s3 = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        s3.create_bucket(Bucket="models")
        pp.dvc(project, "remote", "add", "-d", "store", "s3://models/hydra-ens")
        pp.dvc(project, "remote", "modify", "store", "endpointurl", endpoint)
        assert (
            pp.run(project, seed=4)["version"] == "v0.0.2"
        )  # its version commit has the S3 remote
        pp.dvc(project, "push", "-q", env=env)
        restore(project, "v0.0.2", tmp_path / "copy", env=env)
    finally:
        server.stop()


# 10. Zero checks do not pass; a clone without the registry's tags says so
def test_10_zero_applicable_checks_fail_with_their_own_line(project):
    before = state(project)
    empty = pp.cfg(project).model_copy(update={"gates": []})
    write_params(empty, project / "params.yaml")
    with pytest.raises(ConfigError, match="must keep the compile agreement checks"):
        pp.cfg(project)  # an empty gate list never validates
    # the compile checks alone, on an eager artifact: every check not applicable
    only_compile = [
        {"metric": "compile_argmax_agreement", "threshold": 1.0},
        {"metric": "compile_max_abs_diff", "threshold": "compile_tolerance"},
    ]
    cfg = empty.model_copy(update={"gates": [GateCheck(**g) for g in only_compile]})
    write_params(cfg, project / "params.yaml")
    pp.train(project, seed=2)
    verdict = pp.gate_and_bundle(project)
    assert verdict["verdict"] == "failed" and verdict["failed"] == [NO_CHECK]
    assert "| no applicable check | - | failed |" in (project / "reports" / "gate.md").read_text()
    from tasks.promote import run as promote_stage

    assert promote_stage(pp.cfg(project), project)["why"] == "gate failed"
    res = cli("promote", "-C", str(project))
    assert res.exit_code == 3, res.output
    assert "not promoted: gate failed (failed: no applicable check)" in res.output
    only_eager = [{"metric": "compile_max_abs_diff", "threshold": 1e-4}]
    cfg = pp.cfg(project).model_copy(update={"gates": [GateCheck(**g) for g in only_eager]})
    decided = decide(cfg, pp.evaluation(0.95), None)
    assert decided["counts"]["not applicable"] == 1 and decided["failed"] == [NO_CHECK]
    assert state(project) == before


def test_10_a_clone_without_the_registry_tags_says_so(base, tmp_path):
    clone = tmp_path / "clone"
    pp.git(tmp_path, "clone", "-q", "--no-tags", str(base), str(clone))
    with pytest.raises(RegistryError, match="this clone has no hydra registry tags"):
        prod_version(clone, "hydra", "prod")
    prod, seen = prod_seen(pp.cfg(clone), clone)
    assert "unreadable" in seen and "fetch them" in prod
