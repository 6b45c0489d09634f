"""The prediction service under a bounded load: Hydra vs the single model, side by side.

``python -m benchmarks.serve [--project DIR] [--out FILE.json] [--startup-only]``

Both models are served at once by real ``hydra-ens serve-model`` processes on 127.0.0.1 (Hydra:
the prod bundle; the single model: ``--single``, ``models/base`` of the same project) and driven
from this process over keep-alive HTTP connections:

* ``batch 1``: one client, one input per request, requests back to back (latency of one question);
* ``N clients``: N clients at once, one input per request (what the micro-batcher joins);
* ``batch 16``: one client, 16 inputs per request.

* ``first start`` / ``second start`` (:func:`startup_load`): a fresh ``serve-model`` process of the
  Hydra, timed from its start to ``/health`` ``ok`` (the warm-up of every batch shape), then
  ``--startup-requests`` requests (200) from ``clients`` threads at once, each of 1-4 texts, from
  the first request after ``/health`` is ok; the second start reuses the first one's compile
  caches (``TORCHINDUCTOR_CACHE_DIR``, empty at the first start). p50, p99 and p99 / p50 per
  start. ``--startup-only`` runs only these.

Every block of requests is bounded (a number of requests and a time limit); in each round, each
scenario runs a block on Hydra, then one on the single model, so a change in the machine's load
hits both. Per scenario and model: p50 / p99 latency of a request as the client sees it (HTTP
round trip: JSON, tokenizing, the forward pass, the rows) and throughput (inputs answered per
second of the block's wall time), pooled over rounds. Commands are timed too (wall clock):
``python -c pass`` and ``hydra-ens --help`` (interpreter and CLI start-up), ``hydra-ens predict``
with the service running, and ``predict --local`` (it loads the model itself).

Without ``--project``, a project is built in a temp folder: the bundled MiniLM-L6 as the single
model, and a Hydra of the default shape made from it (M = 3 members keeping 4 of 12 heads in layers
3-5 over a shared trunk of layers 0-2, merged as the merge stage does), gated, bundled and promoted
with real git and GTO; nothing is fine-tuned (latency does not depend on the weights). Both are
served eager in fp32 there (the model a run ships may be compiled: ``answered_by`` says which).
"""

from __future__ import annotations

import copy
import http.client
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "benchmarks" / "results" / "serve.json"
TEXTS = [
    "Shares rose sharply after the company reported strong quarterly profits",
    "The band's new album tops the charts in its first week",
    "The minister announced a new budget for schools and hospitals",
    "A late goal won the match for the home side",
    "Oil prices fell as demand slowed across Europe",
    "The film festival opened with a documentary about jazz",
    "Parliament voted on the new immigration bill last night",
    "The champion lost in straight sets in the second round",
]
CLASSES = ["business", "entertainment", "politics", "sport"]


def build_project(root: Path) -> Path:
    """A promoted project of the default shape in ``root`` (see the module doc)."""
    import torch

    from hydra_ops.heads.plans import HeadPlan
    from hydra_ops.heads.surgery import prune_heads
    from hydra_ops.hydra.merge import merge_members
    from hydra_ops.hydra.serialization import save_hydra
    from hydra_ops.models.checkpoints import save_model
    from hydra_ops.models.factory import load_text_classifier
    from tasks import bundle, gate
    from tasks.params import load_params, resolve_params, write_params
    from tasks.promote import promote
    from tasks.release.git_repo import git

    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "bench@hydra-ens.invalid")
    git(root, "config", "user.name", "hydra-ens benchmark")
    gates = [{"metric": "accuracy", "split": "id_test", "threshold": 0.0}]
    write_params(resolve_params("default", {"gates": gates}), root / "params.yaml")
    cfg = load_params(root / "params.yaml")
    torch.manual_seed(0)
    single, _ = load_text_classifier(len(CLASSES), class_names=CLASSES)
    single.eval()
    save_model(single, root / "models" / "base")
    layers, heads = cfg.model_layers, cfg.model_heads
    shared, members, keep = cfg.shared_layers, cfg.members.num_members, cfg.heads_per_member
    plans = [
        HeadPlan(
            [
                tuple(range(heads)) if layer < shared else tuple(range(m * keep, (m + 1) * keep))
                for layer in range(layers)
            ]
        )
        for m in range(members)
    ]
    hydra = merge_members(
        [prune_heads(copy.deepcopy(single), plan) for plan in plans],
        mode=cfg.merge.mode,
        attention=cfg.merge.attention,
        shared_layers=shared,
        class_names=CLASSES,
    )
    save_hydra(hydra, root / "models" / "hydra", metadata={"benchmark": "untrained, default shape"})
    (root / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    for path, obj in (
        (root / "models" / "compiled" / "compiled.json", {"backend": "eager", "check": None}),
        (root / "metrics" / "evaluate.json", _evaluation(members)),
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(obj))
    git(root, "add", "params.yaml")
    git(root, "commit", "-q", "-m", "benchmark project")
    gate.run(cfg, root)
    bundle.run(cfg, root)
    promote(cfg, root)
    return root


def _evaluation(members: int) -> dict[str, Any]:
    metrics = {"id_test": {"accuracy": 0.25, "nll": 1.4, "ece": 0.1}, "shift": {"accuracy": 0.25}}
    metrics |= {"near_ood": {"auroc": 0.5}, "far_ood": {"auroc": 0.5}}
    hydra = {"members": members, "temperature": 1.0, "parameters": 0, "calibrated": metrics}
    hydra |= {"compile_backend": "eager", "compile_max_abs_diff": None}
    single = {**hydra, "members": 1}
    return {"models": {"hydra": hydra, "single": single}, "counts": {"test": 0}}


class Server:
    """``hydra-ens serve-model`` as a child process (its own process group), until :meth:`stop`."""

    def __init__(self, project: Path, single: bool, max_batch: int, max_wait_ms: float) -> None:
        args = ["serve-model", "-C", str(project), "--port", "0", "--max-batch", str(max_batch)]
        args += ["--max-wait-ms", str(max_wait_ms)] + (["--single"] if single else [])
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", *args],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        deadline, line = time.monotonic() + 300, ""
        while time.monotonic() < deadline and self.proc.poll() is None:
            line = self.proc.stdout.readline()
            if found := re.search(r"at http://127\.0\.0\.1:(\d+)", line):
                self.port = int(found.group(1))
                self.answered_by = line.split("answered by ", 1)[1].split(", at http")[0]
                return
        self.stop()
        raise RuntimeError(f"serve-model did not start: {line!r}")

    def wait_ok(self, limit_s: float = 900) -> float:
        """Poll ``/health`` until it says ``ok`` (the warm-up is over); seconds waited."""
        t0 = time.monotonic()
        while (health := self.get("/health"))["status"] != "ok":
            if time.monotonic() - t0 > limit_s or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"serve-model never became ok: {health}")
            time.sleep(0.1)
        return time.monotonic() - t0

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def get(self, path: str) -> dict[str, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request("GET", path)
        out = json.loads(conn.getresponse().read())
        conn.close()
        return out


def _client(port: int, inputs: list[str], n: int, until: float, out: list[float]) -> None:
    """``n`` requests back to back on one keep-alive connection (stops at ``until``)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    body = json.dumps({"inputs": inputs}).encode()
    _send(conn, [body] * n, until, out)
    conn.close()


def _send(
    conn: http.client.HTTPConnection, bodies: list[bytes], until: float, out: list[float]
) -> None:
    """POST each of ``bodies`` to ``/predict`` in turn (stops at ``until``); seconds each."""
    headers = {"Content-Type": "application/json"}
    for body in bodies:
        if time.monotonic() > until:
            break
        t0 = time.perf_counter()
        conn.request("POST", "/predict", body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"status {resp.status}: {data[:200]!r}")
        out.append(time.perf_counter() - t0)


def drive(port: int, clients: int, batch: int, requests: int, limit_s: float) -> dict[str, Any]:
    """``clients`` clients sending ``requests`` requests of ``batch`` inputs in all (bounded by
    ``limit_s``); latencies in ms and inputs per second."""
    per_client = max(1, requests // clients)
    lats: list[list[float]] = [[] for _ in range(clients)]
    until = time.monotonic() + limit_s
    threads = [
        threading.Thread(
            target=_client,
            args=(
                port,
                [TEXTS[(c + i) % len(TEXTS)] for i in range(batch)],
                per_client,
                until,
                lats[c],
            ),
        )
        for c in range(clients)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    flat = [x * 1000 for c in lats for x in c]
    return {"latencies_ms": flat, "wall_s": wall, "inputs": len(flat) * batch}


def mixed_bodies(requests: int) -> list[bytes]:
    """``requests`` request bodies of 1-4 texts each (1, 2, 3, 4, 1, ...; texts of several
    lengths, so batches are padded to several lengths)."""
    bodies = []
    for i in range(requests):
        texts = [
            " ".join([TEXTS[(i + k) % len(TEXTS)]] * (1 + (i + k) % 3)) for k in range(i % 4 + 1)
        ]
        bodies.append(json.dumps({"inputs": texts}).encode())
    return bodies


def startup_load(
    project: Path, clients: int, requests: int, max_batch: int, max_wait_ms: float
) -> dict[str, Any]:
    """``first start`` and ``second start`` (module doc): per start, the seconds from the
    process start to ``/health`` ok and the p50 / p99 of ``requests`` requests of 1-4 texts from
    ``clients`` threads, sent from the first request after ``/health`` is ok."""
    out: dict[str, Any] = {}
    bodies = mixed_bodies(requests)
    with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # the servers' environment
        try:
            for start in ("first start", "second start"):
                t0 = time.monotonic()
                server = Server(project, False, max_batch, max_wait_ms)
                try:
                    listening = time.monotonic() - t0
                    warm = server.wait_ok()
                    lats: list[list[float]] = [[] for _ in range(clients)]
                    share = [bodies[c::clients] for c in range(clients)]
                    until = time.monotonic() + 600
                    threads = [
                        threading.Thread(
                            target=_one_client, args=(server.port, share[c], until, lats[c])
                        )
                        for c in range(clients)
                    ]
                    for t in threads:
                        t.start()
                    for t in threads:
                        t.join()
                    health = server.get("/health")
                finally:
                    server.stop()
                flat = sorted(x * 1000 for c in lats for x in c)
                p50 = statistics.median(flat)
                p99 = statistics.quantiles(flat, n=100, method="inclusive")[98]
                out[start] = {
                    "requests": len(flat),
                    "p50_ms": p50,
                    "p99_ms": p99,
                    "p99_over_p50": p99 / p50,
                    "max_ms": flat[-1],
                    "listening_after_s": listening,
                    "ok_after_listening_s": warm,
                    "warmed_shapes": health.get("shapes"),
                    "batches": health.get("batches"),
                    "answered_by": server.answered_by,
                }
        finally:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    return out


def _one_client(port: int, bodies: list[bytes], until: float, out: list[float]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    _send(conn, bodies, until, out)
    conn.close()


def _summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    lats = sorted(x for r in runs for x in r["latencies_ms"])
    q = statistics.quantiles(lats, n=100, method="inclusive")
    return {
        "requests": len(lats),
        "p50_ms": statistics.median(lats),
        "p99_ms": q[98],
        "inputs_per_s": sum(r["inputs"] for r in runs) / sum(r["wall_s"] for r in runs),
    }


MODELS = ("hydra", "single")
CLI = [sys.executable, "-m", "flows.cli"]
PREDICT = [*CLI, "predict", "-C"]


def _wall(cmd: list[str]) -> float:
    """Wall seconds of one command (it must succeed)."""
    t0 = time.perf_counter()
    subprocess.run(
        cmd,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
        capture_output=True,
        timeout=600,
    )
    return time.perf_counter() - t0


def main(
    project: Annotated[
        Path | None, typer.Option(help="a project with a prod version and models/base")
    ] = None,
    out: Annotated[Path, typer.Option(help="where the JSON goes")] = DEFAULT_OUT,
    rounds: Annotated[int, typer.Option(min=1, help="rounds alternating the two models")] = 5,
    clients: Annotated[int, typer.Option(min=2, help="clients of the concurrent scenario")] = 8,
    max_batch: Annotated[int, typer.Option(min=1)] = 16,
    max_wait_ms: Annotated[float, typer.Option(min=0)] = 5.0,
    startup_requests: Annotated[
        int, typer.Option(min=1, help="requests after each start (first, second)")
    ] = 200,
    startup_only: Annotated[
        bool, typer.Option("--startup-only", help="only the first / second start scenarios")
    ] = False,
) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    tmp = None
    if project is None:
        tmp = tempfile.TemporaryDirectory(prefix="hydra-ens-serve-bench-")
        t0 = time.perf_counter()
        project = build_project(Path(tmp.name) / "proj")
        print(f"built the benchmark project in {time.perf_counter() - t0:.0f} s", flush=True)
    startup = startup_load(project, clients, startup_requests, max_batch, max_wait_ms)
    settings = {"max_batch": max_batch, "max_wait_ms": max_wait_ms, "clients": clients}
    if startup_only:
        result = {"machine": _machine(), "settings": settings, "startup": startup}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(startup_markdown(startup))
        if tmp is not None:
            tmp.cleanup()
        return
    # per round and scenario, a block of requests for each model in turn: both servers run all
    # along (the idle one costs memory only), so a change in the machine's load hits both alike
    scenarios = {
        "batch 1": (1, 1, 40),
        f"{clients} clients": (clients, 1, 8 * clients),
        "batch 16": (1, 16, 8),
    }
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {s: {} for s in scenarios}
    servers = {m: Server(project, m == "single", max_batch, max_wait_ms) for m in MODELS}
    try:
        for server in servers.values():
            server.wait_ok()  # every batch shape warmed
            drive(server.port, 1, 1, 10, 120)  # warm-up (first calls, caches)
        for _ in range(rounds):
            for name, (c, b, n) in scenarios.items():
                for model, server in servers.items():
                    runs[name].setdefault(model, []).append(drive(server.port, c, b, n, 120))
        served = {
            m: {"answered_by": server.answered_by, "health": server.get("/health")}
            for m, server in servers.items()
        }
        command_s = {
            "python -c pass": [_wall([sys.executable, "-c", "pass"]) for _ in range(3)],
            "hydra-ens --help": [_wall([*CLI, "--help"]) for _ in range(3)],
            "predict (service)": [_wall([*PREDICT, str(project), TEXTS[0]]) for _ in range(3)],
        }
    finally:
        for server in servers.values():
            server.stop()
    command_s["predict --local"] = [_wall([*PREDICT, str(project), TEXTS[0], "--local"])]
    table = {
        name: {model: _summary(r) for model, r in by_model.items()}
        for name, by_model in runs.items()
    }
    result = {
        "machine": _machine(),
        "settings": {**settings, "rounds": rounds},
        "served": served,
        "scenarios": table,
        "startup": startup,
        "command_wall_s": command_s,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    print(startup_markdown(startup))
    if tmp is not None:
        tmp.cleanup()


def _machine() -> dict[str, Any]:
    return {
        "cpu": _cpu_name(),
        "cores": len(os.sched_getaffinity(0)),
        "loadavg_at_end": os.getloadavg(),
        "python": platform.python_version(),
    }


def startup_markdown(startup: dict[str, Any]) -> str:
    """The first / second start table of docs/benchmarks.md."""
    lines = [
        "| start | /health ok after (s) | shapes warmed | requests | p50 ms | p99 ms | p99 / p50 |",
        "|---|---|---|---|---|---|---|",
    ]
    for start, s in startup.items():
        ok = s["listening_after_s"] + s["ok_after_listening_s"]
        lines.append(
            f"| {start} | {ok:.1f} | {s['warmed_shapes']} | {s['requests']} | {s['p50_ms']:.1f} "
            f"| {s['p99_ms']:.1f} | {s['p99_over_p50']:.2f} |"
        )
    return "\n".join(lines)


def _cpu_name() -> str:
    """The CPU model and its vector units that matter here (``lscpu`` flags)."""
    name, flags = platform.processor(), set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
    units = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{name} ({', '.join(units)})"


def markdown(result: dict[str, Any]) -> str:
    """The table of docs/benchmarks.md."""
    lines = [
        "| scenario | model | requests | p50 ms | p99 ms | inputs/s | Hydra / single (p50) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, by_model in result["scenarios"].items():
        for model, s in by_model.items():
            ratio = s["p50_ms"] / by_model["single"]["p50_ms"] if model == "hydra" else None
            lines.append(
                f"| {name} | {model} | {s['requests']} | {s['p50_ms']:.1f} | {s['p99_ms']:.1f} | "
                f"{s['inputs_per_s']:.1f} | {'' if ratio is None else f'{ratio:.2f}x'} |"
            )
    lines += ["", "| command (wall clock, one text) | seconds |", "|---|---|"]
    for cmd, secs in result["command_wall_s"].items():
        lines.append(f"| `{cmd}` | {', '.join(f'{x:.2f}' for x in secs)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    typer.run(main)
