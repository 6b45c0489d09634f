"""Cached outputs hash the same for the same inputs, and a killed run leaves nothing behind.

Fast checks: what goes into a cached checkpoint (no wall-clock timings, no absolute paths), the
stage-start cleanup of what interrupted atomic writes leave, and that git and DVC ignore those
leftovers but not real outputs. The end-to-end check (two projects, one killed and resumed, the
same ``dvc.lock`` hashes) is ``test_pipeline_image.py::test_same_params_same_cached_hashes``.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess

import pytest
import torch
from conftest import REPO
from leftover_files import LEFTOVERS, REAL
from leftover_files import paths as _paths
from leftover_files import touch as _touch
from tiny_models import tiny_model

from flows import dvcops
from hydra_ops.atomic import leftovers
from hydra_ops.models.checkpoints import TIMING_FIELDS, load_model, save_model, split_timings
from hydra_ops.models.training import TrainReport


@pytest.mark.parametrize(
    ("umask", "file_mode", "dir_mode"), [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)]
)
def test_published_outputs_get_the_umask_modes_not_tempfiles_private_ones(
    tmp_path, umask, file_mode, dir_mode
):
    """A bundle others serve must be readable by them: what the atomic helpers publish (a file, a
    folder, a folder nested in it by another atomic write, safetensors files, a head-scores file)
    has the modes a plain open()/mkdir() gives under the umask, where tempfile and safetensors'
    save_file alone give 0o600 / 0o700; an executable file keeps its execute bits."""
    from safetensors.torch import save_file

    from hydra_ops.atomic import atomic_write_bytes, atomic_write_dir, current_umask
    from hydra_ops.scoring import HeadScores

    old = os.umask(umask)
    try:
        assert current_umask() == umask
        atomic_write_bytes(tmp_path / "metrics.json", b"{}", keep_suffix=False)
        with atomic_write_dir(tmp_path / "bundle") as tmp:
            with atomic_write_dir(tmp / "model") as inner:
                (inner / "weights.bin").write_bytes(b"0")
                save_file({"w": torch.ones(2)}, str(inner / "model.safetensors"))  # 0o600
            atomic_write_bytes(tmp / "card.md", b"# card")
            (tmp / "run.sh").write_text("#!/bin/sh\n")
            (tmp / "run.sh").chmod(0o700)
        HeadScores(torch.ones(2, 3), "magnitude").save(tmp_path / "scores.safetensors")
    finally:
        os.umask(old)
    mode = lambda p: p.stat().st_mode & 0o777  # noqa: E731
    files = ["metrics.json", "bundle/card.md", "bundle/model/weights.bin", "scores.safetensors"]
    for file in [*files, "bundle/model/model.safetensors"]:
        assert mode(tmp_path / file) == file_mode, file
    for path in ("bundle", "bundle/model", "bundle/run.sh"):
        assert mode(tmp_path / path) == dir_mode, path


def test_leftover_names_are_matched_literally(tmp_path):
    odd = tmp_path / "a[1]*"
    odd.mkdir()
    _touch(tmp_path, ".a[1]*.old-0a1b2c3d/")
    _touch(tmp_path, ".a1x.old-0a1b2c3d/")  # would match if [1]* were a glob
    assert [p.name for p in leftovers(odd)] == [".a[1]*.old-0a1b2c3d"]


def test_git_ignores_leftovers_not_outputs(tmp_path):
    # the project's own .gitignore alone, in a fresh repo: a checkout where the default run has run
    # also holds DVC's per-output .gitignore files, which rightly ignore the outputs it tracks
    (tmp_path / ".gitignore").write_text((REPO / ".gitignore").read_text())
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)

    def ignored(rel: str) -> bool:
        rc = subprocess.run(
            ["git", "check-ignore", "--no-index", "-q", rel], cwd=tmp_path, check=False
        ).returncode
        assert rc in (0, 1), rel
        return rc == 0

    assert [rel for rel in _paths(LEFTOVERS) if not ignored(rel)] == []
    assert [rel for rel in REAL if ignored(rel)] == []


def test_dvc_ignores_leftovers_not_outputs(tmp_path):
    (tmp_path / ".dvcignore").write_text((REPO / ".dvcignore").read_text())
    dvcops.dvc(tmp_path, "init", "--no-scm", "-q")
    leftover = _paths(LEFTOVERS)
    res = dvcops.dvc(
        tmp_path, "check-ignore", "--details", "--non-matching", *leftover, *REAL, check=False
    )
    # one line per path: "<source>:<line>:<pattern>\t<path>", or "::\t<path>" when not ignored
    matched = dict(line.split("\t")[::-1] for line in res.stdout.strip().splitlines())
    assert set(matched) == {*leftover, *REAL}, res.stdout + res.stderr
    assert [rel for rel in leftover if matched[rel] == "::"] == []
    assert {rel: matched[rel] for rel in REAL if matched[rel] != "::"} == {}


def test_train_report_timings_are_split_off():
    report = TrainReport(epochs=2, steps=4, epoch_losses=[0.9, 0.5], epoch_seconds=[1.5, 1.25])
    report.total_seconds = 2.75
    record, timings = split_timings(report.to_dict())
    assert timings == {"epoch_seconds": [1.5, 1.25], "total_seconds": 2.75}
    assert record["epoch_losses"] == [0.9, 0.5] and record["steps"] == 4
    # every wall-clock field of TrainReport is one of TIMING_FIELDS
    clock = {f.name for f in dataclasses.fields(TrainReport) if "second" in f.name}
    assert clock == set(TIMING_FIELDS) == set(report.to_dict()) - set(record)


def test_checkpoint_bytes_do_not_depend_on_where_the_weights_came_from(tmp_path):
    model = tiny_model("bert")
    meta = {"seed": 0, "train": {"epoch_losses": [0.5]}}
    model.config._name_or_path = "/home/someone/checkout-a/site-packages/minilm"
    save_model(model, tmp_path / "a", meta)
    model.config._name_or_path = "/srv/ci/checkout-b/site-packages/minilm"
    save_model(model, tmp_path / "b", meta)
    for name in ("checkpoint.json", "model.safetensors"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert "checkout-" not in (tmp_path / "a" / "checkpoint.json").read_text()
    assert model.config._name_or_path == "/srv/ci/checkout-b/site-packages/minilm"  # restored
    assert load_model(tmp_path / "a").config.num_labels == model.config.num_labels


def test_a_timing_in_checkpoint_metadata_is_refused(tmp_path):
    model = tiny_model("timm_vit")
    meta = {"train": {"epoch_losses": [0.5], "epoch_seconds": [3.0]}}
    with pytest.raises(ValueError, match=r"metadata: train\.epoch_seconds is a wall-clock"):
        save_model(model, tmp_path / "ckpt", meta)
    assert not (tmp_path / "ckpt").exists()
