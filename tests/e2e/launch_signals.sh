#!/usr/bin/env bash
# launch_signals.sh — failure handling of the local launcher: a rank killed with SIGKILL ends
# the whole job (the others notice the lost peer or are stopped) within the limit, with a
# message naming the rank and a non-zero exit; SIGTERM to the launcher reaches every rank;
# no process of the job survives the launcher.
# e2e: exclusive (signals and the time-outs they race)
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}; ROOT=${JDT_ROOT:?}
fail() { echo "FAIL: $*"; exit 1; }
cd "$TMP" || exit 1
CFG=$ROOT/configs/tiny.yaml
ARGS=(dist-check "$CFG" mesh.data=3 data.batch_size=6 data.micro_batch_size=6 --hold 120)
LPID=
cleanup() { [ -n "$LPID" ] && kill -KILL "$LPID" 2>/dev/null; }
trap cleanup EXIT

# start_job: launches 3 ranks in the background, waits until all three joined
start_job() {
  "$BIN" --nproc 3 "${ARGS[@]}" >out 2>err &
  LPID=$!
  for _ in $(seq 1 300); do
    [ "$(grep -c 'all-reduce ok' out 2>/dev/null)" = 3 ] && return 0
    kill -0 "$LPID" 2>/dev/null || { cat out err; fail "launcher ended early"; }
    sleep 0.1
  done
  cat out err; fail "ranks did not join within 30 s"
}
rank_pid() { sed -nE "s/^\[rank $1\] dist-check: rank $1 of 3, .* pid ([0-9]+), .*/\1/p" out; }
# wait_launcher LIMIT_S: waits for the launcher, sets RC; fails past the limit
wait_launcher() {
  local limit=$1 t0=$SECONDS
  while kill -0 "$LPID" 2>/dev/null; do
    [ $((SECONDS - t0)) -le "$limit" ] || { cat out err; fail "launcher still running after ${limit}s"; }
    sleep 0.1
  done
  wait "$LPID"; RC=$?; LPID=
  echo "  launcher ended after $((SECONDS - t0))s with exit $RC"
}
no_survivors() {
  for p in "$@"; do
    [ -n "$p" ] || continue
    if kill -0 "$p" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null; then
      fail "rank process $p survived"
    fi
  done
}

# 1. SIGKILL one rank mid-job
start_job
P0=$(rank_pid 0); P1=$(rank_pid 1); P2=$(rank_pid 2)
kill -KILL "$P1"
wait_launcher 30
[ "$RC" -ne 0 ] || fail "launcher exited 0 after a rank was killed"
grep -q "^jdt-train: rank 1 was killed by signal 9" err || { cat out err; fail "no message naming rank 1"; }
no_survivors "$P0" "$P1" "$P2"
echo "ok: SIGKILL of rank 1 ended the job"

# 2. SIGTERM to the launcher reaches every rank, which leave cleanly
start_job
P0=$(rank_pid 0); P1=$(rank_pid 1); P2=$(rank_pid 2)
kill -TERM "$LPID"
wait_launcher 30
[ "$RC" -eq 143 ] || { cat out err; fail "launcher exit $RC after SIGTERM, expected 143"; }
for r in 0 1 2; do
  grep -q "^\[rank $r\] dist-check: rank $r got Terminated, leaving" out || { cat out err; fail "rank $r did not get SIGTERM"; }
done
no_survivors "$P0" "$P1" "$P2"
echo "ok: SIGTERM forwarded"

# 3. SIGINT too (like Ctrl-C)
start_job
kill -INT "$LPID"
wait_launcher 30
[ "$RC" -eq 130 ] || { cat out err; fail "launcher exit $RC after SIGINT, expected 130"; }
[ "$(grep -c 'got Interrupt, leaving' out)" = 3 ] || { cat out err; fail "SIGINT not forwarded to all"; }
echo "ok: SIGINT forwarded"

# 4. the launcher itself killed: the ranks do not outlive it (parent-death signal)
start_job
P0=$(rank_pid 0); P1=$(rank_pid 1); P2=$(rank_pid 2)
kill -KILL "$LPID"; wait "$LPID" 2>/dev/null; LPID=
for _ in $(seq 1 100); do
  alive=0; for p in $P0 $P1 $P2; do kill -0 "$p" 2>/dev/null && alive=1; done
  [ $alive = 0 ] && break; sleep 0.1
done
no_survivors "$P0" "$P1" "$P2"
echo "ok: ranks end with a killed launcher"
# 5. a rank that ignores SIGTERM is killed after the grace period; the launcher still ends
"$BIN" --nproc 2 dist-check "$CFG" mesh.data=2 --hold 120 --stubborn --exit 1:3 >out 2>err &
LPID=$!
wait_launcher 40
[ "$RC" -eq 3 ] || { cat out err; fail "exit $RC, expected rank 1's 3"; }
grep -q "^jdt-train: rank 0 did not stop within 10 s: killing it" err || { cat err; fail "no SIGKILL escalation message"; }
echo "ok: SIGKILL after the grace period"
echo "launch_signals: all ok"
