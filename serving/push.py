"""Safe pushes into a TF Serving model folder: `<serving_dir>/<integer version>/`.

`push_model` owns one push: it copies the trained SavedModel into a staging folder on the same
filesystem, adds the warmup records (and optionally TFLite files), checks that the staged copy
loads and answers its own warmup requests, and only then renames the staging folder to its
integer version. TF Serving (and `fullthrottle serve`) only look at folders whose name is an
integer, so a version appears complete or not at all. It refuses to overwrite an existing version
and never pushes a model that fails its check. Retention of the newest K versions removes old
folders by first renaming them out of the integer namespace.

On object stores (``gs://``, ``s3://``) a rename is a copy, so there the files are copied
straight into the version folder with ``saved_model.pb`` last: TF Serving treats a version as
loadable only once ``saved_model.pb`` exists. Exercised on TensorFlow's in-memory ``ram://``
filesystem (no object store is reachable here), which goes through the same tf.io.gfile calls.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import time
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tensorflow as tf

from serving.signatures import (
    EXAMPLES_INPUT,
    PREDICT_RAW,
    PREDICT_TRANSFORMED,
    SERVING_DEFAULT,
    call_signature,
    raw_inputs_from_examples,
    signature_input_specs,
)

WARMUP_FILE = "tf_serving_warmup_requests"
WARMUP_RELATIVE_PATH = os.path.join("assets.extra", WARMUP_FILE)
MAX_WARMUP_RECORDS = 1000  # TF Serving refuses a warmup file with more records
TFLITE_DIR = "tflite"
TFLITE_FLOAT32 = "model_float32.tflite"
TFLITE_DYNAMIC_RANGE = "model_dynamic_range.tflite"
STAGING_PREFIX = ".staging-"
DELETING_PREFIX = ".deleting-"
# Warmup requests cycle through these batch sizes so the batching paths get warm too.
WARMUP_BATCH_SIZES = (1, 2, 4, 8)


class PushError(RuntimeError):
    """A push was refused or failed; nothing was published. The message says why and what to do."""


@dataclass(frozen=True)
class PushResult:
    version: int
    version_dir: str
    warmup_records: int
    tflite_files: tuple[str, ...] = ()
    removed_versions: tuple[int, ...] = field(default=())


def version_dirs(serving_dir: str | os.PathLike) -> dict[int, str]:
    """The published versions in `serving_dir` (integer folder names only), version -> path."""
    serving_dir = str(serving_dir)
    if not tf.io.gfile.isdir(serving_dir):
        return {}
    found = {}
    for name in tf.io.gfile.listdir(serving_dir):
        name = name.rstrip("/")
        if name.isdigit() and tf.io.gfile.isdir(os.path.join(serving_dir, name)):
            found[int(name)] = os.path.join(serving_dir, name)
    return found


def next_version(serving_dir: str | os.PathLike, *, now: float | None = None) -> int:
    """A version number greater than every existing one: the Unix time, or the newest + 1.

    TF Serving serves the largest version number, so a push must never go below an existing one
    (a clock set back would otherwise publish a version that is never served).
    """
    stamp = int(time.time() if now is None else now)
    existing = version_dirs(serving_dir)
    return max(stamp, max(existing, default=0) + 1)


def _is_remote(path: str) -> bool:
    return "://" in path


def _rename_noreplace(source: str, target: str) -> None:
    """Renames `source` to `target`, failing if `target` exists (even as an empty folder).

    `os.rename` silently replaces an empty target folder; Linux's renameat2(RENAME_NOREPLACE)
    makes the check and the rename one atomic step, so two pushers can never both publish.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        at_fdcwd, rename_noreplace = -100, 1
        result = renameat2(
            at_fdcwd, os.fsencode(source), at_fdcwd, os.fsencode(target), rename_noreplace
        )
        if result == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise FileExistsError(errno.EEXIST, "version folder exists", target)
        if err not in (errno.ENOSYS, errno.EINVAL):  # otherwise: filesystem lacks it, fall back
            raise OSError(err, os.strerror(err), target)
    if os.path.exists(target):
        raise FileExistsError(errno.EEXIST, "version folder exists", target)
    os.rename(source, target)


def _copy_tree(source: str, target: str, *, last: Sequence[str] = ()) -> None:
    """Copies a folder with tf.io.gfile (local or object store); `last` files go last."""
    deferred = []
    for directory, _, files in tf.io.gfile.walk(source):
        relative = os.path.relpath(directory, source)
        # Joined, not normalised: normpath turns "gs://bucket" into the local path "gs:/bucket".
        destination = target if relative == "." else os.path.join(target, relative)
        tf.io.gfile.makedirs(destination)
        for name in files:
            pair = (os.path.join(directory, name), os.path.join(destination, name))
            if relative == "." and name in last:
                deferred.append(pair)
            else:
                tf.io.gfile.copy(*pair, overwrite=False)
    for pair in deferred:
        tf.io.gfile.copy(*pair, overwrite=False)


def build_warmup_records(
    model_dir: str, *, model_name: str, examples: Sequence[bytes], count: int
) -> list[bytes]:
    """Serialized `PredictionLog` records for TF Serving's warmup, half per signature.

    Records alternate between `serving_default` (serialized tf.Examples) and `predict_raw`
    (named raw tensors); batch sizes cycle through 1, 2, 4, 8 examples taken in turn from
    `examples` (real evaluation rows, label removed).
    """
    from tensorflow_serving.apis import predict_pb2, prediction_log_pb2

    if count <= 0 or not examples:
        return []
    if count > MAX_WARMUP_RECORDS:
        raise PushError(
            f"at most {MAX_WARMUP_RECORDS} warmup records are allowed (TF Serving's limit), got {count}"
        )
    loaded = tf.saved_model.load(model_dir)
    raw_specs = signature_input_specs(loaded, PREDICT_RAW)
    records = []
    cursor = 0
    for index in range(count):
        size = WARMUP_BATCH_SIZES[(index // 2) % len(WARMUP_BATCH_SIZES)]
        batch = [examples[(cursor + i) % len(examples)] for i in range(size)]
        cursor += size
        request = predict_pb2.PredictRequest()
        request.model_spec.name = model_name
        if index % 2 == 0:
            request.model_spec.signature_name = SERVING_DEFAULT
            request.inputs[EXAMPLES_INPUT].CopyFrom(tf.make_tensor_proto(batch, dtype=tf.string))
        else:
            request.model_spec.signature_name = PREDICT_RAW
            for name, array in raw_inputs_from_examples(batch, raw_specs).items():
                request.inputs[name].CopyFrom(
                    tf.make_tensor_proto(array, dtype=raw_specs[name].dtype)
                )
        log = prediction_log_pb2.PredictionLog(
            predict_log=prediction_log_pb2.PredictLog(request=request)
        )
        records.append(log.SerializeToString())
    return records


def replay_warmup(model_dir: str, records: Sequence[bytes], *, loaded: Any = None) -> int:
    """Runs every warmup record through the SavedModel in `model_dir`, as TF Serving would.

    `loaded` is the already loaded SavedModel of `model_dir`, if the caller has it (a server
    warms the object it will serve; loading again would double the time a new version takes).
    Returns the number of records answered; raises `PushError` on the first one that fails, so a
    model that cannot answer its own warmup requests is never published.
    """
    from tensorflow_serving.apis import prediction_log_pb2

    if loaded is None:
        loaded = tf.saved_model.load(model_dir)
    for index, record in enumerate(records):
        log = prediction_log_pb2.PredictionLog.FromString(record)
        request = log.predict_log.request
        signature = request.model_spec.signature_name or SERVING_DEFAULT
        inputs = {
            name: tf.constant(tf.make_ndarray(proto)) for name, proto in request.inputs.items()
        }
        try:
            # Keyed as TF Serving keys them (the SignatureDef's names); the call maps them.
            outputs = call_signature(loaded, signature, inputs)
        except Exception as exc:
            raise PushError(
                f"the staged model failed warmup record {index} ({request.model_spec.signature_name}): "
                f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}; nothing was pushed"
            ) from exc
        # A classifier answers `probabilities`, a regression model `predictions`.
        if "probabilities" not in outputs and "predictions" not in outputs:
            raise PushError(
                f"warmup record {index}: the model returned neither `probabilities` nor "
                "`predictions`; nothing was pushed"
            )
    return len(records)


# A push refuses a TFLite file whose answers on probe inputs differ from the SavedModel's by more
# than this (probabilities): float32 differs only by kernel rounding; dynamic-range quantization
# stores int8 weights. tests/test_serving_push.py holds the same numbers for evaluation rows.
TFLITE_CHECK_TOLERANCE = {TFLITE_FLOAT32: 1e-4, TFLITE_DYNAMIC_RANGE: 0.05}


def _frozen_transformed_module(model_dir: str) -> tuple[tf.Module, Any, Any]:
    """A module whose `predict_transformed` is the SavedModel's, with its variables as constants.

    Why not `TFLiteConverter.from_saved_model` on the pushed model: measured here, it writes the
    weight tensors (`.../ReadVariableOp`) as constants with empty data buffers (the 10 KB file
    held 136 bytes of data), so the interpreter returns NaN; with `experimental_enable_resource_variables`
    off it is the same. Freezing the concrete function first (`convert_variables_to_constants_v2`)
    puts the values in the graph. Returns (module, its concrete function, the original signature).
    """
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2,
    )

    loaded = tf.saved_model.load(model_dir)
    signature = loaded.signatures[PREDICT_TRANSFORMED]
    frozen = convert_variables_to_constants_v2(signature)
    specs = dict(signature.structured_input_signature[1])
    # The frozen function takes its inputs positionally, named after the signature's inputs.
    order = [tensor.name.split(":")[0] for tensor in frozen.inputs]
    if sorted(order) != sorted(specs):
        raise PushError(
            f"cannot freeze {PREDICT_TRANSFORMED} of {model_dir} for TFLite: its inputs {sorted(specs)} "
            f"became {sorted(order)}; nothing was pushed (set serving.tflite=false to push without it)"
        )
    output_structure = signature.structured_outputs

    module = tf.Module()
    module.frozen = frozen

    # No control flow to convert: autograph off (it would only rewrite the list comprehension).
    @tf.function(input_signature=[{name: specs[name] for name in order}], autograph=False)
    def predict_transformed(features: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        outputs = module.frozen(*[features[name] for name in order])
        return tf.nest.pack_sequence_as(output_structure, tf.nest.flatten(outputs))

    module.predict_transformed = predict_transformed
    return module, predict_transformed.get_concrete_function(), signature


def _probe_inputs(specs: dict[str, tf.TensorSpec], *, batch: int = 8) -> dict[str, Any]:
    """Deterministic transformed-feature inputs for the TFLite check: z-scores and small ids."""
    import numpy as np

    probe = {}
    for index, (name, spec) in enumerate(sorted(specs.items())):
        shape = [batch, *[1 if d is None else d for d in spec.shape.as_list()[1:]]]
        if spec.dtype.is_floating:
            values = np.linspace(-2.0, 2.0, num=int(np.prod(shape))) * (1 if index % 2 else -1)
            probe[name] = values.reshape(shape).astype(spec.dtype.as_numpy_dtype)
        elif spec.dtype.is_integer:
            # Ids 0 and 1: every vocabulary and hash bucket has them.
            probe[name] = (
                (np.arange(int(np.prod(shape))) % 2)
                .reshape(shape)
                .astype(spec.dtype.as_numpy_dtype)
            )
        else:
            raise PushError(
                f"the TFLite export takes numeric transformed features; {name!r} is "
                f"{spec.dtype.name}; set serving.tflite=false for this model"
            )
    return probe


def export_tflite(model_dir: str, target_dir: str, *, quantize: bool) -> list[str]:
    """Writes TFLite models of the `predict_transformed` signature (the model without Transform).

    float32 always; with `quantize`, also a dynamic-range quantized copy (int8 weights, float
    activations). Builtin ops only, so any TFLite interpreter runs them; clients apply the
    Transform themselves (or call `transform_features` on a server). Each file's signature is
    `predict_transformed` with the SavedModel's input and output names.

    Refuses (PushError) a file whose interpreter answers differ from the SavedModel's on probe
    inputs by more than `TFLITE_CHECK_TOLERANCE`, or are not finite: such a file is not pushed.
    """
    import tempfile

    import numpy as np

    module, concrete, signature = _frozen_transformed_module(model_dir)
    specs = dict(signature.structured_input_signature[1])
    probe = _probe_inputs(specs)
    expected = signature(**{k: tf.constant(v) for k, v in probe.items()})
    tf.io.gfile.makedirs(target_dir)
    written = []
    variants = [(TFLITE_FLOAT32, False)] + ([(TFLITE_DYNAMIC_RANGE, True)] if quantize else [])
    with tempfile.TemporaryDirectory(prefix="fullthrottle-tflite-") as frozen_dir:
        # Saved with the signature's own name, so the .tflite's signature key is that name too
        # (from_concrete_functions would call it serving_default).
        tf.saved_model.save(module, frozen_dir, signatures={PREDICT_TRANSFORMED: concrete})
        for filename, optimize in variants:
            converter = tf.lite.TFLiteConverter.from_saved_model(
                frozen_dir, signature_keys=[PREDICT_TRANSFORMED]
            )
            if optimize:
                converter.optimizations = [tf.lite.Optimize.DEFAULT]
            blob = converter.convert()
            with warnings.catch_warnings():
                # Its successor (ai_edge_litert) is not in the lock; TF 2.21's still works.
                warnings.filterwarnings("ignore", "(?s).*tf.lite.Interpreter is deprecated")
                interpreter = tf.lite.Interpreter(model_content=blob)
            runner = interpreter.get_signature_runner(PREDICT_TRANSFORMED)
            got = runner(**probe)
            for name, value in expected.items():
                difference = np.abs(np.asarray(got[name]) - value.numpy())
                # Probabilities are at most 1; a regression model's numbers are in the label's
                # units, so the tolerance is relative to their size.
                tolerance = TFLITE_CHECK_TOLERANCE[filename] * max(
                    1.0, float(np.abs(value.numpy()).max(initial=0.0))
                )
                if not np.isfinite(got[name]).all() or difference.max() > tolerance:
                    raise PushError(
                        f"the TFLite model {filename} answers probe inputs differently from the "
                        f"SavedModel (output {name!r}, max difference {np.nanmax(difference)!r}, "
                        f"tolerance {tolerance:g}); nothing was pushed "
                        "(set serving.tflite=false to push without TFLite files)"
                    )
            path = os.path.join(target_dir, filename)
            with tf.io.gfile.GFile(path, "wb") as f:
                f.write(blob)
            written.append(path)
    return written


def remove_old_versions(serving_dir: str, *, keep: int, protect: int) -> list[int]:
    """Keeps the newest `keep` versions (0 keeps all) and never removes `protect`.

    A folder is first renamed out of the integer namespace, then deleted, so a server scanning
    the folder never sees a half-deleted version.
    """
    if keep <= 0:
        return []
    versions = sorted(version_dirs(serving_dir), reverse=True)
    removed = []
    for version in versions[keep:]:
        if version == protect:
            continue
        path = os.path.join(serving_dir, str(version))
        if _is_remote(serving_dir):
            tf.io.gfile.rmtree(path)
        else:
            doomed = os.path.join(serving_dir, f"{DELETING_PREFIX}{version}-{uuid.uuid4().hex[:8]}")
            os.rename(path, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
        removed.append(version)
    return removed


# Folders left behind by a killed push.
def _lock_staging(staging: str) -> int:
    """Creates the staging folder and holds an exclusive `flock` on it for this push's lifetime.

    The kernel drops the lock when the process dies, SIGKILL included, so a staging folder whose
    lock can be taken belongs to a push that will never finish. Returns the descriptor to close.
    """
    os.makedirs(staging)
    descriptor = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    # Another push's clean-up may have taken it between makedirs and flock (microseconds).
    if os.fstat(descriptor).st_nlink == 0:
        os.close(descriptor)
        raise PushError(f"the staging folder {staging} was removed while pushing; push again")
    return descriptor


def remove_abandoned_folders(serving_dir: str) -> list[str]:
    """Removes what killed pushes left in a local `serving_dir`; returns the names removed.

    Owns: ``.staging-*`` folders whose lock is free (their push died before publishing) and
    ``.deleting-*`` folders (retention died mid-delete; they are already out of the version
    namespace). Refuses to touch a staging folder a live push holds, and never touches versions.
    """
    removed = []
    for name in sorted(os.listdir(serving_dir)):
        path = os.path.join(serving_dir, name)
        if name.startswith(DELETING_PREFIX):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(name)
            continue
        if not name.startswith(STAGING_PREFIX):
            continue
        try:
            descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:  # removed meanwhile, or not a folder
            continue
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live push is writing it
            shutil.rmtree(path, ignore_errors=True)
            removed.append(name)
        finally:
            os.close(descriptor)
    return removed


def push_model(
    *,
    model_dir: str,
    serving_dir: str,
    model_name: str,
    warmup_examples: Sequence[bytes] = (),
    warmup_count: int = 0,
    keep_versions: int = 0,
    tflite: bool = False,
    tflite_quantize: bool = False,
    version: int | None = None,
) -> PushResult:
    """Publishes the SavedModel in `model_dir` as a new version folder in `serving_dir`.

    Owns: choosing the version, staging, warmup records, TFLite files, the check that the staged
    copy loads and answers, the atomic publish and retention. Refuses (PushError): a `model_dir`
    without ``saved_model.pb``, an explicit `version` that already exists, and a staged model
    that fails its warmup replay. Nothing is published when it refuses or fails.
    """
    if not tf.io.gfile.exists(os.path.join(model_dir, "saved_model.pb")):
        raise PushError(
            f"{model_dir} holds no saved_model.pb: the Trainer's model is missing; nothing was pushed"
        )
    remote = _is_remote(serving_dir)
    if not remote:
        serving_dir = str(Path(serving_dir).absolute())
    tf.io.gfile.makedirs(serving_dir)
    if not remote:
        remove_abandoned_folders(serving_dir)  # a killed push's staging folder
    if version is None:
        version = next_version(serving_dir)
    elif version in version_dirs(serving_dir):
        raise PushError(
            f"version {version} already exists in {serving_dir}; versions are never overwritten"
        )
    final_dir = os.path.join(serving_dir, str(version))

    # Stage on the same filesystem (a sibling folder) so publishing is one rename.
    staging = (
        final_dir
        if remote
        else os.path.join(serving_dir, f"{STAGING_PREFIX}{version}-{uuid.uuid4().hex[:8]}")
    )
    staging_lock = None if remote else _lock_staging(staging)  # held until published
    try:
        _copy_tree(model_dir, staging, last=("saved_model.pb",) if remote else ())
        records = build_warmup_records(
            model_dir, model_name=model_name, examples=list(warmup_examples), count=warmup_count
        )
        if records:
            path = os.path.join(staging, WARMUP_RELATIVE_PATH)
            tf.io.gfile.makedirs(os.path.dirname(path))
            with tf.io.TFRecordWriter(path) as writer:
                for record in records:
                    writer.write(record)
            replay_warmup(staging, records)
        tflite_files: list[str] = []
        if tflite:
            tflite_files = export_tflite(
                model_dir, os.path.join(staging, TFLITE_DIR), quantize=tflite_quantize
            )
        if not remote:
            _fsync_tree(staging)
            try:
                _rename_noreplace(staging, final_dir)
            except FileExistsError:
                raise PushError(
                    f"version {version} appeared in {serving_dir} while pushing (another pusher?); "
                    "it was left untouched and nothing was pushed; push again"
                ) from None
            tflite_files = [p.replace(staging, final_dir, 1) for p in tflite_files]
    except BaseException:
        if not remote and os.path.isdir(staging):
            shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        if staging_lock is not None:
            os.close(staging_lock)
    removed = remove_old_versions(serving_dir, keep=keep_versions, protect=version)
    return PushResult(
        version=version,
        version_dir=final_dir,
        warmup_records=len(records),
        tflite_files=tuple(tflite_files),
        removed_versions=tuple(removed),
    )


def _fsync_tree(root: str) -> None:
    """Flushes every staged file, so the renamed folder is complete after a crash too."""
    for directory, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(directory, name), "rb") as f:
                os.fsync(f.fileno())
