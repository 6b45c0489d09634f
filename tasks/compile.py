"""Stage ``compile``: the compiled artifact of the merged model, re-checked against eager.

``hydra_ops.compile.compile_model`` builds the artifact for ``compile.backend`` (``auto``:
TensorRT on CUDA when importable, else the fastest CPU backend measured on the first check batch;
``eager``: no compilation, recorded as such) and ``load_compiled`` loads it back. The loaded
artifact is compared with the eager model on held-out test inputs (max abs difference of ensemble
probabilities, argmax agreement); the result goes to ``metrics/compile.json``, which the gate
checks, and the artifact's metadata records backend, versions and device.
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from hydra_ops.config import PipelineConfig
from tasks import models_io
from tasks.common import COMPILED, MERGED, METRICS, publish_dir, stage_main, write_json

log = logging.getLogger("hydra_ens")


def _eager_fn(hydra) -> Callable[[dict], torch.Tensor]:
    return lambda b: models_io.hydra_logits(hydra, [b])


def run(cfg: PipelineConfig, root: Path) -> dict[str, Any]:
    from hydra_ops.serialization import load_hydra

    hydra = load_hydra(root / MERGED)
    test = models_io.split(root, "test")
    check = models_io.batches(
        cfg, test, cfg.evaluate.batch_size, with_labels=False, limit=cfg.compile.check_examples
    )
    requested = cfg.compile.backend
    with publish_dir(root / COMPILED) as tmp:
        meta: dict[str, Any]
        if requested == "eager":
            meta = {"backend": "eager", "requested": requested, "reason": "requested"}
            fn = _eager_fn(hydra)
        else:
            from hydra_ops import compile as hcompile

            meta = dict(
                hcompile.compile_model(
                    hydra, backend=requested, example_inputs=check[0], out_dir=tmp
                )
            )
            fn = hcompile.load_compiled(tmp)
        meta.update(torch=torch.__version__, machine=platform.machine(), source=str(MERGED))
        meta.setdefault("device", "cpu")
        with torch.no_grad():
            eager = torch.cat([models_io.hydra_logits(hydra, [b]) for b in check]).softmax(-1)
            compiled = torch.cat([fn(b).float() for b in check]).softmax(-1)
        p_e, p_c = eager.mean(1), compiled.mean(1)
        check_result = {
            "compile_max_abs_diff": float((p_e - p_c).abs().max()),
            "compile_argmax_agreement": float((p_e.argmax(-1) == p_c.argmax(-1)).float().mean()),
            "check_examples": int(p_e.shape[0]),
            "tolerance": cfg.compile.tolerance,
        }
        check_result["within_tolerance"] = (
            check_result["compile_max_abs_diff"] <= cfg.compile.tolerance
        )
        meta["check"] = check_result
        write_json(tmp / "compile.json", meta)
    write_json(root / METRICS / "compile.json", {"backend": meta["backend"], **check_result})
    if "auto_selection" in meta:
        sel = meta["auto_selection"]
        log.info(
            "compile: auto measured (batch %d, median of %d): %s",
            sel["batch"],
            sel["repeats"],
            ", ".join(f"{b} {t['median_ms']:.0f} ms" for b, t in sel["trials"].items()),
        )
    log.info(
        "compile: backend %s (requested %s), max |dp| %.2e, argmax agreement %.4f",
        meta["backend"],
        requested,
        check_result["compile_max_abs_diff"],
        check_result["compile_argmax_agreement"],
    )
    return meta


def main() -> None:
    stage_main("compile", run)


if __name__ == "__main__":
    main()
