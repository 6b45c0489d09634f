"""Side-by-side rounds of a few modes, for benchmarks that time whole processes (no torch here
before a report is written).

The order of the modes alternates from round to round, so a drift of the machine (a neighbour's
load, a warming cache) falls on every mode alike; each mode is summarised by its median.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any


def alternating(modes: Sequence[str], rounds: int) -> Iterator[tuple[int, str]]:
    """``(round, mode)`` for every mode of every round: ``modes`` in order in even rounds,
    reversed in odd ones."""
    for r in range(rounds):
        for mode in modes if r % 2 == 0 else list(reversed(modes)):
            yield r, mode


def median_seconds(runs: Sequence[dict[str, Any]], modes: Sequence[str]) -> dict[str, float]:
    """``{mode: median of its runs' "seconds"}`` over ``runs`` (each with ``mode`` and
    ``seconds``)."""
    return {m: statistics.median(x["seconds"] for x in runs if x["mode"] == m) for m in modes}


def publish(result: dict[str, Any], out: Path | None) -> None:
    """Print ``result`` as JSON and, with ``out``, write it there too (atomically)."""
    text = json.dumps(result, indent=2)
    if out:
        from benchmarks.rows import write_report  # imports torch

        write_report(out, text + "\n")
    print(text)


def fail(message: str, code: int = 2) -> None:
    """End the benchmark with ``error: message`` (one line) and exit status ``code``."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(code)


def run_child(argv: Sequence[str], what: str, **kwargs: Any) -> subprocess.CompletedProcess:
    """``argv`` run to its end (``subprocess.run`` ``kwargs``: cwd, env); a failure ends the
    benchmark with exit status 1 and the child's last line of stderr."""
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False, **kwargs)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        fail(f"{what} failed: {last}", 1)
    return proc
