#!/usr/bin/env bash
# netns_hosts.sh — two hosts x two processes without SLURM or the launcher: host1 and host2 are
# network namespaces (tests/infra/netns-up.sh: own address and host name each); each runs two
# jdt-train processes with explicit dist.rank / dist.world_size / dist.coordinator=HOST1_ADDR:PORT
# / dist.token (the manual multi-host recipe of docs/launch.md). Rank 0 binds the coordinator on
# every interface; the 4-process data-parallel run matches the single-process loss curve. A
# wrong token on one process is refused and the job fails with a message instead of hanging.
# Needs root: skips (77) otherwise; under CI=true that is a failure.
# e2e: exclusive (network namespaces, three ranks)
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}; ROOT=${JDT_ROOT:?}
fail() { echo "FAIL: $*"; exit 1; }
. "$ROOT/tests/infra/lib.sh"
[ "$(id -u)" = 0 ] || infra_skip "netns_hosts needs root (network namespaces)"
NET=$TMP/net
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  bash "$INFRA_DIR/netns-down.sh" "$NET" >/dev/null 2>&1
}
trap cleanup EXIT
bash "$INFRA_DIR/netns-up.sh" "$NET" 2 >"$TMP/up.log" 2>&1; rc=$?
[ $rc = 77 ] && infra_skip "$(tail -1 "$TMP/up.log")"
[ $rc = 0 ] || { tail -20 "$TMP/up.log"; fail "could not make 2 namespace hosts (netns-up.sh exited $rc)"; }
. "$NET/env"
cd "$TMP" || exit 1
export JDT_RUNTIME_CACHE_DIR=$TMP/cache
unset JDT_RUNTIME_THREADS
PORT=$(( 29600 + RANDOM % 200 ))
C=("$ROOT/configs/tiny.yaml" run.steps=12 run.eval_every=6 data.batch_size=8 data.micro_batch_size=4)

# job TOKEN1 OUTDIR: 4 ranks, 2 per host; rank 3 uses TOKEN1; waits (bounded) and sets RCS
job() {
  local tok3=$1 out=$2 r h tok
  PIDS=()
  for r in 0 1 2 3; do
    h=$(( r / 2 + 1 )); tok=t0k; [ $r = 3 ] && tok=$tok3
    timeout 180 bash "$INFRA_DIR/netns-exec.sh" "$NET" $h "$BIN" "${C[@]}" mesh.data=4 \
      run.out_dir="$TMP/$out" dist.rank=$r dist.world_size=4 dist.coordinator=$NETNS_ADDR_1:$PORT \
      dist.token=$tok dist.local_rank=$(( r % 2 )) runtime.threads=1 dist.connect_timeout_s=${CT:-20} \
      >"$out.$r.out" 2>"$out.$r.err" &
    PIDS+=($!)
  done
  RCS=""
  for r in 0 1 2 3; do wait "${PIDS[$r]}"; RCS="$RCS $?"; done
  PIDS=()
}

timeout 300 "$BIN" "${C[@]}" run.out_dir="$TMP/single" >/dev/null 2>single.log || { cat single.log; fail "single run"; }
job t0k multi
[ "$RCS" = " 0 0 0 0" ] || { tail -n 3 multi.*.err; fail "4-process job exit codes:$RCS"; }
grep -q 'done: 12 steps' multi.0.err || { tail multi.0.err; fail "rank 0 did not finish"; }
grep -o '"loss": [0-9.e+-]*' single/tiny/metrics.jsonl | awk '{print $2}' >a
grep -o '"loss": [0-9.e+-]*' multi/tiny/metrics.jsonl | awk '{print $2}' >b
[ "$(wc -l <a)" -eq 12 ] && [ "$(wc -l <b)" -eq 12 ] || fail "expected 12 losses each"
paste a b | awk '{ d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > m) m = r }
  END { printf "max relative loss difference %.3g\n", m; exit !(m < 1e-5) }' || fail "curves differ"
echo "ok: 2 hosts x 2 processes"

PORT=$(( PORT + 1 ))
CT=8 job wrong bad
case "$RCS" in *" 0"*) fail "a rank succeeded with a stranger in the job:$RCS";; esac
grep -qi "token" bad.3.err || { cat bad.3.err; fail "rank 3 not told about its token"; }
echo "ok: wrong token refused"
echo ok
