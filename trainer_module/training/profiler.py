"""The profiler window: TensorFlow's profiler running over training steps [start, stop).

The controller asks :meth:`ProfilerWindow.steps_to_edge` when sizing each loop, so the window
opens and closes exactly on its steps (on every worker, so loops stay the same length
everywhere), and calls :meth:`before_loop` / :meth:`after_loop` around each loop. Only the
chief profiles (``enabled``); the trace goes to ``logdir``.
"""

from __future__ import annotations

import tensorflow as tf


class ProfilerWindow:
    def __init__(self, steps: tuple[int, int] | None, logdir: str, *, enabled: bool = True):
        self._steps = steps
        self._logdir = logdir
        self._enabled = enabled
        self.active = False

    def steps_to_edge(self, step: int) -> int | None:
        """Steps from ``step`` to the window's next edge (None when both are behind)."""
        ahead = [edge - step for edge in self._steps or () if step < edge]
        return min(ahead) if ahead else None

    def before_loop(self, step: int) -> None:
        """Start profiling when the loop starting at ``step`` is inside the window."""
        if self._enabled and self._steps and not self.active:
            start, stop = self._steps
            if start <= step < stop:
                tf.profiler.experimental.start(self._logdir)
                self.active = True

    def after_loop(self, step: int) -> None:
        """Stop profiling once the loops have reached the window's end."""
        if self.active and step >= self._steps[1]:
            self.close()

    def close(self) -> None:
        """Stop profiling if it runs (also when training stops early)."""
        if self.active:
            tf.profiler.experimental.stop()
            self.active = False
