#!/usr/bin/env bash
# busy.sh [STEPS] — training speed on a busy machine: the same model trained with
# runtime.threads 1 and 2 while this script keeps one core busy itself (a `yes` pinned to the
# last CPU of the set), alternating the two thread counts REPS times in one run so both see the
# same background. Models: the tiny GPT of issue 14 (L=2 C=128 H=4 T=64 B=16 V=256) and the
# L=6 C=384 GPT of train_gpt.sh (T=256 B=8 V=65). Prints tokens/s (best and spread) per thread
# count and the ratio 2 threads / 1 thread (of the best runs and of the median runs), which should
# be >= 1.
# Env: REPS (default 3), JDT_BIN, CPUS (default 0-1), NO_LOAD=1 (no busy core: the quiet
# comparison), MODELS (default "tiny gpt6"), EXTRA_ENV (e.g. "OMP_WAIT_POLICY=active" to compare
# libgomp's spinning wait against the binary's default), BINS (space-separated binaries, e.g.
# "OLD NEW": every binary runs in every repetition, alternating, one table row per binary and
# model; default: JDT_BIN alone).
set -uo pipefail
STEPS=${1:-60} # tiny's steps (gpt6: a third): enough for the adaptive thread count to settle
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BINS=${BINS:-${JDT_BIN:-$ROOT/build/jdt-train}}
read -r -a BIN_LIST <<<"$BINS"
REPS=${REPS:-3}
CPUS=${CPUS:-0-1}
MODELS=${MODELS:-tiny gpt6}
TMP=$(mktemp -d /tmp/jdt-busy.XXXXXX)
LOAD_PID=
cleanup() { [ -n "$LOAD_PID" ] && kill "$LOAD_PID" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT

write_cfg() { # name L C H T B V steps
  local steps=$8
  [ "$1" = gpt6 ] && steps=$(( (steps + 2) / 3 ))
  cat > "$TMP/$1.yaml" <<YAML
run: {name: $1, out_dir: $TMP/runs, steps: $steps, log_every: $(( steps / 5 > 0 ? steps / 5 : 1 )), eval_every: 0}
model: {type: gpt, vocab_size: $7, seq_len: $5, n_layer: $2, n_embd: $3, n_head: $4}
data: {format: synthetic, batch_size: $6, micro_batch_size: $6}
optimizer: {lr: 0.001, warmup_steps: 2}
checkpoint: {every: 0, resume: none}
runtime: {threads: 1, cache_dir: $TMP/cache}
YAML
}
write_cfg tiny 2 128 4 64 16 256 "$STEPS"
write_cfg gpt6 6 384 6 256 8 65 "$STEPS"

run_one() { # model threads binary -> median tok/s of the logged windows after the first
  env ${EXTRA_ENV:-} taskset -c "$CPUS" "$3" "$TMP/$1.yaml" runtime.threads="$2" \
    2>"$TMP/log" >/dev/null || { tail -3 "$TMP/log" >&2; return 1; }
  grep -o 'threads: [0-9]* instead of [0-9]* from run [0-9]*' "$TMP/log" | sed 's/threads: //' |
    tr '\n' ' ' >>"$TMP/switches.$1.$2"; echo >>"$TMP/switches.$1.$2"
  grep -E "^step [0-9]+/" "$TMP/log" | tail -n +2 | sed -E 's/.*\| ([0-9]+) tok\/s.*/\1/' |
    sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}

for BIN in "${BIN_LIST[@]}"; do # compile every program before the load starts (cache)
  for m in $MODELS; do
    for t in 1 2; do taskset -c "$CPUS" "$BIN" "$TMP/$m.yaml" run.steps=1 runtime.threads=$t \
      >/dev/null 2>&1 || { echo "busy.sh: $m failed to start ($BIN)" >&2; exit 1; }; done
  done
done
last_cpu=$(taskset -c "$CPUS" sh -c 'grep Cpus_allowed_list /proc/self/status' | sed -E 's/.*[-,]([0-9]+)$/\1/; s/.*:\s*//')
if [ -z "${NO_LOAD:-}" ]; then
  taskset -c "$last_cpu" yes >/dev/null &
  LOAD_PID=$!
fi
for ((r = 0; r < REPS; r++)); do
  for m in $MODELS; do
    for b in "${!BIN_LIST[@]}"; do
      for t in 1 2; do run_one "$m" "$t" "${BIN_LIST[$b]}" >> "$TMP/$m.$b.$t" || exit 1
        mv "$TMP/switches.$m.$t" "$TMP/switches.$m.$b.$t.$r"; done
    done
  done
done
[ -n "$LOAD_PID" ] && { kill "$LOAD_PID"; LOAD_PID=; }
best() { sort -g "$1" | tail -1; }
median() { sort -g "$1" | awk '{a[NR]=$1} END {print NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
spread() { sort -g "$1" | awk 'NR==1{lo=$1} {hi=$1} END{printf "%s..%s", lo, hi}'; }
echo "busy.sh: ${NO_LOAD:+no }background load${NO_LOAD:-: one core busy (yes on CPU $last_cpu)}, CPUs $CPUS, best of $REPS alternating runs${EXTRA_ENV:+, env $EXTRA_ENV}; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for b in "${!BIN_LIST[@]}"; do [ "${#BIN_LIST[@]}" -gt 1 ] && echo "bin $b: ${BIN_LIST[$b]}"; done
printf "%-6s %3s %14s %16s %14s %16s %8s %13s\n" model bin "1 thread tok/s" "runs" "2 threads tok/s" "runs" "2t/1t" "median 2t/1t"
for m in $MODELS; do
  for b in "${!BIN_LIST[@]}"; do
    x=$(best "$TMP/$m.$b.1"); y=$(best "$TMP/$m.$b.2")
    mx=$(median "$TMP/$m.$b.1"); my=$(median "$TMP/$m.$b.2")
    printf "%-6s %3s %14s %16s %14s %16s %8s %13s\n" "$m" "$b" "$x" "$(spread "$TMP/$m.$b.1")" "$y" \
      "$(spread "$TMP/$m.$b.2")" "$(awk -v a="$x" -v b="$y" 'BEGIN{printf "%.2f", b/a}')" \
      "$(awk -v a="$mx" -v b="$my" 'BEGIN{printf "%.2f", b/a}')"
  done
done
# the adaptive thread count's changes (runtime.adaptive_threads), per 2-thread run
for m in $MODELS; do
  for b in "${!BIN_LIST[@]}"; do
    sw=$(for ((r = 0; r < REPS; r++)); do printf '[%s] ' "$(cat "$TMP/switches.$m.$b.2.$r" | xargs)"; done)
    echo "$m bin $b, 2-thread runs' thread switches: $sw"
  done
done
