"""Numerical equivalences of the distributed step (real TensorFlow, two logical CPU devices).

* 1 replica x batch 64 and 2 replicas x batch 32 see the same global batches (deterministic
  input order, seeded init, no dropout) and must follow the same loss trajectory.
* k=4 accumulated micro-batches of 16 must update the weights like one batch of 64.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.training_data import feature_spec, tabular_inputs, text_inputs, write_records
from trainer_module.training import TrainingConfig, train


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("equiv_data")
    inputs = tabular_inputs()
    return inputs, write_records(d / "train", inputs, files=2, per_file=256)


def _train(data, work_dir, **overrides):
    inputs, files = data
    base = dict(
        train_steps=20,
        steps_per_loop=2,
        checkpoint_every_steps=0,
        precision="float32",
        dropout_rate=0.0,
        models={"tabular": {"hidden_units": (32, 32)}},
        deterministic_input=True,
        learning_rate_scaling="none",
    )
    base.update(overrides)
    return train(
        config=TrainingConfig(**base),
        model_inputs=inputs,
        feature_spec=feature_spec(inputs),
        train_files=files,
        eval_files=[],
        work_dir=str(work_dir),
    )


def _max_weight_diff(a, b) -> float:
    wa, wb = a.model.get_weights(), b.model.get_weights()
    return max(float(np.max(np.abs(x - y))) for x, y in zip(wa, wb, strict=True))


def test_one_replica_vs_two_same_loss_trajectory(data, tmp_path):
    one = _train(data, tmp_path / "one", per_replica_batch_size=64)
    two = _train(data, tmp_path / "two", per_replica_batch_size=32, num_logical_cpu_devices=2)
    assert (one.facts.num_replicas, two.facts.num_replicas) == (1, 2)
    assert one.facts.strategy_name == "OneDeviceStrategy"
    assert two.facts.strategy_name == "MirroredStrategy"
    assert one.facts.global_batch_size == two.facts.global_batch_size == 64
    l1 = [r["loss"] for r in one.history]
    l2 = [r["loss"] for r in two.history]
    # Tolerance: rel 1e-4. The two runs do the same float32 math on the same examples; only the
    # summation order differs (two half-batch sums + an all-reduce instead of one sum), which
    # perturbs the loss at ~1e-7 relative per step; 20 Adam steps amplify that to ~1e-6. A real
    # error (wrong loss scaling, wrong data split, unsynced replicas) shows up at >= 1e-2.
    np.testing.assert_allclose(l2, l1, rtol=1e-4)
    assert _max_weight_diff(one, two) < 1e-4
    assert l1[-1] < l1[0]


@pytest.fixture(scope="module")
def text_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("equiv_text")
    inputs = text_inputs()
    return inputs, write_records(d / "train", inputs, files=2, per_file=256)


def test_fused_transformer_one_replica_vs_two_and_vs_unfused(text_data, tmp_path):
    """The fused XLA kernels (the training default) under MirroredStrategy: the same loss
    trajectory on 1 and 2 replicas, and the same as the plain Keras layers."""
    options = {"layers": 1, "d_model": 32, "heads": 4, "ffn_dim": 64, "hidden_units": (16,)}
    transformer = dict(model="transformer", models={"transformer": options})
    one = _train(text_data, tmp_path / "one", per_replica_batch_size=32, **transformer)
    two = _train(
        text_data,
        tmp_path / "two",
        per_replica_batch_size=16,
        num_logical_cpu_devices=2,
        **transformer,
    )
    plain = _train(
        text_data,
        tmp_path / "plain",
        per_replica_batch_size=32,
        model="transformer",
        models={"transformer": {**options, "fused_kernels": False}},
    )
    assert two.facts.strategy_name == "MirroredStrategy" and two.facts.num_replicas == 2
    l1, l2, lp = ([r["loss"] for r in run.history] for run in (one, two, plain))
    np.testing.assert_allclose(l2, l1, rtol=1e-4)
    np.testing.assert_allclose(lp, l1, rtol=1e-4)
    assert _max_weight_diff(one, two) < 1e-4 and _max_weight_diff(one, plain) < 1e-4
    assert l1[-1] < l1[0]


@pytest.mark.parametrize(
    "accumulated",
    [
        {"per_replica_batch_size": 16, "gradient_accumulation_steps": 4},
        {
            "per_replica_batch_size": 16,
            "gradient_accumulation_steps": 2,
            "num_logical_cpu_devices": 2,
        },
    ],
    ids=["1replica-k4", "2replicas-k2"],
)
def test_gradient_accumulation_equals_big_batch(data, tmp_path, accumulated):
    # SGD (not Adam): its update is proportional to the gradient, so a mis-scaled accumulated
    # gradient (sum instead of mean, or k times too small) changes the weights. Adam's first
    # steps are ~lr*sign(g) and would hide such a bug.
    common = dict(optimizer="sgd", learning_rate=0.05, train_steps=3, steps_per_loop=3)
    big = _train(data, tmp_path / "big", per_replica_batch_size=64, **common)
    acc = _train(data, tmp_path / "acc", **accumulated, **common)
    assert big.facts.global_batch_size == acc.facts.global_batch_size == 64
    assert acc.facts.gradient_accumulation_steps == accumulated["gradient_accumulation_steps"]
    # Tolerance: 1e-5 absolute on weights of size ~0.1: float32 summation-order differences
    # only (k partial means vs one mean). A wrong scale would differ by ~lr*|g| ~ 1e-2.
    assert _max_weight_diff(big, acc) < 1e-5
    assert acc.final_loss == pytest.approx(big.final_loss, rel=1e-5)
    assert (
        _max_weight_diff(
            big,
            _train(
                data,
                tmp_path / "one_step",
                per_replica_batch_size=64,
                optimizer="sgd",
                learning_rate=0.05,
                train_steps=1,
                steps_per_loop=1,
            ),
        )
        > 1e-3
    )  # the check is sensitive
