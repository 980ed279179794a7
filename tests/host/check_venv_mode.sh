#!/usr/bin/env bash
# The plain-venv mode of bin/envrun (hosts with glibc >= 2.39 and Python 3.13: Debian 13,
# Ubuntu 24.04), run for real, by .ci/run after check_envrun.sh: bin/envrun executed inside a
# Debian 13 userland (the rootfs environment's own, with its venv taken off PATH) must choose
# venv mode, build its venv there from the same lock and wheelhouse, and `make run` must train
# and push a model with it. Prints "ok: ..." or exits non-zero with "FAIL: ...".
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ENVRUN="$REPO/bin/envrun"
fail() { echo "FAIL: $*" >&2; exit 1; }

work=$(mktemp -d /tmp/envrun-venv-mode.XXXXXX)
trap 'rm -rf "$work"' EXIT
start=$SECONDS
# Inside: the userland's own Python 3.13 and no trace of the enclosing environment, so the
# inner bin/envrun measures the host as it would on a Debian 13 machine.
"$ENVRUN" env -u FULLTHROTTLE_IN_ENV -u FULLTHROTTLE_ENV_DIR -u VIRTUAL_ENV \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    FULLTHROTTLE_ENV_CACHE="$work/envs" \
    make -C "$REPO" run ARGS="--output-dir $work/run --set training.train_steps=100" \
    >"$work/out.log" 2>&1 || { tail -n 60 "$work/out.log" >&2; fail "make run in venv mode failed"; }

grep -q "creating a venv with /usr/bin/python3" "$work/out.log" ||
    { tail -n 60 "$work/out.log" >&2; fail "the inner bin/envrun did not build a venv"; }
ls -d "$work"/envs/venv-* >/dev/null 2>&1 || fail "no venv-<key> environment in $work/envs"
grep -q '"status": "succeeded"' "$work/run/last_run.json" || fail "the run did not succeed: $work/run/last_run.json"
pushed=$(grep -o '"pushed_model_dir": "[^"]*"' "$work/run/last_run.json" | cut -d'"' -f4)
[[ -n "$pushed" && -f "$pushed/saved_model.pb" ]] || fail "no model was pushed (pushed_model_dir: '$pushed')"
echo "ok: venv mode inside Debian 13: venv built and a model pushed ($((SECONDS - start)) s)"
