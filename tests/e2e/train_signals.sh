#!/usr/bin/env bash
# train_signals.sh — SIGINT and SIGTERM never run a handler on a worker thread: every thread of a
# training run (OpenMP's workers included) blocks both and one thread, jdt-signals, takes them
# (cmd/main.c, engine/core/signals.c); the run still stops cleanly on either. The C compiler
# the JIT runs gets a normal mask, so Ctrl-C at the terminal still stops a compile; a command
# other than train still ends by the signal itself.
# e2e: exclusive (signals)
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}; ROOT=${JDT_ROOT:?}
fail() { echo "FAIL: $*"; exit 1; }
cd "$ROOT" || exit 1
export JDT_RUNTIME_CACHE_DIR="$TMP/cache"
PID=
trap '[ -n "$PID" ] && kill -KILL "$PID" 2>/dev/null' EXIT
# SigBlk (hex) of a /proc status file blocks SIGINT (bit 1) and SIGTERM (bit 14)
blocks_stop() { local m; m=$(sed -nE 's/^SigBlk:\s*([0-9a-f]+)/\1/p' "$1"); (( (16#$m & 0x4002) == 0x4002 )); }
blocks_any() { local m; m=$(sed -nE 's/^SigBlk:\s*([0-9a-f]+)/\1/p' "$1"); (( (16#$m & 0x4002) != 0 )); }
# wait_line FILE PATTERN: up to 60 s, while PID lives
wait_line() {
  for _ in $(seq 600); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    kill -0 "$PID" 2>/dev/null || { tail -3 "$1"; fail "process ended before '$2'"; }
    sleep 0.1
  done
  tail -3 "$1"; fail "no '$2' within 60 s"
}

# 1. a run with 2 threads (an OpenMP worker) and oneDNN's GEMMs (the width): every thread but
#    jdt-signals blocks SIGINT and SIGTERM; then SIGINT stops it cleanly (exit 130 with a
#    checkpoint), though bash starts a background job with SIGINT ignored, as before
"$BIN" configs/tiny.yaml model.n_embd=384 model.n_head=6 runtime.threads=2 run.steps=100000 \
  run.eval_every=0 checkpoint.every=0 run.out_dir="$TMP/t" >"$TMP/out" 2>"$TMP/err" &
PID=$!
wait_line "$TMP/err" "step 2/"
n=0; sig=0
for t in /proc/$PID/task/*; do
  n=$((n + 1))
  # the one meant to take them: while it waits in sigwaitinfo, the kernel unblocks them for it
  if [ "$(cat "$t/comm")" = jdt-signals ]; then sig=1; continue; fi
  blocks_stop "$t/status" || fail "thread $(basename "$t") ($(cat "$t/comm")) does not block SIGINT and SIGTERM: $(grep SigBlk "$t/status")"
done
[ $sig = 1 ] || fail "no jdt-signals thread"
[ $n -ge 4 ] || fail "only $n threads: main, jdt-signals, the data prefetch and an OpenMP worker expected"
kill -INT $PID; wait $PID; rc=$?; PID=
[ $rc -eq 130 ] || { tail -3 "$TMP/err"; fail "SIGINT: exit $rc, expected 130"; }
grep -q "stopped by SIGINT after step" "$TMP/err" || fail "no clean stop: $(tail -1 "$TMP/err")"
ls -d "$TMP/t/tiny/ckpt/step_"* >/dev/null 2>&1 || fail "no checkpoint after SIGINT"
echo "ok: $n threads block SIGINT/SIGTERM; SIGINT stopped the run cleanly"

# 2. the compiler starts with neither signal blocked (a wrapper records its mask); Ctrl-C, the
#    signal to the whole process group, stops a compile in progress (the wrapper's sleep stands
#    for a long compile): exit 1 naming the compiler, as before, not a hang
cat >"$TMP/cc" <<EOF
#!/usr/bin/env python3
# (not a shell script: dash clears the mask it was given when it starts)
import os, sys
open("$TMP/cc-mask", "w").write([l for l in open("/proc/self/status") if l.startswith("SigBlk")][0])
if sys.argv[1:2] != ["--version"] and os.path.exists("$TMP/cc-hang"):
    os.execvp("sleep", ["sleep", "120"])
os.execvp("cc", ["cc"] + sys.argv[1:])
EOF
chmod +x "$TMP/cc"
timeout 300 "$BIN" configs/tiny.yaml runtime.cc="$TMP/cc" run.steps=1 run.eval_every=0 \
  run.out_dir="$TMP/c" >/dev/null 2>"$TMP/err" || { tail -3 "$TMP/err"; fail "run with the wrapped cc"; }
[ -s "$TMP/cc-mask" ] || fail "the wrapper did not run"
blocks_any "$TMP/cc-mask" && fail "the compiler starts with SIGINT or SIGTERM blocked: $(cat "$TMP/cc-mask")"
touch "$TMP/cc-hang"
JDT_RUNTIME_CACHE_DIR="$TMP/cache2" setsid "$BIN" configs/tiny.yaml runtime.cc="$TMP/cc" \
  run.steps=1 run.out_dir="$TMP/c2" >/dev/null 2>"$TMP/err" &
PID=$!
[ "$(ps -o pgid= -p $PID | tr -d ' ')" = "$PID" ] || fail "setsid did not make a process group of its own"
for _ in $(seq 600); do
  pgrep -P $PID -x sleep >/dev/null && break
  kill -0 $PID 2>/dev/null || { tail -3 "$TMP/err"; fail "ended before the compile"; }
  sleep 0.1
done
pgrep -P $PID -x sleep >/dev/null || fail "the compile did not start"
t0=$SECONDS
kill -INT -- -$PID; wait $PID; rc=$?; PID=
[ $((SECONDS - t0)) -lt 20 ] || fail "Ctrl-C took $((SECONDS - t0)) s to stop the compile"
[ $rc -eq 1 ] || { tail -3 "$TMP/err"; fail "Ctrl-C during the compile: exit $rc, expected 1"; }
grep -q "failed (exit 130)" "$TMP/err" || fail "not the compiler's SIGINT: $(tail -1 "$TMP/err")"
echo "ok: the compiler gets a normal mask and stops on Ctrl-C"

# 3. other commands: killed by the signal itself (the wait status, not an exit code), as before
python3 - "$BIN" "$TMP/t/tiny/ckpt" <<'PY' || fail "sample and eval under signals"
import signal, subprocess, sys, time
binary, ckpt = sys.argv[1], sys.argv[2]
for sig in (signal.SIGINT, signal.SIGTERM):
    p = subprocess.Popen([binary, "sample", ckpt, "--prompt", "ab", "--length", "100000"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.5)
    p.send_signal(sig)
    try:
        rc = p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        sys.exit(f"sample still running 30 s after {sig.name}")
    assert rc == -sig, f"sample: {sig.name} gave {rc}, expected death by the signal ({-sig})"
print("ok: sample dies by SIGINT and SIGTERM")
PY
echo "train_signals: all ok"
