"""Trainer benchmarks: our loop vs the TFX-example trainer, input efficiency, reader vs tfx_bsl,
model FLOPs utilization, tracking overhead.

Contenders are built once and then measured in windows (``measure(steps)`` returns examples/s),
so a comparison alternates windows of the contenders in one process (see ``measure.py``).

- :class:`OurLoop` is the training library's compiled N-step loop (``TrainLoop``) set up by
  ``train()``'s own ``setup.set_up`` (strategy, precision policy from config, model, optimizer,
  scaled learning rate) with ``make_dataset`` per input pipeline; a window is whole loops of
  ``steps_per_loop`` steps with the host sync after each, like the controller. Checkpoints and
  summaries are left out here; the tracking benchmark runs the real ``train()`` and reports its
  rate too. ``source="memory"`` replaces the TFRecord pipeline by the same first batches, parsed,
  cached in memory and repeated (the denominator of input efficiency).
- :class:`KerasFitBaseline` is the way TFX's penguin example trains (``penguin_utils_keras``):
  ``model.fit`` over ``data_accessor.tf_dataset_factory(files, TensorFlowDatasetOptions(
  batch_size, label_key), schema).repeat()``, Adam, ``SparseCategoricalCrossentropy`` and a
  ``SparseCategoricalAccuracy`` metric, float32, default settings, on the same model
  (``build_model``) and the same transformed files.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from fullthrottle.bench.workloads import TrainingData
from trainer_module.training import TrainingConfig, metrics


def tfx_dataset_factory(data: TrainingData) -> Callable[..., tf.data.Dataset]:
    """``fn_args.data_accessor.tf_dataset_factory`` as TFX's Trainer builds it for these files."""
    from tfx.components.util import examples_utils, tfxio_utils
    from tfx.types import standard_artifacts

    examples = standard_artifacts.Examples()
    examples.uri = data.examples_uri
    examples.split_names = '["train", "eval"]'
    examples_utils.set_payload_format(examples, examples_utils.get_payload_format(examples))
    return tfxio_utils.get_tf_dataset_factory_from_artifact([examples], ["fullthrottle", "bench"])


def tfx_example_dataset(data: TrainingData, batch_size: int) -> tf.data.Dataset:
    """The penguin example's ``_input_fn``: defaults but batch size and label key, repeated."""
    from tfx_bsl.public import tfxio

    factory = tfx_dataset_factory(data)
    options = tfxio.TensorFlowDatasetOptions(
        batch_size=batch_size, label_key=data.model_inputs.label
    )
    return factory(list(data.train_files), options, data.schema).repeat()


# Config fields that only say where the training batches come from: contenders that differ in
# these alone can share one model and compiled loop (``OurLoop(same_model_as=...)``).
INPUT_SOURCE_FIELDS = ("cache", "input_snapshot_dir")


class OurLoop:
    """The training library's loop on ``data``; ``measure(steps)`` -> examples/s.

    ``dataset_transform`` (tests, e.g. an artificially slow map) is applied to each input
    pipeline's dataset after ``make_dataset``. ``same_model_as`` (another ``OurLoop`` on the same
    data and config) reuses its strategy, model, optimizer and compiled loop, with an input
    pipeline of its own: the in-memory contender then differs from ours only in where its
    batches come from, and costs no second model build and trace.
    """

    def __init__(
        self,
        data: TrainingData,
        config: TrainingConfig,
        *,
        source: str = "tfrecord",
        memory_batches: int = 16,
        dataset_transform: Callable[[tf.data.Dataset], tf.data.Dataset] | None = None,
        same_model_as: OurLoop | None = None,
    ):
        from trainer_module.training import distribute_input, make_dataset
        from trainer_module.training.loop import TrainLoop
        from trainer_module.training.setup import set_up

        if source not in ("tfrecord", "memory"):
            raise ValueError(f"source must be 'tfrecord' or 'memory', got {source!r}")
        self.config = config
        self.memory_batches = memory_batches if source == "memory" else 0
        if same_model_as is not None:
            # The same model and loop: only where the batches come from may differ.
            reading = {name: getattr(config, name) for name in INPUT_SOURCE_FIELDS}
            if dataclasses.replace(same_model_as.config, **reading) != config:
                raise ValueError("same_model_as must be a loop with the same config")
            self.strategy, self.policy = same_model_as.strategy, same_model_as.policy
            self.batch, self.model = same_model_as.batch, same_model_as.model
            self.loop = same_model_as.loop
        else:
            setup = set_up(config, data.model_inputs)
            self.strategy, self.policy = setup.strategy, setup.policy_name
            self.batch, self.model = setup.batch, setup.model
            self.loop = TrainLoop(
                self.strategy,
                self.model,
                setup.optimizer,
                config,
                self.batch,
                regression=data.model_inputs.regression,
            )

        def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
            ds = make_dataset(
                data.train_files,
                data.feature_spec,
                data.model_inputs,
                config,
                batch_size=self.batch.per_replica_step,
                training=True,
                compression=data.compression,
                input_context=ctx,
            )
            if source == "memory":
                # The same parsed batches, held in memory: what the loop does with no input cost.
                # Taken by the loop's own get_next, the fastest way to feed batches already in
                # memory (a prefetch thread handing them over: 0.95-0.96x on the tabular model).
                options = tf.data.Options()
                options.experimental_optimization.inject_prefetch = False
                ds = ds.take(memory_batches).cache().repeat().with_options(options)
            if dataset_transform is not None:
                ds = dataset_transform(ds)
            return ds

        self._dataset_fn = dataset_fn
        # The dataset as train() builds it; the strong `fit` contender trains on this object.
        self.dataset = distribute_input(self.strategy, dataset_fn)
        self.iterator = iter(self.dataset)
        self.records: list[dict[str, Any]] = []

    def fresh_iterator(self) -> None:
        """A new input pipeline for the next window. A long-lived iterator that sat idle while
        other contenders ran has refilled its buffers (shuffle window, prefetch) meanwhile, and
        its next window reads part of its input for free: a streaming reader measured ~2x."""
        from trainer_module.training import distribute_input

        self.iterator = iter(distribute_input(self.strategy, self._dataset_fn))

    def fill_cache(self) -> None:
        """Pulls the in-memory contender's batches once, so its cache is full (a no-op for the
        TFRecord one): a warm-up of fewer training steps than it holds batches would leave the
        rest to be read and parsed in its first timed window."""
        for _ in range(self.memory_batches):
            next(self.iterator)

    def run_loop(self, steps: int) -> dict[str, Any]:
        """One compiled loop of ``steps`` steps; the controller's loop record."""
        start = time.perf_counter()
        ran = int(self.loop.train_loop(self.iterator, tf.constant(steps, tf.int64)))  # host sync
        wall = time.perf_counter() - start
        record = {
            metrics.STEPS: ran,
            metrics.WALL_TIME: wall,
            metrics.INPUT_WAIT_TIME: float(self.loop.input_wait.numpy()),
            metrics.LOSS: float(self.loop.loss_sum.numpy()) / max(ran, 1),
        }
        self.records.append(record)
        return record

    def measure(self, steps: int) -> float:
        """examples/s over ``steps`` steps run as loops of ``steps_per_loop`` (host time between
        loops included, as in the controller)."""
        per_loop = self.config.steps_per_loop
        start = time.perf_counter()
        done = 0
        while done < steps:
            done += self.run_loop(min(per_loop, steps - done))[metrics.STEPS]
        return done * self.batch.global_batch / (time.perf_counter() - start)


class _WindowTimer:
    """Keras callback: time from the end of batch ``skip - 1`` to the end of the last batch, so
    each ``fit`` call's iterator start-up is not charged to the baseline."""

    def __init__(self, skip: int):
        import keras

        timer = self

        class Callback(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if batch == skip - 1:
                    timer.start = time.perf_counter()
                timer.end = time.perf_counter()
                timer.batches = batch + 1

        self.callback = Callback()
        self.start = self.end = 0.0
        self.batches = 0


class KerasFitBaseline:
    """TFX's penguin-example trainer on the same model and files; ``measure(steps)`` -> examples/s."""

    SKIP = 2  # batches per fit call not timed (iterator start-up)

    def __init__(self, data: TrainingData, config: TrainingConfig):
        import keras

        from trainer_module.training import build_model

        keras.utils.set_random_seed(config.seed)
        self.batch_size = config.per_replica_batch_size
        self.model = build_model(data.model_inputs, config, "float32")
        self.model.compile(
            optimizer=keras.optimizers.Adam(config.learning_rate),
            loss=keras.losses.SparseCategoricalCrossentropy(),
            metrics=[keras.metrics.SparseCategoricalAccuracy()],
        )
        self.dataset = tfx_example_dataset(data, self.batch_size)

    def measure(self, steps: int) -> float:
        timer = _WindowTimer(self.SKIP)
        self.model.fit(
            self.dataset,
            epochs=1,
            steps_per_epoch=steps + self.SKIP,
            verbose=0,
            callbacks=[timer.callback],
        )
        return (timer.batches - self.SKIP) * self.batch_size / (timer.end - timer.start)


class StrongFit:
    """Keras ``model.fit`` given every option our loop has: the model as ``train()`` builds it
    (``setup.set_up``: the same model options, precision policy, optimizer and scaled learning
    rate), ``steps_per_execution`` = our ``steps_per_loop``, our ``jit_compile`` setting, the
    same dataset object (``OurLoop.dataset``) and the same distribution setup: where ours
    iterates that dataset directly (one CPU replica, ``host_only_replica``), the model is built
    outside the strategy's scope, so ``fit`` (under the default strategy) does too instead of
    wrapping it in ``experimental_distribute_dataset``; elsewhere both go through the strategy.
    What is left between it and ours is the loop itself. ``measure(steps)`` -> examples/s
    between the end of its first execution and the end of its last, so each ``fit`` call's
    iterator start-up is not charged to it."""

    def __init__(
        self,
        data: TrainingData,
        config: TrainingConfig,
        ours: OurLoop,
        *,
        steps_per_execution: int | None = None,
    ):
        import keras

        from trainer_module.training import build_model
        from trainer_module.training.inputs import host_only_replica
        from trainer_module.training.optimization import create_optimizer
        from trainer_module.training.setup import set_up

        setup = set_up(config, data.model_inputs)
        self.policy = setup.policy_name
        self.global_batch = setup.batch.global_batch
        model, optimizer = setup.model, setup.optimizer
        # Where ours skips TF's distributed iterator, `fit` must not pay for it either.
        device = host_only_replica(setup.strategy)
        self.distribution = "direct" if device else type(setup.strategy).__name__
        if device:
            keras.utils.set_random_seed(config.seed)  # the weights set_up's model starts from
            with tf.device(device):
                model = build_model(data.model_inputs, config, setup.policy_name, training=True)
                optimizer = create_optimizer(config, setup.learning_rate, setup.policy_name)
                optimizer.build(model.trainable_variables)
        # Ours runs loops of min(steps_per_loop, window) steps; `fit` gets the same (None =
        # steps_per_loop): a longer execution than the window would time steps ours never runs.
        self.steps_per_execution = steps_per_execution or config.steps_per_loop
        self.model = model
        self.model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(),
            steps_per_execution=self.steps_per_execution,
            # Ours XLA-compiles only when the config asks (jit_compile switches the
            # Transformer's padding trimming off, and measured slower there); so does this.
            jit_compile=config.jit_compile,
        )
        self.dataset = ours.dataset
        self.model_options = config.model_options(config.resolved_model(data.model_inputs))

    def measure(self, steps: int) -> float:
        import keras

        marks: list[tuple[int, float]] = []

        class Marks(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                marks.append((batch, time.perf_counter()))

        executions = max(2, -(-steps // self.steps_per_execution) + 1)
        self.model.fit(
            self.dataset,
            epochs=1,
            steps_per_epoch=executions * self.steps_per_execution,
            shuffle=False,  # a tf.data input: our pipeline shuffles
            verbose=0,
            callbacks=[Marks()],
        )
        (first, start), (last, end) = marks[0], marks[-1]
        return (last - first) * self.global_batch / (end - start)


def reader_rates(
    data: TrainingData,
    config: TrainingConfig,
    *,
    batches: int,
    repeats: int,
    with_tfx_bsl: bool = True,
) -> dict[str, list[float]]:
    """Examples/s of the input pipelines alone (no model): our ``make_dataset`` vs TFX's
    ``tf_dataset_factory``, same files and batch size, alternated. Each window takes a FRESH
    iterator (see ``OurLoop.fresh_iterator``), its first batch untimed (files opened, buffers
    filling): the rate a pipeline sustains, not one inflated by buffers filled while idle.
    ``ours_per_cpu_second`` is ours' examples per second of this process's CPU time over the
    window (all threads): the reader's cost per core, whatever the machine's core count.
    ``with_tfx_bsl=False`` times ours alone."""
    from fullthrottle.bench.measure import alternate
    from trainer_module.training import make_dataset

    batch_size = config.per_replica_batch_size

    def ours() -> tf.data.Dataset:
        return make_dataset(
            data.train_files,
            data.feature_spec,
            data.model_inputs,
            config,
            batch_size=batch_size,
            training=True,
            compression=data.compression,
        )

    builders: dict[str, Callable[[], tf.data.Dataset]] = {"ours": ours}
    if with_tfx_bsl:
        builders["tfx_bsl"] = lambda: tfx_example_dataset(data, batch_size)
    per_cpu_second: list[float] = []

    def rate(name: str) -> Callable[[], float]:
        def run() -> float:
            iterator = iter(builders[name]())
            next(iterator)
            start, cpu = time.perf_counter(), time.process_time()
            for _ in range(batches):
                features, _labels = next(iterator)
            # Batches are produced on tf.data threads; touching one value ends the window.
            next(iter(features.values())).numpy()
            wall, cpu = time.perf_counter() - start, time.process_time() - cpu
            if name == "ours":
                per_cpu_second.append(batches * batch_size / cpu)
            return batches * batch_size / wall

        return run

    for name in builders:  # warm-up: threads, autotune, traced functions
        rate(name)()
    per_cpu_second.clear()
    samples = alternate({name: rate(name) for name in builders}, repeats=repeats)
    return {**samples, "ours_per_cpu_second": per_cpu_second}


def write_prebatched_copies(data: TrainingData, config: TrainingConfig) -> dict[str, float]:
    """Writes the pre-batched copies of ``data``'s training files under
    ``config.input_snapshot_dir`` (what a training run does first; nothing when they exist).
    Returns the seconds it took and the copies' bytes."""
    from trainer_module.training import make_dataset

    started = time.perf_counter()
    make_dataset(
        data.train_files,
        data.feature_spec,
        data.model_inputs,
        config,
        batch_size=config.per_replica_batch_size,
        training=True,
        compression=data.compression,
    )
    folder = config.input_snapshot_dir or ""
    copies = tf.io.gfile.glob(os.path.join(folder, "*.prebatched.gz"))
    return {
        "seconds": time.perf_counter() - started,
        "bytes": float(sum(tf.io.gfile.stat(c).length for c in copies)),
    }


def machine_busy_seconds() -> float | None:
    """CPU-seconds every process on this machine has run so far (Linux ``/proc/stat``: all
    states but idle and I/O wait), or None where there is no ``/proc/stat``."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


CPU_METRICS = ("cores", "machine_cores", "cpu_us_per_example")


def metered(window: Callable[[], float], into: dict[str, list[float]]) -> float:
    """Runs ``window`` (returns examples/s) and appends its CPU use to ``into``: ``cores``, this
    process's CPU-seconds (all threads) per wall second; ``machine_cores``, the same for every
    process on the machine (what is left of the cores for this one); ``cpu_us_per_example``,
    this process's CPU microseconds per example. On a shared machine a rate is bounded by the
    cores the scheduler grants; CPU per example is not."""
    machine, cpu, wall = machine_busy_seconds(), time.process_time(), time.perf_counter()
    rate = window()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    end = machine_busy_seconds()
    into.setdefault("cores", []).append(cpu / wall)
    into.setdefault("cpu_us_per_example", []).append(cpu / (rate * wall) * 1e6)
    if machine is not None and end is not None:
        into.setdefault("machine_cores", []).append((end - machine) / wall)
    return rate


def streaming_rates(
    data: TrainingData,
    config: TrainingConfig,
    *,
    batch_sizes: tuple[int, ...],
    window_examples: int,
    repeats: int,
    prebatched_dir: str | None = None,
) -> dict[str, Any]:
    """Streaming input efficiency: our loop reading ``data`` with ``cache: false`` (the files
    are bigger than ``cache: auto``'s line, as a user's large data is) vs the same model and
    compiled loop fed from memory, side by side, at each batch size. Every streaming window
    takes a fresh input pipeline and one untimed loop to start it (see
    ``OurLoop.fresh_iterator``), so it is charged for reading all it trains on.

    ``prebatched_dir``: a third contender, the same loop streaming from pre-batched copies of
    the files (``training.input_snapshot_dir`` there), written before the windows.

    Each batch size's ``cpu``: per contender, each window's :func:`metered` CPU use (its
    ``measure`` part: the streaming windows' start-up is not in it)."""
    from fullthrottle.bench.measure import alternate

    out: dict[str, Any] = {}
    for batch_size in batch_sizes:
        streaming_config = dataclasses.replace(
            config, per_replica_batch_size=batch_size, cache=False
        )
        streaming = OurLoop(data, streaming_config)
        memory = OurLoop(data, streaming_config, source="memory", same_model_as=streaming)
        steps = max(streaming_config.steps_per_loop, window_examples // batch_size)
        warm = streaming_config.steps_per_loop
        streaming.measure(warm)
        memory.fill_cache()
        memory.measure(warm)

        cpu: dict[str, dict[str, list[float]]] = {}

        def streamed(
            loop: OurLoop = streaming,
            name: str = "streaming",
            warm: int = warm,
            steps: int = steps,
            cpu: dict[str, dict[str, list[float]]] = cpu,
        ) -> float:
            loop.fresh_iterator()
            loop.measure(warm)
            return metered(lambda: loop.measure(steps), cpu.setdefault(name, {}))

        contenders = {
            "streaming": streamed,
            "in_memory": lambda m=memory, n=steps, c=cpu: metered(
                lambda: m.measure(n), c.setdefault("in_memory", {})
            ),
        }
        if prebatched_dir is not None:
            prebatched_config = dataclasses.replace(
                streaming_config, input_snapshot_dir=prebatched_dir
            )
            write_prebatched_copies(data, prebatched_config)
            prebatched = OurLoop(data, prebatched_config, same_model_as=streaming)
            prebatched.measure(warm)
            contenders["prebatched"] = lambda loop=prebatched: streamed(loop, "prebatched")
        samples = alternate(contenders, repeats=repeats, side_by_side=("streaming", "in_memory"))
        out[str(batch_size)] = {"samples": samples, "window_steps": steps, "cpu": cpu}
    return out


# ---------------------------------------------------------------------------------- FLOPs
def training_flops_per_example(data: TrainingData, config: TrainingConfig) -> dict[str, float]:
    """Analytic matmul FLOPs per training example (2 FLOPs per multiply-add), as the model's own
    registry entry counts them (``ModelSpec.forward_flops``: every dense matmul of the model as
    built). Not counted (the usual MFU convention): embedding gathers, layer norm, softmax,
    GELU, dropout, the optimizer update. Training = 3 x forward (the backward pass computes two
    matmuls per forward matmul: gradients w.r.t. inputs and weights).
    """
    from trainer_module.training import MODELS

    name = config.resolved_model(data.model_inputs)
    forward = MODELS[name].forward_flops(data.model_inputs, config.model_options(name), config)
    return {"forward": forward, "training": 3 * forward}


class MatmulCeiling:
    """The machine's dense-matmul FLOP/s in ``dtype``: ``size`` x ``size`` square matmuls
    chained inside one ``tf.function`` (no Python between them); ``measure()`` times one chain.
    Built once, so it can be a contender alternated with the training windows."""

    def __init__(self, dtype: str, *, size: int = 2048, iterations: int = 10):
        self.dtype = (
            tf.bfloat16 if "bfloat16" in dtype else tf.float16 if "float16" in dtype else tf.float32
        )
        self.size, self.iterations = size, iterations
        a = tf.random.normal((size, size), dtype=tf.float32)
        self.a = tf.cast(a / size**0.5, self.dtype)
        a_ = self.a

        @tf.function
        def chain(x):
            for _ in tf.range(iterations):
                x = tf.matmul(x, a_)
            return x

        self._chain = chain
        chain(self.a).numpy()  # trace + warm

    def measure(self) -> float:
        start = time.perf_counter()
        self._chain(self.a).numpy()
        return 2 * self.size**3 * self.iterations / (time.perf_counter() - start)


def matmul_ceiling(
    dtype: str, *, size: int = 2048, iterations: int = 10, repeats: int = 5
) -> dict[str, Any]:
    """Measured dense-matmul FLOP/s of this machine in ``dtype`` (median of ``repeats`` chains)."""
    ceiling = MatmulCeiling(dtype, size=size, iterations=iterations)
    rates = [ceiling.measure() for _ in range(repeats)]
    return {
        "dtype": ceiling.dtype.name,
        "size": size,
        "flops_per_second": statistics.median(rates),
        "samples": rates,
    }


def compute_dtype(policy: str) -> str:
    return {"mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}.get(policy, "float32")


def trimmed_lengths(data: TrainingData, config: TrainingConfig, *, batches: int) -> dict[str, Any]:
    """Mean length of the text after ``TrimPadding`` over the first training batches (the
    first text column), and the full length: what trimming saves on this data."""
    from trainer_module.training import make_dataset
    from trainer_module.training.models.transformer import TrimPadding

    name, (_, full) = next(iter(data.model_inputs.text.items()))
    ds = make_dataset(
        data.train_files,
        data.feature_spec,
        data.model_inputs,
        config,
        batch_size=config.per_replica_batch_size,
        training=True,
        compression=data.compression,
    )
    trim = TrimPadding()
    lengths = [int(trim(features[name]).shape[1]) for features, _ in ds.take(batches)]
    return {
        "mean": statistics.mean(lengths),
        "min": min(lengths),
        "max": max(lengths),
        "full": full,
    }


# ---------------------------------------------------------------------------------- tracking
class _LoopTimer:
    """A training hook, listed first: time between the ends of loop 1 and the last loop, which
    covers every later loop plus the controller's work after each (the other hooks, the
    MLflow hook included, and checkpoints)."""

    def __init__(self):
        from trainer_module.training import TrainingHook

        timer = self
        self.ends: list[tuple[int, float]] = []

        class Hook(TrainingHook):
            def on_loop_end(self, step, metrics):
                timer.ends.append((step, time.perf_counter()))

        self.hook = Hook()

    def examples_per_second(self, global_batch: int) -> float:
        if len(self.ends) < 2:
            raise ValueError(
                f"the timed run ended after {len(self.ends)} loop(s); it needs at least 2 "
                "(train_steps >= 2 x training.steps_per_loop)"
            )
        (first_step, first), (last_step, last) = self.ends[0], self.ends[-1]
        return (last_step - first_step) * global_batch / (last - first)


def _train_kwargs(data: TrainingData, config: TrainingConfig) -> dict[str, Any]:
    """``train()``'s arguments for a timed run on `data` (no eval; the work dir and hooks are
    the caller's)."""
    return {
        "config": config,
        "model_inputs": data.model_inputs,
        "feature_spec": data.feature_spec,
        "train_files": data.train_files,
        "eval_files": (),
        "compression": data.compression,
    }


def tracking_rates(
    data: TrainingData, config: TrainingConfig, *, tracking_uri: str, repeats: int
) -> dict[str, Any]:
    """Examples/s of the real ``train()`` with the MLflow training hook on vs off, alternated
    (``fullthrottle.bench.tracked.train_tracked``: a fresh work dir and parent run each time)."""
    from fullthrottle.bench.measure import alternate
    from fullthrottle.bench.tracked import train_tracked

    base = _train_kwargs(data, config)
    reported: dict[str, list[float]] = {"off": [], "on": []}
    cpu: list[dict[str, float]] = []  # the "on" runs' tracking CPU time (hook.CpuMeter.span)

    def contender(name: str) -> Callable[[], float]:
        def run() -> float:
            timer = _LoopTimer()
            tracking: list[Any] = []
            _, result = train_tracked(
                {**base, "hooks": [timer.hook]},
                tracking_uri=tracking_uri if name == "on" else None,
                tracking_hooks=tracking,
            )
            reported[name].append(result.examples_per_second)
            span = tracking[0].cpu.span() if tracking else None
            if span is not None:
                cpu.append(span)
            return timer.examples_per_second(result.facts.global_batch_size)

        return run

    contender("off")()  # warm-up: imports, first tracing
    samples = alternate({"off": contender("off"), "on": contender("on")}, repeats=repeats)
    return {"samples": samples, "train_reported_examples_per_second": reported, "cpu": cpu}


def checkpoint_rates(data: TrainingData, config: TrainingConfig, *, repeats: int) -> dict[str, Any]:
    """Examples/s of the real ``train()`` (a fresh work dir each time, no eval) with periodic
    saves traced (``training.traced_checkpoint_saves``, the default) vs TF's eager save,
    alternated; plus the share of each run's training time after its first loop spent in
    periodic saves, and which save each run reported using (`RunFacts.checkpoint_saves`)."""
    from fullthrottle.bench.measure import alternate
    from fullthrottle.bench.tracked import train_tracked
    from trainer_module.training import TrainingHook

    share: dict[str, list[float]] = {"traced": [], "eager": []}
    saves: dict[str, set[str]] = {"traced": set(), "eager": set()}  # what train() reported using

    def contender(name: str) -> Callable[[], float]:
        class Saves(TrainingHook):
            def on_train_begin(self, facts):
                saves[name].add(facts.checkpoint_saves)

        def run() -> float:
            timer = _LoopTimer()
            traced = dataclasses.replace(config, traced_checkpoint_saves=name == "traced")
            _, result = train_tracked(  # no tracking: a fresh work dir, removed after
                {**_train_kwargs(data, traced), "hooks": [timer.hook, Saves()]},
                tracking_uri=None,
            )
            timed = result.history[1:]  # the loops the timer's window covers
            total = sum(r[metrics.WALL_TIME] + r[metrics.HOST_TIME] for r in timed)
            saving = sum(r[metrics.CHECKPOINT_TIME] for r in timed)
            share[name].append(saving / total if total else 0.0)
            return timer.examples_per_second(result.facts.global_batch_size)

        return run

    contender("eager")()  # warm-up: imports, first tracing
    samples = alternate(
        {"traced": contender("traced"), "eager": contender("eager")}, repeats=repeats
    )
    return {
        "samples": samples,
        "checkpoint_share": share,
        "saves": {name: sorted(kinds) for name, kinds in saves.items()},
    }
