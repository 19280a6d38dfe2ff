#!/usr/bin/env bash
# mesh.sh [L C H T B V STEPS] — parallelism on one host (issue 9, item 9): tokens/s and peak
# RSS per rank of jdt-train on 1 process (2 threads) vs data=2, fsdp=2 and tensor=2 (2 processes
# x 1 thread, the launcher pins each rank to its core; tensor=2 also with sequence parallelism,
# `[seq, tensor]`), against PyTorch DDP and PyTorch FSDP
# (gloo, 2 processes x 1 thread, pinned alike; scripts/bench/mesh_peer.py) on the same GPT and
# global batch, in one run. Also the planner's figures (`jdt-train inspect`): parameter +
# optimizer bytes and the train-step arena per device. Prints a table and the ratios that
# matter: fsdp=2 / data=2, the best mesh / 1 process, jdt / torch for DDP and FSDP.
# Defaults: the issue's point L=6 C=384 H=6 T=256 B=8 V=65 (as train_gpt.sh), 12 steps.
# REPS (default 3): the configurations run alternately REPS times; each reports its best
# tokens/s (the spread min..max is printed), so a burst of load does not land on one only.
# The load average before and after is printed: numbers from a loaded machine are not proof.
# PYTHON_TORCH (default /usr/bin/python3: Debian's torch 1.13); a missing torch is skipped.
set -uo pipefail
L=${1:-6}; C=${2:-384}; H=${3:-6}; T=${4:-256}; B=${5:-8}; V=${6:-65}; STEPS=${7:-12}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${JDT_BIN:-$ROOT/build/jdt-train}
PYTHON_TORCH=${PYTHON_TORCH:-/usr/bin/python3}
REPS=${REPS:-3}
TMP=$(mktemp -d /tmp/jdt-mesh.XXXXXX); trap 'rm -rf "$TMP"' EXIT
CPUS=0-1 # two cores: one process with 2 threads, or 2 processes with 1 thread each

cat > "$TMP/bench.yaml" <<YAML
run: {name: bench, out_dir: $TMP/runs, steps: $STEPS, log_every: 2, eval_every: 0}
model: {type: gpt, vocab_size: $V, seq_len: $T, n_layer: $L, n_embd: $C, n_head: $H,
        norm: layernorm, pos: learned, activation: gelu, tie_embeddings: true, bias: true}
data: {format: synthetic, batch_size: $B, micro_batch_size: $B}
optimizer: {type: adamw, lr: 0.001, warmup_steps: 0, weight_decay: 0.1, grad_clip: 1.0}
checkpoint: {every: 0, resume: none}
runtime: {cache_dir: $TMP/cache}
YAML

# tensor=2 with sequence parallelism: the default rules plus [seq, tensor] (docs/sharding.md)
{ cat "$TMP/bench.yaml"; echo "sharding: {rules: [[batch, [data, fsdp]], [seq, tensor], [embed, fsdp], [mlp, tensor], [heads, tensor], [kv_heads, tensor], [vocab, null], [norm, null]]}"; } > "$TMP/bench_sp.yaml"

NAMES=("1 process" "data=2" "fsdp=2" "tensor=2" "tensor=2 SP" "torch DDP" "torch FSDP")
KEYS=(one data fsdp tensor seqpar ddp tfsdp)
JDT_KEYS="one data fsdp tensor seqpar"
jdt_cmd() { # key -> the jdt-train command line (launcher, config, mesh)
  case $1 in
    one) echo "$BIN $TMP/bench.yaml runtime.threads=2" ;;
    data) echo "$BIN --nproc 2 $TMP/bench.yaml mesh.data=2" ;;
    fsdp) echo "$BIN --nproc 2 $TMP/bench.yaml mesh.fsdp=2" ;;
    tensor) echo "$BIN --nproc 2 $TMP/bench.yaml mesh.tensor=2" ;;
    seqpar) echo "$BIN --nproc 2 $TMP/bench_sp.yaml mesh.tensor=2" ;;
  esac
}
run_jdt() { # key: appends "tok/s rss_mb" (median logged window after the first two; peak RSS
            # of the largest process: /usr/bin/time reports the max over the launcher's ranks)
  local k=$1 out="$TMP/runs/bench/metrics.jsonl"
  rm -rf "$TMP/runs"
  # shellcheck disable=SC2046
  /usr/bin/time -f "%M" -o "$TMP/$k.time" taskset -c $CPUS $(jdt_cmd "$k") \
    >/dev/null 2>"$TMP/$k.log" || { tail -3 "$TMP/$k.log" >&2; return 1; }
  local tps rss
  tps=$(grep -o '"tokens_per_s": [0-9.e+]*' "$out" | awk '{print $2}' | tail -n +3 | sort -g |
        awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]}')
  rss=$(awk '{printf "%.0f", $1 / 1024}' "$TMP/$k.time")
  echo "$tps $rss" >> "$TMP/$k.runs"
}
run_torch() { # key: appends "tok/s rss_mb (max over ranks)"
  local k=$1 mode=ddp; [ "$k" = tfsdp ] && mode=fsdp
  OMP_WAIT_POLICY=PASSIVE taskset -c $CPUS "$PYTHON_TORCH" "$ROOT/scripts/bench/mesh_peer.py" "$mode" \
    "$L" "$C" "$H" "$T" "$B" "$V" "$STEPS" 2 2>"$TMP/$k.err" |
    awk '{ m = 0; for (i = 1; i <= NF; i++) if ($i == "rss_mb") for (j = i + 1; j <= NF; j++) if ($j > m) m = $j
           print $3, m }' >> "$TMP/$k.runs"
  [ -s "$TMP/$k.runs" ] || echo "torch $mode failed: $(grep -v -i warn "$TMP/$k.err" | tail -1)" > "$TMP/$k.missing"
}
have_torch=1
"$PYTHON_TORCH" -c "import torch.distributed" >/dev/null 2>&1 || have_torch=0

load0=$(cut -d' ' -f1-3 /proc/loadavg)
# compile once per mesh (each mesh is its own program; the cache then serves every timed run)
for k in $JDT_KEYS; do
  # shellcheck disable=SC2046
  taskset -c $CPUS $(jdt_cmd "$k") run.steps=1 >/dev/null 2>"$TMP/warm.log" ||
    { tail -3 "$TMP/warm.log"; exit 1; }
done
for ((r = 0; r < REPS; r++)); do
  for k in $JDT_KEYS; do run_jdt "$k" || exit 1; done
  if [ $have_torch = 1 ]; then for k in ddp tfsdp; do run_torch "$k"; done; fi
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)

best() { [ -s "$TMP/$1.runs" ] && sort -g -k1 "$TMP/$1.runs" | tail -1; }
spread() { [ -s "$TMP/$1.runs" ] && sort -g -k1 "$TMP/$1.runs" | awk 'NR==1{lo=$1} {hi=$1} END{printf "%.0f..%.0f", lo, hi}'; }
plan() { # key -> "params+opt MiB, arena MiB" per device from inspect (planner, no allocation)
  local mesh="" cfg="$TMP/bench.yaml"
  case $1 in data) mesh="mesh.data=2" ;; fsdp) mesh="mesh.fsdp=2" ;; tensor) mesh="mesh.tensor=2" ;;
    seqpar) mesh="mesh.tensor=2" cfg="$TMP/bench_sp.yaml" ;; esac
  "$BIN" inspect "$cfg" $mesh 2>/dev/null |
    awk '/per device: [0-9]+ bytes/ { p = $3 / 1048576 }
         /planned peak of intermediates/ { a = $2 }
         END { printf "%.1f %.1f", p, a }'
}

echo "GPT L=$L C=$C H=$H T=$T B=$B V=$V, $STEPS steps, 2 cores (taskset $CPUS), best of $REPS alternating runs"
echo "load average before: $load0, after: $load1 (2 cores)"
printf "%-12s %10s %14s %12s %16s %11s\n" "config" "tokens/s" "runs (min..max)" "peak RSS MB" "plan param+opt MiB" "arena MiB"
declare -A TPS
for i in "${!KEYS[@]}"; do
  k=${KEYS[$i]}
  if [ -f "$TMP/$k.missing" ]; then printf "%-12s %s\n" "${NAMES[$i]}" "$(cat "$TMP/$k.missing")"; continue; fi
  if [ $have_torch = 0 ] && { [ "$k" = ddp ] || [ "$k" = tfsdp ]; }; then
    printf "%-12s %s\n" "${NAMES[$i]}" "torch not installed ($PYTHON_TORCH)"; continue; fi
  read -r tps rss <<<"$(best "$k")"
  TPS[$k]=$tps
  pl="- -"; case $k in one|data|fsdp|tensor|seqpar) pl=$(plan "$k") ;; esac
  read -r pp pa <<<"$pl"
  printf "%-12s %10.0f %14s %12s %18s %11s\n" "${NAMES[$i]}" "$tps" "$(spread "$k")" "$rss" "$pp" "$pa"
done
ratio() { [ -n "${TPS[$1]:-}" ] && [ -n "${TPS[$2]:-}" ] && awk -v a="${TPS[$1]}" -v b="${TPS[$2]}" 'BEGIN { printf "%.2f", a / b }' || echo "n/a"; }
bestmesh=one
for k in data fsdp tensor seqpar; do
  awk -v a="${TPS[$k]}" -v b="${TPS[$bestmesh]}" 'BEGIN { exit !(a > b) }' && bestmesh=$k
done
echo "ratios: fsdp=2 / data=2 $(ratio fsdp data); tensor=2 / data=2 $(ratio tensor data); tensor=2 SP / tensor=2 $(ratio seqpar tensor); data=2 / 1 process $(ratio data one); fastest jdt configuration: $bestmesh"
echo "        jdt data=2 / torch DDP $(ratio data ddp); jdt fsdp=2 / torch FSDP $(ratio fsdp tfsdp); jdt 1 process / torch DDP $(ratio one ddp)"
