"""The few numbers per model that decide, from the evaluation: what DVC shows as metrics (so that
``dvc metrics show`` and ``dvc exp show`` fit a screen) and what the cost-vs-quality figure draws.
The wide tables (every metric, raw and calibrated, OOD by score, bootstrap intervals, verdicts)
stay in ``metrics/evaluate.json``, an output DVC versions but does not show as metrics.

Written twice: ``metrics/key/<model>.json``, every model's (``dvc metrics show metrics/key``: one
row per model), and ``metrics/hydra.json``, the shipped model's, the one file ``dvc.yaml``
declares as metrics. ``dvc exp show`` makes a column of every key of every metrics file, headed
``<file>:<key>`` when files share key names: with one file a study's points show seven short
columns (``near_auroc``, ...) instead of 42 headed ``metrics/key/<model>.json:<key>``.

Per model, calibrated: ``accuracy``, ``nll`` and ``ece`` on ID test, ``near_auroc`` and
``far_auroc`` (the OOD score of ``evaluate.ood_score``), ``shift_nll``, and ``latency_x``, the
model's latency over the single model's (both timed by evaluate on the same batch and machine;
absent when either was not timed). Rounded to :data:`DIGITS` decimals: more is noise at these
split sizes, and every column stays narrow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.runtime.outputs import publish_dir, write_json

#: ``key: (metric group in evaluate.json, metric)`` of every key number but the latency ratio.
KEYS: dict[str, tuple[str, str]] = {
    "accuracy": ("id_test", "accuracy"),
    "nll": ("id_test", "nll"),
    "ece": ("id_test", "ece"),
    "near_auroc": ("near_ood", "auroc"),
    "far_auroc": ("far_ood", "auroc"),
    "shift_nll": ("shift", "nll"),
}
LATENCY_KEY = "latency_x"
#: The folder under ``metrics/`` that evaluate writes them to, one ``<model>.json`` per model (one
#: row per model in ``dvc metrics show``, the keys as its columns).
KEY_METRICS_DIR = "key"
#: Decimals kept.
DIGITS = 4
#: The model latency ratios are relative to.
REFERENCE = "single"
#: The model that ships, whose key numbers are the DVC metrics file :data:`DVC_METRICS`.
SHIPPED = "hydra"
#: The DVC metrics file under ``metrics/``.
DVC_METRICS = f"{SHIPPED}.json"


def key_metrics(
    models: dict[str, dict[str, Any]], latency_ms: dict[str, float]
) -> dict[str, dict[str, float]]:
    """``{model: {key: value}}`` from evaluate's ``models`` entries (``calibrated`` metrics) and
    ``{model: median ms}``; ``latency_x`` = ms / the reference model's ms."""
    ref = latency_ms.get(REFERENCE)
    result: dict[str, dict[str, float]] = {}
    for name, entry in models.items():
        values = {
            key: round(float(entry["calibrated"][split][metric]), DIGITS)
            for key, (split, metric) in KEYS.items()
        }
        if ref and latency_ms.get(name) is not None:
            values[LATENCY_KEY] = round(latency_ms[name] / ref, 3)
        result[name] = values
    return result


def write_key_metrics(metrics: Path, keys: dict[str, dict[str, float]]) -> None:
    """``metrics/key/<model>.json`` per model of ``keys`` (:func:`key_metrics`), published
    atomically (the folder holds exactly this evaluation's models), and the :data:`SHIPPED`
    model's as ``metrics/hydra.json`` (KeyError when ``keys`` has none)."""
    with publish_dir(metrics / KEY_METRICS_DIR) as tmp:
        for name, values in keys.items():
            write_json(tmp / f"{name}.json", values)
    write_json(metrics / DVC_METRICS, keys[SHIPPED])
