#!/usr/bin/env bash
# train_lock.sh — one run at a time in a run directory (engine/train/loop.c lock_run_dir): while
# a training run holds run_dir/.lock, a second run of the same run.out_dir and run.name is
# refused at once (exit 1, one line naming the directory and the holder's pid), without writing
# a checkpoint or a metrics line; another run.name trains beside it, unless it names the same
# checkpoint.dir (that directory is locked too); once the first has ended,
# even killed, the directory is free again. A lock held by another program (flock(1)) is refused
# alike, and `jdt-train --nproc 2` ends its ranks when rank 0 is refused.
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}; ROOT=${JDT_ROOT:?}
fail() { echo "FAIL: $*"; exit 1; }
export JDT_RUNTIME_CACHE_DIR="$TMP/cache"
cd "$ROOT" || exit 1
base=(configs/tiny.yaml run.out_dir="$TMP/runs" run.eval_every=0 checkpoint.resume=none
      runtime.threads=1 checkpoint.every=5)
dir="$TMP/runs/tiny"

# 1. a long first run; wait until it trains (its lock is taken before its data and metrics)
"$BIN" "${base[@]}" run.steps=1000000 checkpoint.dir="$TMP/ck" >"$TMP/a.out" 2>"$TMP/a.err" &
a=$!
for _ in $(seq 200); do [ -s "$dir/metrics.jsonl" ] && break; sleep 0.1; done
[ -s "$dir/metrics.jsonl" ] || { cat "$TMP/a.err"; kill -9 $a; fail "the first run did not start"; }

# 2. the same directory: refused, naming it and the holder; no checkpoint or metrics of its own
timeout 60 "$BIN" "${base[@]}" run.steps=3 checkpoint.every=1 >"$TMP/b.out" 2>"$TMP/b.err"; rc=$?
[ $rc -eq 1 ] || { cat "$TMP/b.err"; kill -9 $a; fail "second run: exit $rc, expected 1"; }
[ "$(grep -c error "$TMP/b.err")" -eq 1 ] &&
  grep -q "run directory $dir is in use by another jdt-train run (pid $a on host " "$TMP/b.err" ||
  { cat "$TMP/b.err"; kill -9 $a; fail "second run: expected one line naming the directory and pid $a"; }
# (the first run saves every 5 steps; the refused one would have saved steps 1 to 3)
ls "$dir/ckpt" "$TMP/ck" 2>/dev/null | grep -q 'step_00000[123]$' && { kill -9 $a; fail "the refused run saved a checkpoint"; }
kill -0 $a 2>/dev/null || fail "the first run died"

# 3. another run.name trains beside it; another run.name with the same checkpoint.dir does not
"$BIN" "${base[@]}" run.steps=3 run.name=other >"$TMP/c.out" 2>"$TMP/c.err" ||
  { cat "$TMP/c.err"; kill -9 $a; fail "a run of another run.name was refused"; }
"$BIN" "${base[@]}" run.steps=3 run.name=third checkpoint.dir="$TMP/ck" >"$TMP/c.out" 2>"$TMP/c.err"; rc=$?
[ $rc -eq 1 ] && grep -q "checkpoint directory $TMP/ck is in use by another jdt-train run (pid $a on host " "$TMP/c.err" ||
  { cat "$TMP/c.err"; kill -9 $a; fail "a shared checkpoint.dir: exit $rc"; }

# 4. the launcher: rank 0 refused, every rank ends, non-zero
timeout 120 "$BIN" --nproc 2 "${base[@]}" mesh.data=2 run.steps=3 >"$TMP/d.out" 2>"$TMP/d.err"; rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] || { cat "$TMP/d.err"; kill -9 $a; fail "--nproc 2 beside the first run: exit $rc"; }
grep -q "is in use by another jdt-train run (pid $a" "$TMP/d.err" ||
  { cat "$TMP/d.err"; kill -9 $a; fail "--nproc 2: the reason is not said"; }

# 5. killed outright, the first run leaves the directory free: the next run resumes in it
kill -9 $a; wait $a 2>/dev/null
"$BIN" "${base[@]}" run.steps=3 checkpoint.resume=none >"$TMP/e.out" 2>"$TMP/e.err" ||
  { cat "$TMP/e.err"; fail "the directory stayed locked after its run was killed"; }

# 6. a lock held by another program is refused alike (the holder unknown to it)
if command -v flock >/dev/null; then
  flock -n "$dir/.lock" sleep 3 &
  f=$!
  sleep 0.3
  "$BIN" "${base[@]}" run.steps=3 >"$TMP/f.out" 2>"$TMP/f.err"; rc=$?
  wait $f 2>/dev/null
  [ $rc -eq 1 ] && grep -q "is in use by another jdt-train run (its pid unknown)" "$TMP/f.err" ||
    { cat "$TMP/f.err"; fail "a lock held by flock(1): exit $rc"; }
fi
echo "ok: a second run refused (pid $a named), another name trains, free after a kill"
