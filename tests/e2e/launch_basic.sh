#!/usr/bin/env bash
# launch_basic.sh — the local launcher (jdt-train --nproc N): every rank joins (dist-check
# all-reduces over the job), each output line carries "[rank r] ", CPU threads are split,
# usage errors (dist.* keys the launcher owns, bad N, wrong command) exit 2 with one message,
# a config error is printed once, and a rank's exit code becomes the launcher's, naming it.
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}; ROOT=${JDT_ROOT:?}
fail() { echo "FAIL: $*"; exit 1; }
# the thread counts below are the auto ones: no OpenMP settings from the caller's environment
unset OMP_NUM_THREADS OMP_PROC_BIND OMP_PLACES OMP_DYNAMIC OMP_THREAD_LIMIT
cd "$TMP" || exit 1
CFG=$ROOT/configs/tiny.yaml

# 3 ranks join; every stdout line is prefixed, each rank reports itself once
timeout 60 "$BIN" --nproc 3 dist-check "$CFG" mesh.data=3 data.batch_size=6 data.micro_batch_size=6 \
  >out 2>err; rc=$?
[ $rc -eq 0 ] || { cat out err; fail "3 ranks: exit $rc"; }
for r in 0 1 2; do
  [ "$(grep -c "^\[rank $r\] dist-check: rank $r of 3, local $r of 3, .*all-reduce ok" out)" -eq 1 ] \
    || { cat out err; fail "rank $r did not report once"; }
done
grep -v '^\[rank [0-2]\] ' out && fail "unprefixed stdout line"
grep -v '^\[rank [0-2]\] ' err && fail "unprefixed stderr line"
grep -q "^\[rank 0\] dist-check: peer 2 at 127.0.0.1" out || { cat out; fail "peer table"; }
echo "ok: 3 ranks joined, output prefixed"

# threads: the config's runtime.threads is kept; when auto, each rank gets cores / N (>= 1)
"$BIN" --nproc 2 dist-check "$CFG" mesh.data=2 >out 2>err || { cat out err; fail "threads kept"; }
[ "$(grep -c 'threads 1,' out)" -eq 2 ] || { cat out; fail "config's runtime.threads not kept"; }
cores=$(nproc); want=$(( cores / 2 )); [ $want -ge 1 ] || want=1
printf 'base_config: %s\nruntime:\n  threads: 0\n' "$CFG" >auto.yaml
"$BIN" --nproc 2 dist-check auto.yaml mesh.data=2 >out 2>err || { cat out err; fail "threads auto"; }
[ "$(grep -c "threads $want," out)" -eq 2 ] || { cat out; fail "auto threads: expected $want each"; }
"$BIN" --nproc 2 dist-check auto.yaml mesh.data=2 runtime.threads=3 >out 2>err \
  || { cat out err; fail "threads override"; }
[ "$(grep -c "threads 3," out)" -eq 2 ] || { cat out; fail "runtime.threads=3 not passed through"; }
echo "ok: threads"

# OMP_NUM_THREADS decides an auto count (as in PyTorch and llm.c); runtime.threads overrides it
OMP_NUM_THREADS=3 "$BIN" dist-check auto.yaml >out 2>err || { cat out err; fail "OMP_NUM_THREADS=3"; }
grep -q "threads 3," out || { cat out; fail "OMP_NUM_THREADS=3 not taken"; }
OMP_NUM_THREADS=3 "$BIN" --nproc 2 dist-check auto.yaml mesh.data=2 >out 2>err ||
  { cat out err; fail "OMP_NUM_THREADS=3 with --nproc 2"; }
[ "$(grep -c 'threads 3,' out)" -eq 2 ] || { cat out; fail "--nproc 2: OMP_NUM_THREADS=3 not taken by each rank"; }
OMP_NUM_THREADS=3 "$BIN" --nproc 2 dist-check auto.yaml mesh.data=2 runtime.threads=1 >out 2>err ||
  { cat out err; fail "OMP_NUM_THREADS=3 with runtime.threads=1"; }
[ "$(grep -c 'threads 1,' out)" -eq 2 ] || { cat out; fail "runtime.threads=1 did not override OMP_NUM_THREADS"; }
echo "ok: OMP_NUM_THREADS"

# OMP_PROC_BIND / OMP_PLACES (SLURM scripts set them): libgomp binds the main thread to its first
# place before main; auto threads still count every place, after the re-exec that sets
# GOMP_SPINCOUNT (cmd/main.c, which once ran the job on that one CPU) and without it
if [ "$cores" -ge 2 ]; then
  for env in "OMP_PROC_BIND=close OMP_PLACES=cores" "OMP_PROC_BIND=true" \
             "OMP_PLACES=threads GOMP_SPINCOUNT=3000"; do
    env $env "$BIN" dist-check auto.yaml >out 2>err || { cat out err; fail "dist-check with $env"; }
    grep -q "threads $cores," out || { cat out; fail "with $env: expected threads $cores"; }
  done
  echo "ok: threads under OpenMP binding"
else
  echo "note: 1 CPU, the OpenMP binding case needs 2"
fi

# a last line without a newline is flushed with one; a line over 64 KiB is split, not lost
long=$(head -c 70000 /dev/zero | tr '\0' x)
"$BIN" --nproc 2 dist-check "$CFG" mesh.data=2 --emit "$(printf 'tail-%s\nno-newline' "$long")" >out 2>err \
  || { cat err; fail "emit"; }
[ "$(grep -c '^\[rank [01]\] no-newline$' out)" -eq 2 ] || { tail -c 300 out; fail "partial last line"; }
[ "$(tr -cd x <out | wc -c)" -eq 140000 ] || fail "long lines lost bytes"
[ "$(grep -c '^\[rank 0\] tail-x' out)" -eq 1 ] && [ "$(grep -c '^\[rank 0\] x' out)" -eq 1 ] \
  || fail "a 70000-byte line should come as two prefixed pieces"
echo "ok: partial and long lines"

# inspect runs per rank too
"$BIN" --nproc 2 inspect "$CFG" mesh.data=2 >out 2>err || { cat out err; fail "inspect"; }
[ "$(grep -c '^\[rank [01]\] mesh        data=2' out)" -eq 2 ] || { cat out; fail "inspect output"; }

# usage errors: exit 2, one line, nothing started
usage() {
  local name=$1 want=$2; shift 2
  timeout 30 "$@" >out 2>err; local rc=$?
  [ $rc -eq 2 ] || { cat out err; fail "$name: exit $rc, expected 2"; }
  [ "$(wc -l <err)" -eq 1 ] || { cat err; fail "$name: expected one line on stderr"; }
  grep -qF -- "$want" err || { cat err; fail "$name: message lacks '$want'"; }
  echo "ok: $name"
}
usage dist-rank "drop 'dist.rank=1'" "$BIN" --nproc 2 train "$CFG" mesh.data=2 dist.rank=1
usage dist-coord "dist.coordinator=h:1" "$BIN" --nproc 2 "$CFG" mesh.data=2 dist.coordinator=h:1
usage env-rank "unset JDT_DIST_RANK" env JDT_DIST_RANK=0 "$BIN" --nproc 2 "$CFG" mesh.data=2
usage nproc-0 "1..1024, got '0'" "$BIN" --nproc 0 "$CFG"
usage nproc-x "got 'x'" "$BIN" --nproc=x "$CFG"
usage nproc-missing "needs a number" "$BIN" "$CFG" --nproc
usage sample "not 'sample'" "$BIN" --nproc 2 sample runs/x
usage export "not 'export'" "$BIN" --nproc 2 export runs/x --format hf out
usage no-config "missing CONFIG" "$BIN" --nproc 2 train
printf 'base_config: %s\ndist:\n  rank: 0\n' "$CFG" >rank.yaml
usage file-rank "rank.yaml sets dist.rank" "$BIN" --nproc 2 rank.yaml mesh.data=2
# a mesh that does not match N: the config error is printed once, not by every rank
usage mesh "dist.world_size" "$BIN" --nproc 2 train "$CFG"

# one rank exits with a code: the launcher names it, stops the others, exits with that code
timeout 60 "$BIN" --nproc 3 dist-check "$CFG" mesh.data=3 data.batch_size=6 data.micro_batch_size=6 \
  --hold 30 --exit 1:7 >out 2>err; rc=$?
[ $rc -eq 7 ] || { cat out err; fail "exit code: got $rc, expected 7"; }
grep -q "^jdt-train: rank 1 exited with code 7; stopping the other ranks" err || { cat err; fail "no message naming rank 1"; }
[ "$(grep -c 'got Terminated, leaving' out)" -eq 2 ] || { cat out err; fail "the other ranks were not stopped by SIGTERM"; }
echo "ok: exit code propagated"
echo "launch_basic: all ok"
