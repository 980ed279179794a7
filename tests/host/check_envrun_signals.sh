#!/usr/bin/env bash
# Host-side checks that bin/envrun (and `make run` through it) passes SIGINT and SIGTERM on to the
# command and returns only when the command has ended, with its status. Run by .ci/run (they
# cannot run inside the environment they check). Each check prints "ok: ..." or exits non-zero
# with "FAIL: ...".
#   1. A command inside (Python, no TensorFlow) gets the signal exactly once and envrun returns
#      its status after it ended: SIGTERM and SIGINT sent to envrun's PID or to its process
#      group; SIGTERM to make's PID and SIGINT to make's process group (Ctrl-C's path) with a
#      Makefile recipe like `make run`'s.
#   2. `bin/envrun fullthrottle run` in training: a second run on the folder is refused, naming
#      envrun's host PID and the command as typed; SIGTERM to envrun's PID ends it with 143, a
#      checkpoint at the step it stopped, last_run.json `interrupted`, the folder's lock free, no
#      process left, and a resume hint that starts with bin/envrun.
#   3. The rerun, as `make run ARGS=...` on the same folder, resumes at that step; SIGINT to
#      make's process group ends it the same way (130), with a `make run ARGS=...` resume hint.
# Processes are started in a session of their own with SIGINT at its default (a command started
# with `&` by a shell without job control would ignore it, and so would everything it starts).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
ENVRUN="$REPO/bin/envrun"
work=$(mktemp -d /tmp/envrun-signals.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail() {
    echo "FAIL: $*" >&2
    exit 1
}

# start LOG CMD...: CMD in a new session (its PID is its process group), output to LOG; sets PID.
start() {
    local log=$1
    shift
    # SIGINT and SIGQUIT at their defaults whatever this script inherited: bash cannot reset a
    # signal ignored when it started (a script started with `&` by a shell without job control,
    # as CI jobs are), and an ignored SIGINT would stay ignored by the launcher it execs.
    env --default-signal=INT,QUIT setsid "$@" >"$log" 2>&1 &
    PID=$!
}

wait_for() { # wait_for LOG PATTERN SECONDS: until LOG has a line matching PATTERN
    local deadline=$((SECONDS + $3))
    until grep -qsE "$2" "$1"; do
        kill -0 "$PID" 2>/dev/null || { tail -40 "$1" >&2; fail "ended before /$2/"; }
        ((SECONDS < deadline)) || { tail -40 "$1" >&2; kill -KILL -- "-$PID"; fail "no /$2/ in $3 s"; }
        sleep 0.2
    done
}

# finish: waits for PID; sets STATUS and ELAPSED (seconds from the signal to the return).
finish() {
    local sent=$SECONDS
    STATUS=0
    wait "$PID" || STATUS=$?
    ELAPSED=$((SECONDS - sent))
}

# --- 1. exactly once, status passed back ----------------------------------------------------
cat >"$work/probe.py" <<'EOF'
import signal, sys, time
got = []
for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, lambda signum, frame: got.append(signum))
print("ready", flush=True)
deadline = time.monotonic() + 60
while not got and time.monotonic() < deadline:
    time.sleep(0.02)
time.sleep(1.5)  # a second delivery of the same request would arrive by now
print("got", " ".join(signal.Signals(s).name for s in got), flush=True)
sys.exit(128 + got[0] if got else 0)
EOF
printf 'run:\n\t%s python %s\n' "$ENVRUN" "$work/probe.py" >"$work/Makefile"
for case in "envrun pid TERM" "envrun pid INT" "envrun group TERM" "envrun group INT" \
    "make pid TERM" "make group INT"; do
    read -r launcher target sig <<<"$case"
    log="$work/probe-$launcher-$target-$sig.log"
    if [[ "$launcher" == envrun ]]; then
        start "$log" "$ENVRUN" python "$work/probe.py"
    else
        start "$log" make -s --no-print-directory -C "$work" run
    fi
    wait_for "$log" '^ready' 120
    # What a failure needs explained: the launcher's signal dispositions and its processes.
    before=$(grep -E '^Sig(Ign|Cgt):' "/proc/$PID/status" 2>/dev/null | tr '\n' ' ' || true)
    before+=$'\n'$(ps -o pid,ppid,pgid,stat,args --forest -s "$PID" 2>/dev/null || true)
    if [[ "$target" == pid ]]; then kill -s "$sig" "$PID"; else kill -s "$sig" -- "-$PID"; fi
    finish
    expected=$((128 + $(kill -l "$sig")))
    grep -qx "got SIG$sig" "$log" || {
        cat "$log" >&2
        echo "the launcher before the signal: $before" >&2
        fail "$case: the command did not get SIG$sig exactly once"
    }
    [[ "$STATUS" == "$expected" ]] || { cat "$log" >&2; fail "$case: status $STATUS, expected $expected"; }
    ! pgrep -f "$work/probe.py" >/dev/null || fail "$case: a process outlived the launcher"
done
echo "ok: SIGINT/SIGTERM to envrun (PID or group) and to make reach the command once; the status is the command's, after it ended"

# --- 2 and 3. a real run in training ----------------------------------------------------------
out="$work/runs"
args=(--output-dir "$out" --set training.train_steps=1000000 --set training.steps_per_loop=10
    --set training.checkpoint_every_steps=1000000)
last_run() { # last_run KEY...: a value of last_run.json
    python3 -c 'import json, sys
value = json.load(open(sys.argv[1]))
for key in sys.argv[2:]:
    value = value[key]
print(value)' "$out/last_run.json" "$@"
}
stopped_cleanly() { # stopped_cleanly LOG SIGNAL STATUS: the run's record, checkpoint, lock, processes
    local log=$1 sig=$2 status=$3 step checkpoint
    [[ "$STATUS" == "$status" ]] || { tail -40 "$log" >&2; fail "exit status $STATUS after $sig, expected $status"; }
    [[ "$(last_run status)" == interrupted && "$(last_run interrupted signal)" == "$sig" &&
        "$(last_run interrupted exit_status)" == "$status" ]] ||
        { cat "$out/last_run.json" >&2; fail "last_run.json does not record the $sig stop"; }
    step=$(last_run interrupted step)
    checkpoint=$(last_run interrupted checkpoint)
    [[ "$step" -gt 0 && "$checkpoint" == *"ckpt-$step" && -f "$checkpoint.index" ]] ||
        fail "no checkpoint at the step the run stopped ($step): $checkpoint"
    flock -n "$out/.fullthrottle.lock" true || fail "the output folder's lock is still held after $sig"
    ! pgrep -f -- "$out" >/dev/null || fail "a process of the run outlived it: $(pgrep -af -- "$out")"
    STEP=$step
}

began=$SECONDS
start "$work/first.log" "$ENVRUN" fullthrottle run "${args[@]}"
first=$PID
wait_for "$work/first.log" '\[trainer\] step [0-9]+' 900
start "$work/refused.log" "$ENVRUN" fullthrottle run --output-dir "$out"
finish
refusal=$(tr '\n' ' ' <"$work/refused.log")
[[ "$STATUS" == 2 && "$refusal" == *"another run is using the output folder"*"pid $first on "*"($ENVRUN fullthrottle run --output-dir $out "* ]] ||
    { cat "$work/refused.log" >&2; fail "the refusal does not name envrun's host PID $first and the typed command"; }
PID=$first
kill -TERM "$PID"
finish
stopped_cleanly "$work/first.log" SIGTERM 143
first_step=$STEP
grep -q "Resume with: $ENVRUN fullthrottle run --output-dir $out " "$work/first.log" ||
    { tail -5 "$work/first.log" >&2; fail "the resume hint is not the command as typed"; }
echo "ok: a run on the folder is refused naming envrun's PID; SIGTERM to envrun: 143 after ${ELAPSED} s, checkpoint at step $first_step, record, lock free, nothing left ($((SECONDS - began)) s)"
began=$SECONDS

start "$work/second.log" make --no-print-directory -C "$REPO" run ARGS="${args[*]}"
wait_for "$work/second.log" '\[trainer\] step [0-9]+' 900
grep -qE "\[trainer\] start step $first_step/" "$work/second.log" ||
    { grep '\[trainer\]' "$work/second.log" >&2; fail "make run did not resume at step $first_step"; }
kill -INT -- "-$PID"
finish
stopped_cleanly "$work/second.log" SIGINT 130
grep -q "Resume with: make run ARGS='--output-dir $out " "$work/second.log" ||
    { tail -5 "$work/second.log" >&2; fail "the resume hint is not the make command as typed"; }
echo "ok: make run resumed at step $first_step; SIGINT to its process group: 130 after ${ELAPSED} s, checkpoint at step $STEP, record, lock free, nothing left ($((SECONDS - began)) s)"
