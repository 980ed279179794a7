"""Refusals and resolution rules that need no training: config validation (errors name the
field), batch arithmetic against the replica count, the precision `auto` rule, TF_CONFIG
parsing, strategy selection and the model builders' contracts."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tests.training_data import feature_spec, tabular_inputs, text_inputs
from trainer_module.training import (
    ConfigError,
    InputDataError,
    ModelInputs,
    TrainingConfig,
    build_model,
    cluster_info,
    create_strategy,
    distribute_input,
    make_dataset,
    make_distributed_dataset,
    resolve_batch_sizes,
    resolve_precision_policy,
    scaled_learning_rate,
    train,
    validate_feature_spec,
)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"per_replica_batch_size": -4}, "per_replica_batch_size"),
        ({"per_replica_batch_size": 0}, "per_replica_batch_size"),
        ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps"),
        ({"train_steps": -1}, "train_steps"),
        ({"steps_per_loop": 0}, "steps_per_loop"),
        ({"eval_steps": 0}, "eval_steps"),
        ({"learning_rate": -1.0}, "learning_rate"),
        ({"learning_rate": float("nan")}, "learning_rate"),
        ({"warmup_steps": -3}, "warmup_steps"),
        ({"precision": "float8"}, "precision"),
        ({"precision": "mixed_float32"}, "precision"),
        ({"strategy": "tpu"}, "strategy"),
        ({"model": "resnet"}, "model"),
        ({"optimizer": "lion"}, "optimizer"),
        ({"learning_rate_scaling": "sqrt"}, "learning_rate_scaling"),
        ({"dropout_rate": 1.0}, "dropout_rate"),
        ({"models": {"tabular": {"hidden_units": ()}}}, "models.tabular.hidden_units"),
        (
            {"models": {"transformer": {"d_model": 30, "heads": 4}}},
            "models.transformer.d_model",
        ),
        ({"models": {"transformer": {"layers": 0}}}, "models.transformer.layers"),
        ({"models": {"transformer": {"pooling": "max"}}}, "models.transformer.pooling"),
        ({"models": {"transformer": {"fused_kernels": "yes"}}}, "models.transformer.fused_kernels"),
        ({"models": {"transformr": {}}}, "models.transformr"),
        ({"models": {"transformer": {"layerz": 2}}}, "models.transformer.layerz"),
        ({"profile_steps": (5, 5)}, "profile_steps"),
        ({"checkpoint_every_seconds": 0}, "checkpoint_every_seconds"),
        ({"shuffle_buffer_size": -1}, "shuffle_buffer_size"),
        ({"num_parallel_calls": 0}, "num_parallel_calls"),
        ({"global_batch_size": 10, "gradient_accumulation_steps": 4}, "global_batch_size"),
        (
            {
                "global_batch_size": 12,
                "gradient_accumulation_steps": 2,
                "num_logical_cpu_devices": 4,
            },
            "global_batch_size",
        ),
        ({"per_replica_batch_size": 2.5}, "per_replica_batch_size"),
    ],
)
def test_bad_config_names_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=f"`{field}`") as info:
        TrainingConfig(**kwargs)
    assert isinstance(info.value, ValueError)


def test_bad_config_message_shows_value():
    with pytest.raises(ConfigError, match=r"`per_replica_batch_size` must be > 0, got -4"):
        TrainingConfig(per_replica_batch_size=-4)


def test_batch_arithmetic_and_lr_scaling():
    c = TrainingConfig(per_replica_batch_size=16, gradient_accumulation_steps=4)
    b = resolve_batch_sizes(c, num_replicas=2)
    assert (b.per_replica, b.per_replica_step, b.global_batch) == (16, 64, 128)
    assert scaled_learning_rate(c, b.global_batch) == pytest.approx(1e-3 * 128 / 64)
    assert scaled_learning_rate(
        TrainingConfig(learning_rate_scaling="none"), b.global_batch
    ) == pytest.approx(1e-3)
    g = resolve_batch_sizes(TrainingConfig(global_batch_size=96, gradient_accumulation_steps=2), 3)
    assert (g.per_replica, g.global_batch) == (16, 96)
    # A global batch that does not split over the replicas (x accumulation) is refused.
    with pytest.raises(ConfigError, match="`global_batch_size`.*replicas \\(2\\)"):
        resolve_batch_sizes(TrainingConfig(global_batch_size=3), num_replicas=2)
    with pytest.raises(ConfigError, match="`global_batch_size`"):
        resolve_batch_sizes(
            TrainingConfig(global_batch_size=8, gradient_accumulation_steps=4), num_replicas=4
        )


def test_global_batch_not_fitting_replicas_fails_in_train(tmp_path):
    inputs = tabular_inputs()
    with pytest.raises(ConfigError, match="`global_batch_size`"):
        train(
            config=TrainingConfig(
                global_batch_size=9, strategy="mirrored", num_logical_cpu_devices=2
            ),
            model_inputs=inputs,
            feature_spec=feature_spec(inputs),
            train_files=[str(tmp_path / "none.gz")],
            eval_files=[],
            work_dir=str(tmp_path),
        )


def test_model_inputs_validation():
    with pytest.raises(ConfigError, match="`num_classes`"):
        ModelInputs(numeric=("a",), num_classes=1)
    with pytest.raises(ConfigError, match="unique"):
        ModelInputs(numeric=("a",), categorical={"a": 3})
    with pytest.raises(ConfigError, match="`label`"):
        ModelInputs(numeric=("label",))
    with pytest.raises(ConfigError, match=r"`text\['t'\]`"):
        ModelInputs(text={"t": (100, 0)})
    with pytest.raises(ConfigError, match="`model` is 'transformer'"):
        TrainingConfig(model="transformer").resolved_model(tabular_inputs())
    assert TrainingConfig().resolved_model(text_inputs()) == "transformer"
    assert TrainingConfig().resolved_model(tabular_inputs()) == "tabular"


def test_feature_spec_validation():
    inputs = text_inputs()
    spec = feature_spec(inputs)
    validate_feature_spec(spec, inputs)
    bad = dict(spec, tokens=tf.io.FixedLenFeature([4], tf.int64))
    with pytest.raises(InputDataError, match="'tokens' must be int64 of shape \\[8\\]"):
        validate_feature_spec(bad, inputs)
    bad = dict(spec, x0=tf.io.FixedLenFeature([], tf.int64))
    with pytest.raises(InputDataError, match="'x0' must be float32"):
        validate_feature_spec(bad, inputs)
    del spec["label"]
    with pytest.raises(InputDataError, match="'label'"):
        validate_feature_spec(spec, inputs)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("fpu sse avx2 avx512f", "float32"),
        ("fpu sse avx2 avx512f avx512_bf16", "mixed_bfloat16"),
        ("fpu amx_tile amx_bf16", "mixed_bfloat16"),
    ],
)
def test_auto_precision_reads_cpu_flags(tmp_path, flags, expected):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n"
    )
    name, reason = resolve_precision_policy(TrainingConfig(), cpuinfo_path=str(cpuinfo))
    assert name == expected and reason
    # An explicit policy always wins.
    assert (
        resolve_precision_policy(
            TrainingConfig(precision="mixed_float16"), cpuinfo_path=str(cpuinfo)
        )[0]
        == "mixed_float16"
    )


def test_tf_config_parsing(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert cluster_info().num_workers == 1 and cluster_info().is_chief
    cluster = {"chief": ["h:1"], "worker": ["h:2", "h:3"], "evaluator": ["h:4"]}
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}})
    )
    info = cluster_info()
    assert (info.num_workers, info.is_chief, info.worker_index) == (3, True, 0)
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}})
    )
    info = cluster_info()
    assert (info.num_workers, info.is_chief, info.worker_index) == (3, False, 2)
    # No chief task: worker 0 is the chief (TensorFlow's convention).
    cluster = {"worker": ["h:1", "h:2"]}
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
    )
    assert cluster_info().is_chief
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ConfigError, match="TF_CONFIG"):
        cluster_info()


def test_strategy_selection(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert isinstance(create_strategy(TrainingConfig()), tf.distribute.OneDeviceStrategy)
    mirrored = create_strategy(TrainingConfig(num_logical_cpu_devices=2))
    assert isinstance(mirrored, tf.distribute.MirroredStrategy)
    assert mirrored.num_replicas_in_sync == 2
    # conftest made exactly two logical CPUs and TF is initialised: 3 cannot be honoured.
    with pytest.raises(ConfigError, match="`num_logical_cpu_devices` is 3"):
        create_strategy(TrainingConfig(num_logical_cpu_devices=3))
    with pytest.raises(ConfigError, match="`strategy` is 'multi_worker'"):
        create_strategy(TrainingConfig(strategy="multi_worker"))
    with pytest.raises(ConfigError, match="`num_logical_cpu_devices`"):
        create_strategy(TrainingConfig(strategy="one_device", num_logical_cpu_devices=2))


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16", "mixed_float16"])
def test_models_output_float32_probabilities(policy):
    config = TrainingConfig(
        models={"transformer": {"layers": 1, "d_model": 16, "heads": 2, "ffn_dim": 16}}
    )
    for inputs in (tabular_inputs(), text_inputs()):
        model = build_model(inputs, config, policy)
        batch = {
            "x0": np.ones(3, np.float32),
            "x1": np.ones(3, np.float32),
            "x2": np.ones(3, np.float32),
            "cat": np.array([0, 1, 4]),
            "tokens": np.array([[1, 2, 0, 0, 0, 0, 0, 0]] * 3),
        }
        probs = model({k: batch[k] for k in model.input}, training=False)
        assert probs.dtype == tf.float32 and tuple(probs.shape) == (3, 3)
        np.testing.assert_allclose(np.sum(probs, -1), 1.0, rtol=1e-3)
        compute = {layer.dtype_policy.compute_dtype for layer in model.layers[:-1]}
        assert policy.removeprefix("mixed_") in compute


def test_transformer_ignores_padding():
    # Padding (id 0) is masked out of attention keys and of the mean pooling, so whatever the
    # padding embedding holds cannot reach the output; a real token can.
    config = TrainingConfig(
        models={"transformer": {"layers": 1, "d_model": 16, "heads": 2}}, dropout_rate=0.0
    )
    inputs = ModelInputs(text={"t": (20, 6)}, num_classes=2)
    model = build_model(inputs, config)
    ids = np.array([[5, 6, 0, 0, 0, 0], [7, 0, 0, 0, 0, 0]])
    before = model({"t": ids}).numpy()
    table = model.get_layer("tok_t")
    (emb,) = table.get_weights()
    emb[0] = np.random.default_rng(0).normal(scale=10.0, size=emb.shape[1])
    table.set_weights([emb])
    np.testing.assert_allclose(model({"t": ids}).numpy(), before, rtol=1e-5, atol=1e-6)
    emb[5] = np.random.default_rng(1).normal(scale=10.0, size=emb.shape[1])
    table.set_weights([emb])
    assert not np.allclose(model({"t": ids}).numpy()[0], before[0], atol=1e-4)


def test_byte_dropout_keeps_the_expectation_and_is_identity_at_inference():
    from trainer_module.training.models.transformer import ByteDropout

    layer = ByteDropout(0.1)
    # The rate is quantized to 1/256: 0.1 -> 26/256; kept values scaled by 256/230.
    assert layer.threshold == 26
    x = tf.ones([500, 400])
    first = layer(x, training=True).numpy()
    second = layer(x, training=True).numpy()
    dropped = float((first == 0).mean())
    assert abs(dropped - 26 / 256) < 0.005, dropped  # 200k draws: sd ~0.0007
    assert abs(float(first.mean()) - 1.0) < 0.01
    np.testing.assert_allclose(first[first != 0], 256 / 230, rtol=1e-6)
    assert not np.array_equal(first == 0, second == 0)  # a fresh mask every call
    np.testing.assert_array_equal(layer(x, training=False).numpy(), x.numpy())
    assert ByteDropout(0.0)(x, training=True) is x


def test_transformer_dropouts_are_byte_dropouts_with_checkpointed_state():
    from trainer_module.training.models.transformer import ByteDropout

    config = TrainingConfig(
        models={"transformer": {"layers": 1, "d_model": 16, "heads": 2, "ffn_dim": 16}}
    )
    model = build_model(text_inputs(), config, "mixed_bfloat16")
    block = model.get_layer("block0_tokens")
    assert isinstance(block.mha._dropout_layer, ByteDropout)  # attention-probability dropout
    assert isinstance(block.drop, ByteDropout)
    ids = {"x0": np.zeros(4, np.float32), "tokens": np.ones((4, 8), np.int64)}
    a, b = (model(ids, training=True).numpy() for _ in range(2))
    assert not np.allclose(a, b)  # dropout active in training
    np.testing.assert_array_equal(model(ids).numpy(), model(ids).numpy())
    # The controller checkpoints every `seed_generator_state` (resume replays the same masks).
    states = [v for v in model.non_trainable_variables if "seed_generator_state" in v.path]
    used = [block.mha._dropout_layer.seed_generator.state, block.drop.seed_generator.state]
    assert all(any(s is u for s in states) for u in used)


def test_cache_auto_rule_and_config_values(tmp_path):
    from trainer_module.training.inputs import CACHE_AUTO_EXPANSION, resolve_cache

    path = tmp_path / "f.gz"
    path.write_bytes(b"x" * 1000)
    assert resolve_cache(TrainingConfig(cache=False), [str(path)])[0] is False
    assert resolve_cache(TrainingConfig(cache=True), [str(path)])[0] is True
    cached, why = resolve_cache(TrainingConfig(), [str(path)])
    assert cached and f"x {CACHE_AUTO_EXPANSION}" in why
    assert resolve_cache(TrainingConfig(), [str(tmp_path / "missing.gz")])[0] is False
    with pytest.raises(ConfigError, match="`cache` must be true, false or 'auto'"):
        TrainingConfig(cache="yes")


def test_cached_input_reshuffles_every_epoch_and_batches_across_epochs(tmp_path):
    from tests.training_data import write_records
    from trainer_module.training import make_dataset

    inputs = tabular_inputs()
    files = write_records(tmp_path / "d", inputs, files=2, per_file=50)  # 100 rows
    spec = feature_spec(inputs)

    def epochs(batch_size, n_batches, **overrides):
        config = TrainingConfig(cache=True, **overrides)
        ds = make_dataset(files, spec, inputs, config, batch_size=batch_size, training=True)
        rows = [f["x0"].numpy() for f, _ in ds.take(n_batches)]
        return np.concatenate(rows)

    stream = epochs(30, 10)  # 300 rows = 3 epochs; batches straddle the epoch boundaries
    first, second = stream[:100], stream[100:200]
    assert len(set(first.tolist())) == 100 and set(first.tolist()) == set(second.tolist())
    assert not np.array_equal(first, second)  # a new permutation each epoch
    # Same seed -> same stream; 1 replica x 60 sees what 2 consecutive batches of 30 see.
    np.testing.assert_array_equal(epochs(60, 5), stream)
    # The uncached pipeline (no shuffle, so its first 100 rows are one epoch) reads the same rows.
    config = TrainingConfig(cache=False, shuffle_buffer_size=0, shuffle_files=False)
    plain = make_dataset(files, spec, inputs, config, batch_size=100, training=True)
    assert set(next(iter(plain))[0]["x0"].numpy().tolist()) == set(first.tolist())


def test_streaming_input_shuffles_rows_across_chunks_and_resumes_exactly(tmp_path, monkeypatch):
    """The streaming reader moves chunks, not records; its shuffle still mixes rows across
    chunks and files, reshuffles every pass, and a resumed pipeline (``skip_batches``) yields
    exactly the batches the uninterrupted one yields after them."""
    from tests.training_data import write_records
    from trainer_module.training import inputs as inputs_module
    from trainer_module.training import make_dataset

    monkeypatch.setattr(inputs_module, "STREAM_CHUNK_ROWS", 16)  # several chunks per tiny file
    inputs = tabular_inputs()
    files = write_records(tmp_path / "d", inputs, files=2, per_file=50)  # 100 rows
    spec = feature_spec(inputs)
    config = TrainingConfig(cache=False, shuffle_buffer_size=64, deterministic_input=True)

    def stream(n_batches, **kwargs):
        ds = make_dataset(files, spec, inputs, config, batch_size=10, training=True, **kwargs)
        return np.concatenate([f["x0"].numpy() for f, _ in ds.take(n_batches)])

    rows = stream(60)  # 600 rows: 6 passes over the files
    in_file_order = np.concatenate(
        [
            f["x0"].numpy()
            for f, _ in make_dataset(files, spec, inputs, config, batch_size=100, training=False)
        ]
    )
    assert set(rows[:300].tolist()) == set(in_file_order.tolist())  # every row is read
    position = {value: i for i, value in enumerate(in_file_order.tolist())}
    jumps = np.abs(np.diff([position[v] for v in rows.tolist()]))
    assert np.mean(jumps == 1) < 0.2, "neighbours in the stream are neighbours in the files"
    assert np.mean(jumps > 16) > 0.3, "rows are not mixed across chunks"
    assert not np.array_equal(rows[:64], rows[100:164])  # not the same order on every pass
    np.testing.assert_array_equal(stream(60), rows)  # seeded: the same stream again
    np.testing.assert_array_equal(stream(23, skip_batches=37), rows[370:])  # exact resume
    assert not np.array_equal(stream(10, seed_offset=5), rows[:100])  # "reseed" resume
    # A Transform output the model does not read is never parsed (here it is not even in the
    # records: parsing it would fail).
    extra = {**spec, "unused_xf": tf.io.FixedLenFeature([], tf.float32)}
    ds = make_dataset(files, extra, inputs, config, batch_size=10, training=True)
    np.testing.assert_array_equal(next(iter(ds))[0]["x0"].numpy(), rows[:10])


@pytest.mark.parametrize("kind", ["tabular", "text"])
def test_pre_batched_copies_are_written_once_and_replay_the_record_stream(
    tmp_path, monkeypatch, kind
):
    """``input_snapshot_dir``: each training file is copied once to one record per chunk; the
    copies give exactly the batches the records give (same chunks, same file shuffle, same
    windows), resume included, and are reused, not rewritten. New files get copies of their
    own; a killed write's leftover is never read."""
    from tests.training_data import write_records
    from trainer_module.training import inputs as inputs_module
    from trainer_module.training import make_dataset

    monkeypatch.setattr(inputs_module, "STREAM_CHUNK_ROWS", 16)
    inputs = tabular_inputs() if kind == "tabular" else text_inputs()
    files = write_records(tmp_path / "d", inputs, files=2, per_file=50)
    spec = feature_spec(inputs)
    copies = tmp_path / "copies"
    base = dict(cache=False, shuffle_buffer_size=64, deterministic_input=True)
    records_config = TrainingConfig(**base)
    config = TrainingConfig(**base, input_snapshot_dir=str(copies))
    (copies / "part-0-leftover.prebatched.gz.tmp-1-deadbeef").parent.mkdir()
    (copies / "part-0-leftover.prebatched.gz.tmp-1-deadbeef").write_bytes(b"half a write")

    def stream(cfg, n_batches, **kwargs):
        ds = make_dataset(files, spec, inputs, cfg, batch_size=10, training=True, **kwargs)
        batches = list(ds.take(n_batches))
        return {
            name: np.concatenate([f[name].numpy() for f, _ in batches]) for name in batches[0][0]
        } | {"label": np.concatenate([y.numpy() for _, y in batches])}

    first = stream(config, 40)  # 4 passes over 100 rows
    written = sorted(p for p in copies.iterdir() if p.name.endswith(".prebatched.gz"))
    assert [p.name for p in written] == sorted(
        os.path.basename(inputs_module.prebatched_path(str(copies), f, spec, compression="GZIP"))
        for f in files
    )
    # One record per chunk of 16 rows (50 rows: 16 + 16 + 16 + 2).
    for path in written:
        assert sum(1 for _ in tf.data.TFRecordDataset(str(path), "GZIP")) == 4
    from_records = stream(records_config, 40)
    assert first.keys() == from_records.keys()
    for name, values in from_records.items():
        np.testing.assert_array_equal(first[name], values, err_msg=name)
    if kind == "text":
        assert first["tokens"].shape[1:] == (spec["tokens"].shape[0],)
    _, counts = np.unique(first[next(iter(first))], axis=0, return_counts=True)
    assert counts.min() >= 2  # every row, pass after pass
    mtimes = [p.stat().st_mtime_ns for p in written]
    resumed = stream(config, 13, skip_batches=27)
    for name, values in resumed.items():
        np.testing.assert_array_equal(values, first[name][270:], err_msg=name)
    assert [p.stat().st_mtime_ns for p in written] == mtimes  # reused, not rewritten
    other = write_records(tmp_path / "e", inputs, files=2, per_file=50, seed=1)
    assert inputs_module.prebatched_path(
        str(copies), other[0], spec, compression="GZIP"
    ) != inputs_module.prebatched_path(str(copies), files[0], spec, compression="GZIP")
    with pytest.raises(ConfigError, match="`input_snapshot_dir` must be a folder path or None"):
        TrainingConfig(input_snapshot_dir="")


@pytest.mark.parametrize("files", [1, 4])
def test_pre_batched_copies_split_between_input_pipelines(tmp_path, monkeypatch, files):
    """Two input pipelines (two workers) on pre-batched copies: by file when there are files
    enough, else every other chunk of each file; either way each row goes to exactly one."""
    from tests.training_data import write_records
    from trainer_module.training import inputs as inputs_module
    from trainer_module.training import make_dataset

    monkeypatch.setattr(inputs_module, "STREAM_CHUNK_ROWS", 16)
    inputs = tabular_inputs()
    paths = write_records(tmp_path / "d", inputs, files=files, per_file=96 // files)
    spec = feature_spec(inputs)
    config = TrainingConfig(
        cache=False,
        shuffle_buffer_size=0,
        interleave_cycle_length=2,
        input_snapshot_dir=str(tmp_path / "copies"),
    )
    seen = []
    for pipeline in (0, 1):
        ds = make_dataset(
            paths,
            spec,
            inputs,
            config,
            batch_size=8,
            training=True,
            input_context=tf.distribute.InputContext(2, pipeline, 2),
        )
        # Half the rows per pipeline (48), two passes of them: the files are read two at a
        # time, so a third pass never starts before the first has been delivered.
        seen.append(set(np.concatenate([f["x0"].numpy() for f, _ in ds.take(12)])))
    assert len(seen[0]) == len(seen[1]) == 48
    assert not seen[0] & seen[1] and len(seen[0] | seen[1]) == 96


def test_cached_batches_are_sliced_by_get_next_with_the_next_permutation_prefetched(tmp_path):
    """Cached input has no final prefetch (a thread handing over slices of memory trained the
    tabular model at 0.94-0.96x); the next element's permutation is prefetched ahead of ``rebatch``.
    An explicit ``prefetch_buffer_size``, and streaming input, keep a final prefetch."""
    from tests.training_data import write_records

    inputs = tabular_inputs()
    files = write_records(tmp_path / "d", inputs, files=1, per_file=20)
    spec = feature_spec(inputs)

    def stages(**overrides):
        config = TrainingConfig(**overrides)
        ds = make_dataset(files, spec, inputs, config, batch_size=8, training=True)
        assert next(iter(ds))[0]["x0"].shape == (8,)  # it still yields batches
        names = []
        node = ds
        while node is not None:
            names.append(type(node).__name__.strip("_").removesuffix("Dataset"))
            node = getattr(node, "_input_dataset", None)
        return names, ds.options().experimental_optimization.inject_prefetch

    names, inject = stages(cache=True)
    cut = names.index("Rebatch")
    assert "Prefetch" not in names[:cut] and inject is False, names
    ahead = names[cut:].index("Prefetch") + cut  # the permutation of the cached table, ahead
    assert names[ahead + 1 : ahead + 3] == ["Map", "Zip"], names  # map(permuted) of enumerate
    names, _ = stages(cache=True, prefetch_buffer_size=2)
    assert names[0] == "Prefetch", names
    names, _ = stages(cache=False)
    assert names[0] == "Prefetch", names


def test_one_cpu_replica_iterates_its_dataset_without_tfs_distributed_iterator(
    tmp_path, monkeypatch
):
    """One CPU replica skips TF's multi-device iterator (measured ~110 us per step); the
    batches, and what ``strategy.run`` computes from them, are those of TF's iterator."""
    from tests.training_data import write_records

    monkeypatch.delenv("TF_CONFIG", raising=False)
    inputs = tabular_inputs()
    files = write_records(tmp_path / "d", inputs, files=2, per_file=50)
    spec = feature_spec(inputs)
    config = TrainingConfig(cache=True)
    contexts = []

    def dataset_fn(ctx):
        contexts.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        return make_dataset(files, spec, inputs, config, batch_size=16, training=True)

    @tf.function
    def summed(strategy, iterator):
        features, labels = next(iterator)
        out = strategy.run(
            lambda f, y: tf.reduce_sum(f["x0"]) + tf.cast(tf.reduce_sum(y), "float32"),
            args=(features, labels),
        )
        return strategy.reduce(tf.distribute.ReduceOp.SUM, out, axis=None)

    one_device = create_strategy(TrainingConfig())
    one_mirrored = create_strategy(TrainingConfig(strategy="mirrored"))
    for strategy in (one_device, one_mirrored):
        direct = distribute_input(strategy, dataset_fn)
        assert isinstance(direct, tf.data.Dataset), type(direct)
        assert contexts.pop() == (1, 0, 1)  # the context TF itself would have passed
        tfs = strategy.distribute_datasets_from_function(dataset_fn)
        assert not isinstance(tfs, tf.data.Dataset)
        ours_it, tfs_it = iter(direct), iter(tfs)
        for _ in range(8):  # 128 rows: past the first 100-row epoch
            np.testing.assert_allclose(
                summed(strategy, ours_it).numpy(), summed(strategy, tfs_it).numpy()
            )
    # Several replicas (and GPUs, multi-worker: not here) keep TF's distributed iterator.
    two = create_strategy(TrainingConfig(num_logical_cpu_devices=2))
    assert not isinstance(distribute_input(two, dataset_fn), tf.data.Dataset)
    train_ds = make_distributed_dataset(
        one_device, files, spec, inputs, config, per_replica_batch_size=16, training=True
    )
    assert isinstance(train_ds, tf.data.Dataset)
