"""Stage ``compile``: the compiled artifact of the *calibrated* model, the one that ships.

``hydra_ops.compile.compile_model`` builds the artifact of ``models/hydra`` for
``compile.backend`` (``auto``: TensorRT on CUDA when importable, else the fastest CPU backend
measured on the first check batch; ``eager``: no compilation, recorded as such) and
``hydra_ops.compile.verify_compiled`` re-checks the loaded artifact against the eager model on
held-out test inputs (max abs difference of ensemble probabilities, argmax agreement).
``compile.precision`` (default ``auto``: each (backend, precision) candidate the device runs fast
is measured against the fp32 eager model on the check batches and the fastest that agrees within
``tolerance_fp32`` / ``tolerance_low_precision`` and ``min_agreement`` ships; one log line and
``precision_reason`` say why, e.g. why fp32 was kept; or ``fp32``, ``bf16``, ``fp16``); the check
uses the tolerance of the precision that ships (``check.tolerance``), and evaluate judges the
Hydra at that precision. The gate judges that check against that same tolerance (``threshold:
compile_tolerance``); with ``eager`` there is nothing to check and the gate reports the compile
checks as ``not applicable``.

Cached (``models/compiled``): the artifact and its ``compiled.json`` (backend, precision, device,
library versions, the check). Run facts that differ between two runs of the same params (build
seconds, the timings of ``auto``'s trials, the creation time) go to ``metrics/compile.json``
only, so the cached output hashes the same every time the same backend is chosen.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from tasks.common import COMPILED, HYDRA, METRICS, publish_dir, stage_main, write_json
from tasks.data import batches, split
from tasks.params import PipelineConfig
from tasks.precision import measurement_cache

log = logging.getLogger("hydra_ens")

#: Fields of ``compiled.json`` that are facts of one run, not of the artifact.
RUN_FACTS = ("compile_seconds", "created_utc")


def _split_run_facts(meta: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(artifact metadata, run facts)``: timings move out of what DVC caches."""
    meta = dict(meta)
    facts = {k: meta.pop(k) for k in RUN_FACTS if k in meta}
    selection = meta.get("auto_selection")
    if selection:
        timings = {
            b: {k: t[k] for k in ("median_ms", "build_and_time_seconds") if k in t}
            for b, t in selection["trials"].items()
            if "median_ms" in t  # a candidate that could not be built has no timing
        }
        trials = {
            b: {k: v for k, v in t.items() if k not in ("median_ms", "build_and_time_seconds")}
            for b, t in selection["trials"].items()
        }
        meta["auto_selection"] = {**selection, "trials": trials}
        facts["auto_selection_timings"] = timings
    return meta, facts


def run(cfg: PipelineConfig, root: Path) -> dict[str, Any]:
    from hydra_ops.compile import METADATA_FILE, compile_model, precision_name, verify_compiled
    from hydra_ops.serialization import load_hydra, read_hydra_config

    hydra = load_hydra(root / HYDRA)
    test = split(root, "test")
    check = batches(
        cfg, test, cfg.evaluate.batch_size, with_labels=False, limit=cfg.compile.check_examples
    )
    requested = cfg.compile.backend
    source = {
        "path": HYDRA.as_posix(),
        "weights_sha256": read_hydra_config(root / HYDRA)["weights_sha256"],
    }
    facts: dict[str, Any] = {}
    with publish_dir(root / COMPILED) as tmp:
        if requested == "eager":
            meta: dict[str, Any] = {
                "backend": "eager",
                "requested_backend": requested,
                "precision": precision_name(next(hydra.parameters()).dtype),
                "requested_precision": cfg.compile.precision,
                "device": "cpu",
                "source": source,
                "check": None,
            }
        else:
            artifact = compile_model(
                hydra,
                backend=requested,
                example_inputs=check[0],
                out_dir=tmp,
                precision=cfg.compile.precision,
                heldout_inputs=check[1:],
                tolerance={p: cfg.compile.tolerance(p) for p in ("fp32", "bf16", "fp16")},
                min_agreement=cfg.compile.min_agreement,
                measurements=measurement_cache(root),
            )
            # the shipped artifact against the fp32 eager model, at its precision's tolerance
            result = verify_compiled(
                artifact,
                hydra,
                check,
                tolerance=cfg.compile.tolerance(artifact["precision"]),
                min_agreement=cfg.compile.min_agreement,
            )
            meta, facts = _split_run_facts(dict(artifact))
            meta.update(source=source, check=result)
        (tmp / METADATA_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    check_result = meta["check"]
    metrics = {
        "backend": meta["backend"],
        "requested_backend": requested,
        "precision": meta["precision"],
        "device": meta["device"],
        "applicable": check_result is not None,
        "compile_max_abs_diff": None
        if check_result is None
        else check_result["max_abs_diff_probs"],
        "compile_argmax_agreement": (
            None if check_result is None else check_result["argmax_agreement"]
        ),
        "check_examples": None if check_result is None else check_result["num_examples"],
        "tolerance": cfg.compile.tolerance(meta["precision"]),
        "precision_reason": meta.get("precision_reason"),
        "torch": torch.__version__,
        **facts,
    }
    write_json(root / METRICS / "compile.json", metrics)
    if check_result is None:
        log.info("compile: backend eager (requested): nothing compiled, compile checks n/a")
    else:
        log.info(
            "compile: backend %s (requested %s, %s on %s), max |dp| %.2e, argmax agreement %.4f",
            meta["backend"],
            requested,
            meta["precision"],
            meta["device"],
            check_result["max_abs_diff_probs"],
            check_result["argmax_agreement"],
        )
    return meta


def main() -> None:
    stage_main("compile", run)


if __name__ == "__main__":
    main()
