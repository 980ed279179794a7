"""How this process was started: which command line the user typed, and which PID stops it.

`bin/envrun` (and the Makefile's targets, through it) tell the command they start, in the
environment:

- ``FULLTHROTTLE_ENVRUN``: the launcher as it was typed (``bin/envrun``, ``./bin/envrun``, a
  full path);
- ``FULLTHROTTLE_ENVRUN_COMMAND_PID``: the PID of the command envrun started, as seen here. The
  processes that command starts inherit the variables; this PID tells them they are not it;
- ``FULLTHROTTLE_ENVRUN_HOST_PID``, in envrun's Debian 13 userland only: the launcher's PID on
  the host. The PIDs inside are those of a PID namespace of the userland's own, which mean
  nothing (or another process) on the host; the launcher passes SIGINT and SIGTERM on to the
  command and returns when it has ended, so its PID is the one to signal;
- ``FULLTHROTTLE_MAKE_TARGET`` (set by the Makefile): the command is ``make TARGET ARGS=...``.

Read when asked, never at import.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

ENVRUN = "FULLTHROTTLE_ENVRUN"
COMMAND_PID = "FULLTHROTTLE_ENVRUN_COMMAND_PID"
HOST_PID = "FULLTHROTTLE_ENVRUN_HOST_PID"
MAKE_TARGET = "FULLTHROTTLE_MAKE_TARGET"


def started_by_envrun() -> bool:
    """This process is the command `bin/envrun` started (not a process that command started)."""
    return os.environ.get(COMMAND_PID) == str(os.getpid())


def launcher_host_pid() -> int | None:
    """The host PID of the `bin/envrun` whose PID namespace this process is in; None outside one."""
    value = os.environ.get(HOST_PID, "")
    return int(value) if value.isdigit() else None


def command_as_typed(argv: Sequence[str]) -> str:
    """`fullthrottle ARGV` as the user would type it here: behind the launcher that started this
    process (``bin/envrun fullthrottle run ...``, ``make run ARGS='...'``), or bare inside the
    environment (where `fullthrottle` is on the PATH)."""
    words = ["fullthrottle", *argv]
    if not started_by_envrun():
        return shlex.join(words)
    target = os.environ.get(MAKE_TARGET)
    if target and argv and argv[0] == target:
        rest = shlex.join(argv[1:])
        return f"make {target}" + (f" ARGS={shlex.quote(rest)}" if rest else "")
    return shlex.join([os.environ.get(ENVRUN) or "bin/envrun", *words])


def pid_namespace() -> str | None:
    """This process's PID namespace (``pid:[4026531836]``): PIDs compare only within one."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def process_record() -> dict[str, int | str | None]:
    """Who this process is, for a record other processes read (the output folder's lock): its
    PID and PID namespace, and the host PID that stops it, or that of the launcher whose
    namespace it is in."""
    host_pid = launcher_host_pid()
    return {
        "pid": os.getpid(),
        "pid_namespace": pid_namespace(),
        "host_pid": host_pid if started_by_envrun() else None,
        "launcher_host_pid": host_pid,
    }


def describe_process(record: dict) -> str:
    """``pid N`` as a person on the host can use it, from a :func:`process_record`."""
    if record.get("host_pid"):
        return f"pid {record['host_pid']}"
    if record.get("launcher_host_pid"):
        return (
            f"pid {record['pid']} inside the PID namespace of bin/envrun "
            f"(pid {record['launcher_host_pid']})"
        )
    return f"pid {record['pid']}"
