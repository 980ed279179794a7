"""A scratch temp folder for work done by libraries that leave their temp folders behind.

TFX, Beam and TFDV create temp folders (Beam's job-server and pipeline folders, TFX executors'
folders, TFX's self-sdist for Beam workers) and do not delete all of them: a default
`fullthrottle run` left 13 folders in /tmp, and with Beam arguments ~50 MB per Beam component.
Work wrapped in :func:`scratch_tempdir` puts them in one folder that is removed afterwards.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def scratch_tempdir(prefix: str) -> Iterator[str]:
    """A new folder inside the usual temp folder, made Python's temp folder (``tempfile.tempdir``,
    which libraries in this process consult) for the duration; it is deleted afterwards with
    whatever was left in it, also when the work raised. The previous temp folder is restored."""
    scratch = tempfile.mkdtemp(prefix=prefix)
    previous = tempfile.tempdir
    tempfile.tempdir = scratch
    try:
        yield scratch
    finally:
        tempfile.tempdir = previous
        shutil.rmtree(scratch, ignore_errors=True)
