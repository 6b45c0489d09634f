"""``hydra-ens serve-model``: the real HTTP server on 127.0.0.1 over a promoted bundle (a tiny BERT
Hydra on the MiniLM tokenizer, gated, bundled and promoted with real git and GTO; no fine-tuning),
talked to over HTTP: its rows equal ``predict``'s, bad requests get one error each, health and
version, ``hydra-ens predict`` asking the running service, a promotion under load, and a stage
left empty (GTO's own ``gto deprecate``, a promotion killed between its two tags). One project and
one in-thread server are shared by the module; the registry tests run last, in order."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import promotion_project as pp
import pytest
import torch
from conftest import REPO, kill_group
from tiny_models import make_members, member_plans

from hydra_ops.hydra.merge import merge_members
from hydra_ops.hydra.serialization import save_hydra
from tasks.params import load_params
from tasks.promote import promote
from tasks.release.custody import scored_record, source_record
from tasks.serving.client import SERVICE_FILE, find_service
from tasks.serving.predict import ROW_FIELDS
from tasks.serving.predict import predict as local_predict
from tasks.serving.prod_model import ModelHolder, load_prod_snapshot, stage_fingerprint
from tasks.serving.service import PredictionService

TEXTS = ["Shares rose on strong profits", "The band's new album", "A late goal won the match"]
#: A tiny BERT that reads the MiniLM tokenizer's ids (what predict tokenizes with).
TOKENIZER_SHAPE = {"vocab_size": 30522, "max_position_embeddings": 64}


def _promote_model(root: Path, seed: int) -> str:
    """A run of the promotion project (:mod:`promotion_project`) whose stand-in trains a tiny
    Hydra on the MiniLM tokenizer's ids: gate, bundle, lock, promotion."""
    torch.manual_seed(seed)
    members = make_members("bert", member_plans(2), fine_tuned=True, seed=seed, **TOKENIZER_SHAPE)
    hydra = merge_members(members)
    hydra.set_temperature(1.0 + seed)
    save_hydra(hydra, root / "models" / "hydra", metadata={"seed": seed})
    pp.write(root / "data" / "prepared" / "manifest.json", {"source": "stand-in"})
    compiled = {"backend": "eager", "check": None, "source": source_record(root)}
    pp.write(root / "models" / "compiled" / "compiled.json", compiled)
    scored = scored_record(pp.cfg(root), root)
    pp.write(root / "metrics" / "evaluate.json", {**pp.evaluation(0.95), "scored": scored})
    pp.gate_and_bundle(root)
    return promote(pp.cfg(root), root)["version"]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = pp.build(tmp_path_factory.mktemp("serve") / "proj")
    assert _promote_model(root, 0) == "v0.0.1"
    return root


@pytest.fixture(scope="module")
def service(project):
    holder = ModelHolder(
        lambda: load_prod_snapshot(project), lambda: stage_fingerprint(project), poll_s=0.1
    )
    svc = PredictionService(holder, port=0, max_batch=8, max_wait_ms=2, info={"model": "hydra"})
    svc.start()
    assert svc.wait_ready(120), "the warm-up did not end"
    yield svc
    svc.close()


def request(
    svc, method: str, path: str, body: bytes | None = None, headers: dict | None = None
) -> tuple[int, dict]:
    host, port = svc.httpd.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def ask(svc, inputs) -> tuple[int, dict]:
    return request(svc, "POST", "/predict", json.dumps({"inputs": inputs}).encode())


def test_the_service_answers_with_the_rows_of_predict(project, service):
    assert service.url.startswith("http://127.0.0.1:")
    status, answer = ask(service, TEXTS)
    assert status == 200, answer
    rows, _ = local_predict(load_params(project / "params.yaml"), project, TEXTS)
    assert answer["rows"] == rows  # same inputs in one forward pass: the same numbers
    assert all(list(r) == list(ROW_FIELDS) for r in answer["rows"])
    assert answer["model_version"] == "v0.0.1" and answer["legend"].startswith("entropy")
    assert answer["answered_by"] == rows[0]["answered_by"]


def test_bad_requests_get_one_clear_error_each_and_the_server_goes_on(service):
    def body(obj) -> bytes:
        return json.dumps(obj).encode()

    cases = [
        ("POST", "/predict", b"{not json", 400, "body is not valid JSON"),
        ("POST", "/predict", body(["a"]), 400, "body must be a JSON object"),
        ("POST", "/predict", body({"text": "a"}), 400, "unknown field 'text'"),
        ("POST", "/predict", body({"inputs": []}), 400, "inputs: give a non-empty list"),
        ("POST", "/predict", body({"inputs": "a text"}), 400, "inputs: give a non-empty list"),
        ("POST", "/predict", body({"inputs": ["ok", 3]}), 400, "inputs[1]: must be a string"),
        ("POST", "/predict", body({"inputs": ["ok", "  "]}), 400, "inputs[1]: empty"),
        ("POST", "/predict", body({"inputs": ["a"] * 257}), 400, "at most 256"),
        ("POST", "/nowhere", body({"inputs": ["a"]}), 404, "no endpoint '/nowhere'"),
        ("GET", "/predict", None, 405, "POST /predict"),
        ("DELETE", "/predict", None, 405, "DELETE is not served"),
        ("GET", "/", None, 404, "no endpoint '/'"),
    ]
    for method, path, payload, code, message in cases:
        status, answer = request(service, method, path, payload)
        assert (status, answer["status"]) == (code, code), (path, payload, answer)
        assert message in answer["error"] and "\n" not in answer["error"], answer
        assert request(service, "GET", "/health")[0] == 200
    host, port = service.httpd.server_address[:2]
    raw = http.client.HTTPConnection(host, port, timeout=30)
    raw.putrequest("POST", "/predict")
    raw.endheaders()  # no Content-Length
    assert raw.getresponse().status == 411
    raw.close()
    too_big = {"Content-Length": str(2 << 20)}
    assert request(service, "POST", "/predict", b"", too_big)[0] == 413
    # one bad request in a batch does not fail the good ones beside it
    answers = {}

    def send(name, inputs):
        answers[name] = ask(service, inputs)

    threads = [
        threading.Thread(target=send, args=(i, ["  "] if i == 0 else TEXTS[:1])) for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert answers[0][0] == 400 and all(answers[i][0] == 200 for i in (1, 2, 3)), answers
    assert ask(service, TEXTS[:1])[0] == 200


def test_health_and_version(service):
    assert ask(service, TEXTS[:1])[0] == 200
    status, health = request(service, "GET", "/health")
    assert status == 200 and health["status"] == "ok" and health["model_version"] == "v0.0.1"
    assert health["answered_by"].startswith("eager") and health["reload_error"] is None
    assert health["requests"] >= 1 and health["max_batch"] == 8
    status, version = request(service, "GET", "/version")
    assert status == 200 and version["version"] == "v0.0.1" and version["model"] == "hydra"
    assert version["tag"] == "hydra@v0.0.1" and version["bundle_md5"].endswith(".dir")
    assert version["schema_version"] == 1 and version["gate"] == "passed"


def test_predict_asks_the_running_service(project):
    """``hydra-ens serve-model`` as a real process registers itself; ``hydra-ens predict`` asks
    it (the title names its URL) and prints the rows it would compute itself; SIGTERM stops the
    service and unregisters it."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "serve-model", "-C", str(project), "--port", "0"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while find_service(project) is None and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[0]
            time.sleep(0.2)
        record = find_service(project)
        assert record and record["pid"] == proc.pid and record["url"].startswith("http://127.0")

        def cli(*args: str) -> str:
            r = subprocess.run(
                [sys.executable, "-m", "flows.cli", "predict", "-C", str(project), *args],
                cwd=REPO,
                env={**env, "COLUMNS": "80"},
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert r.returncode == 0, r.stdout + r.stderr
            return r.stdout

        served = [json.loads(x) for x in cli("--json", *TEXTS).splitlines()]
        loaded, _ = local_predict(load_params(project / "params.yaml"), project, TEXTS)
        assert served == loaded  # what `predict --local` (or no service) prints
        table = cli(*TEXTS)
        print(table)
        assert f"at {record['url']}" in " ".join(table.split()), table
        assert max(map(len, table.splitlines())) <= 80, table
        proc.terminate()  # SIGTERM: stops serving, unregisters
        assert proc.wait(timeout=60) == 0 and "stopped" in proc.communicate()[0]
    finally:
        kill_group(proc)
    assert not (project / SERVICE_FILE).exists()


def test_predict_falls_back_when_the_registered_service_does_not_answer(project):
    """A service registered by a live process that does not answer (here: nothing listens on its
    port): ``predict`` says so in one note and loads the model itself; ``--local`` never asks."""
    from typer.testing import CliRunner

    from flows.cli import app

    record = {"url": "http://127.0.0.1:9", "pid": os.getpid(), "model": "hydra", "stage": "prod"}
    (project / SERVICE_FILE).write_text(json.dumps(record))
    try:
        runner = CliRunner()
        res = runner.invoke(app, ["predict", "-C", str(project), "--json", TEXTS[0]])
        assert res.exit_code == 0, res.output
        assert "note: the registered service did not answer" in res.output
        assert json.loads(res.stdout.splitlines()[-1])["model_version"] == "v0.0.1"
        res = runner.invoke(app, ["predict", "-C", str(project), "--json", "--local", TEXTS[0]])
        assert res.exit_code == 0 and "note:" not in res.output, res.output
    finally:
        (project / SERVICE_FILE).unlink()


def test_the_single_model_is_served_as_one_member(project):
    """``serve-model --single``'s model (``models/base``, what the benchmark compares with): one
    member, so no disagreement and no mutual information; never reloaded."""
    from tiny_models import tiny_model

    from hydra_ops.models.checkpoints import save_model
    from tasks.serving.prod_model import load_single_snapshot

    save_model(tiny_model("bert", 0, **TOKENIZER_SHAPE), project / "models" / "base")
    holder = ModelHolder(lambda: load_single_snapshot(project))
    svc = PredictionService(holder, port=0, max_batch=4).start()
    try:
        assert svc.wait_ready(120)
        status, answer = ask(svc, TEXTS)
    finally:
        svc.close()
    assert status == 200 and answer["model_version"] == "single", answer
    assert answer["answered_by"].startswith("eager (single model base")
    assert [r["class"] for r in answer["rows"]] and len(answer["rows"]) == len(TEXTS)
    for row in answer["rows"]:
        assert row["disagreement"] == 0 and row["mutual_information"] == pytest.approx(0, abs=1e-6)
    assert "of the 1 members" in answer["legend"]


def test_health_is_not_ok_until_every_batch_shape_was_warmed(project):
    """A service starting up answers ``/health`` 503 ``warming up`` and refuses predictions until
    the model ran once on every shape it will meet (batch 1..max_batch x each pad length, each
    once); afterwards requests of 1..7 texts meet only shapes it warmed."""
    from tasks.release.preprocessing import pad_lengths

    holder = ModelHolder(lambda: load_prod_snapshot(project))
    served = holder.current.served
    real, shapes, release = served.member_logits, [], threading.Event()

    def counting(batch):
        shapes.append(tuple(batch["input_ids"].shape))
        release.wait(60)  # the warm-up waits here until the test has looked at /health
        return real(batch)

    served.member_logits = counting
    svc = PredictionService(holder, port=0, max_batch=4, max_wait_ms=1).start()
    try:
        status, health = request(svc, "GET", "/health")
        assert status == 503 and health["status"] == "warming up", health
        status, answer = ask(svc, TEXTS[:1])
        assert status == 503 and answer["error"].startswith("warming up"), answer
        release.set()
        assert svc.wait_ready(120)
        status, health = request(svc, "GET", "/health")
        lengths = pad_lengths(load_params(project / "params.yaml").model.max_length)
        expected = {(b, n) for b in range(1, 5) for n in lengths}
        assert status == 200 and health["status"] == "ok"
        assert health["warmed_shapes"] == health["shapes"] == len(expected)
        assert sorted(shapes) == sorted(expected)  # every shape, each once
        warmed = len(shapes)
        for n in range(1, 8):  # 5..7 texts: more than max_batch, split into warmed passes
            texts = [" ".join([TEXTS[n % 3]] * (4 * n)), *TEXTS * 3][:n]
            assert ask(svc, texts)[0] == 200
        assert set(shapes[warmed:]) <= expected, shapes[warmed:]
    finally:
        release.set()
        svc.close()


def test_a_failed_warm_up_is_never_served_as_ok(project):
    """A model that fails on a batch shape while warming is not served: ``/health`` answers 503
    ``not serving`` with the failure in one line, and ``/predict`` 503 with the same line."""
    holder = ModelHolder(lambda: load_prod_snapshot(project))

    def broken(batch):
        raise RuntimeError("kernel\nmissing")

    holder.current.served.member_logits = broken
    svc = PredictionService(holder, port=0, max_batch=2, max_wait_ms=1).start()
    try:
        assert svc.wait_ready(120)
        status, health = request(svc, "GET", "/health")
        assert status == 503 and health["status"] == "not serving", health
        assert (
            health["reason"].startswith("warm-up failed: kernel") and "\n" not in health["reason"]
        )
        status, answer = ask(svc, TEXTS[:1])
        assert status == 503 and answer["error"] == health["reason"], answer
    finally:
        svc.close()


def test_promoting_what_is_already_in_prod_names_the_version_and_stage(project):
    from typer.testing import CliRunner

    from flows.cli import app

    runner = CliRunner()
    for extra in (["--version", "v0.0.1", "--reason", "again"],):
        res = runner.invoke(app, ["promote", "-C", str(project), *extra])
        assert res.exit_code == 0, res.output
        said = " ".join(res.output.split())
        assert said == "not promoted: hydra@v0.0.1 is already in stage prod", res.output


def test_a_promotion_under_load_switches_versions_atomically(project, service):
    """Four clients send requests while v0.0.2 is promoted: every answer is wholly one version's
    (each row equal to what that version's model computes), each client sees v0.0.1 then only
    v0.0.2, and the server switched without a restart. Bounded: at most 60 s and 8,000 requests."""
    reference = {"v0.0.1": service.holder.current.rows(TEXTS)}
    seen: dict[int, list[dict]] = {i: [] for i in range(4)}
    switched, stop = threading.Event(), threading.Event()
    deadline = time.monotonic() + 60

    def client(i: int) -> None:
        while not stop.is_set() and time.monotonic() < deadline and len(seen[i]) < 2000:
            status, answer = ask(service, TEXTS)
            assert status == 200, answer
            seen[i].append(answer)
            if answer["model_version"] == "v0.0.2":
                switched.set()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        while sum(map(len, seen.values())) < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _promote_model(project, 1) == "v0.0.2"
        assert switched.wait(max(0.0, deadline - time.monotonic())), "never served v0.0.2"
        time.sleep(0.3)  # a few answers after the switch
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    reference["v0.0.2"] = service.holder.current.rows(TEXTS)
    assert service.holder.current.version == "v0.0.2" and service.holder.reloads >= 1
    for answers in seen.values():
        versions = [a["model_version"] for a in answers]
        first_new = versions.index("v0.0.2") if "v0.0.2" in versions else len(versions)
        assert set(versions[first_new:]) <= {"v0.0.2"}, versions  # never back to the old one
        for answer in answers:
            version = answer["model_version"]
            assert {r["model_version"] for r in answer["rows"]} == {version}
            for row, ref in zip(answer["rows"], reference[version], strict=True):
                assert row["class"] == ref["class"]
                assert row["prob"] == pytest.approx(ref["prob"], abs=1e-5)
                assert row["entropy"] == pytest.approx(ref["entropy"], abs=1e-5)
    assert any("v0.0.1" in [a["model_version"] for a in s] for s in seen.values())
    assert reference["v0.0.1"][0]["prob"] != pytest.approx(reference["v0.0.2"][0]["prob"])


def wait_for(svc, done, limit_s: float = 60) -> tuple[int, dict]:
    """Ask ``svc`` until ``done((status, answer))`` or ``limit_s`` passed; the last answer."""
    deadline = time.monotonic() + limit_s
    while not done(answer := ask(svc, TEXTS[:1])) and time.monotonic() < deadline:
        time.sleep(0.05)
    return answer


def test_a_stage_left_by_gto_deprecate_stops_the_answers_until_a_version_is_promoted(
    project, service
):
    """After the promotion, GTO's own ``gto deprecate hydra v0.0.2 prod`` empties the stage
    (``gto show``: no prod) while the service runs: every request is refused with one line naming
    the version and the registry's state, ``/health`` and ``/version`` answer 503; a rollback to
    v0.0.1 is served again, without a restart."""
    from tasks.promote import rollback

    assert ask(service, TEXTS[:1])[1]["model_version"] == "v0.0.2"
    time.sleep(1.1)  # GTO orders tags by their whole-second tag time
    gto = str(Path(sys.executable).parent / "gto")
    subprocess.run([gto, "deprecate", "hydra", "v0.0.2", "prod"], cwd=project, check=True)
    assert pp.gto_prod(project) is None
    status, answer = wait_for(service, lambda a: a[0] != 200)
    assert (status, answer["status"]) == (503, 503), answer
    assert answer["error"] == (
        "not serving hydra@v0.0.2: no model 'hydra' in stage 'prod'; "
        "run the pipeline / promote first"
    )
    assert ask(service, TEXTS)[0] == 503  # it stays refused
    status, health = request(service, "GET", "/health")
    assert status == 503 and health["status"] == "not serving" and health["moving"] is None
    assert health["withdrawn_version"] == "v0.0.2" and health["model_version"] is None
    assert request(service, "GET", "/version") == (503, answer)
    rollback(pp.cfg(project), project, "v0.0.1", "v0.0.2 deprecated")
    assert pp.gto_prod(project) == "v0.0.1"
    status, answer = wait_for(service, lambda a: a[0] == 200)
    assert status == 200 and answer["model_version"] == "v0.0.1", answer
    assert request(service, "GET", "/health")[1]["status"] == "ok"


def test_a_promotion_killed_between_its_two_tags_is_covered_for_a_bounded_grace(
    project, service, monkeypatch
):
    """A move of the stage writes the old version's unassignment, then the new assignment a
    second later. Left after the first tag (a killed promotion), the stage is empty: the old
    version answers on while the move counts as under way (``MOVE_GRACE_S``), then is withdrawn;
    finishing the move serves again."""
    import gto.api

    import tasks.release.model_registry as registry

    holder = ModelHolder(
        lambda: load_prod_snapshot(project), lambda: stage_fingerprint(project), poll_s=60
    )  # checked by hand below
    try:
        assert holder.current.version == "v0.0.1"
        time.sleep(1.1)  # GTO orders tags by their whole-second tag time
        message = registry.MOVE_MESSAGE.format(
            name="hydra", old="v0.0.1", stage="prod", new="v0.0.2"
        )
        gto.api.unassign(str(project), "hydra", stage="prod", version="v0.0.1", message=message)
        assert holder.check() is False and holder.current.version == "v0.0.1"  # within the grace
        assert holder.moving and holder.moving.startswith("v0.0.1 -> v0.0.2")
        move = registry.stage_move_under_way(project, "hydra", "prod")
        assert move and (move["from"], move["to"]) == ("v0.0.1", "v0.0.2")
        later = time.time() + registry.MOVE_GRACE_S
        assert registry.stage_move_under_way(project, "hydra", "prod", now=later) is None
        assert pp.gto_prod(project) is None
        monkeypatch.setattr(registry, "MOVE_GRACE_S", 0.0)  # the grace is over
        assert holder.check() is True and holder.moving is None
        assert holder.current.reason.startswith("not serving hydra@v0.0.1: no model 'hydra'")
        assert wait_for(service, lambda a: a[0] == 503)[0] == 503
        registry.assign(project, "hydra", "prod", "v0.0.1", "hydra-ens: the move, finished")
        assert holder.check() is True and holder.current.version == "v0.0.1"
        assert wait_for(service, lambda a: a[0] == 200)[1]["model_version"] == "v0.0.1"
    finally:
        holder.close()
