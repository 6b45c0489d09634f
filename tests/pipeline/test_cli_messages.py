"""Small messages a new user meets (issue 29, Why 5): a folder that is not there, an unknown
params key with a close one, and what the Prefect UI needs on another port."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from flows.cli import app
from tasks.params import ConfigError, resolve_params, write_params


def _said(res) -> str:
    return " ".join(res.output.split())


@pytest.mark.parametrize("command", ["predict", "status", "promote", "registry", "serve-model"])
def test_a_missing_project_folder_is_named_as_such(tmp_path, command):
    missing = tmp_path / "nonexistent"
    args = [command, "-C", str(missing)] + (["some text"] if command == "predict" else [])
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert _said(res) == f"error: {missing}: not a project folder (no such folder); give -C PROJECT"


@pytest.mark.parametrize(
    ("key", "suggestion"),
    [
        ("finetune.epoch", "(did you mean 'epochs'?)"),
        ("train.epoch", "(did you mean 'finetune.epochs' or 'members.finetune.epochs'?)"),
        ("gates.0.metrik", "(did you mean 'metric'?)"),
        ("runtime.devise", "(did you mean 'device'?)"),
    ],
)
def test_an_unknown_params_key_gets_the_close_ones(key, suggestion):
    with pytest.raises(ConfigError) as err:
        resolve_params("quick", None, {key: 1})
    assert str(err.value).endswith(f"unknown key {suggestion}"), str(err.value)


def test_an_unknown_key_with_nothing_close_gets_no_guess():
    with pytest.raises(ConfigError, match=r"finetune\.zzzz: unknown key$"):
        resolve_params("quick", None, {"finetune.zzzz": 1})


def test_run_set_shows_the_guess_in_its_one_line(tmp_path):
    write_params(resolve_params("quick"), tmp_path / "params.yaml")
    res = CliRunner().invoke(app, ["run", "-C", str(tmp_path), "--set", "finetune.epoch=2"])
    assert res.exit_code == 2, res.output
    assert "finetune.epoch: unknown key (did you mean 'epochs'?)" in _said(res)


def test_serve_without_a_server_says_what_the_ui_needs_on_another_port(tmp_path, monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    write_params(resolve_params("quick"), tmp_path / "params.yaml")
    res = CliRunner().invoke(app, ["serve", "-C", str(tmp_path), "--cron", "0 3 * * *"])
    assert res.exit_code == 2, res.output
    assert "PREFECT_UI_API_URL=http://127.0.0.1:N/api" in _said(res)
