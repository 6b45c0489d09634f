"""The DAG's artifact layout: where each stage writes (``dvc.yaml`` declares the same paths) and
the stages in ``dvc.yaml``'s order (a test checks the two agree)."""

from __future__ import annotations

from pathlib import Path

DATA = Path("data/prepared")
BASE = Path("models/base")
BASELINES = Path("models/baselines")
SCORES = Path("artifacts/scores")
PLANS = Path("artifacts/plans")
MEMBERS = Path("models/members")
MERGED = Path("models/merged")
COMPILED = Path("models/compiled")
HYDRA = Path("models/hydra")
BUNDLE = Path("models/bundle")
METRICS = Path("metrics")
REPORTS = Path("reports")
PLOTS = Path("plots")
REGISTRY = Path("registry")

#: Stage order; dvc.yaml declares the same stages (a test checks the two agree).
STAGES = (
    "prepare_data",
    "finetune_base",
    "finetune_baselines",
    "baseline_logits",
    "score_heads",
    "select_members",
    "finetune_members",
    "merge",
    "calibrate",
    "compile",
    "evaluate",
    "run_report",
    "gate",
    "bundle",
    "promote",
)
