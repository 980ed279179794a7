#!/usr/bin/env bash
# Host-side checks of bin/envrun, run by .ci/run before the test suite (they cannot run inside
# the environment they check). Each check prints "ok: ..." or exits non-zero with "FAIL: ...".
#   1. the environment is built (or found) and works;
#   2. a second call reuses it: no rebuild;
#   3. no mount and no process outlives a command;
#   4. a half-built environment (no completion stamp) is detected and rebuilt, never used;
#   5. the NVIDIA driver pass-through: on a host without a driver nothing changes and nothing
#      is said; with driver files (real files named by a recorded-style listing) they appear
#      read-only under /usr/local/nvidia and on LD_LIBRARY_PATH/PATH, and leave no mount behind.
#      On a host with a real driver, nvidia-smi runs inside.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ENVRUN="$REPO/bin/envrun"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$ENVRUN" python -c 'import tfx, tensorflow, mlflow, apache_beam' 2>"$log" || { cat "$log" >&2; fail "the environment does not import tfx/tensorflow/mlflow/beam"; }
echo "ok: environment ready ($(grep -c 'building' "$log" || true) build messages)"

"$ENVRUN" true 2>"$log"
if grep -q "building\|installing" "$log"; then cat "$log" >&2; fail "a second call rebuilt the environment"; fi
echo "ok: a second call reuses the environment"

# A distinctive duration so that no unrelated sleep is mistaken for ours.
duration=$((3000 + RANDOM % 1000)).5
"$ENVRUN" bash -c "sleep $duration & disown; echo started" >/dev/null 2>&1
sleep 1
if pgrep -f "sleep $duration" >/dev/null; then
    fail "a background process started inside the environment outlived the command"
fi
if grep -q "fullthrottle/envs" /proc/self/mountinfo; then fail "a mount of the environment outlived the command"; fi
echo "ok: no process and no mount outlive a command"

if [[ "${FULLTHROTTLE_SKIP_REBUILD_CHECK:-0}" != 1 ]]; then
    real_env=$(FULLTHROTTLE_IN_ENV= "$ENVRUN" printenv FULLTHROTTLE_ENV_DIR 2>/dev/null)
    [[ -d "$real_env" ]] || fail "cannot find the environment folder ($real_env)"
    scratch=$(mktemp -d /tmp/envrun-check.XXXXXX)
    trap 'rm -rf "$scratch" "$log"' EXIT
    # A hard-linked copy of the real environment, minus its completion stamp: "half-built".
    cp -al "$real_env" "$scratch/$(basename "$real_env")"
    rm -f "$scratch/$(basename "$real_env")/.fullthrottle-env-complete"
    FULLTHROTTLE_ENV_CACHE="$scratch" "$ENVRUN" python -c 'import tfx' 2>"$log" || { cat "$log" >&2; fail "rebuilding a half-built environment failed"; }
    grep -q "incomplete or broken; rebuilding" "$log" || { cat "$log" >&2; fail "a half-built environment was used without a rebuild"; }
    [[ -f "$scratch/$(basename "$real_env")/.fullthrottle-env-complete" ]] || fail "the rebuilt environment has no completion stamp"
    echo "ok: a half-built environment is detected and rebuilt"
fi

plan=$("$REPO/bin/envrun-nvidia" plan)
if [[ -z "$plan" ]]; then
    inside=$("$ENVRUN" sh -c 'echo "ld=[$LD_LIBRARY_PATH] nvidia=$(ls -A /usr/local/nvidia 2>/dev/null | wc -l)"; case ":$PATH:" in *nvidia*) echo "path has nvidia";; esac' 2>"$log")
    if grep -qi nvidia "$log"; then cat "$log" >&2; fail "envrun spoke of NVIDIA on a host without a driver"; fi
    [[ "$inside" == "ld=[] nvidia=0" ]] || fail "without a driver the environment changed: $inside"
    echo "ok: no NVIDIA driver here: nothing changes, nothing is said"
elif grep -q '^gpu' <<<"$plan"; then
    "$ENVRUN" nvidia-smi -L || fail "this host has an NVIDIA driver but nvidia-smi fails inside the environment"
    echo "ok: NVIDIA driver here: nvidia-smi runs inside the environment"
fi

drv=$(mktemp -d /tmp/envrun-driver.XXXXXX)
trap 'rm -rf "$drv" "$log" ${scratch:+"$scratch"}' EXIT
echo "the driver library" >"$drv/libcuda.so.550.54.15"
ln -s libcuda.so.550.54.15 "$drv/libcuda.so.1"
echo "the NVML library" >"$drv/libnvidia-ml.so.550.54.15"
ln -s libnvidia-ml.so.550.54.15 "$drv/libnvidia-ml.so.1"
printf '2 libs found in cache\n\tlibcuda.so.1 (libc6,x86-64) => %s/libcuda.so.1\n\tlibnvidia-ml.so.1 (libc6,x86-64) => %s/libnvidia-ml.so.1\n' "$drv" "$drv" >"$drv/ldconfig"
printf 'null\nnvidia0\nnvidiactl\nnvidia-uvm\n' >"$drv/dev"
inside=$(FULLTHROTTLE_NVIDIA_LDCONFIG="$drv/ldconfig" FULLTHROTTLE_NVIDIA_DEV="$drv/dev" "$ENVRUN" sh -c \
    'cat /usr/local/nvidia/lib64/libcuda.so.1 /usr/local/nvidia/lib64/libnvidia-ml.so.1; echo "ld=$LD_LIBRARY_PATH"; if (echo x >/usr/local/nvidia/lib64/libcuda.so.1) 2>/dev/null; then echo writable; fi' 2>"$log") ||
    { cat "$log" >&2; fail "entering with driver files failed"; }
expected=$(printf 'the driver library\nthe NVML library\nld=/usr/local/nvidia/lib64')
env_dir=$(FULLTHROTTLE_IN_ENV= "$ENVRUN" printenv FULLTHROTTLE_ENV_DIR 2>/dev/null)
if [[ "$(basename "$env_dir")" == rootfs-* ]]; then # a venv sees the host's driver as it is
    [[ "$inside" == "$expected" ]] || fail "driver files not handed over as expected, got: $inside"
    grep -q "NVIDIA driver: /dev/nvidia0, 2 driver libraries" "$log" || { cat "$log" >&2; fail "envrun did not say what it handed over"; }
    [[ "$(cat "$drv/libcuda.so.550.54.15")" == "the driver library" ]] || fail "a driver file was changed from inside"
    if grep -q "fullthrottle-nvidia\|$drv" /proc/self/mountinfo; then fail "a driver mount outlived the command"; fi
    echo "ok: driver files are handed over read-only under /usr/local/nvidia and leave no mount behind"
fi
