"""Stub stages for the study engine's tests (see dvc.yaml here): real files, no models.

``evaluate`` perturbs a real evaluate.json (evaluate_template.json) by the point's variant and
seed; ``gate`` judges it with the pipeline's own gate checks. ``evaluate.cost_rounds: 13``
makes ``evaluate`` fail at seed 1 (a point that fails for a real reason);
``STUB_SLOW_SECONDS`` makes ``STUB_SLOW_STAGE`` (``score_heads`` unless set) take that long (a
window to kill a worker in).
"""

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import yaml

stage = sys.argv[1]
params = yaml.safe_load(Path("params.yaml").read_text())


def write(path: str, obj) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(obj, indent=1, sort_keys=True))


def jitter(*key) -> float:
    return int(hashlib.sha256(repr(key).encode()).hexdigest()[:8], 16) / 16**8 - 0.5


#: The twin's offsets from the Hydra (worse by) on the metrics the default twin group watches.
TWIN_GAP = {("id_test", "nll"): 0.05, ("id_test", "ece"): 0.02, ("shift", "nll"): 0.05}


def twin_of(ev: dict, variant, seed: int) -> None:
    """The naive pruned twin and the control: a ``circuit`` Hydra is separably better than its
    twin (bootstrap +-0.005 around a 0.02-0.05 gap) except at seed 2, a ``taylor`` Hydra is its
    own twin (the twin group of the gates fails it); the control is the Hydra, jittered."""
    import copy

    hydra = ev["models"]["hydra"]
    twin = copy.deepcopy(hydra)
    separable = variant[0] == "circuit" and seed != 2
    boot: dict = {}
    for (split, metric), gap in TWIN_GAP.items():
        if separable:
            twin["calibrated"][split][metric] += gap + 1e-4 * jitter(variant, seed, metric)
        d = hydra["calibrated"][split][metric] - twin["calibrated"][split][metric]
        w = 0.005 if separable else 0.0
        boot.setdefault(split, {})[metric] = {"low": d - w, "high": d + w, "difference": d}
    twin["members"], twin["parameters"] = 1, hydra["parameters"] // 2
    ev["models"]["naive_pruned"] = twin
    ev["bootstrap"]["naive_pruned"] = {"calibrated": boot}
    ev["models"]["control"] = copy.deepcopy(hydra)
    ev["models"]["control"]["parameters"] = 3 * ev["models"]["single"]["parameters"]
    ev["bootstrap"]["control"] = copy.deepcopy(ev["bootstrap"]["single"])


def cost(ev: dict, rounds: int) -> dict:
    """metrics/cost.json as tasks.evaluation.cost writes it: every model a tiny torch stand-in (one
    linear layer per member), all timed in this one process."""
    import torch

    from tasks.evaluation.cost import measure_cost

    x = torch.randn(8, 32)
    layer = torch.nn.Linear(32, 32)
    models = [
        (name, lambda k=e["members"]: [layer(x) for _ in range(k)], e["parameters"])
        for name, e in ev["models"].items()
    ]
    return measure_cost(models, rounds, batch=8, precision="fp32")


seed = params["seed"]
if stage == os.environ.get("STUB_SLOW_STAGE", "score_heads"):
    time.sleep(float(os.environ.get("STUB_SLOW_SECONDS", "0")))
if stage == "prepare_data":
    # the split drawn by data.seed (which follows the replicate seed unless a spec pins it)
    write(
        "data/prepared/split.json",
        {"data": params["data"]["name"], "split": params["data"]["seed"]},
    )
    write("metrics/data.json", {"rows": 160})
elif stage == "finetune_base":
    write("models/base/weights.json", {"seed": seed, "w": jitter("base", seed)})
    write("metrics/finetune_base.json", {"seed": seed})
elif stage == "finetune_baselines":
    write("models/baselines/index.json", {"seed": seed, "w": jitter("de", seed)})
elif stage == "baseline_logits":
    write("artifacts/baseline_logits/index.json", {"seed": seed, "w": jitter("logits", seed)})
elif stage == "score_heads":
    write("artifacts/scores/scores.json", {"method": params["scoring"]["method"], "seed": seed})
elif stage == "evaluate":
    if params["evaluate"]["cost_rounds"] == 13 and seed == 1:
        print("error: evaluate: the stub was asked to fail (cost_rounds 13)", file=sys.stderr)
        sys.exit(1)
    ev = json.loads(Path("evaluate_template.json").read_text())
    variant = (params["scoring"]["method"], params["merge"]["shared_layers"])
    for name, entry in ev["models"].items():
        key = (
            (variant, seed, name) if name in ("hydra", "control", "naive_pruned") else (seed, name)
        )
        for split in entry["calibrated"].values():
            for metric, value in split.items():
                if isinstance(value, float) and 0 < value < 1:
                    split[metric] = min(1.0, max(0.0, value + 0.02 * jitter(key, metric)))
    twin_of(ev, variant, seed)
    write("metrics/evaluate.json", ev)
    write("metrics/latency.json", {n: 10.0 + 5 * jitter(n) for n in ev["models"]})
    write("metrics/cost.json", cost(ev, params["evaluate"]["cost_rounds"]))
elif stage == "gate":
    from tasks.gates.checks import evaluate_check
    from tasks.gates.twin import resolve_any_of
    from tasks.params import validate_params

    cfg = validate_params(params)
    ev = json.loads(Path("metrics/evaluate.json").read_text())
    checks = resolve_any_of(cfg.gates, [evaluate_check(c, ev, None) for c in cfg.gates], ev)
    failed = [c["name"] for c in checks if c["status"] == "failed"]
    write(
        "reports/gate.json",
        {"verdict": "failed" if failed else "passed", "failed": failed, "checks": checks},
    )
