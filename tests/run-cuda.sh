#!/usr/bin/env bash
# run-cuda.sh [BUILD_DIR] — the CUDA suites of `make test-cuda` (which builds build-cuda/ first),
# in two queues that run side by side, since most of them keep one core busy and CI has two
# (about equally long: 255 and 262 s on a 2-core CI machine at 4645b63):
#   A: check_cuk (NVRTC compiles of every builtin kernel, host checks, 159 s), then
#      tests/e2e/cuda_backend.sh with the CUDA binary (96 s)
#   B: on the host CUDA emulator, check_cuk-emu's GPU case warp by warp (the last first, threads
#      in reverse), cp.async copies landing when issued, kernels built with UBSan (84 s); then
#      check_cuda-emu's GPU case warp by warp (cp.async copies landing at their waits, 139 s);
#      then check_cuda (NVRTC compiles of every generated kernel, 39 s)
# Both emulator suites build the kernels at -O2 with floating-point contraction where the host
# has FMA (FMA_FLAGS), as NVRTC's default --fmad=true contracts on a GPU: a tolerance or an exact
# comparison that holds only for separately rounded products fails here. (The host compiler picks
# its own pairs to contract, not necessarily NVRTC's.)
# (MALLOC_PERTURB_ fills freed memory: a use after free of deferred work crashes every time; the
# forward thread order is tests/e2e/cuda_emu.sh's.) None of these races a clock: check_cuk's
# dead-peer case allows its forked peer seconds, not milliseconds. Each suite's output is kept
# and printed whole, A's then B's, with one line per suite; exits non-zero if any failed. With
# JDT_TEST_SUMMARY=FILE it appends each failed suite's line and last lines, and a closing line, to
# FILE (run-all.sh's).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-build}
cd "$ROOT" || exit 1
LOGS=$(mktemp -d /tmp/jdt-cuda-suites.XXXXXX)
export JDT_BIN="$ROOT/$BUILD/jdt-train"
. tests/infra/blas-env.sh # the test binaries on jdt-train's OpenBLAS kernels

FMA_FLAGS=
case "$(uname -m)" in
x86_64) grep -qw fma /proc/cpuinfo 2>/dev/null && FMA_FLAGS="-mfma -ffp-contract=fast" ;;
aarch64) FMA_FLAGS="-ffp-contract=fast" ;;
esac
[ -n "$FMA_FLAGS" ] || echo "run-cuda.sh: this CPU has no FMA; the emulated kernels run uncontracted"

# suite NAME CMD...: runs CMD with its output in $LOGS/NAME.log and its time and status in .rc
suite() {
  local name=$1 t0 rc
  shift
  t0=$(date +%s)
  "$@" >"$LOGS/$name.log" 2>&1; rc=$?
  echo "$rc $(($(date +%s) - t0))" >"$LOGS/$name.rc"
}
queue_a() {
  suite check_cuk build-cuda/tests/check_cuk
  local tmp
  tmp=$(mktemp -d /tmp/jdt-cuda-backend.XXXXXX)
  suite cuda_backend env JDT_CUDA_BIN="$ROOT/build-cuda/jdt-train" JDT_ROOT="$ROOT" JDT_TMP="$tmp" \
    bash tests/e2e/cuda_backend.sh
  rm -rf "$tmp"
}
queue_b() {
  suite check_cuk-emu env JDT_CUDAEMU_ORDER=warps JDT_CUDAEMU_CP_ASYNC=issue MALLOC_PERTURB_=165 \
    CK_RUN_CASE=gpu JDT_CUDAEMU_OPT=-O2 \
    JDT_CUDAEMU_CFLAGS="-fsanitize=undefined -fno-sanitize-recover=all $FMA_FLAGS" \
    build-cuda/tests/check_cuk-emu
  suite check_cuda-emu env JDT_CUDAEMU_ORDER=warps MALLOC_PERTURB_=165 CK_RUN_CASE=gpu \
    JDT_CUDAEMU_OPT=-O2 JDT_CUDAEMU_CFLAGS="$FMA_FLAGS" build-cuda/tests/check_cuda-emu
  suite check_cuda build-cuda/tests/check_cuda
}
t0=$(date +%s)
queue_a & a=$!
queue_b & b=$!
wait $a $b
echo "== CUDA suites: $(( $(date +%s) - t0 ))s"

failed=()
for name in check_cuk check_cuk-emu cuda_backend check_cuda check_cuda-emu; do
  if [ ! -f "$LOGS/$name.rc" ]; then
    echo "cuda $name: did not run"; failed+=("$name"); continue
  fi
  read -r rc secs <"$LOGS/$name.rc"
  cat "$LOGS/$name.log"
  if [ "$rc" -eq 0 ]; then echo "cuda $name: ok (${secs}s)"; else
    echo "cuda $name: FAILED (exit $rc, ${secs}s)"; failed+=("$name")
    [ -n "${JDT_TEST_SUMMARY:-}" ] && { echo "cuda $name: FAILED (exit $rc, ${secs}s)"
      (grep -E ':[EF]:' "$LOGS/$name.log"; tail -5 "$LOGS/$name.log") | head -12 | sed 's/^/    /'; } >>"$JDT_TEST_SUMMARY"
  fi
done
[ -n "${JDT_TEST_SUMMARY:-}" ] &&
  echo "tests/run-cuda.sh: $((5 - ${#failed[@]})) of 5 CUDA suites passed" >>"$JDT_TEST_SUMMARY"
rm -rf "$LOGS"
[ ${#failed[@]} -eq 0 ] || { echo "cuda suites failed: ${failed[*]}"; exit 1; }
