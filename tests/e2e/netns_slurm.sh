#!/usr/bin/env bash
# netns_slurm.sh — SLURM across separate hosts: tests/infra/slurm-up.sh --hosts makes host1 and
# host2 (network namespaces with their own addresses, host names and slurmd; slurmctld on
# host1). Two hosts x two tasks resolve the coordinator on host1 and exchange data over the
# virtual network (peer table shows both addresses); two hosts x one task train tiny.yaml
# data-parallel and match the single-process loss curve; a task killed with SIGKILL on host2
# ends the job with a message naming its rank and host. With --distribution=arbitrary
# (SLURM_HOSTFILE) rank 0 runs on host2 while every task looks for the coordinator on host1, the
# first node of the list: the first task there hosts it, so the job joins (2 x 2 tasks) and
# trains (2 x 1, the same loss curve) instead of timing out at dist.connect_timeout_s.
# Needs root: skips (77) otherwise; under CI=true that is a failure.
# e2e: exclusive (SLURM daemons on namespace hosts)
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}; ROOT=${JDT_ROOT:?}
fail() { echo "FAIL: $*"; exit 1; }
. "$ROOT/tests/infra/lib.sh"
[ "$(id -u)" = 0 ] || infra_skip "netns_slurm needs root (network namespaces, SLURM daemons)"
CL=$TMP/slurm
H1=(bash "$INFRA_DIR/netns-exec.sh" "$CL/net" 1)   # a command on host1, the "login node"
JID=
cleanup() {
  [ -n "$JID" ] && "${H1[@]}" scancel "$JID" 2>/dev/null
  bash "$INFRA_DIR/slurm-down.sh" "$CL" >/dev/null 2>&1
}
trap cleanup EXIT
bash "$INFRA_DIR/slurm-up.sh" --hosts "$CL" 2 >"$TMP/up.log" 2>&1; rc=$?
[ $rc = 77 ] && infra_skip "$(tail -1 "$TMP/up.log")"
[ $rc = 0 ] || { tail -20 "$TMP/up.log"; fail "could not start SLURM on 2 namespace hosts (slurm-up.sh exited $rc)"; }
. "$CL/env"; . "$CL/net/env"
A1=$NETNS_ADDR_1 A2=$NETNS_ADDR_2
cd "$TMP" || exit 1
chmod 755 "$TMP"
export JDT_TRAIN_BIN=$BIN JDT_RUNTIME_CACHE_DIR=$TMP/cache
unset JDT_RUNTIME_THREADS

run_job() {  # NAME LIMIT_S SBATCH_ARGS...: bounded sbatch --wait from host1; sets RC
  local name=$1 limit=$2; shift 2
  timeout "$limit" "${H1[@]}" sbatch --wait --parsable --chdir="$TMP" -o "$TMP/$name.out" "$@" >"$name.id" 2>"$name.err"
  RC=$?
  if [ $RC -eq 124 ]; then
    "${H1[@]}" scancel "$(head -1 "$name.id")" 2>/dev/null
    tail -20 "$name.out" "$name.err" 2>/dev/null; fail "$name: job not done within ${limit}s"
  fi
}

# 1. 2 hosts x 2 tasks
run_job check 120 -N 2 --ntasks-per-node=2 "$ROOT/scripts/slurm/multi-node.sbatch" dist-check \
  "$ROOT/configs/tiny.yaml" data.batch_size=8 data.micro_batch_size=4
[ $RC -eq 0 ] || { cat check.out check.err; fail "dist-check job exited $RC"; }
for r in 0 1 2 3; do
  h=$(( r / 2 + 1 ))
  grep -qE "^dist-check: rank $r of 4, local $((r % 2)) of 2, pid [0-9]+, host host$h, coordinator host1:[0-9]+, source slurm" check.out \
    || { cat check.out; fail "rank $r: wrong world or host"; }
done
for r in 0 1; do grep -qF -x "dist-check: peer $r at $A1" check.out || { cat check.out; fail "peer $r address"; }; done
for r in 2 3; do grep -qF -x "dist-check: peer $r at $A2" check.out || { cat check.out; fail "peer $r address"; }; done
echo "ok: 2 hosts x 2 tasks joined over the network"

# 2. 2 hosts x 1 task: data-parallel training equals one process
C=("$ROOT/configs/tiny.yaml" run.steps=12 run.eval_every=6 data.batch_size=8 data.micro_batch_size=4)
timeout 300 "$BIN" "${C[@]}" run.out_dir="$TMP/single" >/dev/null 2>single.log || { cat single.log; fail "single run"; }
run_job train 300 -N 2 "$ROOT/scripts/slurm/multi-node.sbatch" "${C[@]}" run.out_dir="$TMP/multi"
[ $RC -eq 0 ] || { tail -20 train.out; fail "training job exited $RC"; }
grep -q '^\[rank 0/2\] done: 12 steps' train.out || { tail train.out; fail "training did not finish"; }
grep -o '"loss": [0-9.e+-]*' single/tiny/metrics.jsonl | awk '{print $2}' >a
grep -o '"loss": [0-9.e+-]*' multi/tiny/metrics.jsonl | awk '{print $2}' >b
[ "$(wc -l <a)" -eq 12 ] && [ "$(wc -l <b)" -eq 12 ] || fail "expected 12 losses each"
paste a b | awk '{ d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > m) m = r }
  END { printf "max relative loss difference %.3g\n", m; exit !(m < 1e-5) }' || fail "curves differ"
echo "ok: 2-host data-parallel training"

# 3. SIGKILL the task on host2 mid-run: the job ends, naming rank 1 and its host
"${H1[@]}" sbatch --parsable --chdir="$TMP" -o "$TMP/kill.out" -N 2 "$ROOT/scripts/slurm/multi-node.sbatch" \
  "$ROOT/configs/tiny.yaml" run.steps=100000 run.log_every=1 run.eval_every=0 checkpoint.every=0 \
  run.out_dir="$TMP/kill" >kill.id || fail "sbatch"
jid=$(head -1 kill.id); JID=$jid
for _ in $(seq 1 600); do grep -q '^\[rank 0/2\] step 3/' kill.out 2>/dev/null && break; sleep 0.1; done
grep -q '^\[rank 0/2\] step 3/' kill.out || { tail kill.out; fail "training did not start within 60 s"; }
victim=
for p in $(pgrep -x jdt-train); do
  penv=$(tr '\0' '\n' </proc/$p/environ 2>/dev/null)
  grep -qx "SLURM_CLUSTER_NAME=$SLURM_CLUSTER" <<<"$penv" && grep -qx "SLURM_JOB_ID=$jid" <<<"$penv" || continue
  grep -qx 'SLURM_PROCID=1' <<<"$penv" && victim=$p
done
[ -n "$victim" ] || fail "cannot find rank 1's process"
t0=$SECONDS
kill -KILL "$victim"
while "${H1[@]}" squeue -h -j "$jid" 2>/dev/null | grep -q .; do
  [ $((SECONDS - t0)) -le 60 ] || { tail kill.out; fail "job still running 60 s after rank 1 was killed"; }
  sleep 0.2
done
echo "job ended $((SECONDS - t0)) s after SIGKILL of rank 1"
grep -qE "rank 1.*${A2//./\\.}" kill.out || { tail -20 kill.out; fail "no message naming rank 1 and its host"; }
echo "ok: a killed task ends the job"
JID=

# 4. rank 0 not on the first node: srun --distribution=arbitrary places task i on line i of
# SLURM_HOSTFILE. Every task looks for the coordinator on host1 (the node list is host[1-2]);
# the first task of host1 (rank 1) hosts it. A rank 0 hosting it on host2 timed out here after
# dist.connect_timeout_s (30 s), every task exiting 1.
cat >arbitrary.sbatch <<'EOS'
#!/usr/bin/env bash
# arbitrary.sbatch HOSTFILE ARGS...: srun jdt-train ARGS with tasks placed as HOSTFILE lists
set -euo pipefail
export SLURM_HOSTFILE=$1; shift
srun --kill-on-bad-exit=1 -u --distribution=arbitrary "$JDT_TRAIN_BIN" "$@"
EOS
printf 'host2\nhost1\nhost1\nhost2\n' >hosts4
printf 'host2\nhost1\n' >hosts2
t0=$SECONDS
run_job arb-check 120 -N 2 --ntasks-per-node=2 "$TMP/arbitrary.sbatch" "$TMP/hosts4" dist-check \
  "$ROOT/configs/tiny.yaml" mesh.data=4 data.batch_size=8 data.micro_batch_size=4 dist.connect_timeout_s=30
[ $RC -eq 0 ] || { cat arb-check.out arb-check.err; fail "dist-check job with rank 0 on host2 exited $RC"; }
for r in 0 1 2 3; do
  h=2 l=0; [ $r = 1 ] || [ $r = 2 ] && h=1; [ $r = 2 ] || [ $r = 3 ] && l=1
  grep -qE "^dist-check: rank $r of 4, local $l of 2, pid [0-9]+, host host$h, coordinator host1:[0-9]+, source slurm" arb-check.out \
    || { cat arb-check.out; fail "arbitrary: rank $r: wrong world or host"; }
done
for r in 0 3; do grep -qF -x "dist-check: peer $r at $A2" arb-check.out || { cat arb-check.out; fail "arbitrary: peer $r address"; }; done
for r in 1 2; do grep -qF -x "dist-check: peer $r at $A1" arb-check.out || { cat arb-check.out; fail "arbitrary: peer $r address"; }; done
grep -q "warn: SLURM started rank 0" arb-check.out && { cat arb-check.out; fail "arbitrary: a warning for a placement that works"; }
echo "ok: rank 0 on host2, the coordinator on host1 (rank 1): joined in $((SECONDS - t0)) s"

run_job arb-train 300 -N 2 "$TMP/arbitrary.sbatch" "$TMP/hosts2" "${C[@]}" mesh.data=2 dist.connect_timeout_s=30 \
  run.out_dir="$TMP/arb"
[ $RC -eq 0 ] || { tail -20 arb-train.out; fail "training job with rank 0 on host2 exited $RC"; }
grep -q '^\[rank 0/2\] done: 12 steps' arb-train.out || { tail arb-train.out; fail "arbitrary: training did not finish"; }
grep -o '"loss": [0-9.e+-]*' arb/tiny/metrics.jsonl | awk '{print $2}' >c
[ "$(wc -l <c)" -eq 12 ] || fail "arbitrary: expected 12 losses"
paste a c | awk '{ d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > m) m = r }
  END { printf "max relative loss difference %.3g\n", m; exit !(m < 1e-5) }' || fail "arbitrary: curves differ"
echo "ok: data-parallel training with rank 0 on host2"
echo ok
