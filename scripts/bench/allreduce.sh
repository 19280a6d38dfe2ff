#!/usr/bin/env bash
# allreduce.sh — all-reduce bus bandwidth vs message size on loopback: jdt-train's collectives
# (build/bench/allreduce: shared memory, and TCP only) against torch.distributed gloo, in the
# same run, printing one table with the ratios.
#
#   scripts/bench/allreduce.sh [--nproc 2] [--min 1024] [--max 67108864] [--time 0.5]
#
# PYTHON (default python3) must import torch for the gloo column; without it that column reads
# "-" (pip install torch). Needs `make bench-build` (done here if missing).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN="$ROOT/build/bench/allreduce"
PYTHON=${PYTHON:-python3}
[ -x "$BIN" ] || make -C "$ROOT" --no-print-directory bench-build >/dev/null
tmp=$(mktemp -d /tmp/jdt-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

"$BIN" "$@" > "$tmp/shm.txt"
JDT_BENCH_NO_SHM=1 "$BIN" "$@" > "$tmp/tcp.txt"
if "$PYTHON" -c "import torch.distributed" 2>/dev/null; then
  "$PYTHON" "$ROOT/scripts/bench/allreduce_gloo.py" "$@" 2>/dev/null > "$tmp/gloo.txt" || true
  gloo_ver=$("$PYTHON" -c "import torch; print(torch.__version__)" 2>/dev/null)
else
  : > "$tmp/gloo.txt"; gloo_ver="not installed"
fi

"$PYTHON" - "$tmp" "$gloo_ver" <<'PY'
import sys
tmp, ver = sys.argv[1], sys.argv[2]
def load(name):
    rows = {}
    for line in open(f"{tmp}/{name}.txt"):
        f = line.split()
        if len(f) == 4 and f[0].isdigit():
            rows[int(f[0])] = float(f[3])
    return rows
shm, tcp, gloo = load("shm"), load("tcp"), load("gloo")
print(f"all-reduce f32, bus bandwidth GB/s (busbw = bytes*2(n-1)/n/time); torch {ver}")
print(f"{'bytes':>10} {'jdt-shm':>9} {'jdt-tcp':>9} {'gloo':>9} {'shm/gloo':>9} {'tcp/gloo':>9}")
def fmt(v): return f"{v:9.3f}" if v is not None else f"{'-':>9}"
def ratio(a, b): return f"{a / b:8.2f}x" if a is not None and b else f"{'-':>9}"
for size in sorted(shm):
    s, t, g = shm.get(size), tcp.get(size), gloo.get(size)
    print(f"{size:>10} {fmt(s)} {fmt(t)} {fmt(g)} {ratio(s, g)} {ratio(t, g)}")
PY
