"""The output folder's run lock (one holder at a time, released on any exit, stale after a kill)
and the free-space check before a run."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap

import pytest

from fullthrottle.core.disk import (
    BYTES_PER_INPUT_BYTE,
    DiskSpaceError,
    FolderNotWritableError,
    bytes_needed,
    check_copies_folder,
    check_free_space,
    input_bytes,
)
from fullthrottle.core.errors import FullthrottleError
from fullthrottle.core.run_lock import LOCK_FILE, RunLockedError, hold_run_lock
from tests.helpers import REPO

HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from fullthrottle.core.run_lock import hold_run_lock
    with hold_run_lock(Path(sys.argv[1]), command="fullthrottle run --holder"):
        print("held", flush=True)
        time.sleep(120)
    """
)


def _holder(folder):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_holder_is_refused_with_the_holders_name_until_it_dies(tmp_path):
    folder = tmp_path / "out"
    proc = _holder(folder)
    try:
        with (
            pytest.raises(RunLockedError) as refused,
            hold_run_lock(folder, command="fullthrottle run"),
        ):
            pass
        message = str(refused.value)
        assert f"pid {proc.pid}" in message
        assert "fullthrottle run --holder" in message
        assert str(folder.resolve()) in message
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # The kernel dropped the dead holder's lock: the stale file is taken over.
    assert json.loads((folder / LOCK_FILE).read_text())["pid"] == proc.pid
    with hold_run_lock(folder, command="fullthrottle run") as path:
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert (folder / LOCK_FILE).read_text() == ""  # released and emptied on the way out


def test_the_lock_is_released_when_the_block_raises(tmp_path):
    with pytest.raises(KeyboardInterrupt), hold_run_lock(tmp_path, command="a"):
        raise KeyboardInterrupt
    with hold_run_lock(tmp_path, command="b"):
        pass


def test_an_output_folder_that_is_a_file_is_named(tmp_path):
    folder = tmp_path / "taken"
    folder.write_text("not a folder")
    with (
        pytest.raises(FullthrottleError, match="cannot create the output folder") as refused,
        hold_run_lock(folder, command="a"),
    ):
        pass
    assert str(folder) in str(refused.value)


def test_too_little_free_space_is_refused_naming_folder_and_bytes(tmp_path):
    import shutil

    free = shutil.disk_usage(tmp_path).free
    # An input so large that the estimate exceeds what this disk has free.
    size = free // BYTES_PER_INPUT_BYTE + 1
    with pytest.raises(DiskSpaceError) as refused:
        check_free_space(tmp_path, input_size=size)
    message = str(refused.value)
    assert str(tmp_path) in message and f"{bytes_needed(size):,}" in message
    assert check_free_space(tmp_path, input_size=1000) > bytes_needed(1000)
    data = tmp_path / "in.csv"
    data.write_bytes(b"x" * 1234)
    assert input_bytes([str(data), str(tmp_path / "missing")]) == 1234


def test_the_pre_batched_copies_folder_is_checked_before_the_run(tmp_path, capsys):
    """`training.input_snapshot_dir`: created when missing; a folder that cannot be made (here
    below a file: root ignores permission bits) or a disk without room for the copies is
    refused by `fullthrottle run` before any component, naming the setting and the folder."""
    from fullthrottle.cli import main

    setting = "training.input_snapshot_dir"
    folder = tmp_path / "new" / "copies"
    check_copies_folder(str(folder), input_size=1000, setting=setting)
    assert folder.is_dir() and not list(folder.iterdir())  # the probe file is gone
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(FolderNotWritableError) as refused:
        check_copies_folder(str(blocker / "copies"), input_size=1000, setting=setting)
    assert setting in str(refused.value) and str(blocker / "copies") in str(refused.value)
    with pytest.raises(DiskSpaceError, match=setting):
        check_copies_folder(str(folder), input_size=2**62, setting=setting)
    check_copies_folder("gs://bucket/copies", input_size=2**62, setting=setting)  # not checked

    output = tmp_path / "runs"
    code = main(["run", "--output-dir", str(output), "--set", f"{setting}={blocker / 'copies'}"])
    message = " ".join(capsys.readouterr().err.split())
    assert code == 2, message
    assert f"`{setting}` is" in message and "Nothing was written" in message
    assert "Traceback" not in message
    assert not (output / "pipeline_root").exists() and not (output / "metadata").exists()


def test_the_resume_command_is_the_one_typed_without_its_secrets(monkeypatch):
    """As the user typed it: behind the launcher that started the run (`bin/envrun`, or `make
    run`, whose ARGS carry the rest), bare inside the environment (a process the launcher's
    command started, e.g. in `bin/envrun bash`)."""
    import argparse

    from fullthrottle.commands.run import resume_command

    args = argparse.Namespace(
        argv=("run", "--output-dir", "my runs", "--set", "tracking.uri=https://me:s3cret@mlflow.x")
    )
    monkeypatch.setenv("FULLTHROTTLE_ENVRUN", "./bin/envrun")
    monkeypatch.setenv("FULLTHROTTLE_ENVRUN_COMMAND_PID", str(os.getpid() + 1))
    bare = resume_command(args)
    assert bare.startswith("fullthrottle run --output-dir 'my runs' --set ")
    monkeypatch.setenv("FULLTHROTTLE_ENVRUN_COMMAND_PID", str(os.getpid()))
    assert resume_command(args) == "./bin/envrun " + bare
    monkeypatch.setenv("FULLTHROTTLE_MAKE_TARGET", "run")
    made = resume_command(args)
    make, target, variable = shlex.split(made)
    assert (make, target) == ("make", "run") and variable.startswith("ARGS=")
    assert shlex.split(variable.removeprefix("ARGS="))[:3] == ["--output-dir", "my runs", "--set"]
    for command in (bare, made):
        assert "s3cret" not in command and "mlflow.x" in command


def test_a_refusal_names_the_pid_that_stops_the_holder_on_the_host(tmp_path, monkeypatch):
    """A run in bin/envrun's userland has a PID of the userland's PID namespace; the refusal
    names the launcher's host PID (envrun passes a signal on to the run) and the command line as
    typed, and does not call a holder of another PID namespace ended because its PID is not
    seen here."""
    monkeypatch.setenv("FULLTHROTTLE_ENVRUN_COMMAND_PID", str(os.getpid()))
    monkeypatch.setenv("FULLTHROTTLE_ENVRUN_HOST_PID", "4242")
    with hold_run_lock(tmp_path, command="bin/envrun fullthrottle run --output-dir x") as path:
        with pytest.raises(RunLockedError) as refused, hold_run_lock(tmp_path, command="b"):
            pass
        message = str(refused.value)
        assert (
            "pid 4242 on " in message and "(bin/envrun fullthrottle run --output-dir x," in message
        )
        # Whole numbers only: this process may be pid 42, a prefix of the launcher's 4242.
        assert re.search(rf"\bpid {os.getpid()}\b", message) is None
        # Seen from another PID namespace: a PID that does not exist here proves nothing.
        holder = json.loads(path.read_text())
        holder.update(pid=2**22 + 7, pid_namespace="pid:[1]")
        path.write_text(json.dumps(holder))
        with pytest.raises(RunLockedError) as refused, hold_run_lock(tmp_path, command="b"):
            pass
        assert "pid 4242 on " in str(refused.value) and "has ended" not in str(refused.value)
        # A process the run started (inside the namespace, not the launcher's own command).
        holder.update(pid=57, pid_namespace=None, host_pid=None)
        path.write_text(json.dumps(holder))
        with pytest.raises(RunLockedError) as refused, hold_run_lock(tmp_path, command="b"):
            pass
        assert "pid 57 inside the PID namespace of bin/envrun (pid 4242) on " in str(refused.value)
