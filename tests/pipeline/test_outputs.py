"""tasks.runtime.outputs: a published folder replaces its target in one rename and leaves nothing
behind."""

from __future__ import annotations

from leftover_files import touch as _touch

from hydra_ops.atomic import leftovers, replace_dir
from tasks.runtime.outputs import publish_dir


def test_publish_dir_and_replace_dir_leave_no_leftovers(tmp_path):
    target = tmp_path / "out"
    stale = [_touch(tmp_path, ".out.old-0a1b2c3d/"), _touch(tmp_path, ".out.tmp-zzzzzzzz/")]
    with publish_dir(target) as tmp:
        (tmp / "a").write_text("1")
    with publish_dir(target) as tmp:  # replaces an existing target: the old one renamed aside
        (tmp / "a").write_text("2")
    assert not any(p.exists() for p in stale)
    assert leftovers(target) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (target / "a").read_text() == "2"
    fresh = tmp_path / ".new.tmp-abcdefgh"
    fresh.mkdir()
    replace_dir(fresh, target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
