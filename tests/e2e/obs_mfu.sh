#!/usr/bin/env bash
# obs_mfu.sh — an MFU above 100% is never printed without a warning (issue 13): with
# runtime.peak_gflops pinned absurdly low every progress line's MFU carries "(!)", one warning
# says the configured reference is too low, and the end-of-run summary is marked too; with a
# generous reference nothing is marked or warned about.
set -uo pipefail
cd "$JDT_TMP"
fail() { echo "FAIL: $*"; exit 1; }
# every "MFU N%" above 100 outside the warning itself must be followed by " (!)"
unmarked() { grep -v "^warn:" "$1" | grep -oE "MFU [0-9.]+%( \(!\))?" | awk '{ v = $2 + 0; if (v > 100 && $3 != "(!)") n++ } END { print n + 0 }'; }
"$JDT_BIN" "$JDT_ROOT/configs/tiny.yaml" run.out_dir="$JDT_TMP/runs" run.steps=6 run.log_every=2 \
  runtime.peak_gflops=0.001 > low.log 2>&1 || { cat low.log; fail "training failed"; }
grep -q "MFU reference: 0.001 GFLOP/s .*(runtime.peak_gflops)" low.log || { cat low.log; fail "reference line"; }
[ "$(grep -cE '^step [0-9]+/6 .*MFU [0-9.]+% \(!\)' low.log)" -ge 3 ] || { cat low.log; fail "progress lines not marked (!)"; }
[ "$(grep -c 'is above 100%' low.log)" -eq 1 ] || { cat low.log; fail "want exactly one MFU warning"; }
grep -q "warn: MFU .* is above 100%: runtime.peak_gflops (0.001 GFLOP/s per process) is below" low.log ||
  { cat low.log; fail "the warning does not name runtime.peak_gflops"; }
grep -qE "throughput .* MFU [0-9.]+% \(!\)" low.log || { cat low.log; fail "summary MFU not marked"; }
[ "$(unmarked low.log)" -eq 0 ] || { cat low.log; fail "an MFU above 100% without (!)"; }
awk '/"mfu"/' "runs/tiny/metrics.jsonl" | grep -q . || fail "no mfu in metrics.jsonl"

"$JDT_BIN" "$JDT_ROOT/configs/tiny.yaml" run.out_dir="$JDT_TMP/runs2" run.steps=4 run.log_every=2 \
  runtime.peak_gflops=1e9 > high.log 2>&1 || { cat high.log; fail "training failed"; }
grep -q "(!)\|above 100%" high.log && { cat high.log; fail "marked or warned with a generous reference"; }
grep -qE "MFU [0-9.]+%" high.log || fail "no MFU printed"
echo "ok"
