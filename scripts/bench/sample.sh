#!/usr/bin/env bash
# sample.sh [STEPS MAX_NEW REPS] — `jdt-train sample` tokens/s: the old path (--no-kv-cache: the
# whole compiled forward graph over seq_len tokens for every new token) against the KV-cache
# decoder, on configs/llm.yaml's model (byte GPT, L=4 C=256 T=128) after a short training run
# of STEPS steps (default 20) on the fortunes corpus. Greedy decoding of one prompt for MAX_NEW
# tokens (default 100: prompt + generation stay within seq_len, so both paths must print the
# same text, which is checked); the two paths run alternately REPS times (default 3) and each
# reports its best decode tokens/s. Then the KV path on 8 prompts as one batch (decode tokens/s
# of all sequences together) and on 1000 tokens (past seq_len: context shifts included).
# Prints the numbers, the ratio new/old and the load average (the machine may be shared).
set -uo pipefail
STEPS=${1:-20}; MAX_NEW=${2:-100}; REPS=${3:-3}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${JDT_BIN:-$ROOT/build/jdt-train}
TMP=$(mktemp -d /tmp/jdt-bench-sample.XXXXXX); trap 'rm -rf "$TMP"' EXIT
fail() { echo "sample.sh: $*" >&2; exit 1; }

CORPUS=$ROOT/data/llm/input.txt
[ -s "$CORPUS" ] || { CORPUS=$TMP/input.txt; bash "$ROOT/scripts/fortunes-corpus.sh" "$CORPUS" || exit 1; }
O=(run.out_dir="$TMP/runs" data.source="$CORPUS" data.train_path="$TMP/data" data.val_path="$TMP/data"
   runtime.cache_dir="$TMP/cache")
"$BIN" prepare "$ROOT/configs/llm.yaml" "${O[@]}" >/dev/null 2>"$TMP/log" || { cat "$TMP/log"; fail "prepare"; }
"$BIN" "$ROOT/configs/llm.yaml" "${O[@]}" run.steps="$STEPS" checkpoint.every="$STEPS" run.eval_every=0 \
  >/dev/null 2>"$TMP/log" || { tail "$TMP/log"; fail "training"; }
CK=$TMP/runs/llm/ckpt
P="The meaning of life is"
# decode tokens/s from the stats line on stderr
rate() { sed -nE 's/.*decode [0-9]+ tokens in [0-9.]+ ms \(([0-9]+) tokens\/s\).*/\1/p' "$1"; }
"$BIN" sample "$CK" --prompt "$P" --max-new-tokens 4 --no-kv-cache >/dev/null 2>&1 # compile once
for ((r = 0; r < REPS; r++)); do
  "$BIN" sample "$CK" --prompt "$P" --max-new-tokens "$MAX_NEW" --temperature 0 --no-kv-cache \
    >"$TMP/old.out" 2>"$TMP/old.err" || { cat "$TMP/old.err"; fail "old path"; }
  rate "$TMP/old.err" >> "$TMP/old.runs"
  "$BIN" sample "$CK" --prompt "$P" --max-new-tokens "$MAX_NEW" --temperature 0 \
    >"$TMP/new.out" 2>"$TMP/new.err" || { cat "$TMP/new.err"; fail "KV path"; }
  rate "$TMP/new.err" >> "$TMP/new.runs"
done
cmp -s "$TMP/old.out" "$TMP/new.out" || fail "greedy text differs between the paths"
old=$(sort -n "$TMP/old.runs" | tail -1); new=$(sort -n "$TMP/new.runs" | tail -1)
for i in 1 2 3 4 5 6 7 8; do echo "Prompt number $i:"; done > "$TMP/prompts"
"$BIN" sample "$CK" --prompts "$TMP/prompts" --max-new-tokens "$MAX_NEW" --seed 5 \
  >/dev/null 2>"$TMP/batch.err" || { cat "$TMP/batch.err"; fail "batch"; }
"$BIN" sample "$CK" --prompt "$P" --max-new-tokens 1000 --seed 5 --ignore-eos \
  >/dev/null 2>"$TMP/long.err" || { cat "$TMP/long.err"; fail "long"; }
echo "sample on configs/llm.yaml's model ($STEPS training steps), greedy, prompt of ${#P} bytes + $MAX_NEW tokens, best of $REPS alternating runs; load average $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
echo "  old (full forward per token): $(sort -n "$TMP/old.runs" | tr '\n' ' ')tokens/s -> best $old"
echo "  new (KV cache):               $(sort -n "$TMP/new.runs" | tr '\n' ' ')tokens/s -> best $new"
echo "  identical greedy text; speedup $(awk -v a="$new" -v b="$old" 'BEGIN { printf "%.1fx", a / b }')"
echo "  8 prompts as one batch:       $(rate "$TMP/batch.err") tokens/s decode (all sequences)"
echo "  1000 tokens (past seq_len):   $(rate "$TMP/long.err") tokens/s decode ($(grep -oE '[0-9]+ context re-runs?' "$TMP/long.err"))"
grep -h "^sample:" "$TMP/new.err" "$TMP/old.err" | sed 's/^/  last: /'
