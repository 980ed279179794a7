"""One output folder, one run at a time: an exclusive `flock` on `<output_dir>/.fullthrottle.lock`.

`fullthrottle run` takes it before any work and holds it to its last line; a second run on the same
folder is refused at once, naming the holder (pid, host, command, since when) and the folder. The
pid is the one a person on the host can signal: in `bin/envrun`'s userland, the launcher's (see
`fullthrottle.core.launcher`), and the command is the one they typed. The
kernel drops a `flock` when its holder's file descriptor is closed, so the lock is released on any
exit, SIGKILL included: a stale lock file (its holder gone) is simply taken over. The holder's pid is
recorded in the file and checked when the lock is busy (by a reader in the same PID namespace), to
tell "a live run" from "a process that inherited the lock and outlived the run" (a forked child). The descriptor is not inherited by
processes the run starts with `exec` (Python opens files close-on-exec).

Commands that only read the folder (`serve`, `compare`, `ui`) do not take the lock.
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import json
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fullthrottle.core.errors import FullthrottleError
from fullthrottle.core.launcher import describe_process, pid_namespace, process_record

LOCK_FILE = ".fullthrottle.lock"


class RunLockedError(FullthrottleError):
    """Another run holds the output folder's lock."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _holder_text(path: Path) -> str:
    try:
        holder = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        holder = {}
    pid = holder.get("pid")
    if not pid:
        return "another process (it has not written its name yet)"
    who = describe_process(holder)
    text = (
        f"{who} on {holder.get('host', '?')} ({holder.get('command', '?')}, "
        f"since {holder.get('started_at', '?')})"
    )
    comparable = holder.get("pid_namespace") == pid_namespace()
    if comparable and holder.get("host") == socket.gethostname() and not _pid_alive(int(pid)):
        text += (
            f"; {who} has ended, but a process it started still holds the lock: "
            "end that process, or wait for it"
        )
    return text


@contextmanager
def hold_run_lock(output_dir: Path, *, command: str) -> Iterator[Path]:
    """Holds the exclusive lock of ``output_dir`` for the block (creating the folder); raises
    RunLockedError at once when another process holds it. Yields the lock file's path."""
    output_dir = Path(output_dir)
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FullthrottleError(
            f"cannot create the output folder {output_dir}: {e.strerror}. Choose a folder you "
            "can write (--output-dir)."
        ) from e
    path = output_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise FullthrottleError(
            f"cannot write in the output folder {output_dir} ({path}: {e.strerror}). Choose a "
            "folder you can write (--output-dir)."
        ) from e
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise RunLockedError(
                f"another run is using the output folder {output_dir.resolve()}: "
                f"{_holder_text(path)}. Wait for it to finish, stop it, or use another "
                f"--output-dir. (Lock file: {path}.)"
            ) from None
        holder = {
            **process_record(),
            "host": socket.gethostname(),
            "command": command,
            "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode("utf-8"), 0)
        try:
            yield path
        finally:
            os.ftruncate(fd, 0)  # a reader between here and the close sees no stale holder
    finally:
        os.close(fd)  # releases the flock
