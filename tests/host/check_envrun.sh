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
#   6. host paths (userland mode, as root): a CSV in a folder outside the repo, the working
#      directory and /tmp trains; the outputs land on a small tmpfs mounted under the working
#      directory (checked on that filesystem, and nothing beneath it); a host path under a folder
#      the userland has itself (/var/lib/...) is refused with the reason when only a config file
#      names it, and read when the command line names it (init's command to train names it too).
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

if [[ "$(basename "$env_dir")" == rootfs-* && $EUID -eq 0 ]]; then
    hp=$(mktemp -d /srv/fullthrottle-envrun-check.XXXXXX)
    # Under a folder the userland has itself: shown only when the command line names it. The
    # shallowest host folder the userland lacks (this one, fixed) is what envrun shows there.
    hidden_base=/var/lib/fullthrottle-envrun-check
    mkdir -p "$hidden_base"
    hidden=$(mktemp -d "$hidden_base/run.XXXXXX")
    cleanup_paths() {
        umount "$hp/work/out" 2>/dev/null || true
        rm -rf "$hp" "$hidden" "$log" "$drv" ${scratch:+"$scratch"}
        rmdir "$hidden_base" 2>/dev/null || true
    }
    trap cleanup_paths EXIT
    mkdir -p "$hp/data" "$hp/work/out"
    "$ENVRUN" python -c 'from fullthrottle.core.bundled import bundled_path; print(bundled_path("palmerpenguins").read_text(), end="")' \
        >"$hp/data/penguins.csv" 2>"$log" || { cat "$log" >&2; fail "cannot write the penguins CSV"; }
    cp "$hp/data/penguins.csv" "$hidden/penguins.csv"
    mount -t tmpfs -o size=256m fullthrottle-envrun-check "$hp/work/out"
    (cd "$hp/work" && "$ENVRUN" fullthrottle run --data "$hp/data/penguins.csv" --output-dir out \
        --set training.train_steps=20 --set evaluation.accuracy_threshold=0) >"$log" 2>&1 ||
        { tail -40 "$log" >&2; fail "a run on a CSV under /srv, outputs on a tmpfs under the working directory, failed"; }
    pushed=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["pushed_model_dir"] or "")' "$hp/work/out/last_run.json")
    [[ "$pushed" == "$hp/work/out/serving/"* && -f "$pushed/saved_model.pb" ]] || fail "no pushed model under the output folder: '$pushed'"
    for file in "$hp/work/out/last_run.json" "$pushed/saved_model.pb"; do
        [[ "$(findmnt -n -o SOURCE --target "$file")" == fullthrottle-envrun-check ]] || fail "$file is not on the tmpfs mounted under the working directory"
    done
    umount "$hp/work/out"
    [[ -z "$(ls -A "$hp/work/out")" ]] || fail "outputs landed on the disk beneath the tmpfs: $(ls -A "$hp/work/out")"
    echo "ok: a CSV under /srv trains; the outputs are on the tmpfs mounted under the working directory"

    printf 'data:\n  path: %s/penguins.csv\n' "$hidden" >"$hp/work/hidden.yaml"
    if (cd "$hp/work" && "$ENVRUN" fullthrottle run --config hidden.yaml --output-dir out2) >"$log" 2>&1; then
        fail "a run on a data path the userland hides did not stop"
    fi
    message=$(tr '\n' ' ' <"$log")
    [[ "$message" == *"cannot be reached"*"is on the host, not inside bin/envrun's Debian 13 userland"* && "$message" != *Traceback* ]] ||
        { cat "$log" >&2; fail "a hidden data path was not refused with the reason"; }
    (cd "$hp/work" && "$ENVRUN" fullthrottle init --data "$hidden/penguins.csv" --label species --output init.yaml) >"$log" 2>&1 ||
        { cat "$log" >&2; fail "init could not read a path under /var/lib named on the command line"; }
    # The command init prints names the data again (the config file alone would not show it).
    grep -qx "  $ENVRUN fullthrottle run --config init.yaml --data $hidden/penguins.csv" "$log" ||
        { cat "$log" >&2; fail "init's command to train does not name the data it alone shows"; }
    echo "ok: a path under the userland's /var/lib is refused with the reason from a config file, read from the command line"
fi
