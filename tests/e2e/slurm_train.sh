#!/usr/bin/env bash
# slurm_train.sh — the scripts in scripts/slurm on a real SLURM cluster (tests/infra/slurm-up.sh:
# 2 nodes on this machine): multi-node.sbatch with 2 nodes x 2 tasks resolves ranks, local ranks
# and the coordinator (first node, job-derived port) and all-reduces over 4 processes;
# one-node.sbatch trains tiny.yaml data-parallel on 2 tasks and matches the single-process loss
# curve; a heterogeneous step (1 + 2 tasks) joins; jdt-train run in the batch script without
# srun is refused with a hint.
# Needs root (the cluster's daemons): skips (77) otherwise; under CI=true that is a failure.
# e2e: exclusive (SLURM daemons)
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}; ROOT=${JDT_ROOT:?}
fail() { echo "FAIL: $*"; exit 1; }
. "$ROOT/tests/infra/lib.sh"
[ "$(id -u)" = 0 ] || infra_skip "slurm_train needs root to run SLURM's daemons"
CL=$TMP/slurm
trap 'bash "$INFRA_DIR/slurm-down.sh" "$CL" >/dev/null 2>&1' EXIT
bash "$INFRA_DIR/slurm-up.sh" "$CL" 2 >"$TMP/up.log" 2>&1; rc=$?
[ $rc = 77 ] && infra_skip "$(tail -1 "$TMP/up.log")"
[ $rc = 0 ] || { tail -20 "$TMP/up.log"; fail "could not start a 2-node SLURM cluster (slurm-up.sh exited $rc)"; }
. "$CL/env"
cd "$TMP" || exit 1
chmod 755 "$TMP"
export JDT_TRAIN_BIN=$BIN JDT_RUNTIME_CACHE_DIR=$TMP/cache
unset JDT_RUNTIME_THREADS

# run_job NAME LIMIT_S SBATCH_ARGS...: sbatch --wait bounded in time; sets RC, output in NAME.out
run_job() {
  local name=$1 limit=$2; shift 2
  timeout "$limit" sbatch --wait --parsable --chdir="$TMP" -o "$TMP/$name.out" "$@" >"$name.id" 2>"$name.err"
  RC=$?
  if [ $RC -eq 124 ]; then
    scancel "$(head -1 "$name.id")" 2>/dev/null
    cat "$name.out" "$name.err" 2>/dev/null | tail -20; fail "$name: job not done within ${limit}s"
  fi
}

# 1. 2 nodes x 2 tasks: world resolution inside srun
run_job check 120 -N 2 --ntasks-per-node=2 "$ROOT/scripts/slurm/multi-node.sbatch" dist-check "$ROOT/configs/tiny.yaml" \
  data.batch_size=8 data.micro_batch_size=4
[ $RC -eq 0 ] || { cat check.out check.err; fail "dist-check job exited $RC"; }
jid=$(head -1 check.id)
for r in 0 1 2 3; do
  grep -qE "^dist-check: rank $r of 4, local $((r % 2)) of 2, .*coordinator node1:[0-9]+, source slurm, .*all-reduce ok" check.out \
    || { cat check.out; fail "rank $r: wrong or missing world"; }
done
[ "$(grep -oE 'coordinator node1:[0-9]+' check.out | sort -u | wc -l)" = 1 ] || fail "ranks disagree on the coordinator"
echo "ok: 2 nodes x 2 tasks joined (job $jid)"

# 2. data-parallel training on 2 tasks equals the single-process curve
C=("$ROOT/configs/tiny.yaml" run.steps=12 run.eval_every=6 data.batch_size=8 data.micro_batch_size=4)
timeout 300 "$BIN" "${C[@]}" run.out_dir="$TMP/single" >/dev/null 2>single.log || { cat single.log; fail "single run"; }
run_job train 300 -n 2 "$ROOT/scripts/slurm/one-node.sbatch" "${C[@]}" run.out_dir="$TMP/multi"
[ $RC -eq 0 ] || { tail -20 train.out; fail "training job exited $RC"; }
grep -q '^\[rank 0/2\] step 12/12 | loss' train.out || { tail train.out; fail "no final loss line"; }
grep -q '^\[rank 0/2\] done: 12 steps' train.out || { tail train.out; fail "training did not finish"; }
grep -o '"loss": [0-9.e+-]*' single/tiny/metrics.jsonl | awk '{print $2}' >a
grep -o '"loss": [0-9.e+-]*' multi/tiny/metrics.jsonl | awk '{print $2}' >b
[ "$(wc -l <a)" -eq 12 ] && [ "$(wc -l <b)" -eq 12 ] || fail "expected 12 losses each"
paste a b | awk '{ d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > m) m = r }
  END { printf "max relative loss difference %.3g\n", m; exit !(m < 1e-5) }' || fail "curves differ"
echo "ok: SLURM data-parallel training"

# 3. a heterogeneous step: components of 1 and 2 tasks (SLURM gives the components of a
#    heterogeneous job separate nodes: two on one node pend for resources), one srun over both:
#    ranks 0-2, local sizes 1 and 2 (the step's tasks per node), the coordinator on node1
printf '#!/bin/bash\nsrun --het-group=0,1 --kill-on-bad-exit=1 -u "%s" dist-check "%s" mesh.data=3 data.batch_size=6 data.micro_batch_size=6\n' \
  "$BIN" "$ROOT/configs/tiny.yaml" >het.sh
run_job het 120 -n 1 : -n 2 het.sh
[ $RC -eq 0 ] || { cat het.out het.err; fail "heterogeneous dist-check job exited $RC"; }
for want in "rank 0 of 3, local 0 of 1" "rank 1 of 3, local 0 of 2" "rank 2 of 3, local 1 of 2"; do
  grep -qE "^dist-check: $want, .*coordinator node1:[0-9]+, source slurm, .*all-reduce ok" het.out \
    || { cat het.out; fail "heterogeneous step: no line '$want'"; }
done
echo "ok: a heterogeneous step (1 + 2 tasks) joined"

# 4. jdt-train in the batch script itself (no srun) with 2 tasks: a clear refusal
printf '#!/bin/bash\n"%s" dist-check "%s" mesh.data=2\n' "$BIN" "$ROOT/configs/tiny.yaml" >nosrun.sh
run_job nosrun 60 -n 2 nosrun.sh
[ $RC -eq 2 ] || { cat nosrun.out; fail "no-srun job exited $RC, expected 2"; }
grep -q "outside srun" nosrun.out || { cat nosrun.out; fail "no hint about srun"; }
echo "ok: refused outside srun"
echo ok
