"""The inner loop: N training steps inside ONE ``tf.function`` call, and the eval pass.

Owns: the replica step (forward, loss, gradients, optional k-micro-batch accumulation, one
optimizer update), the N-step loop over a tensor count, the per-loop counters (input wait,
loss sum, first non-finite step). Refuses: nothing; it never touches files, clocks on the host,
checkpoints or hooks (that is the controller's job).

Why N steps per call: each host->device call of a tf.function costs tens of microseconds plus a
host sync when results are read; a loop over ``tf.range(n)`` inside the function keeps the
device busy and reads results once per loop. ``n`` is a tensor argument, so a short last loop
(or a checkpoint boundary) does not retrace.
"""

from __future__ import annotations

import time

import keras
import tensorflow as tf
from tensorflow.python.framework import config as _tf_config

from trainer_module.training.config import BatchSizes, TrainingConfig


def _op_determinism_enabled() -> bool:
    # No public getter exists (only enable_op_determinism); this is what TF itself consults.
    getter = getattr(_tf_config, "is_op_determinism_enabled", None)
    return bool(getter()) if getter else False


def _local_tensors(strategy: tf.distribute.Strategy, structure) -> list[tf.Tensor]:
    """Every component tensor of a (possibly per-replica) nested structure, for control deps."""
    out = []
    for value in tf.nest.flatten(structure):
        out.extend(strategy.experimental_local_results(value))
    return out


class TrainLoop:
    """Compiled training/eval loops for one (strategy, model, optimizer) triple.

    Create it (outside ``strategy.scope()``) once model and optimizer exist and the optimizer
    is built (its variables are read as the step's completion signal); it makes
    its own ``step`` variable in the scope (checkpointed by the controller) and host-side
    counters outside it (per-loop scratch, not checkpointed).
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        model: keras.Model,
        optimizer: keras.optimizers.Optimizer,
        config: TrainingConfig,
        batch: BatchSizes,
        *,
        regression: bool = False,
    ):
        self.strategy = strategy
        # The model answers one number per example (``ModelInputs.task``): squared-error (or
        # Huber) loss, and MAE/RMSE sums in the eval pass instead of the count correct.
        self.regression = regression
        self.model = model
        self.optimizer = optimizer
        self.config = config
        self.batch = batch
        self.input_names = tuple(model.input.keys()) if isinstance(model.input, dict) else None
        with strategy.scope():
            # Steps attempted (incl. float16 steps the loss scaler skipped); the optimizer's own
            # `iterations` counts applied updates only. Both are checkpointed.
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        # Per-loop scratch counters, local to this worker (never checkpointed or mirrored).
        self.input_wait = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.loss_sum = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.last_loss = tf.Variable(0.0, dtype=tf.float32, trainable=False)
        self.steps_run = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.bad_step = tf.Variable(-1, dtype=tf.int64, trainable=False)

        # The device clock (tf.timestamp) is refused under op determinism, so deterministic runs
        # read the host's monotonic clock through py_function (a few tens of us per call; the
        # control dependencies below order it exactly like the device stamp).
        self._host_clock = config.deterministic or _op_determinism_enabled()

        self._updated_variables = list(model.trainable_variables) + list(optimizer.variables)

        grads_fn = self._gradients
        if config.jit_compile:
            # Only forward+backward is XLA-compiled: the optimizer update all-reduces through
            # the strategy (merge_call), which cannot live inside an XLA cluster.
            grads_fn = tf.function(grads_fn, jit_compile=True, reduce_retracing=True)
        self._grads_fn = grads_fn
        if config.run_eagerly:
            self.train_loop = self._train_loop
            self.eval_loop = self._eval_loop
        else:
            self.train_loop = tf.function(self._train_loop)
            self.eval_loop = tf.function(self._eval_loop)

    # ----------------------------------------------------------------------- replica step
    def _features(self, features):
        if self.input_names is None:
            return features
        return {k: features[k] for k in self.input_names}

    def _micro_gradients(self, features, labels):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            outputs = self.model(self._features(features), training=True)
            per_example = self._per_example_loss(labels, outputs)
            # Average over the GLOBAL batch (replicas x micro-batches x per-replica batch), not
            # over this replica's micro-batch: the optimizer SUMs gradients across replicas and
            # we SUM across micro-batches, so every example ends up weighted 1/global_batch and
            # the update is the mean gradient of the global batch however it was split.
            loss = tf.nn.compute_average_loss(
                per_example, global_batch_size=self.batch.global_batch
            )
            # Identity for float32/bf16; multiplies by the dynamic scale under float16.
            scaled = self.optimizer.scale_loss(loss)
        # Densify embedding gradients (IndexedSlices): Keras optimizers apply sparse and dense
        # gradients with different arithmetic (Adam's moments differ for repeated ids), and
        # MirroredStrategy's all-reduce turns slices into other slices, so keeping them sparse
        # made 1-replica and 2-replica runs diverge. Dense = one topology-independent update.
        grads = [
            None if g is None else tf.convert_to_tensor(g) for g in tape.gradient(scaled, variables)
        ]
        return grads, loss

    def _per_example_loss(self, labels, outputs):
        """Cross-entropy of the class probabilities, or the regression loss of the number."""
        if not self.regression:
            return keras.losses.sparse_categorical_crossentropy(labels, outputs)
        predictions = tf.reshape(tf.cast(outputs, tf.float32), [-1])
        error = predictions - tf.cast(labels, tf.float32)
        if self.config.regression_loss == "huber":
            delta = self.config.huber_delta
            small = tf.abs(error) <= delta
            return tf.where(small, 0.5 * tf.square(error), delta * (tf.abs(error) - 0.5 * delta))
        return tf.square(error)

    def _gradients(self, features, labels):
        """Gradients (loss-scaled, summed over k micro-batches) and this replica's loss share."""
        k = self.batch.accumulation_steps
        if k == 1:
            return self._micro_gradients(features, labels)
        b = self.batch.per_replica
        acc = [tf.zeros(v.shape, tf.float32) for v in self.model.trainable_variables]
        total = tf.constant(0.0, tf.float32)
        # A graph loop (not Python unrolling): graph size stays constant in k.
        for i in tf.range(k):

            def micro(t, i=i):
                return t[i * b : (i + 1) * b]

            grads, loss = self._micro_gradients(
                tf.nest.map_structure(micro, features), micro(labels)
            )
            acc = [a + g for a, g in zip(acc, grads, strict=True)]
            total += loss
        return acc, total

    def _replica_step(self, features, labels):
        grads, loss = self._grads_fn(features, labels)
        if self.strategy.num_replicas_in_sync > 1:
            # All replicas must agree whether this step's gradients are finite. The optimizer
            # all-reduces grads itself, but Keras' LossScaleOptimizer decides "skip or apply"
            # on the local, pre-reduction grads: with merge_call it takes replica 0's verdict
            # (an Inf on replica 1 would then be applied), without merge_call (multi-worker)
            # replicas could take different branches and hang in the all-reduce. One scalar
            # all-reduce makes the verdict global; a non-finite step becomes NaN everywhere.
            local_ok = tf.reduce_all(
                [tf.reduce_all(tf.math.is_finite(g)) for g in grads if g is not None]
            )
            bad = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, 1.0 - tf.cast(local_ok, tf.float32)
            )
            grads = [
                None if g is None else tf.where(bad < 0.5, g, tf.fill(tf.shape(g), float("nan")))
                for g in grads
            ]
        self.optimizer.apply(grads, self.model.trainable_variables)
        # Make the returned loss a completion signal for the WHOLE update: automatic control
        # dependencies only order ops on the same resource, so we read every variable the
        # update wrote (weights, optimizer slots, iterations, loss scale) after `apply`.
        # Reading only `iterations` let the weight/slot updates spill past the step's end stamp
        # into the next step's input-wait interval (measured: ~1 ms of a 3 ms step).
        done = [tf.convert_to_tensor(v) for v in self._updated_variables]
        with tf.control_dependencies(done):
            return tf.identity(loss)

    # ----------------------------------------------------------------------- N-step loop
    def _now(self):
        if self._host_clock:
            return tf.py_function(time.perf_counter, [], tf.float64)
        return tf.timestamp()

    def _train_loop(self, iterator, num_steps):
        """Run ``num_steps`` steps; stops early at the first non-finite loss (``bad_step``).

        Input wait is measured on the device timeline: a timestamp when the previous step has
        finished (control-dependent on its loss), then get_next, then a timestamp that depends
        on every tensor of the batch. So the interval is exactly the time this loop was blocked
        on the input pipeline, and steps never overlap it (the next get_next waits on the
        previous step's end stamp).
        """
        self.input_wait.assign(0.0)
        self.loss_sum.assign(0.0)
        self.steps_run.assign(0)
        self.bad_step.assign(-1)
        prev_end = self._now()
        for _ in tf.range(num_steps):
            with tf.control_dependencies([prev_end]):
                features, labels = next(iterator)
            with tf.control_dependencies(_local_tensors(self.strategy, (features, labels))):
                got = self._now()
            per_replica = self.strategy.run(self._replica_step, args=(features, labels))
            # Replicas hold loss shares of the global mean (see compute_average_loss): SUM.
            loss = self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
            step = self.step.assign_add(1)
            self.input_wait.assign_add(got - prev_end)
            self.loss_sum.assign_add(tf.cast(loss, tf.float64))
            self.last_loss.assign(loss)
            self.steps_run.assign_add(1)
            with tf.control_dependencies([loss, step]):
                prev_end = self._now()
            if not tf.math.is_finite(loss):
                self.bad_step.assign(step)
                break
        return self.steps_run.read_value()

    # ----------------------------------------------------------------------- eval
    def _eval_replica(self, features, labels):
        """Sums over the batch: loss, then (classification) the count correct and 0, or
        (regression) the absolute and the squared errors; then the example count."""
        outputs = self.model(self._features(features), training=False)
        per_example = tf.cast(self._per_example_loss(labels, outputs), tf.float32)
        n = tf.cast(tf.shape(labels)[0], tf.float32)
        if self.regression:
            error = tf.reshape(tf.cast(outputs, tf.float32), [-1]) - tf.cast(labels, tf.float32)
            absolute, squared = tf.reduce_sum(tf.abs(error)), tf.reduce_sum(tf.square(error))
            return tf.reduce_sum(per_example), absolute, squared, n
        correct = tf.cast(
            tf.equal(tf.argmax(outputs, axis=-1), tf.cast(labels, tf.int64)), "float32"
        )
        return tf.reduce_sum(per_example), tf.reduce_sum(correct), tf.constant(0.0), n

    def _eval_loop(self, iterator, max_steps):
        """Sum the ``_eval_replica`` sums over at most ``max_steps`` batches or until the data
        ends: (loss, correct or absolute error, 0 or squared error, count).

        ``get_next_as_optional`` (not a Python StopIteration) ends the loop inside the graph;
        under multi-worker it agrees across workers, so a worker whose shard ran out early
        keeps stepping with empty batches instead of hanging the others.
        """
        loss_sum = tf.constant(0.0)
        first = tf.constant(0.0)
        second = tf.constant(0.0)
        count = tf.constant(0.0)
        # A counted `while` rather than tf.range: max_steps may be "unbounded" (2**62), which
        # tf.range would materialise when run eagerly.
        i = tf.constant(0, tf.int64)
        while i < max_steps:
            i += 1
            optional = iterator.get_next_as_optional()
            if not optional.has_value():
                break
            features, labels = optional.get_value()
            out = self.strategy.run(self._eval_replica, args=(features, labels))
            s, a, b, n = (
                self.strategy.reduce(tf.distribute.ReduceOp.SUM, v, axis=None) for v in out
            )
            loss_sum += s
            first += a
            second += b
            count += n
        return loss_sum, first, second, count
