#!/usr/bin/env bash
# fault_dist.sh — faults in multi-process training (explicit dist.* keys, rank 0 hosting the
# coordinator on a free loopback port; short peer time-outs), each ending every process with a
# non-zero exit and one line naming the problem and the rank, and losing no work:
#  1. a rank killed in the middle of a checkpoint save: the job ends naming it, resume: auto
#     takes the newest complete checkpoint and the loss curve continues exactly;
#  2. a rank killed after rank 0 committed the checkpoint: rank 0 says it was saved, not "not
#     saved (the previous one is kept)" as it did of a checkpoint in place;
#  3. ranks that see different checkpoints (a relative run.out_dir from different working
#     directories) refuse to start instead of training together from steps 4 and 2;
#  4. a rank given a shorter copy of the data (data.train_path is per process), or other data of
#     the same size, refuses to train instead of drawing its batches from another dataset;
#  5. the --nproc launcher with a stopped rank (SIGSTOP): it is named and continued, so the
#     job ends at dist.peer_timeout_s instead of after the 10 s grace period;
#  6. a rank stopped while it compiles the step into a cache the other rank waits on: the other
#     ends at dist.peer_timeout_s naming it, not after the compile lock's wait (10 minutes).
# e2e: exclusive (peer time-outs and kills timed against a running job)
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}; ROOT=${JDT_ROOT:?}
fail() { echo "FAIL: $*"; exit 1; }
cd "$TMP" || exit 1
export JDT_RUNTIME_CACHE_DIR="$TMP/cache"
PIDS=()
cleanup() { for p in "${PIDS[@]}" ${LP:-}; do kill -KILL "$p" 2>/dev/null; done; }
trap cleanup EXIT
freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
C=("$ROOT/configs/tiny.yaml" run.eval_every=0 run.log_every=1 checkpoint.every=2 checkpoint.keep=5
   data.batch_size=8 data.micro_batch_size=4 runtime.threads=1)
D=(mesh.data=2 dist.world_size=2 dist.token=t0k dist.peer_timeout_s=3 dist.heartbeat_s=0.5
   dist.connect_timeout_s=20)
# start2 NAME ARGS...: ranks 0 and 1 in the background (logs NAME.err0/1, pids in PIDS)
start2() {
  local name=$1 port; shift; port=$(freeport)
  for r in 0 1; do
    "$BIN" "${C[@]}" "${D[@]}" dist.coordinator=127.0.0.1:$port dist.rank=$r "$@" \
      >/dev/null 2>"$name.err$r" &
    PIDS[$r]=$!
  done
}
# wait2 LIMIT_S: waits for both ranks (killing them past the limit), sets RC0 and RC1
wait2() {
  local t0=$SECONDS
  for r in 0 1; do
    while kill -0 "${PIDS[$r]}" 2>/dev/null; do
      [ $((SECONDS - t0)) -le "$1" ] || { kill -KILL "${PIDS[$r]}"; echo "rank $r still running after $1 s"; }
      sleep 0.05
    done
    wait "${PIDS[$r]}"; eval "RC$r=$?"
  done
  PIDS=()
}
# when_exists PATH PID SIG: sends SIG to PID as soon as PATH exists (polled every millisecond)
when_exists() {
  python3 - "$@" <<'PY'
import os, signal, sys, time
path, pid, sig = sys.argv[1], int(sys.argv[2]), getattr(signal, sys.argv[3])
t0 = time.time()
while not os.path.exists(path):
    if time.time() - t0 > 120: sys.exit("never appeared: " + path)
    time.sleep(0.001)
os.kill(pid, sig)
PY
}
losses() { grep -o '"step": [0-9]*, "loss": [0-9.e+-]*' "$1" | awk '{ gsub(",", ""); l[$2] = $4 } END { for (s in l) print s, l[s] }' | sort -n; }

# 1. rank 1 killed as the step-4 save begins: the job ends naming it; resume continues exactly
start2 ref run.out_dir="$TMP/ref" run.steps=8
wait2 120; [ "$RC0$RC1" = 00 ] || { tail -n 3 ref.err0 ref.err1; fail "reference run: exits $RC0 $RC1"; }
start2 k run.out_dir="$TMP/k" run.steps=8
when_exists "$TMP/k/tiny/ckpt/step_000004.tmp" "${PIDS[1]}" SIGKILL || fail "no save at step 4"
wait2 30
[ "$RC1" = 137 ] && [ "$RC0" = 1 ] || { tail -n 3 k.err0; fail "killed mid-save: exits $RC0 $RC1, expected 1 137"; }
grep -q "rank 1 (host 127.0.0.1) lost" k.err0 || { cat k.err0; fail "rank 0 does not name rank 1"; }
[ "$(grep -c 'error:' k.err0)" -eq 1 ] || { grep error k.err0; fail "rank 0 reports the job's end in more than one error line"; }
ls k/tiny/ckpt/step_000004/state.h5 >/dev/null 2>&1 && echo "  (the kill came after the commit)"
start2 k run.out_dir="$TMP/k" run.steps=8 checkpoint.resume=auto
wait2 120; [ "$RC0$RC1" = 00 ] || { tail -n 3 k.err0 k.err1; fail "resume: exits $RC0 $RC1"; }
grep -qE "resumed from .*/step_00000[24] at step [24]" k.err0 || { cat k.err0; fail "resume did not take a complete checkpoint"; }
[ "$(ls k/tiny/ckpt)" = "$(printf 'step_000002\nstep_000004\nstep_000006\nstep_000008')" ] || fail "checkpoints after the resume: $(ls k/tiny/ckpt)"
losses ref/tiny/metrics.jsonl >a; losses k/tiny/metrics.jsonl >b
[ "$(wc -l <b)" -eq 8 ] || fail "expected 8 steps of losses, got $(wc -l <b)"
cmp -s a b || { paste a b; fail "the resumed loss curve differs from the uninterrupted one"; }
echo "ok: rank killed mid-save, resumed from the last complete checkpoint, same losses"

# 2. rank 1 killed once rank 0 writes the step-4 manifest (every part is on disk: rank 0
#    commits): rank 0 must not call the checkpoint in place "not saved"
start2 c run.out_dir="$TMP/c" run.steps=8
when_exists "$TMP/c/tiny/ckpt/step_000004.tmp/state.h5" "${PIDS[1]}" SIGKILL || fail "no manifest at step 4"
wait2 30
[ "$RC0" = 1 ] || { cat c.err0; fail "rank 0 exited $RC0 after rank 1 was killed"; }
[ -f c/tiny/ckpt/step_000004/state.h5 ] || fail "step 4 not committed: $(ls c/tiny/ckpt)"
grep -q "not saved" c.err0 && { grep error c.err0; fail "rank 0 says 'not saved' of a committed checkpoint"; }
grep -q "rank 1 (host 127.0.0.1) lost" c.err0 || { cat c.err0; fail "rank 0 does not name rank 1"; }
[ "$(grep -c 'error:' c.err0)" -eq 1 ] || { grep error c.err0; fail "rank 0 reports the job's end in more than one error line"; }
echo "ok: a rank lost after the commit: $(grep -o 'error: after saving checkpoint [^:]*' c.err0 || tail -n 1 c.err0)"

# 3. rank 1 sees only step 2 (its working directory's copy), rank 0 step 4: refused at start
mkdir -p h0 h1 # run.out_dir=runs: relative, from each rank's working directory
port=$(freeport)
(cd h0 && exec "$BIN" "${C[@]}" "${D[@]}" dist.coordinator=127.0.0.1:$port dist.rank=0 run.out_dir=runs run.steps=4 >/dev/null 2>err0) &
(cd h0 && exec "$BIN" "${C[@]}" "${D[@]}" dist.coordinator=127.0.0.1:$port dist.rank=1 run.out_dir=runs run.steps=4 >/dev/null 2>err1)
wait; [ -d h0/runs/tiny/ckpt/step_000004 ] || { cat h0/err0; fail "set-up run"; }
cp -r h0/runs h1/; rm -rf h1/runs/tiny/ckpt/step_000004
port=$(freeport); t0=$SECONDS
for r in 0 1; do
  (cd h$r && exec timeout 60 "$BIN" "${C[@]}" "${D[@]}" dist.coordinator=127.0.0.1:$port dist.rank=$r \
    run.out_dir=runs run.steps=8 checkpoint.resume=auto >/dev/null 2>err) &
  PIDS[$r]=$!
done
wait2 60
[ "$RC0" = 1 ] && [ "$RC1" = 1 ] || { cat h0/err h1/err; fail "ranks resuming apart: exits $RC0 $RC1, expected 1 1"; }
want="rank 1 starts at step 2 (data batch 2), rank 0 at step 4 (data batch 4): the ranks see different checkpoints in runs/tiny/ckpt"
grep -qF "$want" h0/err && grep -qF "$want" h1/err || { cat h0/err h1/err; fail "no line naming both steps"; }
grep -qE '^(\[rank 0/2\] )?step [0-9]+/8' h0/err && fail "rank 0 trained with a rank that started elsewhere"
echo "ok: ranks that see different checkpoints refused in $((SECONDS - t0)) s"

# 4. rank 1 given a shorter copy of the training data (data.train_path is per process): both
#    refuse to train, naming both sample counts, instead of drawing batches from two datasets
awk 'BEGIN { for (i = 0; i < 300; i++) printf "the quick brown fox %d jumps over the lazy dog\n", i }' >long.txt
head -c 3000 long.txt >short.txt
for d in long short; do
  "$BIN" prepare "${C[@]}" data.format=tokens data.source=$d.txt data.train_path=$d data.n_shards=1 \
    >/dev/null 2>prep.err || { cat prep.err; fail "prepare $d"; }
done
# data_refused NAME DATA0 DATA1 WANT: rank 0 reads DATA0, rank 1 DATA1; both exit 1 saying WANT
data_refused() {
  local name=$1 d0=$2 other=$3 want=$4 port d; port=$(freeport)
  for r in 0 1; do
    d=$d0; [ $r = 1 ] && d=$other
    "$BIN" "${C[@]}" "${D[@]}" dist.coordinator=127.0.0.1:$port dist.rank=$r run.out_dir="$TMP/$name" \
      data.format=tokens data.train_path=$d run.steps=8 >/dev/null 2>$name.err$r &
    PIDS[$r]=$!
  done
  wait2 60
  [ "$RC0" = 1 ] && [ "$RC1" = 1 ] || { cat $name.err0 $name.err1; fail "rank 1 reading $other: exits $RC0 $RC1, expected 1 1"; }
  grep -qF "$want" $name.err0 && grep -qF "$want" $name.err1 || { tail -n 2 $name.err0 $name.err1; fail "no line saying: $want"; }
}
data_refused dd long short "rank 1's training data holds 84 samples, rank 0's 401: every rank must read the same dataset"
echo "ok: a rank with a shorter copy of the data refused"
# 4b. the same number of samples, other text in the last line only ("fox 299" -> "cat 299",
# past every row of the first batch; nothing held out for validation, so it is training data):
# refused by the content's print
sed 's/fox 299/cat 299/' long.txt >other.txt
cmp -s long.txt other.txt && fail "other.txt is long.txt"
for d in long other; do
  "$BIN" prepare "${C[@]}" data.format=tokens data.source=$d.txt data.train_path=${d}0 data.n_shards=1 \
    data.val_fraction=0 >/dev/null 2>prep.err || { cat prep.err; fail "prepare ${d}0"; }
done
data_refused do long0 other0 "rank 1's training data differs from rank 0's (the same 446 samples, other content)"
echo "ok: a rank with other data of the same size (its last line) refused"
# 4c. the same tokens split into other shards: accepted (the print reads the stream, not files)
"$BIN" prepare "${C[@]}" data.format=tokens data.source=long.txt data.train_path=long3 data.n_shards=3 \
  >/dev/null 2>prep.err || { cat prep.err; fail "prepare long3"; }
port=$(freeport)
for r in 0 1; do
  d=long; [ $r = 1 ] && d=long3
  "$BIN" "${C[@]}" "${D[@]}" dist.coordinator=127.0.0.1:$port dist.rank=$r run.out_dir="$TMP/l3" \
    data.format=tokens data.train_path=$d run.steps=2 checkpoint.every=0 >/dev/null 2>l3.err$r &
  PIDS[$r]=$!
done
wait2 60
[ "$RC0$RC1" = 00 ] || { tail -n 3 l3.err0 l3.err1; fail "the same data in 3 shards refused: exits $RC0 $RC1"; }
echo "ok: the same data in other shards accepted"

# 5. the launcher with rank 1 stopped: named, continued, the job ends within about 3 s
"$BIN" --nproc 2 "${C[@]}" mesh.data=2 dist.peer_timeout_s=2 dist.heartbeat_s=0.5 \
  run.steps=100000 checkpoint.every=0 run.out_dir="$TMP/l" >l.out 2>l.err &
LP=$!
for _ in $(seq 1 600); do grep -q '^\[rank 0\] step 3/' l.err && break; sleep 0.1; done
grep -q '^\[rank 0\] step 3/' l.err || { tail l.err; fail "launched job did not start"; }
P1=$(pgrep -P $LP | while read -r p; do tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx 'JDT_DIST_RANK=1' && echo $p; done)
[ -n "$P1" ] || fail "cannot find rank 1's pid"
kill -STOP "$P1"; t0=$SECONDS
while kill -0 $LP 2>/dev/null; do
  [ $((SECONDS - t0)) -le 8 ] || { kill -CONT "$P1"; tail l.err; fail "job still running 8 s after rank 1 stopped"; }
  sleep 0.1
done
wait $LP; rc=$?; LP=
[ $rc -ne 0 ] || fail "launcher exited 0 with a stopped rank"
grep -q "no heartbeat for 2.0 s" l.err && grep -q "^jdt-train: rank 1 is stopped" l.err || { cat l.err | grep -v '| loss'; fail "rank 1 not named as stopped"; }
kill -0 "$P1" 2>/dev/null && ! grep -q '^State:.*Z' /proc/$P1/status 2>/dev/null && fail "rank 1 survived"
echo "ok: launcher with a stopped rank ended after $((SECONDS - t0)) s, exit $rc"

# 6. the rank that compiles the step (a fresh cache both share) stopped mid-compile: the other,
# waiting on the compile lock, ends at the peer time-out naming it
JDT_RUNTIME_CACHE_DIR="$TMP/cache6" start2 c6 run.steps=3 checkpoint.every=0 run.out_dir="$TMP/c6"
H=; W=
for _ in $(seq 1 3000); do
  for r in 0 1; do
    if [ -n "$(pgrep -P "${PIDS[$r]}")" ]; then H=${PIDS[$r]}; W=${PIDS[$((1 - r))]}; HR=$r; fi
  done
  [ -n "$H" ] && break
  sleep 0.01
done
[ -n "$H" ] || { tail -n 3 c6.err0 c6.err1; fail "no rank started the compiler"; }
kill -STOP "$H"; t0=$SECONDS
while kill -0 "$W" 2>/dev/null; do
  [ $((SECONDS - t0)) -le 15 ] || { kill -CONT "$H"; fail "the waiting rank still runs 15 s after rank $HR stopped mid-compile"; }
  sleep 0.05
done
wait "$W"; rcw=$?
kill -KILL "$H" 2>/dev/null; kill -CONT "$H" 2>/dev/null; wait "$H" 2>/dev/null; PIDS=()
[ $rcw -ne 0 ] || fail "the waiting rank exited 0"
grep -q "error: .*rank $HR .*\(no heartbeat\|silent\|lost\)" "c6.err$((1 - HR))" ||
  { cat "c6.err$((1 - HR))"; fail "the waiting rank's closing line does not name rank $HR"; }
[ "$(grep -c 'error:' "c6.err$((1 - HR))")" -eq 1 ] ||
  { grep error "c6.err$((1 - HR))"; fail "the waiting rank reports the job's end in more than one error line"; }
echo "ok: a rank stopped mid-compile ended the other after $((SECONDS - t0)) s, exit $rcw"
