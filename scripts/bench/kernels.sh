#!/usr/bin/env bash
# kernels.sh [SCALE] [THREADS] [wall|cpu] — runs build/bench/kernels (compiled program with fusion, without
# fusion, and the reference interpreter) and, in the same run, the JAX/PyTorch CPU peers from
# kernels_ref.py (whichever is installed; PYTHON selects the interpreter, default python3), then
# prints one table with the ratios peer/jit (> 1: jdt-train is faster).
#   make bench-build && bash scripts/bench/kernels.sh 1 2
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SCALE=${1:-1}
THREADS=${2:-$(nproc)}
CLOCK=${3:-wall}
PY=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$ROOT/build/bench/kernels" "$SCALE" "$THREADS" "$CLOCK" | tee "$tmp/jit.txt"
XLA_FLAGS="--xla_force_host_platform_device_count=1 $([ "$THREADS" = 1 ] && echo --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1) ${XLA_FLAGS:-}" \
  "$PY" "$ROOT/scripts/bench/kernels_ref.py" "$SCALE" "$THREADS" "$CLOCK" | tee "$tmp/ref.txt" || true
echo
printf '%-20s %10s %10s %9s %10s %9s\n' case jit_ms jax_ms jax/jit torch_ms torch/jit
awk 'NR==FNR { if ($1 == "jax" || $1 == "torch") t[$1, $2] = $3; next }
     /^[a-z_]+ +[0-9.]+ / { j = $2; jx = t["jax", $1]; tr = t["torch", $1];
       printf "%-20s %10.3f %10s %9s %10s %9s\n", $1, j, jx ? jx : "-", jx ? sprintf("%.2f", jx / j) : "-",
              tr ? tr : "-", tr ? sprintf("%.2f", tr / j) : "-" }' "$tmp/ref.txt" "$tmp/jit.txt"
