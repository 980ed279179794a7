#!/usr/bin/env bash
# The images, built and run for real: a CI step of its own (.ci/run), run on the host because it
# drives buildah (or docker). Prints "ok: ..." with the seconds each step took, or exits non-zero
# with "FAIL: ...".
#   1. `bin/image --target cpu` builds the Dockerfile's cpu target on a locally made Debian 13
#      base (no base image can be pulled here); the wheels come from the machine's wheelhouse,
#      so after bin/envrun's build nothing is downloaded again (the wheelhouse is unchanged).
#   2. In that image, as its non-root user: `fullthrottle run` on the bundled data pushes a model.
#   3. `fullthrottle compile --target kubeflow` in the image, then the compiled spec's first task
#      (ArrowExampleGen: its driver, then its executor) through exactly the container command and
#      arguments the spec gives it, with the executor input KFP's driver would build
#      (tests/kfp_local.py), the spec's default roots on a volume mounted where the spec's PVC is.
#   4. `bin/image --target gpu`: the cpu image plus the CUDA wheels; its build fails unless
#      TensorFlow's CUDA libraries load, and `fullthrottle doctor` in it reports them loaded.
# FULLTHROTTLE_IMAGE_CHECK_GPU=0 leaves step 4 out.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CPU_TAG=localhost/fullthrottle-check:cpu
GPU_TAG=localhost/fullthrottle-check:gpu
WHEELHOUSE=${FULLTHROTTLE_WHEELHOUSE:-${HOME:-/root}/.cache/fullthrottle/wheels}
UID_IN_IMAGE=10001
fail() {
    echo "FAIL: $*" >&2
    exit 1
}

if docker info >/dev/null 2>&1; then
    echo "ok: skipped: a Docker engine runs here; this check drives buildah (bin/image builds with docker)"
    exit 0
fi

work=$(mktemp -d /tmp/fullthrottle-image-check.XXXXXX)
containers=()
cleanup() {
    local container
    for container in "${containers[@]}"; do buildah rm "$container" >/dev/null 2>&1 || true; done
    rm -rf "$work"
}
trap cleanup EXIT

wheel_listing() { find "$WHEELHOUSE" -maxdepth 1 -type f ! -name .lock -printf '%f %s %T@\n' 2>/dev/null | sort; }
image_size() { buildah images --format '{{.Size}}' "$1" | head -n1; }

# --- 1. the cpu image --------------------------------------------------------------------------
wheel_listing >"$work/wheels-before"
start=$SECONDS
"$REPO/bin/image" --target cpu --base local --tag "$CPU_TAG" >"$work/build-cpu.log" 2>&1 ||
    { tail -n 60 "$work/build-cpu.log" >&2; fail "building the cpu image failed"; }
echo "ok: cpu image built in $((SECONDS - start)) s, $(image_size "$CPU_TAG")"
wheel_listing >"$work/wheels-after"
if [[ -s "$work/wheels-before" ]] && ! diff -q "$work/wheels-before" "$work/wheels-after" >/dev/null; then
    echo "note: the build added to the wheelhouse (the environment had not downloaded these):"
    diff "$work/wheels-before" "$work/wheels-after" | grep '^>' | cut -d' ' -f2 | head -n 20
else
    echo "ok: the build downloaded nothing: every wheel came from the machine's wheelhouse"
fi

cpu=$(buildah from --quiet "$CPU_TAG")
containers+=("$cpu")
user=$(buildah run --isolation chroot "$cpu" -- id -u)
[[ "$user" == "$UID_IN_IMAGE" ]] || fail "the image runs as uid $user, not the non-root $UID_IN_IMAGE"
echo "ok: the image runs as uid $user (non-root)"

# --- 2. fullthrottle run ---------------------------------------------------------------------
mkdir -p "$work/out"
chown "$UID_IN_IMAGE:$UID_IN_IMAGE" "$work/out"
start=$SECONDS
buildah run --isolation chroot -v "$work/out:/work" "$cpu" -- \
    fullthrottle run --output-dir /work/run --set training.train_steps=50 \
    --set evaluation.accuracy_threshold=0 >"$work/run.log" 2>&1 ||
    { tail -n 60 "$work/run.log" >&2; fail "fullthrottle run in the cpu image failed"; }
python3 - "$work/out/run/last_run.json" "$work/out" <<'EOF' || fail "the run in the image pushed no model"
import json, os, sys
outcome = json.load(open(sys.argv[1]))
assert outcome["status"] == "succeeded", outcome["status"]
pushed = outcome["pushed_model_dir"]
assert pushed and pushed.startswith("/work/run/serving/"), pushed
assert os.path.isfile(os.path.join(sys.argv[2], pushed[len("/work/"):], "saved_model.pb")), pushed
EOF
owner=$(stat -c %u "$work/out/run/last_run.json")
[[ "$owner" == "$UID_IN_IMAGE" ]] || fail "the run's files belong to uid $owner, not $UID_IN_IMAGE"
echo "ok: fullthrottle run in the cpu image pushed a model, as uid $owner ($((SECONDS - start)) s)"

# --- 3. one compiled Kubeflow task -----------------------------------------------------------
volume="$work/volume" # what the PVC `fullthrottle` holds, mounted at the spec's /mnt/fullthrottle
mkdir -p "$volume"
cp -r "$work/out/run/data/fullthrottle-penguins" "$volume/data" # train/data.csv, eval/data.csv
start=$SECONDS
buildah run --isolation chroot -v "$work/out:/work" "$cpu" -- \
    fullthrottle compile --target kubeflow -o /work/spec.yaml >"$work/compile.log" 2>&1 ||
    { cat "$work/compile.log" >&2; fail "fullthrottle compile in the cpu image failed"; }
grep -q "PVC 'fullthrottle' at /mnt/fullthrottle" "$work/compile.log" ||
    { cat "$work/compile.log" >&2; fail "compile did not mount the roots' volume"; }
buildah run --isolation chroot -v "$work/out:/work" "$cpu" -- \
    python -m tests.kfp_local /work/spec.yaml ArrowExampleGen check-run >"$work/task.json" 2>"$work/task.log" ||
    { cat "$work/task.log" >&2; fail "cannot read ArrowExampleGen's commands from the compiled spec"; }
output_file=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["output_file"])' "$work/task.json")
[[ "$output_file" == /mnt/fullthrottle/* ]] || fail "the task's output is not on the volume: $output_file"
mkdir -p "$volume$(dirname "${output_file#/mnt/fullthrottle}")"
chown -R "$UID_IN_IMAGE:$UID_IN_IMAGE" "$volume"
count=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["commands"]))' "$work/task.json")
for ((i = 0; i < count; i++)); do
    mapfile -d '' -t command < <(python3 -c 'import json,sys; sys.stdout.write("\0".join(json.load(open(sys.argv[1]))["commands"][int(sys.argv[2])]))' "$work/task.json" "$i")
    buildah run --isolation chroot -v "$volume:/mnt/fullthrottle" "$cpu" -- "${command[@]}" \
        >"$work/task-$i.log" 2>&1 ||
        { tail -n 60 "$work/task-$i.log" >&2; fail "ArrowExampleGen's command $((i + 1)) of $count failed in the image: ${command[*]:0:4}"; }
done
task_dir="$volume$(dirname "${output_file#/mnt/fullthrottle}")"
[[ -s "$task_dir/executor_output.json" ]] || fail "ArrowExampleGen wrote no executor output"
for split in train eval; do
    compgen -G "$task_dir/examples/Split-$split/*.gz" >/dev/null ||
        fail "ArrowExampleGen wrote no $split examples under $task_dir/examples"
done
echo "ok: ArrowExampleGen ran in the cpu image with the spec's command and arguments ($count commands, driver first), examples written to the volume ($((SECONDS - start)) s)"

# --- 4. the gpu image ------------------------------------------------------------------------
if [[ "${FULLTHROTTLE_IMAGE_CHECK_GPU:-1}" == 1 ]]; then
    start=$SECONDS
    "$REPO/bin/image" --target gpu --base local --tag "$GPU_TAG" >"$work/build-gpu.log" 2>&1 ||
        { tail -n 60 "$work/build-gpu.log" >&2; fail "building the gpu image failed (its CUDA libraries must load)"; }
    echo "ok: gpu image built in $((SECONDS - start)) s, $(image_size "$GPU_TAG"); TensorFlow's CUDA libraries load in it"
    gpu=$(buildah from --quiet "$GPU_TAG")
    containers+=("$gpu")
    buildah run --isolation chroot "$gpu" -- fullthrottle doctor --json >"$work/doctor.json" 2>"$work/doctor.log" || true
    python3 - "$work/doctor.json" <<'EOF' || { cat "$work/doctor.log" >&2; fail "doctor in the gpu image does not report the CUDA libraries loaded"; }
import json, sys
report = json.load(open(sys.argv[1]))
libraries = {lib["soname"]: lib for lib in report["cuda_libraries"]}
assert libraries and all(lib["error"] is None for lib in libraries.values()), libraries
assert all("site-packages/nvidia/" in lib["path"] for lib in libraries.values()), libraries
assert libraries["libcudart.so.12"]["version"].startswith("12."), libraries
assert libraries["libcudnn.so.9"]["version"].startswith("9."), libraries
print(f"ok: doctor in the gpu image: {len(libraries)} CUDA libraries loaded, CUDA runtime "
      f"{libraries['libcudart.so.12']['version']}, cuDNN {libraries['libcudnn.so.9']['version']}")
EOF
fi
