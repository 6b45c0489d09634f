"""tasks.params refusals of data and model sections found by an audit: each is one line naming
its key, before any stage runs (no near-OOD set)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.params import ConfigError, resolve_params, to_raw, validate_params


def one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert len(msg.splitlines()) == 1, msg
    return msg


def write_csv(path: Path, labels: str = "abc") -> Path:
    path.write_text(
        "text,label\n" + "".join(f"text {i},{labels[i % len(labels)]}\n" for i in range(30))
    )
    return path


# ---- B1: the pipeline needs a near-OOD split ----


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_a_table_source_without_near_ood_is_refused(tmp_path, kind):
    data = write_csv(tmp_path / f"d.{kind}")  # the check reads no rows: any file will do
    with pytest.raises(ConfigError) as info:
        validate_params({"data": {"name": kind, "path": str(data)}})
    msg = one_line(info)
    assert msg.startswith(f"params.yaml: data.near_ood_classes: source '{kind}' needs a near-OOD")
    assert "data.near_ood" in msg.split("needs a near-OOD", 1)[1]


def test_a_table_source_with_a_near_ood_set_passes(tmp_path):
    data = str(write_csv(tmp_path / "d.csv"))
    cfg = validate_params({"data": {"name": "csv", "path": data, "near_ood_classes": ["c"]}})
    assert cfg.data.near_ood_classes == ["c"]
    ood = write_csv(tmp_path / "ood.csv")
    user = {"name": "csv", "path": data, "near_ood": {"kind": "csv", "path": str(ood)}}
    assert validate_params({"data": user}).data.near_ood is not None
    # held out by id_classes: unknown labels until the file is read, so it passes here
    assert validate_params({"data": {"name": "csv", "path": data, "id_classes": ["a", "b"]}})
    held = {"name": "csv", "path": data, "classes": ["a", "b", "c"], "id_classes": ["a", "b"]}
    assert validate_params({"data": held})


def test_numeric_class_names_are_read_as_strings(tmp_path):
    data = str(write_csv(tmp_path / "d.csv", labels="012"))
    # what `--set 'data.near_ood_classes=[2]'` parses to: YAML integers
    cfg = resolve_params(
        "quick", sets={"data.name": "csv", "data.path": data, "data.near_ood_classes": [2]}
    )
    assert cfg.data.near_ood_classes == ["2"] and to_raw(cfg)["data"]["near_ood_classes"] == ["2"]
    digits = validate_params({"data": {"name": "digits", "id_classes": [0, 1, 2]}})
    assert digits.data.id_classes == ["0", "1", "2"]


def test_folder_sources_and_explicit_empty_lists(tmp_path):
    root = tmp_path / "corpus"
    for cls in ("x", "y", "z"):
        (root / cls).mkdir(parents=True)
        (root / cls / "0.txt").write_text(f"a {cls} text")
    folder = {"name": "folder", "path": str(root)}
    with pytest.raises(
        ConfigError, match=r"^params\.yaml: data\.near_ood_classes: source 'folder'"
    ):
        validate_params({"data": folder})
    assert validate_params({"data": folder | {"id_classes": ["x", "y"]}})
    with pytest.raises(ConfigError) as info:
        validate_params({"data": folder | {"id_classes": ["x", "y", "z"]}})
    assert one_line(info).startswith("params.yaml: data.id_classes: ['x', 'y', 'z'] cover every")
    with pytest.raises(ConfigError) as info:
        validate_params({"data": {"name": "bbc-news", "near_ood_classes": []}})
    assert one_line(info).startswith("params.yaml: data.near_ood_classes: is empty")


def test_built_in_sources_keep_their_near_ood_classes():
    for name in ("bbc-news", "mnist5k", "digits"):
        assert validate_params({"data": {"name": name}}).data.near_ood is None
    with pytest.raises(ConfigError, match=r"data\.id_classes: .* cover every class"):
        validate_params({"data": {"name": "digits", "id_classes": [str(i) for i in range(10)]}})


def test_a_missing_data_path_is_the_only_data_error(tmp_path):
    with pytest.raises(ConfigError) as info:
        validate_params({"data": {"name": "csv", "path": str(tmp_path / "nope.csv")}})
    assert one_line(info).startswith("params.yaml: data.path: ")
