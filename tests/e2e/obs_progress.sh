#!/usr/bin/env bash
# obs_progress.sh — long operations print progress lines when stderr is not a terminal (a
# SLURM log): saving and then loading a GPT-2-124M-sized checkpoint (an MLP of 121M f32
# parameters, 460 MB; SGD without momentum, so the checkpoint is the parameters) with
# JDT_PROGRESS_INTERVAL=0 (a line per tensor, so the count does not depend on the disk's speed;
# docs/observability.md) gives several plain "saving checkpoint step 1: done/total MB (pct),
# rate, ETA" lines and then "loading checkpoint: ..." lines on resume, with no terminal control
# characters; `prepare` with a BPE trained on the fortunes corpus (2.5 MB) reports its three
# long phases (counting words and merging while training, then encoding) the same way; a bad
# JDT_PROGRESS_INTERVAL is one warning.
set -uo pipefail
cd "$JDT_TMP"
trap 'rm -rf "$JDT_TMP/runs"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cat > big.yaml <<YAML
run: {name: big, out_dir: $JDT_TMP/runs, steps: 1, log_every: 1, eval_every: 0}
model: {type: mlp, in_dim: 784, hidden_dim: 4096, n_hidden: 8, n_classes: 10, activation: relu}
data: {format: synthetic, batch_size: 8}
optimizer: {type: sgd, lr: 0.01, momentum: 0, schedule: constant, warmup_steps: 0, grad_clip: 0}
checkpoint: {every: 1, resume: auto}
runtime: {threads: 2}
YAML
JDT_PROGRESS_INTERVAL=0 "$JDT_BIN" big.yaml > save.log 2>&1 || { cat save.log; fail "training failed"; }
n=$(grep -cE "^saving checkpoint step 1: [0-9.]+/460\.[0-9] MB \([0-9]+%\), [0-9.]+ MB/s, [0-9]+s elapsed, ETA [0-9]+s$" save.log)
[ "$n" -ge 2 ] || { cat save.log; fail "want >= 2 plain save progress lines, got $n"; }
grep -q "^saved checkpoint .*step_000001" save.log || fail "no 'saved checkpoint' line"
if grep -q $'\r\|\033' save.log; then fail "terminal control characters in a non-terminal log"; fi
# done MB never decreases and never exceeds the total
grep -oE "^saving checkpoint step 1: [0-9.]+" save.log | awk -F': ' '
  { if ($2 + 0 < prev || $2 + 0 > 460.6) bad = 1; prev = $2 + 0 } END { exit bad }' ||
  fail "save progress is not monotonic within the total"

JDT_PROGRESS_INTERVAL=0 "$JDT_BIN" big.yaml run.steps=2 checkpoint.every=0 > load.log 2>&1 ||
  { cat load.log; fail "resume failed"; }
grep -q "resum" load.log || { cat load.log; fail "the second run did not resume"; }
n=$(grep -cE "^loading checkpoint: [0-9.]+/460\.[0-9] MB" load.log)
[ "$n" -ge 2 ] || { cat load.log; fail "want >= 2 plain load progress lines, got $n"; }

JDT_PROGRESS_INTERVAL=soon "$JDT_BIN" "$JDT_ROOT/configs/tiny.yaml" run.out_dir="$JDT_TMP/runs" \
  run.steps=2 > bad.log 2>&1 || { cat bad.log; fail "a bad JDT_PROGRESS_INTERVAL must not fail the run"; }
[ "$(grep -c "JDT_PROGRESS_INTERVAL='soon' is not a number of seconds" bad.log)" -eq 1 ] || { cat bad.log; fail "want one warning for a bad JDT_PROGRESS_INTERVAL"; }
# prepare: BPE training (words counted in MB, merges made) and encoding, plain lines
for f in /usr/share/games/fortunes/*; do
  case "$f" in *.dat|*.u8|*/art|*/ascii-art) continue;; esac
  [ -f "$f" ] && cat "$f"
done > corpus.txt
[ "$(stat -c %s corpus.txt)" -gt 2000000 ] || fail "no fortunes corpus (apt-get install fortunes)"
cat > prep.yaml <<YAML
run: {name: prep, out_dir: $JDT_TMP/runs, steps: 1}
model: {type: gpt, vocab_size: 2000, seq_len: 64, n_layer: 1, n_embd: 32, n_head: 2}
data: {format: tokens, source: $JDT_TMP/corpus.txt, tokenizer: bpe, train_path: $JDT_TMP/prep, batch_size: 4}
YAML
JDT_PROGRESS_INTERVAL=0 "$JDT_BIN" prepare prep.yaml > prep.log 2>&1 || { tail prep.log; fail "prepare failed"; }
if grep -q $'\r\|\033' prep.log; then fail "terminal control characters in prepare's log"; fi
n=$(grep -cE "^BPE training: counting words: [0-9.]+/[0-9.]+ MB \([0-9]+%\)" prep.log)
[ "$n" -ge 2 ] || { tail prep.log; fail "want >= 2 'counting words' lines, got $n"; }
n=$(grep -cE "^BPE training: merges: [0-9.]+/1743\.0 merges \([0-9]+%\)" prep.log)
[ "$n" -ge 100 ] || { tail prep.log; fail "want a 'merges' line per merge (1743 at most), got $n"; }
grep -oE "^BPE training: merges: [0-9.]+" prep.log | awk -F': ' '
  { if ($3 + 0 <= prev || $3 + 0 > 1743) bad = 1; prev = $3 + 0 } END { exit bad }' ||
  fail "merge progress is not strictly increasing within the total"
n=$(grep -cE "^prepare: encoding: [0-9.]+/[0-9.]+ MB \([0-9]+%\)" prep.log)
[ "$n" -ge 2 ] || { tail prep.log; fail "want >= 2 'prepare: encoding' lines, got $n"; }
grep -q "^prepared .*corpus.txt" prep.log || fail "no 'prepared' line"

echo "ok: $(grep -c '^saving checkpoint' save.log) save and $(grep -c '^loading checkpoint' load.log) load progress lines"
