"""flows.dvcops: which failed ``dvc repro`` runs are retried (DVC lock errors and kills only, not
Ctrl-C), which output lines are progress bars, how an interrupted run stops its processes."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flows import dvcops

#: DVC 3's messages, as its CLI prints them (dvc/lock.py, dvc/rwlock.py, dvc/stage/exceptions.py).
REPO_LOCK = (
    "ERROR: Unable to acquire lock. Most likely another DVC process is running or was terminated "
    "abruptly. Check the page <https://dvc.org/doc/user-guide/troubleshooting#lock-issue> for "
    "other possible reasons and to learn how to resolve this."
)
RW_LOCK = "ERROR: failed to reproduce 'merge': 'models/hydra' is busy, it is being blocked by:"
STAGE_FAILED = (
    "ERROR: failed to reproduce 'merge': failed to run: python -m tasks.merge, exited with 1"
)


@pytest.mark.parametrize(
    ("returncode", "lines"),
    [
        (255, [REPO_LOCK]),
        (255, ["Running stage 'merge':", RW_LOCK, "  (PID 4242): dvc repro merge", ""]),
        (255, ["\x1b[31mERROR\x1b[39m: " + REPO_LOCK.removeprefix("ERROR: ")]),  # coloured
        (-9, ["Running stage 'merge':"]),  # the dvc process killed
        (137, []),
        (143, ["anything"]),
        (255, ["ERROR: failed to reproduce 'merge': failed to run: python x.py, exited with -9"]),
        (255, ["ERROR: failed to reproduce 'merge': failed to run: python x.py, exited with 137"]),
    ],
)
def test_lock_errors_and_kills_are_transient(returncode, lines) -> None:
    assert dvcops.is_transient_failure(returncode, lines)


@pytest.mark.parametrize(
    "lines",
    [
        # the stage's own log mentions "is busy" / "lock", then fails for a real reason
        ["Running stage 'merge':", "GPU 0 is busy, falling back to CPU", STAGE_FAILED],
        ["database lock held by the stage itself", STAGE_FAILED],
        # even a stage printing DVC's exact lock text is not DVC's error: DVC's comes last
        ["Running stage 'merge':", REPO_LOCK, RW_LOCK, STAGE_FAILED],
        ["ERROR: failed to reproduce 'merge': the lock on artifacts/x.json is busy"],
        ["Killed", "Resource temporarily unavailable", "is busy"],  # no DVC error line at all
        [],
    ],
)
def test_other_failures_are_not_transient(lines) -> None:
    assert not dvcops.is_transient_failure(255, lines)
    assert not dvcops.is_transient_failure(1, lines)


def test_dvc_error_line_is_the_last_error() -> None:
    assert dvcops.dvc_error_line([REPO_LOCK, "stage output", STAGE_FAILED, "bye"]) == STAGE_FAILED
    assert dvcops.dvc_error_line(["no error here"]) is None


def _fake_dvc(tmp_path: Path, monkeypatch, output: str, rc: int) -> None:
    fake = tmp_path / "dvc"
    body = "".join(f"echo {line!r}\n" for line in output.splitlines())
    fake.write_text(f"#!/bin/sh\n{body}exit {rc}\n")
    fake.chmod(0o755)
    monkeypatch.setattr(dvcops, "bin_path", lambda name: str(fake))


def test_repro_stage_raises_the_right_error(tmp_path, monkeypatch) -> None:
    busy = "Running stage 'merge':\nthe tokenizer cache is busy\n" + STAGE_FAILED
    _fake_dvc(tmp_path, monkeypatch, busy, 255)
    with pytest.raises(dvcops.StageError, match="exited with 1"):
        dvcops.repro_stage(tmp_path, "merge", log=lambda _: None)
    _fake_dvc(tmp_path, monkeypatch, "Running stage 'merge':\n" + RW_LOCK, 255)
    with pytest.raises(dvcops.TransientStageError, match="is busy"):
        dvcops.repro_stage(tmp_path, "merge", log=lambda _: None)


@pytest.fixture
def dvc_project(tmp_path: Path) -> Path:
    dvc = Path(sys.executable).parent / "dvc"
    if not dvc.exists():
        pytest.skip("dvc is not installed next to this Python")
    env = dvcops.subprocess_env()
    subprocess.run([str(dvc), "init", "--no-scm", "-q"], cwd=tmp_path, check=True, env=env)
    (tmp_path / "stage.py").write_text(
        "print('worker pool is busy; could not take the lock')\n"
        "print('ERROR: Unable to acquire lock. Most likely another DVC process is running')\n"
        "raise SystemExit(3)\n"
    )
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n"
        "  ok:\n    cmd: echo hi > out.txt\n    outs: [out.txt]\n"
        f"  bad:\n    cmd: {sys.executable} stage.py\n"
    )
    return tmp_path


def test_real_dvc_lock_is_transient_and_a_real_failure_is_not(dvc_project: Path) -> None:
    import zc.lockfile

    with pytest.raises(dvcops.StageError, match="exited with 3"):
        dvcops.repro_stage(dvc_project, "bad", log=lambda _: None)
    # another DVC process holding the repo lock: DVC gives up after ~3 s with its lock error
    lock = zc.lockfile.LockFile(str(dvc_project / ".dvc" / "tmp" / "lock"))
    try:
        with pytest.raises(dvcops.TransientStageError, match="Unable to acquire lock"):
            dvcops.repro_stage(dvc_project, "ok", log=lambda _: None)
    finally:
        lock.close()
    assert dvcops.repro_stage(dvc_project, "ok", log=lambda _: None).ran


def test_stale_stages_are_the_root_pipelines_only(dvc_project: Path) -> None:
    """A second ``dvc.yaml`` below the root (a test stub, a vendored example) whose stages share
    the pipeline's names is reported by ``dvc status`` as ``dir/dvc.yaml:name``: not ours."""
    nested = dvc_project / "examples" / "stub"
    nested.mkdir(parents=True)
    (nested / "dvc.yaml").write_text(
        "stages:\n  ok:\n    cmd: echo nested > n.txt\n    outs: [n.txt]\n"
    )
    assert dvcops.stale_stages(dvc_project) == {"ok", "bad"}
    assert dvcops.repro_stage(dvc_project, "ok", log=lambda _: None).ran
    # the nested `ok` never ran and is stale; the root's `ok` is up to date
    assert dvcops.stale_stages(dvc_project) == {"bad"}


#: What tqdm prints on a pipe (one ``\r`` segment each): known total, unknown total, slow rate
#: with a postfix, scaled units.
TQDM_LINES = (
    " 45%|####5     | 45/100 [00:01<00:02, 22.50it/s]",
    "1it [00:00, 199728.76it/s]",
    " 33%|###3      | 1/3 [00:01<00:02,  1.21s/it, loss=0.3]",
    "  0%|          | 0/3 [00:00<?, ?it/s]",
    "  0%|          | 1.00/2.00k [00:00<00:00, 155kB/s]",
    "train epoch 1: 100%|##########| 10/10 [1:02:03<00:00, 2.25batch/s]",
)


@pytest.mark.parametrize("line", TQDM_LINES)
def test_progress_lines_are_tqdm_bars(line) -> None:
    assert dvcops.is_progress_line(line)


@pytest.mark.parametrize(
    "line",
    [
        # a project under /tmp/audit/s2/ contains "it/s": the stage's own lines must stay
        "error: stage prepare_data: data source 'csv': /tmp/audit/s2/data.csv has 1 class",
        "2026-01-01 12:00:00 hydra_ens: reading /tmp/audit/s2/proj/data/prepared",
        "ERROR: failed to reproduce 'prepare_data': failed to run: python -m tasks.prepare_data, "
        "exited with 1",
        "error: 12/100 [00:01<00:02, 2.5it/s] looks like a bar but is an error line",
        "throughput 1200 it/s (s/it 0.001)",
    ],
)
def test_other_lines_are_not_progress(line) -> None:
    assert not dvcops.is_progress_line(line)


def test_repro_stage_relays_error_lines_that_contain_it_s(tmp_path, monkeypatch) -> None:
    """The stage's own ``error:`` line ends up in the StageError (the CLI's one line) even when
    its path contains "it/s"; a tqdm bar does not."""
    out = (
        "Running stage 'prepare_data':\n"
        " 45%|####5     | 45/100 [00:01<00:02, 22.50it/s]\n"
        "error: stage prepare_data: /tmp/audit/s2/data.csv: only 1 class\n"
        "ERROR: failed to reproduce 'prepare_data': failed to run: python x.py, exited with 1"
    )
    _fake_dvc(tmp_path, monkeypatch, out, 255)
    seen: list[str] = []
    with pytest.raises(dvcops.StageError, match=re.escape("/tmp/audit/s2/data.csv: only 1 class")):
        dvcops.repro_stage(tmp_path, "prepare_data", log=seen.append)
    assert not any("22.50it/s" in line for line in seen)
    assert "[prepare_data] error: stage prepare_data: /tmp/audit/s2/data.csv: only 1 class" in seen


@pytest.mark.parametrize(
    ("returncode", "lines"),
    [
        (-2, ["Running stage 'merge':"]),  # dvc itself stopped by Ctrl-C
        (130, []),  # through a shell
        (255, ["ERROR: failed to reproduce 'merge': failed to run: python x.py, exited with -2"]),
        (255, ["ERROR: failed to reproduce 'merge': failed to run: python x.py, exited with 130"]),
    ],
)
def test_ctrl_c_is_not_transient(returncode, lines) -> None:
    assert not dvcops.is_transient_failure(returncode, lines)
    assert not dvcops.is_transient_exit(-2) and not dvcops.is_transient_exit(130)


def test_nothing_is_transient_once_the_run_is_interrupted(monkeypatch) -> None:
    """SIGKILL (the OOM killer, the kill-and-resume test) and SIGTERM stay transient, until the
    user interrupts the run (the CLI sets INTERRUPTED): then nothing is retried or started."""
    monkeypatch.setattr(dvcops, "INTERRUPTED", threading.Event())
    killed = ["ERROR: failed to reproduce 'merge': failed to run: python x.py, exited with -9"]
    assert dvcops.is_transient_exit(-9) and dvcops.is_transient_exit(-15)
    assert dvcops.is_transient_failure(-9, []) and dvcops.is_transient_failure(255, killed)
    dvcops.INTERRUPTED.set()
    assert not dvcops.is_transient_exit(-9) and not dvcops.is_transient_exit(-15)
    assert not dvcops.is_transient_failure(-9, []) and not dvcops.is_transient_failure(255, killed)
    assert not dvcops.is_transient_failure(255, [REPO_LOCK])
    # a task started after the interrupt first waits for the process to end (it reports nothing
    # while the interrupt records Crashed), then refuses
    monkeypatch.setattr(dvcops, "INTERRUPT_WAIT_SECONDS", 0.3)
    t0 = time.monotonic()
    with pytest.raises(dvcops.StageError, match="not started: the run was interrupted"):
        dvcops.repro_stage(Path("/nonexistent"), "merge", log=lambda _: None)
    with pytest.raises(dvcops.StageError, match="member 1 not started"):
        dvcops.run_member(Path("/nonexistent"), 1, log=lambda _: None)
    assert time.monotonic() - t0 >= 0.6


def test_stop_descendants_stops_the_whole_tree(tmp_path) -> None:
    """A child and its grandchild (like dvc and its stage command) are both stopped, the
    grandchild too although only the child had a signal forwarded to it first."""
    import psutil

    script = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(tmp_path / 'pid')!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        for _ in range(200):
            if (tmp_path / "pid").is_file() and (tmp_path / "pid").read_text():
                break
            time.sleep(0.05)
        grandchild = int((tmp_path / "pid").read_text())
        # the tree below a wrapper: this test process's other children are not touched
        wrapper = psutil.Process(parent.pid)
        assert [p.pid for p in wrapper.children()] == [grandchild]
        t0 = time.monotonic()
        assert dvcops.stop_descendants(forward=True, pid=parent.pid) == [grandchild]
        assert time.monotonic() - t0 < 5
        assert not psutil.pid_exists(grandchild) or (
            psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
        )
        assert parent.poll() is None  # only the descendants
    finally:
        parent.kill()
        parent.wait()


def test_config_values_are_read_as_dvc_config_prints_them(tmp_path):
    """``config_value`` (read in process) answers what ``dvc config NAME`` prints: the most
    specific level wins, a relative remote path is resolved against its config file, a level
    can be asked for, an unset name or a folder outside DVC is ""."""
    root = tmp_path / "proj"
    root.mkdir()
    dvcops.dvc(root, "init", "--no-scm", "-q")
    dvcops.dvc(root, "remote", "add", "-d", "store", "../elsewhere/store")
    dvcops.dvc(root, "config", "cache.type", "copy")
    dvcops.dvc(root, "config", "--local", "cache.type", "hardlink,copy")
    names = ["cache.type", "core.remote", "remote.store.url", "core.analytics", "remote.x.url"]
    for name in names:
        printed = dvcops.dvc(root, "config", name, check=False).stdout.strip()
        assert dvcops.config_value(root, name) == printed, name
    assert dvcops.config_value(root, "cache.type") == "hardlink,copy"
    assert dvcops.config_value(root, "cache.type", level="repo") == "copy"
    assert dvcops.config_value(root, "remote.store.url") == str(tmp_path / "elsewhere" / "store")
    assert dvcops.config_value(root, "core.analytics") == ""
    assert dvcops.config_value(tmp_path, "cache.type") == ""


def test_the_local_remote_is_added_though_another_remote_s_url_has_the_word(tmp_path):
    """``ensure_project`` adds its remote ``local`` when the project's other remote lives under
    ``/srv/my local store`` (``dvc remote list`` split on spaces read a remote named ``local``)."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "dvc.yaml").write_text("stages: {}\n")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    dvcops.dvc(root, "init", "-q")
    dvcops.dvc(root, "remote", "add", "store", "/srv/my local store")
    dvcops.ensure_project(root)
    url = dvcops.dvc(root, "config", f"remote.{dvcops.REMOTE_NAME}.url").stdout.strip()
    assert url == str(root / dvcops.REMOTE_DIR)


def test_the_local_remote_does_not_take_over_the_projects_default(tmp_path):
    """A project whose default remote is its own (an S3 store added with ``-d``) keeps it as the
    default: ``ensure_project`` adds ``local`` beside it (it made ``local`` the default, and so
    ``dvc push`` and ``study`` quietly used the local folder instead)."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "dvc.yaml").write_text("stages: {}\n")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    dvcops.dvc(root, "init", "-q")
    dvcops.dvc(root, "remote", "add", "-d", "store", "s3://bucket/prefix")
    done = dvcops.ensure_project(root)
    assert done[0] == "dvc remote local -> .dvc-remote/ (the default stays 'store')"
    assert dvcops.dvc(root, "config", "core.remote").stdout.strip() == "store"
    assert dvcops.has_remote(root, dvcops.REMOTE_NAME)


def test_stage_log_relays_dvc_output_without_its_git_advice(tmp_path, monkeypatch):
    from flows import dvcops

    fake = tmp_path / "dvc"
    fake.write_text(
        "#!/bin/sh\n"
        "echo \"Running stage 'merge':\"\n"
        "echo '> python -m tasks.merge'\n"
        "echo 'To track the changes with git, run:'\n"
        "echo '        git add dvc.lock'\n"
        "echo 'To enable auto staging, run:'\n"
        "echo '        dvc config core.autostage true'\n"
        "echo 'Use `dvc push` to send your updates to remote storage.'\n"
    )
    fake.chmod(0o755)
    monkeypatch.setattr(dvcops, "bin_path", lambda name: str(fake))
    logged: list[str] = []
    result = dvcops.repro_stage(tmp_path, "merge", log=logged.append)
    assert result.ran
    assert logged == ["[merge] Running stage 'merge':", "[merge] > python -m tasks.merge"]
    assert len(result.lines) == 7  # kept for error messages
