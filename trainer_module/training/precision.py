"""Numeric precision: which Keras dtype policy to train with, and what it implies.

This module is the ONE place that maps a policy name to Keras objects: the layer dtype policy
(:func:`dtype_policy`) and the loss-scaling optimizer wrapper (:func:`wrap_optimizer`). The
training step never asks which policy is active; it only calls ``optimizer.scale_loss`` and
``optimizer.apply``, which are identity-scaling for every policy except float16.

No global Keras state is touched: policies are passed to layers explicitly, so building the
float32 serving twin of a mixed-precision model in the same process cannot be contaminated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import keras

from trainer_module.training.hardware import BF16_CPU_FLAGS, CPUINFO, device_facts

if TYPE_CHECKING:
    from trainer_module.training.config import TrainingConfig


def resolve_precision_policy(
    config: TrainingConfig, *, cpuinfo_path: str = CPUINFO
) -> tuple[str, str]:
    """Return (policy_name, human-readable reason).

    auto: mixed_float16 when every GPU has compute capability >= 7.0 (tensor cores); else, with
    no GPU, mixed_bfloat16 when the CPU has AVX512_BF16 or AMX-BF16 (oneDNN runs bf16 matmuls
    natively there); otherwise float32 (bf16 emulation on older CPUs is slower than float32).
    """
    if config.precision != "auto":
        return config.precision, f"set in config (precision={config.precision!r})"
    device = device_facts(cpuinfo_path)
    if device.has_gpu:
        lowest = min(device.gpu_compute_capabilities)
        if device.gpu_float16:
            return "mixed_float16", f"GPU compute capability {lowest} >= 7.0 (tensor cores)"
        return "float32", f"GPU compute capability {lowest} < 7.0 (no tensor cores)"
    found = [flag for flag in BF16_CPU_FLAGS if flag in device.cpu_flags]
    if found:
        return "mixed_bfloat16", f"CPU has native bf16 ({', '.join(found)})"
    return "float32", "no GPU and no CPU bf16 support (avx512_bf16/amx_bf16)"


def dtype_policy(name: str) -> keras.DTypePolicy:
    """The Keras dtype policy for ``name`` ("float32", "mixed_bfloat16", "mixed_float16")."""
    return keras.DTypePolicy(name)


def wrap_optimizer(
    optimizer: keras.optimizers.Optimizer, policy_name: str, config: TrainingConfig
) -> keras.optimizers.Optimizer:
    """float16 needs dynamic loss scaling (its 5-bit exponent underflows small gradients);
    bfloat16 has float32's exponent range and float32 needs nothing, so they are left alone.

    Keras 3's ``LossScaleOptimizer`` skips the update (and halves the scale) when any gradient
    is non-finite, and doubles the scale after ``loss_scale_growth_steps`` finite steps.
    """
    if policy_name == "mixed_float16":
        return keras.optimizers.LossScaleOptimizer(
            optimizer,
            initial_scale=config.loss_scale_initial,
            dynamic_growth_steps=config.loss_scale_growth_steps,
        )
    return optimizer


def loss_scale_variable(optimizer: keras.optimizers.Optimizer):
    """The dynamic loss-scale variable, or None for optimizers that do not scale the loss."""
    return getattr(optimizer, "dynamic_scale", None)
