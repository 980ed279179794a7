"""`fullthrottle gpu-check`: the acceptance run for a machine with NVIDIA GPUs (`make gpu-check`).

Trains the benchmark's Transformer (BERT-mini width, `fullthrottle.bench.workloads`) on
synthetic token data written to TFRecord files, through the real training library (`train()`:
input pipeline, compiled N-step loop, loss scaling), twice: on one GPU with `mixed_float16` and
XLA, then with MirroredStrategy over every visible GPU. Prints examples/s, the model FLOPs
utilisation (MFU) against a float16 matmul ceiling measured on this GPU in the same run, the
input-wait fraction and the steps the loss scaler skipped. Refuses, with the reason, when
TensorFlow sees no GPU. `--allow-cpu` runs the same path on the CPU (two logical devices for
the mirrored run): that tests the check itself; its numbers say nothing about a GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from fullthrottle.core import exit_status
from fullthrottle.core.errors import FullthrottleError
from trainer_module.training import metrics

NUM_CLASSES = 4
VOCAB_SIZE = 1000
EXAMPLES_IN_FILE = 4096
# Large enough to keep a data-centre GPU busy between launches (1.1 TFLOP per matmul); on the
# CPU (--allow-cpu only) a smaller one keeps the check short.
GPU_MATMUL_SIZE = 8192
CPU_MATMUL_SIZE = 1024
CEILING_REPEATS = 5


class GpuCheckError(FullthrottleError):
    """No GPU to check, or a check that could not run; the message says why and what to do."""


def register(sub: Any) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "gpu-check",
        help="acceptance run on NVIDIA GPUs: examples/s, MFU, input wait, loss-scale skips",
        description=(
            "Trains the benchmark Transformer on synthetic data for a few hundred steps with "
            "mixed_float16 and XLA on one GPU, then with MirroredStrategy over every visible "
            "GPU, and prints examples/s, MFU against a float16 matmul ceiling measured on this "
            "GPU in the same run, the input-wait fraction and the loss-scale skips. Exits with "
            "status 2 and the reason when TensorFlow sees no GPU."
        ),
        epilog=(
            "Examples:\n"
            "  fullthrottle gpu-check\n"
            "  fullthrottle gpu-check --steps 500 --json gpu-check.json\n"
            "  fullthrottle gpu-check --allow-cpu --steps 20 --per-replica-batch-size 8"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--steps", type=int, default=300, help="training steps per run (300)")
    parser.add_argument(
        "--per-replica-batch-size", type=int, default=64, help="examples per GPU and step (64)"
    )
    parser.add_argument("--sequence-length", type=int, default=128, help="tokens per example (128)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument(
        "--allow-cpu",
        action="store_true",
        help="run on the CPU when there is no GPU (tests the check itself, not a GPU)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    for name in ("steps", "per_replica_batch_size", "sequence_length"):
        if getattr(args, name) < 2:
            flag = "--" + name.replace("_", "-")
            raise GpuCheckError(f"`{flag}` must be >= 2, got {getattr(args, name)}")
    from trainer_module.training.hardware import tensorflow_gpus, what_to_do_without_gpu, why_no_gpu

    gpus = tensorflow_gpus()  # before any op: devices can still be configured
    if not gpus and not args.allow_cpu:
        raise GpuCheckError(
            f"TensorFlow sees no GPU, so there is nothing to check: {why_no_gpu()}. "
            f"{what_to_do_without_gpu()} (`fullthrottle gpu-check --allow-cpu` runs the check "
            "itself on the CPU.)"
        )
    results = check(
        gpus=gpus,
        steps=args.steps,
        per_replica_batch_size=args.per_replica_batch_size,
        sequence_length=args.sequence_length,
    )
    print(report(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return exit_status.SUCCESS


def check(
    *, gpus: list[Any], steps: int, per_replica_batch_size: int, sequence_length: int
) -> dict[str, Any]:
    """Both runs and the ceiling; returns what `report` prints (JSON-safe)."""
    import tensorflow as tf

    from fullthrottle.bench.trainer import MatmulCeiling, training_flops_per_example
    from fullthrottle.bench.workloads import TRANSFORMER_TRAINING, TrainingData
    from trainer_module.training import ModelInputs, train
    from trainer_module.training.strategy import enable_gpu_memory_growth, logical_cpu_devices

    enable_gpu_memory_growth()
    on_cpu = not gpus
    if on_cpu:
        logical_cpu_devices(2)  # the mirrored run's replicas; before any op
    replicas = len(gpus) if gpus else 2

    model_inputs = ModelInputs(
        text={"tokens": (VOCAB_SIZE, sequence_length)}, label="label", num_classes=NUM_CLASSES
    )
    feature_spec = {
        "tokens": tf.io.FixedLenFeature([sequence_length], tf.int64),
        "label": tf.io.FixedLenFeature([], tf.int64),
    }
    base = dataclasses.replace(
        TRANSFORMER_TRAINING,
        train_steps=steps,
        per_replica_batch_size=per_replica_batch_size,
        precision="mixed_float16",
        jit_compile=True,
        steps_per_loop=max(1, min(50, steps // 4)),
        checkpoint_every_steps=0,
    )
    with tempfile.TemporaryDirectory(prefix="fullthrottle-gpu-check-") as work:
        train_file = write_token_file(
            Path(work) / "train.tfrecord.gz", sequence_length=sequence_length
        )
        data = TrainingData(
            name="gpu-check",
            train_files=(train_file,),
            examples_uri="",
            feature_spec=feature_spec,
            schema=None,
            model_inputs=model_inputs,
        )
        flops_per_example = training_flops_per_example(data, base)["training"]
        size = CPU_MATMUL_SIZE if on_cpu else GPU_MATMUL_SIZE
        with tf.device("/cpu:0" if on_cpu else "/gpu:0"):
            ceiling = MatmulCeiling("float16", size=size)
            samples = [ceiling.measure() for _ in range(CEILING_REPEATS)]
        ceiling_flops = statistics.median(samples)

        runs = []
        for label, strategy, devices in (
            ("one GPU" if gpus else "one CPU device", "one_device", 1),
            (
                f"MirroredStrategy, {replicas} {'GPUs' if gpus else 'CPU devices'}",
                "mirrored",
                replicas,
            ),
        ):
            config = dataclasses.replace(
                base, strategy=strategy, num_logical_cpu_devices=2 if on_cpu and devices > 1 else 0
            )
            result = train(
                config=config,
                model_inputs=model_inputs,
                feature_spec=feature_spec,
                train_files=[train_file],
                eval_files=[],
                work_dir=str(Path(work) / strategy),
            )
            examples_per_second = float(result.examples_per_second)
            runs.append(
                {
                    "run": label,
                    "strategy": result.facts.strategy_name,
                    "replicas": int(result.facts.num_replicas),
                    "steps": int(result.steps_completed),
                    "global_batch_size": int(result.facts.global_batch_size),
                    metrics.EXAMPLES_PER_SECOND: examples_per_second,
                    metrics.MFU: examples_per_second
                    * flops_per_example
                    / (ceiling_flops * result.facts.num_replicas),
                    metrics.INPUT_WAIT_FRACTION: float(result.input_wait_fraction),
                    metrics.LOSS_SCALE_SKIPPED_STEPS: int(result.loss_scale_skipped_steps),
                    metrics.FINAL_LOSS: float(result.final_loss),
                    "precision": result.facts.precision_policy,
                }
            )
    build = tf.sysconfig.get_build_info()
    transformer = base.model_options("transformer")
    return {
        "device": "cpu" if on_cpu else "gpu",
        "gpus": [
            {"name": g.name, "model": g.device_name, "compute_capability": g.compute_capability}
            for g in gpus
        ],
        "tensorflow": tf.__version__,
        "cuda_build": build.get("cuda_version"),
        "cudnn_build": build.get("cudnn_version"),
        "model": {
            "layers": transformer.layers,
            "d_model": transformer.d_model,
            "heads": transformer.heads,
            "ffn": transformer.ffn_dim,
            "sequence_length": sequence_length,
            "per_replica_batch_size": per_replica_batch_size,
            "steps": steps,
            "training_flops_per_example": flops_per_example,
        },
        "matmul_ceiling": {
            "dtype": "float16",
            "size": size,
            "flops_per_second": ceiling_flops,
            "samples": samples,
        },
        "runs": runs,
    }


def write_token_file(path: Path, *, sequence_length: int) -> str:
    """Synthetic token sequences (id 0 pads each to its random length) with a label the model
    can learn: the bucket of the sequence's mean token id. GZIP TFRecords of tf.Examples, as
    Transform writes them."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    with tf.io.TFRecordWriter(str(path), options="GZIP") as writer:
        for _ in range(EXAMPLES_IN_FILE):
            length = int(rng.integers(sequence_length // 2, sequence_length + 1))
            tokens = np.zeros(sequence_length, dtype=np.int64)
            tokens[:length] = rng.integers(1, VOCAB_SIZE, size=length)
            label = min(NUM_CLASSES - 1, int(tokens[:length].mean() * NUM_CLASSES / VOCAB_SIZE))
            example = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "tokens": tf.train.Feature(int64_list=tf.train.Int64List(value=tokens)),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                    }
                )
            )
            writer.write(example.SerializeToString())
    return str(path)


def report(results: dict[str, Any]) -> str:
    gpus = results["gpus"]
    if gpus:
        models = sorted({g["model"] or g["name"] for g in gpus})
        caps = sorted({tuple(g["compute_capability"] or ()) for g in gpus})
        capability = ", ".join(".".join(map(str, c)) for c in caps if c)
        where = f"{len(gpus)} x {', '.join(models)}" + (
            f" (compute capability {capability})" if capability else ""
        )
    else:
        where = "the CPU (--allow-cpu: these numbers say nothing about a GPU)"
    model = results["model"]
    ceiling = results["matmul_ceiling"]
    lines = [
        f"fullthrottle gpu-check: on {where}",
        f"  TensorFlow {results['tensorflow']}, built for CUDA {results['cuda_build']}, "
        f"cuDNN {results['cudnn_build']}",
        f"  Transformer: {model['layers']} layers, d_model {model['d_model']}, "
        f"{model['heads']} heads, FFN {model['ffn']}, sequence {model['sequence_length']}, "
        f"{model['per_replica_batch_size']} examples per replica, {model['steps']} steps, "
        "mixed_float16, XLA",
        f"  matmul ceiling: {ceiling['size']}x{ceiling['size']} float16, "
        f"{ceiling['flops_per_second'] / 1e12:.2f} TFLOP/s per device "
        f"(median of {len(ceiling['samples'])})",
        "",
        f"  {'run':<32} {'replicas':>8} {'examples/s':>11} {'MFU':>7} {'input wait':>11} "
        f"{'loss-scale skips':>17} {'final loss':>11}",
    ]
    for r in results["runs"]:
        lines.append(
            f"  {r['run']:<32} {r['replicas']:>8} {r[metrics.EXAMPLES_PER_SECOND]:>11.1f} "
            f"{r[metrics.MFU]:>7.1%} {r[metrics.INPUT_WAIT_FRACTION]:>11.1%} "
            f"{r[metrics.LOSS_SCALE_SKIPPED_STEPS]:>17d} {r[metrics.FINAL_LOSS]:>11.4f}"
        )
    single, multi = results["runs"]
    if multi["replicas"] > 1 and single[metrics.EXAMPLES_PER_SECOND] > 0:
        speedup = multi[metrics.EXAMPLES_PER_SECOND] / single[metrics.EXAMPLES_PER_SECOND]
        lines.append(
            f"  scaling over {multi['replicas']} replicas: {speedup:.2f}x "
            f"({speedup / multi['replicas']:.0%} of linear)"
        )
    return "\n".join(lines)
