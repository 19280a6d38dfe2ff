#!/usr/bin/env bash
# regions.sh — the ceiling test for busy machines (scripts/bench/regions.c): a synthetic step
# of parallel regions run on 1 thread, a 2-thread OpenMP team (passive waiting, as jdt-train),
# a 2-thread pool that does not wait for late threads, and that pool pinned (caller on CPU 0,
# worker on CPU 1), with and without one core kept busy (`yes` on CPU 1). Prints the median
# milliseconds per step of REPS alternating runs and the speed-up over 1 thread (> 1: the
# second thread helps). Shapes (R regions x W us, C chunks each): "300 200 8" is the tiny GPT's
# step (about 300 regions in 60 ms), "30 3000 16" long GEMM-like regions, "1000 50 4" many
# small ones. Needs CPUs 0 and 1. Env: REPS (default 3), STEPS (default 10), SHAPES.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
REPS=${REPS:-3}
STEPS=${STEPS:-10}
SHAPES=${SHAPES:-"300 200 8|30 3000 16|1000 50 4"}
LOAD_PID=
cleanup() { [ -n "$LOAD_PID" ] && kill "$LOAD_PID" 2>/dev/null; }
trap cleanup EXIT
BIN="$ROOT/build/bench/regions"
[ -x "$BIN" ] || make -C "$ROOT" --no-print-directory build/bench/regions >/dev/null
export OMP_WAIT_POLICY=passive
MODES="one omp pool pinned"
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print NR % 2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
echo "regions.sh: median ms per step of $REPS alternating runs ($STEPS steps each); x = 1 thread's time / this one's"
printf "%-10s %-12s %10s %10s %10s %10s\n" load "R W C" $MODES
for load in none busy; do
  if [ $load = busy ]; then taskset -c 1 yes >/dev/null & LOAD_PID=$!; sleep 0.3; fi
  IFS='|' read -r -a shapes <<<"$SHAPES"
  for shape in "${shapes[@]}"; do
    declare -A t=()
    for ((r = 0; r < REPS; r++)); do
      for m in $MODES; do t[$m]+="$(taskset -c 0-1 "$BIN" $m $shape "$STEPS") "; done
    done
    one=$(echo "${t[one]}" | median)
    row=""
    for m in $MODES; do
      v=$(echo "${t[$m]}" | median)
      row+=$(printf " %10s" "$(awk -v a="$one" -v b="$v" 'BEGIN{printf "%.1f x%.2f", b, a/b}')")
    done
    printf "%-10s %-12s%s\n" "$load" "$shape" "$row"
    unset t
  done
  [ -n "$LOAD_PID" ] && { kill "$LOAD_PID"; LOAD_PID=; }
done
echo "load average $(cut -d' ' -f1-3 /proc/loadavg)"
