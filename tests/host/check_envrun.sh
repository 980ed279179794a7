#!/usr/bin/env bash
# Host-side checks of bin/envrun, run by .ci/run before the test suite (they cannot run inside
# the environment they check). Each check prints "ok: ..." or exits non-zero with "FAIL: ...".
#   1. the environment is built (or found) and works;
#   2. a second call reuses it: no rebuild;
#   3. no mount and no process outlives a command;
#   4. a half-built environment (no completion stamp) is detected and rebuilt, never used.
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
