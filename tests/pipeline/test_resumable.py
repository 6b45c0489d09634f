"""tasks.runtime.resumable: units skipped when verified, rebuilt when tampered, never
half-written."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.runtime.resumable import ensure_unit, finalise, unit_is_done


def test_resumable_unit_skips_verified_and_rebuilds_tampered(tmp_path):
    calls = []

    def build(d: Path):
        calls.append(1)
        (d / "w.bin").write_bytes(b"weights")
        return {"n": len(calls)}

    unit = tmp_path / "out" / "member_0"
    ensure_unit(unit, "fp1", build, "m0")
    ensure_unit(unit, "fp1", build, "m0")
    assert len(calls) == 1 and unit_is_done(unit, "fp1")
    assert not unit_is_done(unit, "fp2")  # other inputs: recompute
    (unit / "w.bin").write_bytes(b"weightz")  # tampered: recompute
    assert not unit_is_done(unit, "fp1")
    ensure_unit(unit, "fp1", build, "m0")
    assert len(calls) == 2 and (unit / "w.bin").read_bytes() == b"weights"
    (tmp_path / "out" / "member_9").mkdir()
    finalise(tmp_path / "out", {"member_0": {"sha256": "x"}}, {})
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["index.json", "member_0"]


def test_a_failing_build_leaves_no_unit(tmp_path):
    def build(d: Path):
        (d / "partial").write_text("x")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        ensure_unit(tmp_path / "u", "fp", build, "u")
    assert not (tmp_path / "u").exists()
