#!/usr/bin/env bash
# run-all.sh BUILD_DIR [unit|e2e] — runs the Check unit suites and the end-to-end tests of the
# binary, then prints one closing line "N passed, N failed, N skipped" and exits non-zero if
# anything failed.
#
# Unit suites: every BUILD_DIR/tests/check_* binary (Check, fork mode, per-test timeouts).
# End-to-end: every tests/e2e/*.sh, run with JDT_BIN set to the binary, in a fresh temp dir
# ($JDT_TMP). Exit 0 = pass, 77 = skip (the script prints why), anything else = fail. Tests set
# up what they need themselves (tests/infra/ fixtures, docs/testing.md); after each one,
# tests/infra/teardown.sh stops any fixture still up under its $JDT_TMP (a test that leaked one
# fails). Under CI=true a test whose fixture cannot run fails instead of skipping.
set -uo pipefail
BUILD=${1:-build}
WHAT=${2:-all}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export JDT_BIN="$ROOT/$BUILD/jdt-train"
export JDT_ROOT="$ROOT"
pass=0; fail=0; skip=0; failed=()

if [ "$WHAT" = all ] || [ "$WHAT" = unit ]; then
  for t in "$ROOT/$BUILD"/tests/check_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    out=$(cd "$ROOT" && "$t" 2>&1); rc=$?
    echo "$out" | grep -vE '^Running suite' | grep -E '^[0-9]+%:|:[EF]:|SKIP' || true
    line=$(echo "$out" | grep -E '^[0-9]+%: Checks:' | tail -1)
    n=$(echo "$line" | sed -nE 's/.*Checks: ([0-9]+).*/\1/p'); n=${n:-0}
    f=$(echo "$line" | sed -nE 's/.*Failures: ([0-9]+).*/\1/p'); f=${f:-0}
    e=$(echo "$line" | sed -nE 's/.*Errors: ([0-9]+).*/\1/p'); e=${e:-0}
    s=$(echo "$out" | grep -c '^SKIP' || true)
    if [ $rc -ne 0 ] || [ -z "$line" ]; then
      echo "unit $name: FAILED (exit $rc)"; echo "$out" | tail -20
      failed+=("unit:$name")
      [ -z "$line" ] && f=$((f + 1))
    fi
    pass=$((pass + n - f - e - s)); fail=$((fail + f + e)); skip=$((skip + s))
  done
fi

if [ "$WHAT" = all ] || [ "$WHAT" = e2e ]; then
  for t in "$ROOT"/tests/e2e/*.sh; do
    [ -f "$t" ] || continue
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
    case $rc in
      0)  echo "e2e $name: ok (${secs}s)"; pass=$((pass + 1));;
      77) echo "e2e $name: SKIP: $(echo "$out" | grep -m1 -i 'skip' || echo "$out" | tail -1)"; skip=$((skip + 1));;
      99) echo "e2e $name: FAILED (passed, but left fixtures up; stopped them)"; echo "$td" | sed 's/^/    /'
          fail=$((fail + 1)); failed+=("e2e:$name");;
      *)  echo "e2e $name: FAILED (exit $rc, ${secs}s)"; echo "$out" | tail -30 | sed 's/^/    /'
          fail=$((fail + 1)); failed+=("e2e:$name");;
    esac
    rm -rf "$tmp"
  done
fi

[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ]
