#!/usr/bin/env bash
# obs_mfu.sh — an MFU above 100% is never printed without a warning (issue 13): with
# runtime.peak_gflops pinned absurdly low every progress line's MFU carries "(!)", one warning
# says the configured reference is too low, and the end-of-run summary is marked too; with a
# generous reference nothing is marked or warned about. The measured reference names the
# OpenBLAS kernels it ran on: never pre-AVX2 ones on a CPU with AVX2 and FMA (jdt-train
# re-executes itself with OPENBLAS_CORETYPE where OpenBLAS fell back to them), and the user's
# OPENBLAS_CORETYPE is kept (both with JDT_SGEMM_NO_DNNL=1: f32 GEMMs on OpenBLAS). A reference
# not cached because the machine was busy says how many cores its threads held (fewer than 0.9
# of them). Where f32
# GEMMs run as oneDNN tiles (`jdt-train version` says so) the f32 reference is their rate; under
# bf16 compute through oneDNN it is oneDNN's bf16 GEMM.
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

old_cores="Prescott|Core2|Penryn|Dunnington|Nehalem|Atom|Sandybridge|Barcelona|Opteron|Bobcat|Bulldozer|Piledriver|Steamroller"
env -u OPENBLAS_CORETYPE JDT_SGEMM_NO_DNNL=1 "$JDT_BIN" "$JDT_ROOT/configs/tiny.yaml" run.out_dir="$JDT_TMP/runs3" \
  run.steps=2 runtime.cache_dir="$JDT_TMP/cache3" > measured.log 2>&1 || { cat measured.log; fail "training failed"; }
core=$(sed -nE 's/^MFU reference: .*; OpenBLAS (.*) kernels$/\1/p' measured.log)
[ -n "$core" ] || { cat measured.log; fail "the measured reference names no OpenBLAS kernels"; }
ls "$JDT_TMP/cache3/peak/"*"-$core.txt" >/dev/null 2>&1 || grep -q "busy machine" measured.log ||
  fail "the reference was not cached under the kernels' name"
# busy means its threads did not hold their cores (under 0.9 of them), and the warning says so
held=$(sed -nE 's/^warn: the MFU reference was measured on a busy machine \(its threads held ([0-9.]+) of ([0-9.]+) cores\).*/\1 \2/p' measured.log)
if grep -q "busy machine" measured.log; then
  [ -n "$held" ] || { cat measured.log; fail "a busy reference without the cores its threads held"; }
  awk -v h="${held% *}" -v w="${held#* }" 'BEGIN { exit !(h < 0.9 * w + 0.0005) }' || # printed %.3f
    { cat measured.log; fail "called busy, yet its threads held $held cores"; }
fi
if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
  grep -qxE "$old_cores" <<<"$core" && fail "OpenBLAS runs its $core kernels on a CPU with AVX2"
fi
OPENBLAS_CORETYPE=Prescott JDT_SGEMM_NO_DNNL=1 "$JDT_BIN" "$JDT_ROOT/configs/tiny.yaml" run.out_dir="$JDT_TMP/runs4" \
  run.steps=2 runtime.cache_dir="$JDT_TMP/cache4" > user.log 2>&1 || { cat user.log; fail "training failed"; }
grep -q "; OpenBLAS Prescott kernels$" user.log || { cat user.log; fail "OPENBLAS_CORETYPE=Prescott not kept"; }
# oneDNN_ref LOG NAME WHAT: the run in LOG was measured against oneDNN's GEMM rate, cached as
# ...-<kernels>-NAME.txt (unless the machine was busy), its reference line ending "; WHAT"
onednn_ref() {
  grep -qE "^MFU reference: .*; $3\$" "$1" || { cat "$1"; fail "GEMMs through oneDNN, MFU not against $3"; }
  ls "$JDT_TMP/cache3/peak/"*"-$core-$2.txt" >/dev/null 2>&1 || grep -q "busy machine" "$1" ||
    fail "the $3 reference was not cached under its own name: $(ls "$JDT_TMP/cache3/peak")"
}
# f32 GEMMs as oneDNN tiles: MFU against their rate (1024^3 through the same tiles), cached under
# its own name; elsewhere the SGEMM's
"$JDT_BIN" "$JDT_ROOT/configs/tiny.yaml" run.out_dir="$JDT_TMP/runs6" run.steps=2 \
  runtime.cache_dir="$JDT_TMP/cache3" > f32.log 2>&1 || { cat f32.log; fail "f32 training failed"; }
if "$JDT_BIN" version | grep -q "f32 GEMMs: oneDNN"; then
  onednn_ref f32.log dnnl-f32 "oneDNN f32 GEMMs"
  f32_ref="oneDNN f32 GEMMs"
else
  grep -qE "^MFU reference: .*; OpenBLAS $core kernels$" f32.log ||
    { cat f32.log; fail "f32 on OpenBLAS: the reference is not the SGEMM's"; }
  f32_ref="the SGEMM"
fi
# bf16 compute: where its GEMMs run through oneDNN (the run says so once), MFU is against
# oneDNN's bf16 GEMM rate, cached beside the SGEMM's under its own name (against the SGEMM a
# healthy bf16 run read MFU 170% with a warning that the reference was wrong); elsewhere bf16
# GEMMs are f32 GEMMs on rounded inputs and the f32 GEMM's reference stays
"$JDT_BIN" "$JDT_ROOT/configs/tiny.yaml" run.out_dir="$JDT_TMP/runs5" run.steps=2 \
  precision.compute=bf16 runtime.cache_dir="$JDT_TMP/cache3" > bf16.log 2>&1 ||
  { cat bf16.log; fail "bf16 training failed"; }
if grep -q "precision.compute bf16: bf16 GEMMs: oneDNN" bf16.log; then
  onednn_ref bf16.log bf16 "oneDNN bf16 GEMMs"
  bf16_ref="oneDNN bf16 GEMMs"
else
  grep -qF "; ${f32_ref/the SGEMM/OpenBLAS $core kernels}" bf16.log ||
    { cat bf16.log; fail "bf16 on f32 GEMMs: the reference is not the f32 GEMM's ($f32_ref)"; }
  bf16_ref="$f32_ref (no oneDNN bf16 path here)"
fi
echo "ok ($core kernels; f32 against $f32_ref; bf16 against $bf16_ref)"
