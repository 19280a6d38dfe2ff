#!/usr/bin/env bash
# train_dp.sh — data-parallel training: two processes (explicit dist.* keys, rank 0 hosting the
# coordinator on a free loopback port) with mesh.data=2 reproduce the single-process loss curve
# over 20 steps to 1e-5 relative, with gradient accumulation on; mesh/world mismatch is a clear
# config error; a rank whose config differs from rank 0's in a key that shapes the job ends both
# ranks with one line naming the key, while per-process keys (data.prefetch here) may differ.
# (The --nproc launcher and SLURM have their own tests.)
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}
fail() { echo "FAIL: $*"; exit 1; }
export JDT_RUNTIME_CACHE_DIR="$TMP/cache"
C="configs/tiny.yaml run.steps=20 run.eval_every=10 data.batch_size=8 data.micro_batch_size=4"
"$BIN" $C run.out_dir="$TMP/single" >/dev/null 2>"$TMP/single.log" || { cat "$TMP/single.log"; fail "single run"; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for r in 0 1; do
  "$BIN" $C run.out_dir="$TMP/multi" mesh.data=2 dist.world_size=2 dist.rank=$r \
    dist.coordinator=127.0.0.1:$port dist.token=t0k runtime.threads=1 data.prefetch=$((2 + r)) \
    >/dev/null 2>"$TMP/err$r" &
  pids[$r]=$!
done
rc=0; for r in 0 1; do wait ${pids[$r]} || rc=$?; done
[ $rc -eq 0 ] || { tail -n 5 "$TMP/err0" "$TMP/err1"; fail "2-process run exited $rc"; }
grep -o '"loss": [0-9.e+-]*' "$TMP/single/tiny/metrics.jsonl" | awk '{print $2}' > "$TMP/a"
grep -o '"loss": [0-9.e+-]*' "$TMP/multi/tiny/metrics.jsonl" | awk '{print $2}' > "$TMP/b"
[ "$(wc -l < "$TMP/a")" -eq 20 ] && [ "$(wc -l < "$TMP/b")" -eq 20 ] || fail "expected 20 losses each"
paste "$TMP/a" "$TMP/b" | awk '{ d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > m) m = r }
  END { printf "max relative loss difference %.3g\n", m; exit !(m < 1e-5) }' || fail "curves differ"
grep -q '"val_loss"' "$TMP/multi/tiny/metrics.jsonl" || fail "no val loss from the 2-process run"
[ -d "$TMP/multi/tiny/ckpt/step_000020" ] || fail "rank 0 wrote no checkpoint"
# a mesh that does not match the job is a config error (exit 2) naming both numbers
"$BIN" $C run.out_dir="$TMP/x" mesh.data=2 >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] || { cat "$TMP/err"; fail "mesh.data=2 in one process exited $rc, expected 2"; }
grep -q "= 2 devices, but the job has 1 process" "$TMP/err" || fail "mismatch message: $(cat "$TMP/err")"
# rank 1 with another learning rate: both ranks stop at start-up, naming the key and values
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
for r in 0 1; do
  lr=0.001; [ $r -eq 1 ] && lr=0.002
  timeout 60 "$BIN" $C run.out_dir="$TMP/differ" mesh.data=2 dist.world_size=2 dist.rank=$r \
    dist.coordinator=127.0.0.1:$port dist.token=t0k runtime.threads=1 optimizer.lr=$lr \
    >/dev/null 2>"$TMP/differ$r" &
  pids[$r]=$!
done
wait ${pids[0]}; rc0=$?; wait ${pids[1]}; rc1=$?
[ $rc1 -eq 2 ] || { cat "$TMP/differ1"; fail "rank 1 with another optimizer.lr exited $rc1, expected 2"; }
[ $rc0 -ne 0 ] && [ $rc0 -ne 124 ] || { cat "$TMP/differ0"; fail "rank 0 exited $rc0"; }
want="rank 1's config differs from rank 0's: optimizer.lr is 0.002 here, 0.001 on rank 0"
grep -qF "$want" "$TMP/differ1" || fail "rank 1 said: $(tail -n 1 "$TMP/differ1")"
grep -qF "$want" "$TMP/differ0" || fail "rank 0 said: $(tail -n 1 "$TMP/differ0")"
[ ! -e "$TMP/differ/tiny/ckpt" ] || fail "the refused job wrote a checkpoint"
echo ok
