#!/usr/bin/env bash
# run-all.sh [BIN] — `make bench`: every benchmark side by side with its peers, in one go:
#   1. train_gpt.sh  GPT training tokens/s and MFU: jdt-train vs PyTorch vs JAX (CPU)
#   2. kernels.sh    fused kernels and attention: JIT vs no-fusion vs interpreter (vs JAX)
#   3. allreduce.sh  all-reduce bus bandwidth: shared memory / TCP vs torch.distributed gloo
#   4. sample.sh     sampling tokens/s: KV-cache decoder vs the full forward per token
#   5. loader.sh     the HDF5 loader alone over 32 shards, 1/2/4 ranks, vs training's tokens/s
# Peers that are not installed are reported and skipped (PyTorch: Debian's python3-torch at
# /usr/bin/python3; JAX: `pip install jax`, PYTHON_JAX=...). Results belong in docs/perf.md.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export JDT_BIN=${1:-$ROOT/build/jdt-train}
cd "$ROOT"
echo "== GPT training (scripts/bench/train_gpt.sh)"; bash scripts/bench/train_gpt.sh
echo; echo "== kernels (scripts/bench/kernels.sh 1 2)"; bash scripts/bench/kernels.sh 1 2
echo; echo "== all-reduce (scripts/bench/allreduce.sh)"; PYTHON=${PYTHON:-/usr/bin/python3} bash scripts/bench/allreduce.sh
echo; echo "== sampling (scripts/bench/sample.sh)"; bash scripts/bench/sample.sh
echo; echo "== data loader (scripts/bench/loader.sh)"; bash scripts/bench/loader.sh
