#!/usr/bin/env bash
# launch_others.sh — end to end: jobs started by other launchers join without dist.* settings.
#   a) Open MPI's mpirun (OMPI_COMM_WORLD_*; on one host the coordinator is derived from its
#      job id) trains data=2 to the same losses, bit for bit, as `jdt-train --nproc 2`;
#   b) torchrun's worker environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
#      MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*: what torch's local elastic agent sets, read
#      from its source; Debian's torchrun itself fails to start on Python 3.11) in both
#      rendezvous kinds: c10d (MASTER_PORT free for the workers) and static (the agent's store
#      holds MASTER_PORT: a listener holds it here, and the job uses the next port): the same
#      losses again;
#   c) mpirun processes spread over "two hosts" (local size below world size) without
#      MASTER_ADDR or dist.coordinator: one line that says what to set, exit 2;
#   d) the peak RSS a process reports is its own, not the launcher's that exec'd it.
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}; ROOT=${JDT_ROOT:-$PWD}
. "$ROOT/tests/infra/lib.sh"
fail() { echo "FAIL: $*"; exit 1; }
command -v mpirun >/dev/null || infra_skip "mpirun is not installed (apt-get install openmpi-bin)"
export JDT_RUNTIME_CACHE_DIR="$TMP/cache"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 # CI runs as root
C=("$ROOT/configs/tiny.yaml" mesh.data=2 run.steps=6 run.eval_every=3 checkpoint.every=0)
losses() { sed -nE 's/.*"(loss|val_loss)": ([0-9.e+-]+).*/\1 \2/p' "$1/tiny/metrics.jsonl"; }

"$BIN" --nproc 2 "${C[@]}" run.out_dir="$TMP/ref" >/dev/null 2>"$TMP/err" || { tail -5 "$TMP/err"; fail "--nproc 2 reference"; }
losses "$TMP/ref" > "$TMP/ref.txt"
[ "$(wc -l < "$TMP/ref.txt")" -eq 8 ] || fail "reference has $(wc -l < "$TMP/ref.txt") losses, expected 8"

# a) mpirun
timeout 120 mpirun -np 2 --oversubscribe "$BIN" "${C[@]}" run.out_dir="$TMP/mpi" >"$TMP/out" 2>"$TMP/err" ||
  { tail -5 "$TMP/out" "$TMP/err"; fail "mpirun -np 2"; }
losses "$TMP/mpi" | cmp -s - "$TMP/ref.txt" || { losses "$TMP/mpi" | paste - "$TMP/ref.txt"; fail "mpirun losses differ from --nproc 2"; }
echo "mpirun -np 2: the same 6 train and 2 val losses as --nproc 2"

# b) torchrun's worker environment, both rendezvous kinds
torchrun_job() { # OUT AGENT_STORE PORT
  local out=$1 agent=$2 port=$3 pids=() r rc=0
  for r in 0 1; do
    env RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 GROUP_RANK=0 ROLE_RANK=$r \
      ROLE_NAME=default GROUP_WORLD_SIZE=1 ROLE_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT="$port" TORCHELASTIC_RESTART_COUNT=0 TORCHELASTIC_MAX_RESTARTS=0 \
      TORCHELASTIC_RUN_ID=none TORCHELASTIC_USE_AGENT_STORE="$agent" \
      timeout 120 "$BIN" "${C[@]}" run.out_dir="$out" >"$TMP/tr$r.out" 2>"$TMP/tr$r.err" &
    pids+=($!)
  done
  for r in 0 1; do wait "${pids[$r]}" || { rc=1; tail -3 "$TMP/tr$r.err"; }; done
  return $rc
}
port=$(infra_free_port)
torchrun_job "$TMP/c10d" False "$port" || fail "torchrun (c10d) environment"
losses "$TMP/c10d" | cmp -s - "$TMP/ref.txt" || fail "torchrun (c10d) losses differ from --nproc 2"
# static: the agent's store listens on MASTER_PORT for the whole job
port=$(infra_free_port)
python3 -c "import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(120)" "$port" &
holder=$!
sleep 0.5
torchrun_job "$TMP/static" True "$port"; rc=$?
kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null
[ $rc -eq 0 ] || fail "torchrun (static) environment"
losses "$TMP/static" | cmp -s - "$TMP/ref.txt" || fail "torchrun (static) losses differ from --nproc 2"
echo "torchrun's environment (c10d and static rendezvous): the same losses as --nproc 2"

# c) ranks on several hosts need an address: said in one line, exit 2
env OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=0 \
  OMPI_COMM_WORLD_LOCAL_SIZE=1 OMPI_MCA_ess_base_jobid=77 \
  "$BIN" "${C[@]}" run.out_dir="$TMP/bad" >"$TMP/out" 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] || { cat "$TMP/err"; fail "mpi on two hosts without an address exited $rc, expected 2"; }
grep -q "mpi started 2 processes (OMPI_COMM_WORLD_SIZE) but MASTER_ADDR is not set: set dist.coordinator=HOST:PORT" "$TMP/err" ||
  { cat "$TMP/err"; fail "no message naming dist.coordinator"; }
[ "$(grep -c "error" "$TMP/err")" -eq 1 ] || { cat "$TMP/err"; fail "not one error line"; }
# d) a launcher's memory is not ours: exec'd by a process holding 400 MB (torchrun's Python
# forks, then execs us), the peak RSS reported is this program's own (getrusage's ru_maxrss
# survives exec and said ~400 MB)
python3 -c "import os, sys
ballast = bytearray(400 << 20)
os.execv(sys.argv[1], sys.argv[1:])" "$BIN" "$ROOT/configs/tiny.yaml" run.steps=2 run.log_every=1 \
  run.eval_every=0 checkpoint.every=0 run.out_dir="$TMP/big" >/dev/null 2>"$TMP/err" || { tail -3 "$TMP/err"; fail "exec from a big parent"; }
rss=$(sed -nE 's/.*peak RSS ([0-9]+) MB.*/\1/p' "$TMP/err" | tail -1)
[ -n "$rss" ] && [ "$rss" -lt 300 ] || { grep "peak" "$TMP/err"; fail "peak RSS '$rss' MB counts the parent's 400 MB"; }
echo "exec'd by a 400 MB parent: peak RSS $rss MB"
echo "launch_others: ok"
