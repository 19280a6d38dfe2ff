#!/usr/bin/env bash
# sample.sh [STEPS MAX_NEW REPS] — `jdt-train sample` tokens/s: the old path (--no-kv-cache: the
# whole compiled forward graph over seq_len tokens for every new token) against the KV-cache
# decoder, on configs/llm.yaml's model (byte GPT, L=4 C=256 T=128) after a short training run
# of STEPS steps (default 20) on the fortunes corpus. Greedy decoding of one prompt for MAX_NEW
# tokens (default 100: prompt + generation stay within seq_len, so both paths must print the
# same text, which is checked); the two paths run alternately REPS times (default 3), with the
# checkpoint's runtime.threads and with --threads 1, and each reports its best decode tokens/s.
# Then the KV path on 8 prompts as one batch (decode tokens/s of all sequences together) and on
# 1000 tokens (past seq_len: context shifts included).
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
# THREADS: the checkpoint's runtime.threads (llm.yaml: 2), then 1 (no OpenMP workers at all)
for th in 0 1; do
  for ((r = 0; r < REPS; r++)); do
    for path in old new; do
      flag=(); [ $path = old ] && flag=(--no-kv-cache)
      "$BIN" sample "$CK" --prompt "$P" --max-new-tokens "$MAX_NEW" --temperature 0 --threads $th "${flag[@]}" \
        >"$TMP/$path$th.out" 2>"$TMP/$path$th.err" || { cat "$TMP/$path$th.err"; fail "$path path"; }
      rate "$TMP/$path$th.err" >> "$TMP/$path$th.runs"
    done
  done
  cmp -s "$TMP/old$th.out" "$TMP/new$th.out" || fail "greedy text differs between the paths"
done
for ((i = 1; i <= 8; i++)); do echo "Prompt number $i:"; done > "$TMP/prompts"
for th in 0 1; do
  "$BIN" sample "$CK" --prompts "$TMP/prompts" --max-new-tokens "$MAX_NEW" --seed 5 --threads $th \
    >/dev/null 2>"$TMP/batch$th.err" || { cat "$TMP/batch$th.err"; fail "batch"; }
  "$BIN" sample "$CK" --prompt "$P" --max-new-tokens 1000 --seed 5 --ignore-eos --threads $th \
    >/dev/null 2>"$TMP/long$th.err" || { cat "$TMP/long$th.err"; fail "long"; }
done
best() { sort -n "$1" | tail -1; }
runs() { sort -n "$1" | tr '\n' ' '; }
echo "sample on configs/llm.yaml's model ($STEPS training steps), greedy, prompt of ${#P} bytes + $MAX_NEW tokens, best of $REPS alternating runs; load average $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
for th in 0 1; do
  label="the checkpoint's threads"; [ $th = 1 ] && label="--threads 1"
  old=$(best "$TMP/old$th.runs"); new=$(best "$TMP/new$th.runs")
  echo "  $label:"
  echo "    old (full forward per token): $(runs "$TMP/old$th.runs")tokens/s -> best $old"
  echo "    new (KV cache):               $(runs "$TMP/new$th.runs")tokens/s -> best $new"
  echo "    identical greedy text; speedup $(awk -v a="$new" -v b="$old" 'BEGIN { printf "%.1fx", a / b }')"
  echo "    KV, 8 prompts as one batch:   $(rate "$TMP/batch$th.err") tokens/s decode (all sequences)"
  echo "    KV, 1000 tokens past seq_len: $(rate "$TMP/long$th.err") tokens/s decode ($(grep -oE '[0-9]+ context re-runs?' "$TMP/long$th.err"))"
done
grep -h "^sample:" "$TMP/new0.err" "$TMP/old0.err" | sed 's/^/  last: /'
