"""What :mod:`benchmarks.run` and :mod:`benchmarks.gpu_check` share: a *row* is one measured
model (a dict of facts plus its callable ``fn() -> Tensor`` until it is timed), built under a
guard, warmed up, timed round-robin with the others, and compared as a ratio.

No typer, pydantic or pipeline imports: :mod:`benchmarks.gpu_check` runs on a bare GPU image.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks import measure

#: The compile backends timed by default, in table order (TensorRT only on CUDA).
COMPILE_BACKENDS = ("tensorrt", "inductor", "export", "onnxruntime")


def error_text(error: BaseException) -> str:
    """The one-line ``error`` of a row that failed: its type and the start of its message."""
    return f"{type(error).__name__}: {str(error)[:300]}"


def build_row(row: dict[str, Any], make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """``row`` updated with what ``make()`` returns (its ``fn``, say), or with the ``error`` it
    raised: a row that cannot be built is reported, not timed."""
    try:
        row.update(make())
    except Exception as error:
        row["error"] = error_text(error)
    return row


def time_rows(
    rows: list[dict[str, Any]],
    device: torch.device,
    min_rounds: int,
    max_rounds: int,
    budget_s: float = 0.0,
    warmup_calls: int = 1,
    prepare: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Warm up every row with an ``fn`` (``warmup_s``), run ``prepare(row)`` on it (untimed
    facts: memory, FLOPs), then time all of them round-robin (:func:`measure.time_round_robin`,
    between ``min_rounds`` and ``max_rounds`` rounds, within ``budget_s``) and add each timing's
    summary. A row whose warm-up or ``prepare`` raises gets its ``error`` and is not timed.
    Every ``fn`` is removed."""
    with torch.no_grad():
        for row in rows:
            if "fn" not in row:
                continue
            try:
                row["warmup_s"] = measure.warm_up(row["fn"], device, calls=warmup_calls)
                if prepare is not None:
                    prepare(row)
            except Exception as error:
                row.pop("fn")
                row["error"] = error_text(error)
        live = [r for r in rows if "fn" in r]
        timings = measure.time_round_robin(
            [r["fn"] for r in live], device, budget_s, min_rounds, max_rounds
        )
    for row, timing in zip(live, timings, strict=True):
        row.update(timing.summary())
        del row["fn"]


def ratio(value: float | None, reference: float | None) -> float | None:
    """``value / reference``; None when either is unknown or the reference is 0."""
    return value / reference if value is not None and reference else None


def default_backends(
    device: torch.device, candidates: tuple[str, ...] = COMPILE_BACKENDS
) -> list[str]:
    """The ``candidates`` that ``hydra_ops.compile`` can use here (``available_backends``), in
    their order; TensorRT only on CUDA."""
    from hydra_ops.compile import available_backends

    usable = [b for b, why in available_backends().items() if why is None]
    return [b for b in candidates if b in usable and (b != "tensorrt" or device.type == "cuda")]


def write_report(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (:mod:`hydra_ops.atomic`; folders created): an
    interrupted benchmark leaves the last whole report, never half of one."""
    from hydra_ops.atomic import atomic_write_bytes

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, text.encode(), keep_suffix=False)
