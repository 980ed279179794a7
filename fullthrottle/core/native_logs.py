"""TensorFlow's C++ log lines written while it loads, before its log level applies.

TensorFlow reads `TF_CPP_MIN_LOG_LEVEL` when absl's logging starts; a few lines come before
that (oneDNN, "Could not find cuda drivers"), with absl's note that they go to stderr. They go to
file descriptor 2, which Python's `sys.stderr` does not see. The command line drops them unless
`--verbose` (`load_notes_dropped`): in its own process while TensorFlow loads, and in the
processes it starts that load TensorFlow themselves, Beam's SDK workers in `multi_processing`
mode.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

# absl's format: severity letter (INFO or WARNING), MMDD, time, thread, file:line.
NATIVE_LOAD_NOTE = re.compile(
    rb"^(WARNING: All log messages before absl::InitializeLog\(\) is called"
    rb"|[IW]\d{4} [\d:.]+ +\d+ [^\]\s]+:\d+\] )"
)


@contextmanager
def load_notes_dropped(*, enabled: bool = True) -> Iterator[None]:
    """Within the block, stderr (file descriptor 2, inherited by the processes started in it)
    goes through a pipe; a thread writes every line out as it comes, except native load notes.
    Lines still in the pipe when the block ends are written out before it returns (the
    processes started in the block have ended by then, or their lines come within 5 s)."""
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def forward() -> None:
        # The thread owns `saved`: a process started in the block may outlive it and write on.
        try:
            with os.fdopen(read_end, "rb") as pipe:
                for line in pipe:
                    if NATIVE_LOAD_NOTE.match(line):
                        continue
                    # stderr gone: drain on all the same, so that no writer blocks.
                    with suppress(OSError):
                        os.write(saved, line)
        finally:
            os.close(saved)

    forwarder = threading.Thread(target=forward, name="native-log-filter", daemon=True)
    forwarder.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last writer in this process: the thread sees its end
        forwarder.join(timeout=5)
