"""Room on disk before a run writes: the output folder must take what the run will write.

A run writes, per input byte, a staged copy of a CSV, ExampleGen's gzipped tf.Examples,
Transform's transformed examples and statistics, and, whatever the input, a model (SavedModel,
checkpoints, a pushed version), the ML Metadata store and MLflow's files. On the bundled penguins
data (16 KB) a whole run wrote 3.2 MB. The estimate below is deliberately generous (the model
part depends on the model, the data part on the columns): it is a floor under which a run will
certainly not fit, checked once before the pipeline starts, so a full disk stops the run before
Transform with a message rather than inside a component with ENOSPC.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from fullthrottle.core.errors import FullthrottleError

BYTES_PER_INPUT_BYTE = 10  # staged copy + examples + transformed examples + statistics, generous
FIXED_BYTES = 64 * 2**20  # model, checkpoints, pushed version, ML Metadata, MLflow


class DiskSpaceError(FullthrottleError, OSError):
    """The output folder has less free space than the run needs."""


def input_bytes(files: Iterable[str]) -> int:
    """Total size of the local input files (remote ones count as 0: their size is not asked)."""
    total = 0
    for name in files:
        path = Path(name)
        if path.is_dir():
            total += sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        elif path.is_file():
            total += path.stat().st_size
    return total


def bytes_needed(input_size: int) -> int:
    return FIXED_BYTES + BYTES_PER_INPUT_BYTE * input_size


def check_free_space(output_dir: Path, *, input_size: int) -> int:
    """Refuses (DiskSpaceError) when ``output_dir``'s filesystem has fewer free bytes than
    :func:`bytes_needed`; returns the free bytes otherwise. Remote folders are not checked."""
    if "://" in str(output_dir):
        return -1
    needed = bytes_needed(input_size)
    free = shutil.disk_usage(output_dir).free
    if free < needed:
        raise DiskSpaceError(
            f"not enough free space for this run in {os.fspath(output_dir)}: {free:,} bytes free, "
            f"about {needed:,} needed ({input_size:,} bytes of input x {BYTES_PER_INPUT_BYTE} "
            f"+ {FIXED_BYTES:,} for the model, metadata and tracking). Free some space or choose "
            "another --output-dir. Nothing was written by this run."
        )
    return free


class FolderNotWritableError(FullthrottleError, OSError):
    """A folder the run is configured to write to cannot be written."""


def check_copies_folder(folder: str, *, input_size: int, setting: str) -> None:
    """The folder for pre-batched copies of the training files (``setting``): created if
    missing, written to once (a probe file, removed), and with room for about the input's size
    (the copies take about half the transformed records, which take about the input's). Refused
    with what to do; remote folders are not checked."""
    if "://" in folder:
        return
    path = Path(folder).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".fullthrottle-probe-") as probe:
            probe.write(b"probe")
            probe.flush()
    except OSError as exc:
        raise FolderNotWritableError(
            f"`{setting}` is {folder!r}, which cannot be written: "
            f"{exc.strerror or type(exc).__name__}"
            f"{f' ({exc.filename})' if exc.filename else ''}. Set it to a folder this user can "
            "create and write, or remove it to read the records directly. Nothing was written "
            "by this run."
        ) from None
    free = shutil.disk_usage(path).free
    if free < input_size:
        raise DiskSpaceError(
            f"not enough free space for the pre-batched copies in {os.fspath(path)} (`{setting}`): "
            f"{free:,} bytes free, about {input_size:,} needed. Free some space, choose another "
            "folder, or remove the setting. Nothing was written by this run."
        )
