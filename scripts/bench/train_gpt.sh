#!/usr/bin/env bash
# train_gpt.sh [L C H T B V STEPS THREADS] — GPT training throughput: jdt-train against
# PyTorch (CPU, eager; Debian's python3-torch or any importable torch) and JAX (CPU, jax.jit of
# the whole step) on the same model, batch and thread count, in one run. Prints tokens/s, MFU
# against jdt-train's measured f32 GEMM peak, and the ratios jdt/peer.
# Defaults: the issue's reference point L=6 C=384 H=6 T=256 B=8 V=65, 12 steps, 2 threads.
# REPS (default 3): the frameworks run alternately REPS times (jdt, torch, jax, jdt, ...) and
# each reports its best run, so a burst of load on a shared machine does not land on one side
# only; the spread (worst..best) is printed too.
# Peers: PYTHON_TORCH (default /usr/bin/python3), PYTHON_JAX (default python3); missing ones
# are reported and skipped. BF16=1 adds three rows to the same alternation: jdt-train with
# precision.compute: bf16 (f32 activations, the default), jdt-train with bf16 activations too
# (precision.activations: bf16: the linear layers' outputs stored as bf16, as autocast stores
# them) and PyTorch under CPU bf16 autocast, and prints the bf16 ratios.
set -uo pipefail
L=${1:-6}; C=${2:-384}; H=${3:-6}; T=${4:-256}; B=${5:-8}; V=${6:-65}; STEPS=${7:-12}; THREADS=${8:-2}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${JDT_BIN:-$ROOT/build/jdt-train}
PYTHON_TORCH=${PYTHON_TORCH:-/usr/bin/python3}
PYTHON_JAX=${PYTHON_JAX:-python3}
TMP=$(mktemp -d /tmp/jdt-bench.XXXXXX); trap 'rm -rf "$TMP"' EXIT
CPUS="0-$((THREADS - 1))"

cat > "$TMP/bench.yaml" <<YAML
run: {name: bench, out_dir: $TMP/runs, steps: $STEPS, log_every: 2, eval_every: 0}
model: {type: gpt, vocab_size: $V, seq_len: $T, n_layer: $L, n_embd: $C, n_head: $H,
        norm: layernorm, pos: learned, activation: gelu, tie_embeddings: true, bias: true}
data: {format: synthetic, batch_size: $B, micro_batch_size: $B}
optimizer: {type: adamw, lr: 0.001, warmup_steps: 0, weight_decay: 0.1, grad_clip: 1.0}
checkpoint: {every: 0, resume: none}
runtime: {threads: $THREADS, cache_dir: $TMP/cache}
YAML
{ cat "$TMP/bench.yaml"; echo "precision: {compute: bf16}"; } > "$TMP/bench-bf16.yaml"
{ cat "$TMP/bench.yaml"; echo "precision: {compute: bf16, activations: bf16}"; } > "$TMP/bench-bf16act.yaml"
BF16=${BF16:-0}
REPS=${REPS:-3}
# compile once (cache), then the timed runs
taskset -c "$CPUS" "$BIN" "$TMP/bench.yaml" run.steps=1 >/dev/null 2>&1
# The peers on the OpenBLAS kernels jdt-train runs on (`jdt-train version`): where OpenBLAS
# falls back to pre-AVX2 kernels on a CPU it does not know, jdt-train sets OPENBLAS_CORETYPE for
# itself (cmd/main.c), and Debian's PyTorch (whose BLAS is that OpenBLAS) would otherwise run
# the slow ones.
JDT_BIN="$BIN" . "$ROOT/tests/infra/blas-env.sh"
if [ "$BF16" = 1 ]; then
  for y in bench-bf16 bench-bf16act; do taskset -c "$CPUS" "$BIN" "$TMP/$y.yaml" run.steps=1 >/dev/null 2>&1; done
fi
run_jdt() { # [yaml] prints the median tok/s of the logged windows after the first two; log: $TMP/<yaml name>.log
  local y=${1:-$TMP/bench.yaml}; local log=$TMP/$(basename "$y" .yaml).log
  taskset -c "$CPUS" "$BIN" "$y" 2>"$log" >/dev/null || { cat "$log" >&2; return 1; }
  # each run's MFU reference, and whether it was measured on a busy machine (not cached)
  grep -oE "MFU reference: [0-9.]+ GFLOP" "$log" | tail -1 | awk '{print $3}' >> "${log%.log}.refs"
  grep -q "measured on a busy machine" "$log" && touch "${log%.log}.busy"
  grep -E "^step [0-9]+/" "$log" | tail -n +3 | sed -E 's/.*\| ([0-9]+) tok\/s.*/\1/' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}
run_peer() { # fw (torch, jax, torch-bf16): prints tok/s or nothing
  local fw=$1 py=$PYTHON_TORCH bf=0; [ "$fw" = jax ] && py=$PYTHON_JAX
  [ "$fw" = torch-bf16 ] && { fw=torch; bf=1; }
  BF16=$bf OMP_NUM_THREADS=$THREADS OMP_WAIT_POLICY=PASSIVE \
  XLA_FLAGS="--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads=$THREADS" \
    taskset -c "$CPUS" "$py" "$ROOT/scripts/bench/gpt_peer.py" "$fw" $L $C $H $T $B $V $STEPS $THREADS 2>"$TMP/$fw.err" | awk '{print $3}'
}
peers=()
for fw in torch jax; do
  py=$PYTHON_TORCH; [ $fw = jax ] && py=$PYTHON_JAX
  hint="apt-get install python3-torch"; [ $fw = jax ] && hint="python3 -m venv V && V/bin/pip install jax; PYTHON_JAX=V/bin/python3"
  if "$py" -c "import $fw" >/dev/null 2>&1; then peers+=("$fw"); else echo "$fw: not installed ($py; $hint)" > "$TMP/$fw.missing"; fi
done
for ((r = 0; r < REPS; r++)); do
  x=$(run_jdt) || exit 1
  echo "$x" >> "$TMP/jdt.runs"
  if [ "$BF16" = 1 ]; then
    x=$(run_jdt "$TMP/bench-bf16.yaml") || exit 1; echo "$x" >> "$TMP/jdt-bf16.runs"
    x=$(run_jdt "$TMP/bench-bf16act.yaml") || exit 1; echo "$x" >> "$TMP/jdt-bf16act.runs"
  fi
  for fw in "${peers[@]}"; do run_peer "$fw" >> "$TMP/$fw.runs"; done
  if [ "$BF16" = 1 ] && [ ! -f "$TMP/torch.missing" ]; then run_peer torch-bf16 >> "$TMP/torch-bf16.runs"; fi
done
best() { sort -g "$1" 2>/dev/null | grep -v '^$' | tail -1; }
spread() { sort -g "$1" 2>/dev/null | grep -v '^$' | awk 'NR==1{lo=$1} {hi=$1} END{if (NR) printf "%s..%s", lo, hi}'; }
jdt=$(best "$TMP/jdt.runs")
# each reference is the highest of the runs' MFU references: a GEMM rate measured while
# something else ran comes out low, never high (one such bf16 reference, 225 GFLOP/s where a
# quiet measurement gave 383-407, made the bf16 row read MFU 146%)
peak=$(sort -g "$TMP/bench.refs" | tail -1)
# the bf16 rows' reference: jdt-train's under bf16 compute (oneDNN's bf16 GEMM rate where its
# bf16 GEMMs run through oneDNN, else the SGEMM's) and its description
peak16=$(sort -g "$TMP/bench-bf16.refs" 2>/dev/null | tail -1)
ref16=$(sed -nE 's/^MFU reference: .*\); (.*)$/\1/p' "$TMP/bench-bf16.log" 2>/dev/null | tail -1)
flops=$(awk -v L=$L -v C=$C -v T=$T -v V=$V 'BEGIN { n = V*C + L*(12*C*C + 13*C) + 2*C; print 6*n + 12*L*T*C }')
mfu() { awk -v r="$1" -v f="$flops" -v p="${2:-$peak}" 'BEGIN { printf "%.1f", 100 * r * f / (p * 1e9) }'; }

# the f32 rows' reference: jdt-train's f32 GEMM rate (oneDNN tiles where `jdt-train version`
# says so, else OpenBLAS's SGEMM), named from its reference line
ref32=$(sed -nE 's/^MFU reference: .*\); (.*)$/\1/p' "$TMP/bench.log" | tail -1)
echo "GPT L=$L C=$C H=$H T=$T B=$B V=$V, $THREADS threads, f32 GEMM peak ${peak} GFLOP/s (the highest of the jdt runs' references: ${ref32:-?}; the peers on OpenBLAS ${OPENBLAS_CORETYPE:-default} kernels), $(awk -v f=$flops 'BEGIN{printf "%.1f", f/1e6}') MFLOP/token, best of $REPS alternating runs"
printf "%-11s %12s %8s %10s %16s\n" "framework" "tokens/s" "MFU %" "jdt/peer" "runs (min..max)"
printf "%-11s %12s %8s %10s %16s\n" "jdt-train" "$jdt" "$(mfu "$jdt")" "1.00" "$(spread "$TMP/jdt.runs")"
for fw in torch jax; do
  if [ -f "$TMP/$fw.missing" ]; then printf "%-11s %12s\n" "$fw" "$(cut -d' ' -f2- "$TMP/$fw.missing")"; continue; fi
  r=$(best "$TMP/$fw.runs")
  if [ -z "$r" ]; then printf "%-11s %12s\n" "$fw" "failed: $(tail -1 "$TMP/$fw.err")"; continue; fi
  printf "%-11s %12s %8s %10s %16s\n" "$fw" "$r" "$(mfu "$r")" "$(awk -v a="$jdt" -v b="$r" 'BEGIN{printf "%.2f", a/b}')" "$(spread "$TMP/$fw.runs")"
done
if [ "$BF16" = 1 ]; then
  jb=$(best "$TMP/jdt-bf16.runs"); ja=$(best "$TMP/jdt-bf16act.runs")
  printf "%-11s %12s %8s %10s %16s\n" "jdt-bf16" "$jb" "$(mfu "$jb" "$peak16")" "$(awk -v a="$jdt" -v b="$jb" 'BEGIN{printf "%.2f", a/b}')" "$(spread "$TMP/jdt-bf16.runs")"
  printf "%-11s %12s %8s %10s %16s\n" "jdt-bf16act" "$ja" "$(mfu "$ja" "$peak16")" "$(awk -v a="$jdt" -v b="$ja" 'BEGIN{printf "%.2f", a/b}')" "$(spread "$TMP/jdt-bf16act.runs")"
  tb=$(best "$TMP/torch-bf16.runs" 2>/dev/null)
  [ -n "$tb" ] && printf "%-11s %12s %8s %10s %16s\n" "torch-bf16" "$tb" "$(mfu "$tb" "$peak16")" "$(awk -v a="$jdt" -v b="$tb" 'BEGIN{printf "%.2f", a/b}')" "$(spread "$TMP/torch-bf16.runs")"
  echo "bf16: jdt-bf16 / jdt-train f32 = $(awk -v a="$jb" -v b="$jdt" 'BEGIN{printf "%.2f", a/b}')${tb:+, jdt-bf16 / torch-bf16 = $(awk -v a="$jb" -v b="$tb" 'BEGIN{printf "%.2f", a/b}')}${tb:+, jdt-bf16act / torch-bf16 = $(awk -v a="$ja" -v b="$tb" 'BEGIN{printf "%.2f", a/b}') (bf16 activations on both sides)} (MFU of bf16 rows is against ${peak16} GFLOP/s: ${ref16:-?})"
fi
# a reference measured on a busy machine may still be low in every run: say so
busy=""
for f in "$TMP"/bench*.busy; do [ -e "$f" ] && busy="$busy $(basename "$f" .busy)"; done
[ -n "$busy" ] && echo "note: runs of${busy} measured their MFU reference on a busy machine (not cached); the rows use the highest of the runs' references, and MFU may still be overstated"
exit 0
