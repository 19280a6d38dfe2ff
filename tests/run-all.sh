#!/usr/bin/env bash
# run-all.sh BUILD_DIR [unit|e2e] — runs the Check unit suites and the end-to-end tests of the
# binary, then prints one closing line "N passed, N failed, N skipped" and exits non-zero if
# anything failed.
#
# Unit suites: every BUILD_DIR/tests/check_* binary (Check, fork mode, per-test timeouts),
# JDT_TEST_JOBS at a time. End-to-end: every tests/e2e/*.sh, run with JDT_BIN set to the binary,
# in a fresh temp dir ($JDT_TMP), JDT_TEST_JOBS at a time (those marked "# e2e: exclusive" alone). Exit 0 = pass,
# 77 = skip (the script prints why), anything else = fail. Tests set
# up what they need themselves (tests/infra/ fixtures, docs/testing.md); after each one,
# tests/infra/teardown.sh stops any fixture still up under its $JDT_TMP (a test that leaked one
# fails). Under CI=true a test whose fixture cannot run fails instead of skipping.
# With JDT_TEST_SUMMARY=FILE it also appends the closing line and, for each failure, its name
# and the last lines it printed to FILE (`make test` prints FILE again after the CUDA suites, so
# that the end of a CI log names what failed).
set -uo pipefail
BUILD=${1:-build}
WHAT=${2:-all}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export JDT_BIN="$ROOT/$BUILD/jdt-train"
export JDT_ROOT="$ROOT"
# the OpenMP defaults: the tests' auto thread counts and timings assume no caller settings
# (jdt-train takes OMP_NUM_THREADS and honours OMP_PROC_BIND / OMP_PLACES, docs/launch.md)
unset OMP_NUM_THREADS OMP_PROC_BIND OMP_PLACES OMP_DYNAMIC OMP_THREAD_LIMIT
# the test binaries on the OpenBLAS kernels jdt-train runs on
. "$ROOT/tests/infra/blas-env.sh"
pass=0; fail=0; skip=0; failed=()
details="" # the failures' names and last lines, for $JDT_TEST_SUMMARY

# One unit suite: runs it, its output to $RES/NAME.out, "rc secs" to $RES/NAME.rc.
run_unit() {
  local t=$1 name start rc
  name=$(basename "$t")
  start=$(date +%s)
  (cd "$ROOT" && "$t") > "$RES/$name.out" 2>&1; rc=$?
  echo "$rc $(( $(date +%s) - start ))" > "$RES/$name.rc"
}

# Prints unit suite NAME's lines from $RES and counts its checks.
report_unit() {
  local name=$1 rc secs out line n f e s
  read -r rc secs < "$RES/$name.rc"
  out=$(cat "$RES/$name.out")
  line=$(echo "$out" | grep -E '^[0-9]+%: Checks:' | tail -1)
  echo "$out" | grep -vE '^Running suite' | grep -E ':[EF]:|SKIP' || true
  n=$(echo "$line" | sed -nE 's/.*Checks: ([0-9]+).*/\1/p'); n=${n:-0}
  f=$(echo "$line" | sed -nE 's/.*Failures: ([0-9]+).*/\1/p'); f=${f:-0}
  e=$(echo "$line" | sed -nE 's/.*Errors: ([0-9]+).*/\1/p'); e=${e:-0}
  s=$(echo "$out" | grep -c '^SKIP' || true)
  if [ "$rc" -ne 0 ] || [ -z "$line" ]; then
    echo "unit $name: FAILED (exit $rc)"; echo "$out" | tail -20
    details+="unit $name: FAILED (exit $rc)"$'\n'"$( (echo "$out" | grep -E ':[EF]:'; echo "$out" | tail -5) | head -12 | sed 's/^/    /')"$'\n'
    failed+=("unit:$name")
    [ -z "$line" ] && f=$((f + 1))
  else
    echo "unit $name: ok (${secs}s) $line"
  fi
  pass=$((pass + n - f - e - s)); fail=$((fail + f + e)); skip=$((skip + s))
}

# One e2e test: runs it in a fresh $JDT_TMP under a 600 s limit, stops any fixture it left up,
# and writes "rc secs" to $RES/NAME.rc (rc 99: passed but leaked a fixture), its output to
# $RES/NAME.out and the teardown's to $RES/NAME.td.
run_e2e() {
  local t=$1 name tmp start out rc secs td tdrc
  name=$(basename "$t" .sh)
  tmp=$(mktemp -d /tmp/jdt-e2e.XXXXXX)
  start=$(date +%s)
  out=$(cd "$ROOT" && JDT_TMP="$tmp" timeout -k 10 600 bash "$t" 2>&1); rc=$?
  secs=$(( $(date +%s) - start ))
  td=$(bash "$ROOT/tests/infra/teardown.sh" "$tmp" 2>&1); tdrc=$?
  if [ $tdrc -ne 0 ]; then
    out="$out
$td"
    [ $rc -eq 0 ] || [ $rc -eq 77 ] && rc=99
  fi
  printf '%s\n' "$out" > "$RES/$name.out"
  printf '%s\n' "$td" > "$RES/$name.td"
  rm -rf "$tmp"
  echo "$rc $secs" > "$RES/$name.rc"
}

# Prints test NAME's result line from $RES and counts it.
report_e2e() {
  local name=$1 rc secs out
  read -r rc secs < "$RES/$name.rc"
  out=$(cat "$RES/$name.out")
  case $rc in
    0)  echo "e2e $name: ok (${secs}s)"; pass=$((pass + 1));;
    77) echo "e2e $name: SKIP: $(echo "$out" | grep -m1 -i 'skip' || echo "$out" | tail -1)"; skip=$((skip + 1));;
    99) echo "e2e $name: FAILED (passed, but left fixtures up; stopped them)"; sed 's/^/    /' "$RES/$name.td"
        details+="e2e $name: FAILED (passed, but left fixtures up)"$'\n'
        fail=$((fail + 1)); failed+=("e2e:$name");;
    *)  echo "e2e $name: FAILED (exit $rc, ${secs}s)"; echo "$out" | tail -30 | sed 's/^/    /'
        details+="e2e $name: FAILED (exit $rc, ${secs}s)"$'\n'"$(echo "$out" | tail -12 | sed 's/^/    /')"$'\n'
        fail=$((fail + 1)); failed+=("e2e:$name");;
  esac
}

# pool RUN REPORT ITEM...: runs `RUN ITEM` for each item in the background, $jobs at a time,
# and `REPORT NAME` (NAME: the item's base name less .sh) as each ends.
pool() {
  local runf=$1 repf=$2 t pid
  shift 2
  declare -A running=()
  for t in "$@"; do
    while [ ${#running[@]} -ge "$jobs" ]; do
      for pid in "${!running[@]}"; do
        kill -0 "$pid" 2>/dev/null && continue
        wait "$pid"; "$repf" "${running[$pid]}"; unset "running[$pid]"
      done
      [ ${#running[@]} -ge "$jobs" ] && sleep 0.2
    done
    "$runf" "$t" &
    running[$!]=$(basename "$t" .sh)
  done
  for pid in "${!running[@]}"; do
    wait "$pid"; "$repf" "${running[$pid]}"
  done
}

# Tests run JDT_TEST_JOBS at a time (default: the CPUs, at most 4): the unit suites (none races a
# clock; the slow ones first, so that the last to start are short), then the end-to-end tests,
# except those whose header has a line "# e2e: exclusive (why)": timing-sensitive ones (signals,
# peer time-outs, rate limits), daemons and namespaces, and the multi-process heavyweights run
# alone afterwards.
jobs=${JDT_TEST_JOBS:-$(nproc)}
[ "$jobs" -ge 1 ] 2>/dev/null || jobs=1
[ "$jobs" -le 4 ] || jobs=4
RES=$(mktemp -d /tmp/jdt-test-results.XXXXXX)

if [ "$WHAT" = all ] || [ "$WHAT" = unit ]; then
  # the longest suites (about 60, 40, 25 and 20 s on 2 cores; check_dist mostly waits on
  # peers' time-outs) first, then the rest in name order
  slow=(check_train check_runtime check_dist check_jit)
  units=()
  for n in "${slow[@]}"; do [ -x "$ROOT/$BUILD/tests/$n" ] && units+=("$ROOT/$BUILD/tests/$n"); done
  for t in "$ROOT/$BUILD"/tests/check_*; do
    [ -x "$t" ] || continue
    [[ " ${slow[*]} " == *" $(basename "$t") "* ]] && continue
    units+=("$t")
  done
  t0=$(date +%s)
  pool run_unit report_unit "${units[@]}"
  echo "== unit suites: $(( $(date +%s) - t0 ))s"
fi

if [ "$WHAT" = all ] || [ "$WHAT" = e2e ]; then
  shared=(); alone=()
  for t in "$ROOT"/tests/e2e/*.sh; do
    [ -f "$t" ] || continue
    if grep -q '^# e2e: exclusive' "$t"; then alone+=("$t"); else shared+=("$t"); fi
  done
  t0=$(date +%s)
  pool run_e2e report_e2e "${shared[@]}"
  t1=$(date +%s)
  for t in "${alone[@]}"; do
    run_e2e "$t"; report_e2e "$(basename "$t" .sh)"
  done
  echo "== e2e tests: $(( t1 - t0 ))s $jobs at a time, then $(( $(date +%s) - t1 ))s the exclusive ones"
fi
rm -rf "$RES"

[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed, $skip skipped"
if [ -n "${JDT_TEST_SUMMARY:-}" ]; then
  { printf '%s' "$details"; echo "tests/run-all.sh: $pass passed, $fail failed, $skip skipped"; } >>"$JDT_TEST_SUMMARY"
fi
[ $fail -eq 0 ]
