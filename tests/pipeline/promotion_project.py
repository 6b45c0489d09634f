"""A small real project for promotion tests: git, real DVC (``dvc init``, a local remote, a real
``dvc.lock`` written by ``dvc commit``) and GTO, with the expensive stages replaced by a stand-in.

``dvc.yaml`` has the last stages of the pipeline as the real one declares them (``gate``,
``bundle``, ``promote``) and one stand-in, ``train``, for everything before: its outputs (a tiny
random-init Hydra, an eager ``compiled.json``, ``metrics/evaluate.json``) are written in process
by :func:`train`. :func:`run` is what ``hydra-ens run`` does after the model stages: the gate and
the bundle, ``dvc commit`` (the lock DVC writes after each stage), then the ``promote`` stage's
own code (:func:`tasks.promote.run`). A run costs one ``dvc commit`` process, no fine-tuning.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from tiny_models import make_members, member_plans

from hydra_ops.hydra.merge import merge_members
from hydra_ops.hydra.serialization import save_hydra
from tasks import bundle, gate
from tasks.params import load_params, resolve_params, write_params
from tasks.release.custody import scored_record, source_record

DVC = str(Path(sys.executable).parent / "dvc")
GATES = [
    {"metric": "accuracy", "split": "id_test", "threshold": 0.5},
    {"metric": "nll", "split": "id_test", "baseline": "prod", "tolerance": 1.0, "optional": True},
    {"metric": "compile_max_abs_diff", "threshold": 1e-4},
    {"metric": "compile_argmax_agreement", "threshold": 1.0},
]
DVC_YAML = """\
stages:
  train:  # stands in for prepare_data .. evaluate
    cmd: python -c "raise SystemExit('a stand-in, the test writes these outputs')"
    outs: [data/prepared, models/hydra, models/compiled]
    metrics:
      - metrics/evaluate.json: {cache: false}
  gate:
    cmd: python -m tasks.gate
    deps: [models/hydra, models/compiled, metrics/evaluate.json]
    params:
      - params.yaml:
    outs:
      - reports/gate.md: {cache: false}
    metrics:
      - reports/gate.json: {cache: false}
  bundle:
    cmd: python -m tasks.bundle
    deps: [models/hydra, models/compiled, metrics/evaluate.json, reports/gate.json]
    params:
      - params.yaml:
    outs: [models/bundle]
  promote:
    cmd: python -m tasks.promote
    deps: [reports/gate.json, models/bundle]
    params: [promote]
    outs:
      - registry/promotion.json: {cache: false}
"""


def git(root: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=root, check=True, capture_output=True, text=True
    ).stdout


def dvc(root: Path, *args: str, env: dict[str, str] | None = None) -> str:
    r = subprocess.run([DVC, *args], cwd=root, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def evaluation(acc: float) -> dict:
    def entry(a: float) -> dict:
        metrics = {"id_test": {"accuracy": a, "nll": 0.3, "ece": 0.02}}
        metrics |= {"shift": {"accuracy": a}, "near_ood": {"auroc": 0.8}}
        metrics |= {"far_ood": {"auroc": 0.9}}
        return {"members": 2, "temperature": 1.0, "parameters": 10, "calibrated": metrics}

    hydra = {**entry(acc), "compile_backend": "eager", "compile_max_abs_diff": None}
    return {"models": {"hydra": hydra, "single": entry(0.9)}, "counts": {"test": 4}}


def write(path: Path, obj) -> None:
    """Replace ``path`` as a stage does (a new file renamed into place), never write into it: DVC
    links the workspace's outputs to its cache, so writing into one would change the cached
    object of an earlier version (its bundle could then not be rebuilt for a rollback)."""
    from hydra_ops.atomic import atomic_write_bytes

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(obj).encode())


def train(root: Path, seed: int, acc: float = 0.95) -> None:
    """The stand-in stage's outputs: a data manifest, a tiny Hydra (seeded), an eager compiled
    record of that model, and metrics that record what they scored
    (:mod:`tasks.release.custody`)."""
    torch.manual_seed(seed)
    hydra = merge_members(make_members("bert", member_plans(2), fine_tuned=True))
    hydra.set_temperature(1.0 + seed)
    save_hydra(hydra, root / "models" / "hydra", metadata={"seed": seed})
    write(root / "data" / "prepared" / "manifest.json", {"source": "stand-in"})
    compiled = {"backend": "eager", "check": None, "source": source_record(root)}
    write(root / "models" / "compiled" / "compiled.json", compiled)
    write(
        root / "metrics" / "evaluate.json",
        {**evaluation(acc), "scored": scored_record(cfg(root), root)},
    )


def cfg(root: Path):
    return load_params(root / "params.yaml")


def gate_and_bundle(root: Path) -> dict:
    """The ``gate`` and ``bundle`` stages' code, then ``dvc commit`` records them in dvc.lock."""
    verdict = gate.run(cfg(root), root)
    bundle.run(cfg(root), root)
    dvc(root, "commit", "-f", "-q", "train", "gate", "bundle")
    return verdict


def run(root: Path, seed: int, acc: float = 0.95) -> dict:
    """A whole run: the stand-in, gate, bundle, lock, and the ``promote`` stage's code."""
    from tasks.promote import run as promote_stage

    train(root, seed, acc)
    gate_and_bundle(root)
    return promote_stage(cfg(root), root)


def build(root: Path, gates: list[dict] | None = None) -> Path:
    """The project: params, dvc.yaml, git (one commit), DVC set up by ``hydra-ens run``'s own
    :func:`flows.dvcops.ensure_project` (a local remote), nothing run yet."""
    from flows.dvcops import ensure_project

    root.mkdir(parents=True)
    write_params(resolve_params("quick", {"gates": gates or GATES}), root / "params.yaml")
    (root / "dvc.yaml").write_text(DVC_YAML)
    (root / ".gitignore").write_text(".hydra-ens/\n.dvc-remote/\n__pycache__/\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "config", "user.email", "tests@hydra-ens.invalid")
    git(root, "config", "user.name", "hydra-ens tests")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "project")
    ensure_project(root)
    return root


def gto_prod(root: Path, name: str = "hydra") -> str | None:
    """The version in ``prod`` as GTO's own ``gto show`` says (None: none)."""
    gto = str(Path(sys.executable).parent / "gto")
    out = subprocess.run(
        [gto, "show", "--json"], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    return (json.loads(out).get(name) or {}).get("stage", {}).get("prod")
