"""flows.cli: what a command refuses is one error line and an exit status, whatever the path holds;
a failing stage ends ``hydra-ens run`` with its own line and where the full log is (the real CLI
on a project whose one-class CSV fails ``prepare_data`` within seconds); the small messages a new
user meets (a folder that is not there, an unknown params key with a close one, what the Prefect
UI needs on another port)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, make_project
from typer.testing import CliRunner

from flows.cli import app
from tasks.params import ConfigError, resolve_params, write_params


def test_cli_refuses_force_without_reason_and_bad_cron(tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["promote", "-C", str(tmp_path), "--force"])
    assert res.exit_code == 2 and "--reason" in res.output
    res = runner.invoke(
        app,
        ["serve", "-C", str(tmp_path), "--cron", "every day"],
        env={"PREFECT_API_URL": "http://127.0.0.1:1/api"},
    )
    assert res.exit_code == 2 and "cron" in res.output


def test_run_outside_a_project_writes_nothing(tmp_path):
    """No dvc.yaml here: exit 2 with one line, and no params.yaml left behind."""
    res = CliRunner().invoke(app, ["run", "-C", str(tmp_path), "--profile", "quick"])
    assert res.exit_code == 2, res.output
    assert (
        _said(res) == f"error: {tmp_path}: no dvc.yaml here; run hydra-ens from the project folder"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("folder", ["proj [v2]", "a[/b]"])
def test_an_error_shows_a_path_with_brackets_as_it_is(tmp_path, folder):
    """The error line is plain text, not console markup: ``[v2]`` was dropped from the path
    shown, and ``[/b]`` ended the command with a MarkupError traceback."""
    root = tmp_path / folder
    root.mkdir(parents=True)
    res = CliRunner().invoke(app, ["run", "-C", str(root), "--profile", "quick"])
    assert res.exit_code == 2, res.output
    assert _said(res) == f"error: {root}: no dvc.yaml here; run hydra-ens from the project folder"


def _said(res) -> str:
    """The CLI's output, each run of whitespace one space (a wrapped line reads whole)."""
    return " ".join(res.output.split())


LOG_NAME = re.compile(r"\(full log: (\S*\.hydra-ens/logs/run-\d{8}T\d{6}Z(?:-\d+)?\.log)\)$")


def cli(*args: str) -> subprocess.CompletedProcess:
    """``hydra-ens ARGS`` as a real process against the session's Prefect server."""
    from prefect.settings import PREFECT_API_URL

    env = dict(os.environ, HYDRA_ENS_THREADS="1")
    if PREFECT_API_URL.value():
        env["PREFECT_API_URL"] = PREFECT_API_URL.value()
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_bad_data_ends_the_run_with_one_error_line_and_a_full_log(prefect_server, tmp_path):
    data = tmp_path / "one_class.csv"
    rows = [f"message number {i},{'ham' if i >= 12 else 'spam'}\n" for i in range(15)]
    data.write_text("text,label\n" + "".join(rows))  # one ID class once 'ham' is near-OOD
    root = make_project(tmp_path / "proj")
    sets = ["--set", "data.name=csv", "--set", f"data.path={data}"]
    r = cli("run", "-C", str(root), *sets, "--set", "data.near_ood_classes=[ham]")
    output = r.stdout + r.stderr
    assert r.returncode == 1, output[-4000:]
    assert "Traceback" not in output
    assert "| ERROR" not in output  # Prefect's failure reports stay in the file
    mentions = [ln for ln in output.splitlines() if "in-distribution class" in ln]
    errors = [ln for ln in r.stderr.splitlines() if ln.lower().startswith("error")]
    assert len(mentions) == 1 and errors == mentions, output[-4000:]
    line = errors[0]
    assert line.startswith("error: stage prepare_data: data source 'csv'")
    assert "only 1 in-distribution class ['spam']" in line and str(data) in line
    match = LOG_NAME.search(line)
    assert match, line
    log_file = Path(match.group(1))
    log_file = log_file if log_file.is_absolute() else REPO / log_file
    assert log_file.parent == root / ".hydra-ens" / "logs" and log_file.is_file()
    text = log_file.read_text()
    assert "Traceback (most recent call last)" in text  # Prefect's, kept in full
    assert "StageError" in text
    assert "Task run 'prepare_data' - [prepare_data] error: stage prepare_data" in text
    assert "hydra_ens.cli - " + line[: match.start()].rstrip() in text  # the CLI's last word


@pytest.mark.parametrize(
    "command", ["predict", "status", "promote", "registry", "serve-model", "hardware"]
)
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
        (
            "train.epoch",
            "(did you mean 'finetune.epochs' or 'members.finetune.epochs' or "
            "'baselines.lora_ensemble.epochs'?)",
        ),
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
