#!/usr/bin/env bash
# fault_disk.sh — fault tests of checkpoint saving (issue 11, item 1): a checkpoint directory
# on a small tmpfs and on a read-only mount. Each must end with exit 1 and one error line,
# never a signal; a save that runs out of space mid-run keeps the previous checkpoint, which
# then resumes. Needs root (mount); skips otherwise.
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}
fail() { echo "FAIL: $*"; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root to mount a tmpfs"; exit 77; }
export JDT_RUNTIME_CACHE_DIR="$TMP/cache"
D="$TMP/disk"; mkdir -p "$D"
mounted=0
cleanup() { [ $mounted -eq 1 ] && umount "$D" 2>/dev/null; }
trap cleanup EXIT
mnt() { cleanup; mount -t tmpfs -o "$1" tmpfs "$D" || { echo "SKIP: cannot mount tmpfs"; exit 77; }; mounted=1; }
# 6.8 MiB reserved per checkpoint of this model (0.43M params + AdamW moments)
R="configs/tiny.yaml run.out_dir=$TMP/runs checkpoint.dir=$D/ck run.eval_every=0 model.n_embd=128"
one_error_line() { # exactly one line of error output, naming what ran out
  [ "$(grep -c 'error' "$TMP/err")" -eq 1 ] || { cat "$TMP/err"; fail "expected one error line"; }
  grep -q "$1" "$TMP/err" || { cat "$TMP/err"; fail "error does not say '$1'"; }
}

# 1. no room for one checkpoint: refused before the first step
mnt size=2m
"$BIN" $R run.steps=8 >"$TMP/out" 2>"$TMP/err"; rc=$?
[ $rc -eq 1 ] || { cat "$TMP/err"; fail "tiny disk: exit $rc, expected 1"; }
one_error_line "has no room for one checkpoint: No space left on device: needs [0-9.]* MiB"
grep -q "^step 1/" "$TMP/err" && fail "trained before checking the checkpoint directory"

# 2. room for one checkpoint only: step 4 saves, step 8 runs out of space mid-run
mnt size=11m
"$BIN" $R run.steps=8 checkpoint.every=4 >"$TMP/out" 2>"$TMP/err"; rc=$?
[ $rc -eq 1 ] || { cat "$TMP/err"; fail "full disk mid-run: exit $rc, expected 1 (never a signal)"; }
one_error_line "checkpoint at step 8 not saved (the previous one is kept): .*step_000008.tmp/state.h5: No space left on device"
[ "$(ls "$D/ck")" = "step_000004" ] || fail "partial save not cleaned: $(ls -A "$D/ck")" # (and .lock, the run's lock)
umount "$D"; mounted=0 # the checkpoint is gone with the tmpfs; redo it on a roomy one
mnt size=64m
"$BIN" $R run.steps=4 checkpoint.every=4 >/dev/null 2>&1 || fail "save on a roomy tmpfs"
"$BIN" $R run.steps=6 checkpoint.resume=auto checkpoint.every=100 >"$TMP/out" 2>"$TMP/err" ||
  { cat "$TMP/err"; fail "resume after the failed save"; }
grep -q "resumed from .*step_000004 at step 4" "$TMP/err" || fail "did not resume from step 4"

# 3. read-only checkpoint directory: refused before the first step
mnt ro,size=1m
"$BIN" $R run.steps=2 >"$TMP/out" 2>"$TMP/err"; rc=$?
[ $rc -eq 1 ] || { cat "$TMP/err"; fail "read-only dir: exit $rc, expected 1"; }
one_error_line "Read-only file system"
grep -q "^step 1/" "$TMP/err" && fail "trained before checking the checkpoint directory"

# 4. read-only run directory (metrics, config.yaml): one line, exit 1
"$BIN" configs/tiny.yaml run.out_dir="$D/runs" checkpoint.dir="$TMP/ck" run.steps=2 >"$TMP/out" 2>"$TMP/err"; rc=$?
[ $rc -eq 1 ] || { cat "$TMP/err"; fail "read-only run dir: exit $rc, expected 1"; }
one_error_line "Read-only file system"
# 5. prepare onto a full disk (0 bytes free) and onto one with too little room: exit 1, one line
mnt size=1m
dd if=/dev/zero of="$D/fill" bs=4k 2>/dev/null
awk 'BEGIN { for (i = 0; i < 20000; i++) print "some text to tokenize", i }' > "$TMP/text.txt"
P="data.format=tokens data.source=$TMP/text.txt data.train_path=$D/data data.val_path=$D/data"
"$BIN" prepare configs/tiny.yaml $P >"$TMP/out" 2>"$TMP/err"; rc=$?
[ $rc -eq 1 ] || { cat "$TMP/err"; fail "prepare on a full disk: exit $rc, expected 1"; }
one_error_line "No space left on device"
rm -f "$D/fill"; dd if=/dev/zero of="$D/fill" bs=1k count=700 2>/dev/null
"$BIN" prepare configs/tiny.yaml $P >"$TMP/out" 2>"$TMP/err"; rc=$?
[ $rc -eq 1 ] || { cat "$TMP/err"; fail "prepare with too little room: exit $rc, expected 1"; }
one_error_line "No space left on device: needs [0-9.]* MiB"
ls "$D/data" 2>/dev/null | grep -q . && fail "prepare left files behind: $(ls "$D/data")"
# 6. the run directory fills up during training: the metrics' write fails with the file named
#    (they used to stop silently, exit 0)
"$BIN" configs/tiny.yaml run.out_dir="$TMP/r6" run.steps=1 checkpoint.every=0 >/dev/null 2>&1 ||
  fail "tiny run for the synthetic data"
mnt size=8m; mkdir -p "$D/runs/tiny"; cp "$TMP"/r6/tiny/*.h5 "$D/runs/tiny/"
dd if=/dev/zero of="$D/fill" bs=4k 2>/dev/null; truncate -s -16K "$D/fill"
"$BIN" configs/tiny.yaml run.out_dir="$D/runs" checkpoint.dir="$TMP/ck6" checkpoint.every=0 \
  run.steps=400 run.log_every=1 run.eval_every=0 >"$TMP/out" 2>"$TMP/err"; rc=$?
[ $rc -eq 1 ] || { tail -3 "$TMP/err"; fail "run directory full: exit $rc, expected 1"; }
one_error_line "No space left on device\|a write failed"
grep -q "metrics.jsonl\|events.out.tfevents" "$TMP/err" || { cat "$TMP/err"; fail "the error does not name the file"; }
# 7. a full disk under the JIT cache: one line with the reason (it said "writing ... failed")
mnt size=64k
dd if=/dev/zero of="$D/fill" bs=4k 2>/dev/null
JDT_RUNTIME_CACHE_DIR="$D/cache" "$BIN" configs/tiny.yaml run.out_dir="$TMP/r7" run.steps=1 \
  >"$TMP/out" 2>"$TMP/err"; rc=$?
[ $rc -eq 1 ] || { tail -3 "$TMP/err"; fail "full cache disk: exit $rc, expected 1"; }
one_error_line "compile cache: writing .* failed: No space left on device"
echo "full disk, read-only checkpoint and run directories, prepare on a full disk, a run directory filling up, a full cache disk: exit 1, one line each"
