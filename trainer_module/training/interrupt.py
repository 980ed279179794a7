"""SIGINT and SIGTERM: stop at the next loop boundary, or at once.

Two ways to take a signal, one rule for the second one:

- :func:`raising_on_signals` (what a command line wraps its work in): the first SIGINT or SIGTERM
  raises :class:`errors.Interrupted` in the main thread, where Python next runs bytecode.
- :class:`StopBetweenLoops` (what the controller holds while it trains): the first signal only
  sets a flag; the controller reads it after each N-step loop, every worker agrees (one all-reduce
  of the flags), and it saves a checkpoint at that step before it stops.

Either way the first signal puts both signals back to the kernel's default action, so a second
one ends the process at once, even in the middle of a checkpoint write or of any C++ call (a
Python handler would only run when that call returns).

Why not ``tf.distribute.experimental.PreemptionCheckpointHandler``: it installs its own SIGTERM
handler and watcher thread per process and saves with its own ``CheckpointManager`` and
numbering, it handles SIGTERM only (not Ctrl-C), and after saving it ends the process
(``sys.exit``/``os._exit`` by default) — inside TFX's ``LocalDagRunner``, which runs the Trainer in
the ``fullthrottle run`` process, that would skip the CLI's records (``last_run.json``, the MLflow
runs). A flag read between loops, agreed by an all-reduce, and the run's own ``CheckpointManager``
save give the same guarantee (every worker stops at the same step with that step saved) and let
the caller finish its records.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from trainer_module.training.errors import Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def signal_name(signum: int | None) -> str:
    return signal.Signals(signum).name if signum else "a stop request from another worker"


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _second_signal_aborts() -> None:
    """From now on SIGINT and SIGTERM end the process at once (the kernel's default)."""
    for s in SIGNALS:
        signal.signal(s, signal.SIG_DFL)


def _install(handler: Callable[[int, FrameType | None], Any]) -> dict[int, Any]:
    return {s: signal.signal(s, handler) for s in SIGNALS}


@contextmanager
def raising_on_signals() -> Iterator[None]:
    """Within the block the first SIGINT or SIGTERM raises :class:`Interrupted` (a second one ends
    the process at once); the handlers before it are put back after it unless a signal came. A
    no-op off the main thread (only it can take signals in Python)."""
    if not _on_main_thread():
        yield
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        _second_signal_aborts()
        raise Interrupted(signum)

    previous = _install(handle)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is handle:
            for s, h in previous.items():
                signal.signal(s, h)


class StopBetweenLoops:
    """Within ``with``, the first SIGINT or SIGTERM is recorded (``signum``) instead of stopping
    anything; the controller asks :meth:`requested` between loops. A second signal ends the process
    at once. On leaving, the previous handlers come back unless a signal came (then a second one
    keeps aborting at once while the caller writes its records). Off the main thread nothing is
    installed and only :meth:`request` (tests, other stop sources) sets the flag."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopBetweenLoops:
        if _on_main_thread():
            self._previous = _install(self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous and self.signum is None:
            for s, h in self._previous.items():
                signal.signal(s, h)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        _second_signal_aborts()
        self.signum = signum

    def request(self, signum: int = signal.SIGTERM) -> None:
        self.signum = signum

    def requested(self, agree: Callable[[bool], bool]) -> bool:
        """True when this worker or any other was asked to stop; ``agree`` is the all-reduce (any)
        over workers (every worker must call this after the same loop, so all stop at one step)."""
        return agree(self.signum is not None)
