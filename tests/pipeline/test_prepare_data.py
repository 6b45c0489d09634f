"""The prepare_data stage: one error line, and nothing written for data without a near-OOD split."""

from __future__ import annotations

from pathlib import Path

import pytest


def _texts(n: int, word: str) -> list[str]:
    return [f"{word} item {i} {word}" for i in range(n)]


def _csv(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("text,label\n" + "".join(f'"{t}",{lab}\n' for t, lab in rows))
    return path


def test_prepare_data_stage_prints_one_error_line(tmp_path, monkeypatch, capsys):
    from tasks import prepare_data
    from tasks.params import resolve_params, write_params

    rows = [(t, "spam") for t in _texts(12, "spam")] + [(t, "ham") for t in _texts(3, "ham")]
    path = _csv(tmp_path / "one.csv", rows)  # one ID class once 'ham' is held out as near-OOD
    sets = {"data.name": "csv", "data.path": str(path), "data.near_ood_classes": ["ham"]}
    cfg = resolve_params("quick", sets=sets)
    write_params(cfg, tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HYDRA_ENS_THREADS", "1")
    with pytest.raises(SystemExit) as exit_info:
        prepare_data.main()
    assert exit_info.value.code == 1
    err_lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error")]
    assert len(err_lines) == 1
    assert err_lines[0].startswith("error: stage prepare_data: data source 'csv'")
    assert "only 1 in-distribution class ['spam']" in err_lines[0]
    assert not (tmp_path / "data").exists()


def test_prepare_data_refuses_data_without_a_near_ood_split_before_writing(tmp_path, monkeypatch):
    """A CSV whose id_classes cover every label passes the params check (its labels are unknown
    until the file is read) and is refused by prepare_data, in one line, with nothing written."""
    from tasks import prepare_data
    from tasks.params import resolve_params, write_params

    rows = [(t, "spam") for t in _texts(12, "spam")] + [(t, "ham") for t in _texts(12, "ham")]
    path = _csv(tmp_path / "two.csv", rows)
    sets = {"data.name": "csv", "data.path": str(path), "data.id_classes": ["spam", "ham"]}
    write_params(resolve_params("quick", sets=sets), tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as err:
        prepare_data.run(resolve_params("quick", sets=sets), tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and "builds no near_ood split" in msg and "ham" in msg
    assert "data.near_ood_classes" in msg
    assert not (tmp_path / "data").exists()
