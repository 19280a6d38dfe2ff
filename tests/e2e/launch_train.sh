#!/usr/bin/env bash
# launch_train.sh — data-parallel training through the launcher: `jdt-train --nproc 2
# configs/tiny.yaml mesh.data=2` reproduces the single-process loss curve (metrics.jsonl, 1e-5
# relative), and a rank killed with SIGKILL mid-run ends the whole job within the limit with a
# message naming it and a non-zero exit.
# e2e: exclusive (a killed rank must end the job within 30 s)
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}; ROOT=${JDT_ROOT:?}
fail() { echo "FAIL: $*"; exit 1; }
cd "$TMP" || exit 1
export JDT_RUNTIME_CACHE_DIR="$TMP/cache"
C=("$ROOT/configs/tiny.yaml" run.steps=20 run.eval_every=10 data.batch_size=8 data.micro_batch_size=4)

timeout 300 "$BIN" "${C[@]}" run.out_dir="$TMP/single" >/dev/null 2>single.log || { cat single.log; fail "single run"; }
timeout 300 "$BIN" --nproc 2 "${C[@]}" mesh.data=2 run.out_dir="$TMP/multi" >multi.out 2>multi.log \
  || { tail -n 20 multi.log; fail "--nproc 2 run"; }
grep -q '^\[rank 0\] step 20/20 | loss' multi.log || { tail multi.log; fail "no final loss line from rank 0"; }
grep -q '^\[rank 0\] \[rank' multi.log && fail "doubled rank prefix"
grep -o '"loss": [0-9.e+-]*' single/tiny/metrics.jsonl | awk '{print $2}' >a
grep -o '"loss": [0-9.e+-]*' multi/tiny/metrics.jsonl | awk '{print $2}' >b
[ "$(wc -l <a)" -eq 20 ] && [ "$(wc -l <b)" -eq 20 ] || fail "expected 20 losses each"
paste a b | awk '{ d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > m) m = r }
  END { printf "max relative loss difference %.3g\n", m; exit !(m < 1e-5) }' || fail "curves differ"

# SIGKILL rank 1 mid-run: the job ends, naming it
"$BIN" --nproc 2 "$ROOT/configs/tiny.yaml" mesh.data=2 run.steps=100000 run.log_every=1 \
  run.eval_every=0 checkpoint.every=0 run.out_dir="$TMP/kill" >kill.out 2>kill.log &
LPID=$!
trap 'kill -KILL $LPID 2>/dev/null' EXIT
for _ in $(seq 1 600); do
  grep -q '^\[rank 0\] step 3/' kill.log && break
  kill -0 $LPID 2>/dev/null || { tail kill.log; fail "launcher ended early"; }
  sleep 0.1
done
grep -q '^\[rank 0\] step 3/' kill.log || { tail kill.log; fail "training did not start within 60 s"; }
P1=$(pgrep -P $LPID | while read -r p; do tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx 'JDT_DIST_RANK=1' && echo $p; done)
[ -n "$P1" ] || fail "cannot find rank 1's pid"
t0=$SECONDS
kill -KILL "$P1"
while kill -0 $LPID 2>/dev/null; do
  [ $((SECONDS - t0)) -le 30 ] || { tail kill.log; fail "job still running 30 s after rank 1 was killed"; }
  sleep 0.1
done
wait $LPID; rc=$?
echo "job ended $((SECONDS - t0)) s after SIGKILL of rank 1, exit $rc"
[ $rc -ne 0 ] || fail "exit 0 after a rank was killed"
grep -q '^jdt-train: rank 1 was killed by signal 9' kill.log || { tail kill.log; fail "no message naming rank 1"; }
pgrep -P $LPID >/dev/null 2>&1 && fail "ranks survived"
echo ok
