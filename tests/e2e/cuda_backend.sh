#!/usr/bin/env bash
# cuda_backend.sh — runtime.backend: cuda from the command line, on any machine: a binary built
# without CUDA says so in one line (exit 2); `inspect` compiles the CUDA step to source without
# a GPU; a CUDA build (JDT_CUDA_BIN, from make CUDA=1) on a machine without a GPU gives one clear
# error and exit 1, and with a GPU trains configs/tiny.yaml with a falling loss.
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}; ROOT=${JDT_ROOT:?}
fail() { echo "FAIL: $*"; exit 1; }
cd "$ROOT" || exit 1
O=(run.out_dir="$TMP/runs" run.steps=6 run.eval_every=0)

"$BIN" train configs/tiny.yaml "${O[@]}" runtime.backend=cuda >"$TMP/out" 2>"$TMP/err"; rc=$?
if grep -q "make CUDA=1" "$TMP/err"; then
  [ $rc -eq 2 ] || fail "no-CUDA build: exit $rc, expected 2"
  [ "$(grep -c 'jdt-train: .*error' "$TMP/err")" -eq 1 ] || { cat "$TMP/err"; fail "expected one error line"; }
fi

# inspect: a CPU-only binary summarises the config and says why it cannot run it (the one
# capability check, engine/train/caps.c); a CUDA build plans the step, and with --compile
# compiles it to CUDA source, no GPU
"$BIN" inspect configs/tiny.yaml runtime.backend=cuda >"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err"; fail "inspect cuda failed"; }
if "$BIN" version | grep -q '^backends:.* cuda'; then IBIN=$BIN; else
  grep -q "not runnable by this build: runtime.backend" "$TMP/out" || { cat "$TMP/out"; fail "CPU build: inspect does not say why"; }
  # asked to compile for a GPU ahead of time, a build without CUDA fails instead of summarising
  "$BIN" inspect configs/tiny.yaml runtime.backend=cuda --cuda-arch sm_90 >"$TMP/out" 2>"$TMP/err"; rc=$?
  [ $rc -eq 2 ] && grep -q "nothing compiled: .*make CUDA=1" "$TMP/err" || { cat "$TMP/err"; fail "CPU build: --cuda-arch exit $rc, expected 2 naming make CUDA=1"; }
  IBIN=${JDT_CUDA_BIN:-}
fi
if [ -n "$IBIN" ]; then
  "$IBIN" inspect configs/tiny.yaml runtime.backend=cuda >"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err"; fail "inspect cuda failed"; }
  grep -q "planned step (one process)" "$TMP/out" || { cat "$TMP/out"; fail "inspect does not plan the CUDA step"; }
  grep -qE "kernels +[0-9]+ fused" "$TMP/out" || fail "inspect lacks the kernel count"
  # ahead of time, no GPU: NVRTC compiles the bf16 step and the builtins it launches (misc,
  # rows, the tensor-core attention) for sm_90 into runtime.cache_dir; the cubins are CUDA ELF
  # images (e_machine 190); a second inspect finds them all
  A=(configs/tiny.yaml runtime.backend=cuda precision.compute=bf16 runtime.cache_dir="$TMP/aot")
  if "$IBIN" version | grep -q '^backends:.* cuda'; then
    "$IBIN" inspect "${A[@]}" --cuda-arch sm_90 >"$TMP/out" 2>"$TMP/err" || { cat "$TMP/out" "$TMP/err"; fail "inspect --cuda-arch sm_90 failed"; }
    grep -qE "NVRTC .* for sm_90\), cache miss" "$TMP/out" || { cat "$TMP/out"; fail "inspect --cuda-arch: no NVRTC compile of the step"; }
    grep -q "builtin kernel sources: 3 compiled, 0 found" "$TMP/out" || { cat "$TMP/out"; fail "inspect --cuda-arch: builtins not compiled"; }
    [ "$(ls "$TMP/aot"/*.cuk | wc -l)" -eq 3 ] || { ls -l "$TMP/aot"; fail "expected 3 builtin entries"; }
    n=0
    for f in "$TMP/aot"/*.sm_90.cubin; do
      [ "$(od -An -tx1 -N4 "$f" | tr -d ' ')" = 7f454c46 ] && [ "$(od -An -tu2 -j18 -N2 "$f" | tr -d ' ')" = 190 ] ||
        fail "$f is not a CUDA ELF image"
      n=$((n + 1))
    done
    [ $n -ge 1 ] || { ls -l "$TMP/aot"; fail "no sm_90 cubin stored"; }
    # a list: sm_90 again (all found), then sm_86 (compiled: its own cubins and builtins)
    "$IBIN" inspect "${A[@]}" --cuda-arch=90,sm_86 >"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err"; fail "inspect --cuda-arch=90,sm_86 failed"; }
    grep -qE "NVRTC .* for sm_90\), cache hit" "$TMP/out" && grep -q "sm_90, .*builtin kernel sources: 0 compiled, 3 found" "$TMP/out" ||
      { cat "$TMP/out"; fail "second inspect --cuda-arch compiled sm_90 again"; }
    grep -qE "NVRTC .* for sm_86\), cache miss" "$TMP/out" && grep -q "sm_86, .*builtin kernel sources: 3 compiled, 0 found" "$TMP/out" ||
      { cat "$TMP/out"; fail "inspect --cuda-arch=90,sm_86 did not compile for sm_86"; }
    [ "$(grep -c "^  compile " "$TMP/out")" -eq 2 ] && [ "$(grep -c "^compiled step" "$TMP/out")" -eq 1 ] ||
      { cat "$TMP/out"; fail "a list of two archs: expected one summary and two compile lines"; }
    m=$(ls "$TMP/aot" | wc -l)
    [ "$(ls "$TMP/aot"/*.sm_86.cubin | wc -l)" -eq $n ] && [ "$(ls "$TMP/aot"/*.cuk | wc -l)" -eq 6 ] ||
      { ls -l "$TMP/aot"; fail "expected $n sm_86 cubins and 6 builtin entries"; }
    echo "inspect --cuda-arch sm_90 (no GPU): $n program cubins + 3 builtin sources stored; --cuda-arch=90,sm_86 found those and compiled sm_86's"
    # an architecture NVRTC lacks, or not one at all, also in a list's tail, or one listed
    # twice: one line, exit 2, nothing compiled
    for bad in "sm_95:cannot compile for sm_95; it compiles for: .*sm_90" "gpu9:is not an architecture" \
      "sm_80,sm_95:cannot compile for sm_95" "sm_80,:is not an architecture" "sm_80,80:listed twice"; do
      "$IBIN" inspect "${A[@]}" --cuda-arch "${bad%%:*}" >"$TMP/out" 2>"$TMP/err"; rc=$?
      [ $rc -eq 2 ] && [ "$(grep -c 'jdt-train: ' "$TMP/err")" -eq 1 ] && grep -q "${bad#*:}" "$TMP/err" ||
        { cat "$TMP/err"; fail "--cuda-arch ${bad%%:*}: exit $rc, expected 2 and one line saying why"; }
      [ "$(ls "$TMP/aot" | wc -l)" -eq "$m" ] || { ls -l "$TMP/aot"; fail "--cuda-arch ${bad%%:*} compiled something"; }
    done
  fi
  # a CPU config, or a build without CUDA: --cuda-arch compiles nothing, which is an error
  "$IBIN" inspect configs/tiny.yaml --cuda-arch sm_90 >"$TMP/out" 2>"$TMP/err"; rc=$?
  [ $rc -eq 2 ] && grep -q "runtime.backend: cuda" "$TMP/err" || { cat "$TMP/err"; fail "--cuda-arch on a cpu config: exit $rc, expected 2"; }
  "$IBIN" inspect configs/tiny.yaml runtime.backend=cuda --compile >"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err"; fail "inspect --compile cuda failed"; }
  grep -q "to CUDA source" "$TMP/out" || { cat "$TMP/out"; fail "inspect --compile does not show the CUDA step"; }
  # bf16 compute runs on the CUDA backend (cuBLASLt bf16 GEMMs): accepted and compiled
  "$IBIN" inspect configs/tiny.yaml runtime.backend=cuda precision.compute=bf16 --compile >"$TMP/out" 2>"$TMP/err" || { cat "$TMP/out" "$TMP/err"; fail "inspect --compile cuda bf16 failed"; }
  grep -q "not runnable" "$TMP/out" && { cat "$TMP/out"; fail "cuda bf16 refused"; }
  grep -q "to CUDA source" "$TMP/out" || { cat "$TMP/out"; fail "inspect --compile does not show the CUDA bf16 step"; }
  # collectives overlap compute on CUDA too (NCCL on its own stream): the FSDP step's
  # collectives are start/wait pairs (one per tensor with runtime.bucket_mb=0, else in
  # buckets), none with runtime.overlap_comm=false
  M=(runtime.backend=cuda mesh.fsdp=2 dist.world_size=2)
  started() { grep -oE "micro-batch program: [0-9]+ calls per run, [0-9]+ of them start/wait" "$TMP/out" | grep -oE "[0-9]+ of them" | grep -oE "[0-9]+"; }
  "$IBIN" inspect configs/tiny.yaml "${M[@]}" runtime.bucket_mb=0 >"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err"; fail "inspect cuda fsdp failed"; }
  n=$(started)
  [ "${n:-0}" -gt 10 ] || { cat "$TMP/out"; fail "cuda fsdp: collectives not overlapped (${n:-none})"; }
  "$IBIN" inspect configs/tiny.yaml "${M[@]}" >"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err"; fail "inspect cuda fsdp failed"; }
  n=$(started)
  [ "${n:-0}" -ge 1 ] || { cat "$TMP/out"; fail "cuda fsdp: bucketed collectives not overlapped (${n:-none})"; }
  grep -qE "micro-batch program: .* [1-9][0-9]* collectives coalesced" "$TMP/out" || { cat "$TMP/out"; fail "cuda fsdp: no buckets"; }
  "$IBIN" inspect configs/tiny.yaml "${M[@]}" runtime.overlap_comm=false >"$TMP/out" 2>"$TMP/err" || { cat "$TMP/err"; fail "inspect cuda fsdp blocking failed"; }
  grep -q "micro-batch program: [0-9]* calls per run, 0 of them start/wait" "$TMP/out" || { cat "$TMP/out"; fail "cuda fsdp: overlap_comm=false still overlaps"; }
fi

if [ -n "${JDT_CUDA_BIN:-}" ]; then
  "$JDT_CUDA_BIN" train configs/tiny.yaml "${O[@]}" runtime.backend=cuda >"$TMP/out" 2>"$TMP/err"; rc=$?
  if nvidia-smi -L >/dev/null 2>&1; then
    [ $rc -eq 0 ] || { tail -5 "$TMP/err"; fail "CUDA build with a GPU: exit $rc"; }
    # bf16 compute on the GPU: trains, names its GEMM path once, the loss falls
    "$JDT_CUDA_BIN" train configs/tiny.yaml run.out_dir="$TMP/runs-bf16" run.steps=40 run.eval_every=0 \
      runtime.backend=cuda precision.compute=bf16 >"$TMP/out" 2>"$TMP/err"; rc=$?
    [ $rc -eq 0 ] || { tail -5 "$TMP/err"; fail "CUDA bf16 with a GPU: exit $rc"; }
    grep -q "precision.compute bf16: cuBLASLt" "$TMP/err" || { cat "$TMP/err"; fail "bf16 GEMM path not named"; }
    python3 - "$TMP/runs-bf16/tiny/metrics.jsonl" <<'PY' || fail "CUDA bf16: the loss did not fall"
import json, sys
l = [json.loads(x)["loss"] for x in open(sys.argv[1]) if '"loss"' in x]
print("CUDA bf16 tiny: loss %.4f -> %.4f" % (l[0], l[-1]))
sys.exit(0 if l[-1] < l[0] - 0.5 else 1)
PY
  else
    [ $rc -eq 1 ] || { cat "$TMP/err"; fail "CUDA build without a GPU: exit $rc, expected 1"; }
    [ "$(grep -c 'jdt-train: error' "$TMP/err")" -eq 1 ] || { cat "$TMP/err"; fail "expected one error line"; }
    grep -q "no usable GPU" "$TMP/err" || { cat "$TMP/err"; fail "the error does not say there is no GPU"; }
    echo "CUDA build without a GPU: $(grep 'jdt-train: error' "$TMP/err")"
  fi
fi
echo "ok"
