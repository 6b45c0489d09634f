"""``hydra_smoke``: a tiny health-check flow (params valid, DVC status readable), for testing a
served deployment end to end without running the full pipeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from flows import dvcops
from tasks.params.schema import load_params


@flow(name="hydra-smoke")
def hydra_smoke(project_dir: str = ".") -> dict[str, Any]:
    logger = get_run_logger()
    root = Path(project_dir).resolve()
    cfg = load_params(root / "params.yaml")
    stale = sorted(dvcops.stale_stages(root)) if (root / ".dvc").is_dir() else []
    logger.info("params ok (profile %s); stale stages: %s", cfg.profile, stale or "none")
    return {"profile": cfg.profile, "stale": stale}
