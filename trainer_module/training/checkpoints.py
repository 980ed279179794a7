"""Checkpoints: what a run saves, where each worker saves, restore, and the save cadence.

- :func:`training_checkpoint`: the saved objects (model, optimizer, step, dropout RNG state).
- :class:`CheckpointStore`: where this worker saves, and restoring the chief's newest readable
  checkpoint (unreadable ones are moved aside, see :meth:`CheckpointStore.restore_latest`).
- :class:`CheckpointAction`: the outer loop's save action, on cadence (steps, seconds) and at the
  end, timed.
- :class:`TracedWriteCheckpoint`: periodic saves without re-walking the object graph.

Periodic checkpoints without re-walking the object graph at every save:

`tf.train.Checkpoint.write`, run eagerly, walks the whole Python object graph (model, optimizer,
their layers and variables) at every save, to rebuild the list of tensors to save and the graph
proto it stores beside them. For the tabular model that walk is most of a save: measured on an
AMD EPYC (2 cores, AVX2), a `CheckpointManager.save` took 28 ms eagerly and 6.6 ms
traced (3.3 ms of it the write, the rest the manager's state file and sweep), and at the
default cadence (every 100 steps of ~0.4 ms) the eager saves were ~30% of the training time,
the traced ones ~13%. The first save pays the trace (~150 ms against ~65 ms eagerly).

`TracedWriteCheckpoint` runs the same `write` as one `tf.function`, traced at the first save: the
walk happens once, and later saves only run the traced SaveV2/MergeV2Checkpoints ops, which read
the variables' current values. The files are the same (same object graph, same keys, written by
the same ops, renamed into place by the same merge), so `restore`, `latest_checkpoint` and
`CheckpointManager` (which calls `_write` and passes its bookkeeping as write callbacks) see no
difference.

The traced function is only valid while the object graph is the one it was traced on; a
`structure_key` (for us: the number of model and optimizer variables) is compared at every save,
and a change retraces. A write with any option but CheckpointManager's callbacks (async, an I/O
device, sharding, skipped slots) goes through TF's own path.
Multi-worker runs keep TF's eager path: their saves may run collectives, and TF's multi-worker
checkpoint recipe is only tested eagerly here.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Hashable
from typing import Any

import keras
import tensorflow as tf

from trainer_module.training.errors import CheckpointUnreadableError
from trainer_module.training.strategy import ClusterInfo

_log = logging.getLogger(__name__)

UNREADABLE_DIR = "unreadable"  # where unreadable checkpoints are moved, inside the folder
_STEP = re.compile(r"-(\d+)$")


def _only_callbacks(options: tf.train.CheckpointOptions | None) -> bool:
    """True when `options` sets nothing but write callbacks (what CheckpointManager passes): the
    traced save is traced with default options, so any other option takes TF's own path."""
    if options is None:
        return True
    default = tf.train.CheckpointOptions()
    return all(
        getattr(options, name) == getattr(default, name)
        for name in type(default).__slots__
        if name != "experimental_write_callbacks"
    )


class _Traced:
    """The traced save and the structure key it was traced at. A plain object on purpose: a
    tf.function set as an attribute of a Checkpoint would become a node of the saved graph."""

    def __init__(self) -> None:
        self.fn: Any = None
        self.key: Hashable = None


class TracedWriteCheckpoint(tf.train.Checkpoint):
    """A `tf.train.Checkpoint` whose eager writes run one traced save (see the module)."""

    def __init__(self, *, structure_key: Callable[[], Hashable] | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self._ft_structure_key = structure_key or (lambda: None)
        self._ft_traced = _Traced()
        self.traces = 0  # how many times the save was traced (1 unless the graph changed)

    def _write(self, file_prefix, options=None):
        if not tf.executing_eagerly() or not _only_callbacks(options):
            return super()._write(file_prefix, options)
        key = self._ft_structure_key()
        if self._ft_traced.fn is None or key != self._ft_traced.key:
            parent_write = super()._write

            @tf.function(input_signature=[tf.TensorSpec([], tf.string)], autograph=False)
            def traced(prefix):
                return parent_write(prefix, tf.train.CheckpointOptions())

            self._ft_traced.fn, self._ft_traced.key = traced, key
            self.traces += 1
        # As TrackableSaver.save does for a prefix given as a string (ours is a tensor inside).
        tf.io.gfile.makedirs(os.path.dirname(os.fspath(file_prefix)))
        path = self._ft_traced.fn(tf.constant(os.fspath(file_prefix))).numpy().decode("utf-8")
        # What Checkpoint._write does after its save (the callbacks are CheckpointManager's
        # bookkeeping: the "checkpoint" state file and the sweep of old checkpoints).
        for callback in (options.experimental_write_callbacks if options else None) or ():
            callback(*([path] if inspect.signature(callback).parameters else []))
        return path


def training_checkpoint(
    *,
    model: keras.Model,
    optimizer: keras.optimizers.Optimizer,
    step: tf.Variable,
    traced: bool,
) -> tf.train.Checkpoint:
    """The objects a run saves and restores: model, optimizer (slots, iterations, loss scale),
    the step counter and the dropout RNG state. ``traced``: saves run as one traced function
    (:class:`TracedWriteCheckpoint`; single host), else TF's own eager save."""
    # Keras keeps dropout RNG state in SeedGenerator variables that tf.train.Checkpoint does not
    # reach through the model; without them a resumed run would redraw the first run's masks.
    rng_state = tf.train.Checkpoint(
        **{
            f"seed{i}": v.value
            for i, v in enumerate(model.non_trainable_variables)
            if "seed_generator_state" in v.path
        }
    )
    saved = {"model": model, "optimizer": optimizer, "step": step, "rng_state": rng_state}
    if not traced:
        return tf.train.Checkpoint(**saved)
    return TracedWriteCheckpoint(
        structure_key=lambda: (len(model.variables), len(optimizer.variables)), **saved
    )


class CheckpointStore:
    """Where this worker's checkpoints go, and restoring from the chief's.

    The chief saves to ``work_dir/checkpoints``. As TF's multi-worker guide has it, every worker
    saves (saving may run collectives) but only the chief's copy is kept: the others write to a
    private temporary directory, removed by :meth:`close`. Every worker restores the chief's
    latest checkpoint.
    """

    def __init__(
        self,
        checkpoint: tf.train.Checkpoint,
        *,
        work_dir: str,
        cluster: ClusterInfo,
        max_to_keep: int,
    ):
        self.checkpoint = checkpoint
        self.chief_directory = os.path.join(work_dir, "checkpoints")
        self._own_directory: str | None = None
        if cluster.is_chief:
            self.directory = self.chief_directory
        else:
            self._own_directory = tempfile.mkdtemp(
                prefix=f"fullthrottle-worker{cluster.worker_index}-ckpt-"
            )
            self.directory = self._own_directory
        self.max_to_keep = max_to_keep
        self.manager = tf.train.CheckpointManager(
            checkpoint, self.directory, max_to_keep=max_to_keep
        )
        self.set_aside: list[str] = []  # unreadable checkpoints found by restore_latest
        self.unreadable_reasons: dict[str, str] = {}

    @property
    def saves(self) -> str:
        """How periodic saves are written: "traced" or "eager"."""
        return "traced" if isinstance(self.checkpoint, TracedWriteCheckpoint) else "eager"

    def restore_latest(self, *, unreadable: str = "fail") -> str | None:
        """Restore the chief's newest readable checkpoint, if there is one; returns its prefix.

        Every tensor of a checkpoint is read before it is restored (a data file truncated by a full
        disk or a crash fails there, not halfway through a restore). An unreadable one is skipped
        for the next older one; the chief moves its files to ``checkpoints/unreadable/`` and
        rewrites the state file without it (names in :attr:`set_aside`). When checkpoints exist
        but none is readable: :class:`CheckpointUnreadableError`, or, with ``unreadable=
        "start_over"``, all are moved aside and training starts from step 0.
        """
        readable = None
        candidates = checkpoint_candidates(self.chief_directory)
        for prefix in candidates:
            reason = unreadable_reason(prefix)
            if reason is None:
                readable = prefix
                break
            _log.warning(
                "checkpoint %s is unreadable (%s); trying the one before it", prefix, reason
            )
            self.set_aside.append(prefix)
            self.unreadable_reasons[prefix] = reason
        if readable is None and self.set_aside and unreadable != "start_over":
            # Left in place: a plain rerun must not find an empty folder and start over silently.
            reasons = "; ".join(
                f"{os.path.basename(p)}: {r}" for p, r in self.unreadable_reasons.items()
            )
            raise CheckpointUnreadableError(
                f"none of the checkpoints in {self.chief_directory} can be read ({reasons}). "
                "Set `training.unreadable_checkpoints: start_over` to move them to "
                f"{os.path.join(self.chief_directory, UNREADABLE_DIR)} and train from step 0."
            )
        if self.set_aside and self.directory == self.chief_directory:
            self._move_aside(kept=[p for p in candidates if p not in self.set_aside])
        if readable:
            self.checkpoint.restore(readable).assert_existing_objects_matched()
        return readable

    def _move_aside(self, *, kept: list[str]) -> None:
        """Moves the unreadable checkpoints' files to ``unreadable/`` and names only ``kept`` in
        the state file (CheckpointManager would otherwise keep pointing at the moved one)."""
        target = os.path.join(self.chief_directory, UNREADABLE_DIR)
        tf.io.gfile.makedirs(target)
        gfile = tf.io.gfile  # local folders and object stores alike (there a rename is a copy)
        for prefix in self.set_aside:
            for path in gfile.glob(prefix + ".*"):
                dest = os.path.join(target, os.path.basename(path))
                if gfile.exists(dest):
                    dest += f".{int(time.time())}"
                gfile.rename(path, dest)
        state = os.path.join(self.chief_directory, "checkpoint")
        if kept:
            # CheckpointManager's state file (a CheckpointState text proto), oldest first, names
            # relative to the folder as the manager writes them.
            names = [os.path.basename(p) for p in reversed(kept)]
            lines = [f"model_checkpoint_path: {json.dumps(names[-1])}"]
            lines += [f"all_model_checkpoint_paths: {json.dumps(n)}" for n in names]
            with gfile.GFile(state + ".tmp", "w") as f:
                f.write("\n".join(lines) + "\n")
            gfile.rename(state + ".tmp", state, overwrite=True)
        elif gfile.exists(state):
            gfile.remove(state)
        # The manager read the old state when it was made: make it again.
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, self.directory, max_to_keep=self.max_to_keep
        )

    def save(self, step: int) -> str:
        """Write checkpoint ``ckpt-<step>`` (keeping the newest ``max_to_keep``); its prefix."""
        return self.manager.save(checkpoint_number=step)

    def close(self) -> None:
        """Remove a non-chief worker's private checkpoints (the chief's stay)."""
        if self._own_directory:
            shutil.rmtree(self._own_directory, ignore_errors=True)


def checkpoint_candidates(directory: str) -> list[str]:
    """The committed checkpoints the state file of ``directory`` names, newest step first."""
    state = tf.train.get_checkpoint_state(directory)
    if state is None:
        return []
    paths = list(state.all_model_checkpoint_paths)
    if state.model_checkpoint_path and state.model_checkpoint_path not in paths:
        paths.append(state.model_checkpoint_path)

    def step(prefix: str) -> int:
        match = _STEP.search(prefix)
        return int(match.group(1)) if match else -1

    return sorted(paths, key=step, reverse=True)


def unreadable_reason(prefix: str) -> str | None:
    """Why checkpoint ``prefix`` cannot be restored (every tensor is read: the data files' checksums
    are checked as they are read), or None when it can."""
    try:
        reader = tf.train.load_checkpoint(prefix)
        for name in reader.get_variable_to_dtype_map():
            reader.get_tensor(name)
    # The reader turns TF's status codes into builtins (OUT_OF_RANGE -> IndexError, DATA_LOSS and
    # others -> RuntimeError/ValueError, NOT_FOUND -> OSError); graph restores raise OpError.
    except (tf.errors.OpError, ValueError, IndexError, RuntimeError, OSError) as e:
        text = (getattr(e, "message", None) or str(e)).strip().splitlines()
        return f"{type(e).__name__}: {text[0][:300] if text else ''}"
    return None


class CheckpointAction:
    """The outer loop's checkpoint action: after a loop that ends at ``step``, save when the
    step is a multiple of ``every_steps``, when ``every_seconds`` have passed since the last save
    (as decided by ``agree``, so every worker takes the same decision), and at ``train_steps``;
    never twice at one step (a run restored at its end saves nothing). Times each save.

    The controller cuts loops at :meth:`steps_to_next` so saves happen exactly on their step.
    The clock starts when the action is made: make it just before the first loop.
    """

    def __init__(
        self,
        save: Callable[[int], str],
        *,
        train_steps: int,
        every_steps: int,
        every_seconds: float | None,
        start_step: int,
        agree: Callable[[bool], bool] = lambda flag: flag,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._save = save
        self._train_steps = train_steps
        self._every_steps = every_steps
        self._every_seconds = every_seconds
        self._agree = agree
        self._clock = clock
        self._last_saved = start_step
        self._last_path: str | None = None
        self._last_save_time = clock()

    def steps_to_next(self, step: int) -> int | None:
        """Steps from ``step`` to the next step-cadence save (None without one)."""
        if not self._every_steps:
            return None
        return self._every_steps - step % self._every_steps

    def __call__(self, step: int) -> tuple[str | None, float]:
        """Save if due after the loop that ended at ``step``: (checkpoint prefix or None,
        seconds the save took)."""
        due = step == self._train_steps or bool(self._every_steps and step % self._every_steps == 0)
        if self._every_seconds is not None and not due:
            late = self._clock() - self._last_save_time >= self._every_seconds
            due = self._agree(late)
        if not due or step == self._last_saved:
            return None, 0.0
        return self._save_timed(step)

    def save_now(self, step: int) -> tuple[str | None, float]:
        """Save at ``step`` whatever the cadence (a stop was asked): (prefix, seconds); nothing new
        when this step is already saved (then the prefix saved at it, if this action saved it)."""
        if step == self._last_saved:
            return self._last_path, 0.0
        return self._save_timed(step)

    def _save_timed(self, step: int) -> tuple[str, float]:
        started = time.perf_counter()
        path = self._save(step)
        seconds = time.perf_counter() - started
        self._last_saved, self._last_save_time, self._last_path = step, self._clock(), path
        return path, seconds
