#!/usr/bin/env bash
# train_resume_batch.sh — the checkpoint's data position is read back: a run saved after 4
# steps at batch 8 and resumed at batch 4 continues at global sample 32 (batch 8 of size 4),
# not at sample 16. With lr = 0 the losses depend on the data alone, so the resumed steps
# 5..8 must equal steps 9..12 of a batch-4 run from scratch; a batch size that does not divide
# the position is a config error, exit 2.
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}
fail() { echo "FAIL: $*"; exit 1; }
export JDT_RUNTIME_CACHE_DIR="$TMP/cache"
C="configs/tiny.yaml runtime.threads=1 run.eval_every=0 optimizer.lr=0 checkpoint.every=4"
"$BIN" $C run.steps=4 data.batch_size=8 data.micro_batch_size=8 run.out_dir="$TMP/a" >/dev/null 2>"$TMP/err" \
  || { cat "$TMP/err"; fail "batch-8 run"; }
"$BIN" $C run.steps=8 data.batch_size=4 data.micro_batch_size=4 run.out_dir="$TMP/r" \
  checkpoint.resume="$TMP/a/tiny/ckpt/step_000004" >/dev/null 2>"$TMP/err" || { cat "$TMP/err"; fail "resume at batch 4"; }
grep -q "at step 4 (data batch 8)" "$TMP/err" || fail "resume message: $(grep resumed "$TMP/err")"
"$BIN" $C run.steps=12 data.batch_size=4 data.micro_batch_size=4 run.out_dir="$TMP/b" >/dev/null 2>"$TMP/err" \
  || { cat "$TMP/err"; fail "batch-4 reference run"; }
grep -o '"loss": [0-9.e+-]*' "$TMP/r/tiny/metrics.jsonl" > "$TMP/x"
grep -o '"loss": [0-9.e+-]*' "$TMP/b/tiny/metrics.jsonl" | sed -n 9,12p > "$TMP/y"
[ "$(wc -l < "$TMP/x")" -eq 4 ] && cmp -s "$TMP/x" "$TMP/y" || { paste "$TMP/x" "$TMP/y"; fail "resumed steps read other samples"; }
# the next checkpoint records the position in its own batch size: batch 12 of size 4 at step 8
"$BIN" $C run.steps=9 data.batch_size=16 data.micro_batch_size=16 run.out_dir="$TMP/r2" \
  checkpoint.resume="$TMP/r/tiny/ckpt/step_000008" >/dev/null 2>"$TMP/err" || { cat "$TMP/err"; fail "resume at batch 16"; }
grep -q "at step 8 (data batch 3)" "$TMP/err" || fail "second resume: $(grep resumed "$TMP/err")"
"$BIN" $C run.steps=9 data.batch_size=5 data.micro_batch_size=5 run.out_dir="$TMP/bad" \
  checkpoint.resume="$TMP/a/tiny/ckpt/step_000004" >/dev/null 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] || { cat "$TMP/err"; fail "batch 5 resume exited $rc, expected 2"; }
grep -q "sample 32" "$TMP/err" || fail "message: $(cat "$TMP/err")"
echo "resumed at batch 4 reads samples 32.. (losses equal to the reference's steps 9-12)"
echo ok
