#!/usr/bin/env bash
# loader.sh [SHARDS TOKENS_PER_SHARD BATCHES] — is the HDF5 loader fast enough? Issue 12's bar:
# the loader alone, over many shards with per-rank hyperslabs, delivers >= 10x the tokens/s
# that training consumes on configs/llm.yaml.
#   1. training's consumption: a short run of configs/llm.yaml on synthetic data (the step's
#      speed without the loader), its best logged tok/s window after compilation;
#   2. SHARDS (default 32) shards of TOKENS_PER_SHARD (default 4M) byte tokens written by
#      build/bench/loader (the format `prepare` writes), uncompressed and deflate level 1;
#   3. build/bench/loader reads them the way 1, 2 and 4 data-parallel ranks do (one process per
#      rank, all at once, each only its rows of every global batch; T and B of llm.yaml,
#      shuffled windows, no prefetch so the loader's own cost is measured), BATCHES (default
#      5000) global batches; the ranks' tokens together over the slowest rank's time.
# Prints one line per case with the ratio to training and whether it meets 10x; exits 1 if a
# case does not. The files sit in the page cache (just written): this measures the loader's CPU
# cost, not the disk. Results belong in docs/perf.md ("Data loader").
set -uo pipefail
SHARDS=${1:-32}; PER=${2:-4000000}; BATCHES=${3:-5000}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${JDT_BIN:-$ROOT/build/jdt-train}
LOADER=${LOADER:-$ROOT/build/bench/loader}
for f in "$BIN" "$LOADER"; do
  [ -x "$f" ] || { echo "loader.sh: $f not built (make -j2 all bench-build)" >&2; exit 2; }
done
TMP=$(mktemp -d /tmp/jdt-bench-loader.XXXXXX); trap 'rm -rf "$TMP"' EXIT
cd "$ROOT"
T=$(awk '/^ *seq_len:/ {print $2; exit}' configs/llm.yaml)
B=$(awk '/^ *batch_size:/ {print $2; exit}' configs/llm.yaml)

# 1. what training consumes (compile first so the timed run is all steps)
CACHE=${JDT_CACHE_DIR:-$TMP/cache}
train() {
  JDT_CACHE_DIR=$CACHE "$BIN" configs/llm.yaml data.format=synthetic run.out_dir="$TMP/runs" \
    run.eval_every=0 checkpoint.every=0 checkpoint.resume=none "$@"
}
train run.steps=1 >/dev/null 2>&1 || { echo "loader.sh: the training run failed" >&2; train run.steps=1; exit 1; }
train run.steps=40 run.log_every=5 2>"$TMP/train.log" >/dev/null || { cat "$TMP/train.log" >&2; exit 1; }
consume=$(grep -E "^step [0-9]+/" "$TMP/train.log" | tail -n +2 |
          sed -E 's/.*\| ([0-9]+) tok\/s.*/\1/' | sort -n | tail -1)
[ -n "$consume" ] || { echo "loader.sh: no tok/s in the training log" >&2; cat "$TMP/train.log" >&2; exit 1; }
echo "training consumes $consume tok/s (configs/llm.yaml, T=$T B=$B, best 5-step window of 40)"

# 2-3. the loader alone
ok=1
for level in 0 1; do
  dir="$TMP/shards$level"
  "$LOADER" write "$dir" "$SHARDS" "$PER" 256 "$level" || exit 1
  for R in 1 2 4; do
    line=$("$LOADER" read "$dir" "$T" "$B" "$R" "$BATCHES" 1 0 | tail -1) || exit 1
    read -r tok open <<<"$(echo "$line" | awk '{for (i = 1; i < NF; i++) { if ($i == "tok_s") t = $(i+1); if ($i == "open_s") o = $(i+1) } print t, o}')"
    ratio=$(awk -v a="$tok" -v b="$consume" 'BEGIN { printf "%.0f", a / b }')
    verdict="meets 10x"; [ "$ratio" -ge 10 ] || { verdict="BELOW 10x"; ok=0; }
    printf "%2d shards, deflate %d, %d rank(s): %12.0f tok/s (open %.2f s per rank) = %5sx training  %s\n" \
      "$SHARDS" "$level" "$R" "$tok" "$open" "$ratio" "$verdict"
  done
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
[ $ok = 1 ]
