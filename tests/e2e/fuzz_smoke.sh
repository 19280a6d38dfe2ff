#!/usr/bin/env bash
# fuzz_smoke.sh — builds the libFuzzer targets (make fuzz-build: clang, ASan, UBSan) and runs
# each for 3 s on its kept corpus (tests/fuzz/corpus/): every corpus input must still pass and
# a short run must find nothing. Skips where clang or libFuzzer is missing.
set -uo pipefail
ROOT=${JDT_ROOT:?}
command -v clang >/dev/null || { echo "SKIP: no clang (scripts/install-deps.sh installs it)"; exit 77; }
echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' > "${JDT_TMP:?}/t.c"
clang -fsanitize=fuzzer "$JDT_TMP/t.c" -o "$JDT_TMP/t" 2>/dev/null ||
  { echo "SKIP: clang has no libFuzzer (libclang-rt-dev)"; exit 77; }
make -C "$ROOT" --no-print-directory -j2 fuzz-build >"$JDT_TMP/build.log" 2>&1 ||
  { tail -20 "$JDT_TMP/build.log"; echo "FAIL: fuzz-build"; exit 1; }
make -C "$ROOT" --no-print-directory fuzz SECONDS=3 || { echo "FAIL: a fuzz target found a failure"; exit 1; }
echo ok
