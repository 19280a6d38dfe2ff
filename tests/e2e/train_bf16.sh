#!/usr/bin/env bash
# train_bf16.sh — precision.compute: bf16 end to end on configs/tiny.yaml (issue 14): the GEMM
# path is named once, the loss falls and ends within 2% of the f32 run's; the compiled step
# matches the reference interpreter's bf16 semantics over the first steps; the portable path
# (what a CPU without AVX512-BF16 gets; forced here with JDT_BF16_NO_DNNL) warns once and
# gives the same losses; precision.activations: bf16's reads of bf16 logits, q, k and v change no
# loss and shrink the arena. The bf16 run asks for oneDNN (JDT_BF16_DNNL=1) even on CPUs where the
# portable path is the faster default (Intel's AVX512-BF16 without AMX).
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}
fail() { echo "FAIL: $*"; exit 1; }
export JDT_RUNTIME_CACHE_DIR="$TMP/cache"
run() { # name args... -> $TMP/name.err, metrics in $TMP/name/
  local name=$1; shift
  "$BIN" configs/tiny.yaml run.out_dir="$TMP/$name" checkpoint.every=0 run.eval_every=0 \
    run.log_every=1 "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" || { tail "$TMP/$name.err"; fail "$name: exit $?"; }
}
loss() { grep '"loss"' "$TMP/$1/tiny/metrics.jsonl" | sed -n "${2}p" | sed -E 's/.*"loss": ([0-9.e+-]+).*/\1/'; }
close() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t * (a < 0 ? -a : a)) }'; }

run f32 run.steps=40
JDT_BF16_DNNL=1 run bf16 run.steps=40 precision.compute=bf16 # oneDNN wherever it runs at all
[ "$(grep -c "precision.compute bf16" "$TMP/bf16.err")" -eq 1 ] || { cat "$TMP/bf16.err"; fail "GEMM path not named once"; }
f=$(loss f32 40); b=$(loss bf16 40); b1=$(loss bf16 1)
awk -v a="$b1" -v b="$b" 'BEGIN { exit !(b < a - 0.5) }' || fail "bf16 loss did not fall: $b1 -> $b"
close "$f" "$b" 0.02 || fail "bf16 final loss $b not within 2% of f32's $f"
echo "loss at step 40: f32 $f, bf16 $b"

run interp run.steps=3 precision.compute=bf16 runtime.jit=false
for s in 1 2 3; do
  close "$(loss bf16 $s)" "$(loss interp $s)" 1e-4 || fail "step $s: compiled bf16 $(loss bf16 $s) vs interpreter $(loss interp $s)"
done

# inspect shows the bf16 plan: values stored as bf16, and no GEMM operand converted at every
# call (the backward's cotangents are cast once, in the kernel that computes them)
"$BIN" inspect configs/tiny.yaml precision.compute=bf16 >"$TMP/inspect" 2>"$TMP/inspect.err" || { cat "$TMP/inspect.err"; fail "inspect bf16"; }
grep -qE "^  bf16 +[1-9][0-9]* values stored as bf16, 0 bf16 GEMM operands converted" "$TMP/inspect" ||
  { cat "$TMP/inspect"; fail "inspect bf16: no bf16 line, or operands converted per call"; }
# the same on a mesh (the backward is built on the partitioned graph): data x fsdp, tensor
for m in "mesh.data=2 mesh.fsdp=2" "mesh.data=1 mesh.tensor=2"; do
  # shellcheck disable=SC2086 # one override per word
  "$BIN" inspect configs/tiny.yaml precision.compute=bf16 $m >"$TMP/inspect" 2>"$TMP/inspect.err" || { cat "$TMP/inspect.err"; fail "inspect bf16 $m"; }
  grep -qE "^  bf16 +[1-9][0-9]* values stored as bf16, 0 bf16 GEMM operands converted" "$TMP/inspect" ||
    { grep "^  bf16" "$TMP/inspect"; fail "inspect bf16 $m: operands converted per call"; }
done
"$BIN" inspect configs/tiny.yaml >"$TMP/inspect32" 2>&1 || fail "inspect f32"
grep -q "values stored as bf16" "$TMP/inspect32" && fail "inspect f32 prints a bf16 line"

# precision.activations: bf16 on the CPU: the attention reads bf16 q, k, v and the cross-entropy
# bf16 logits (passes.c fold_bf16_casts) instead of their widened f32 copies: the same losses
# and gradient norms, digit for digit, as with the widening kept (JDT_*=0), and a smaller arena
run act16 run.steps=3 precision.compute=bf16 precision.activations=bf16
JDT_XENT_BF16_LOGITS=0 JDT_ATTENTION_BF16_QKV=0 run act16w run.steps=3 precision.compute=bf16 \
  precision.activations=bf16
diff <(grep -oE '"(loss|grad_norm)": [0-9.e+-]+' "$TMP/act16/tiny/metrics.jsonl") \
  <(grep -oE '"(loss|grad_norm)": [0-9.e+-]+' "$TMP/act16w/tiny/metrics.jsonl") ||
  fail "bf16 logits and q, k, v read in place change the losses"
arena() { JDT_XENT_BF16_LOGITS=$1 "$BIN" inspect configs/tiny.yaml precision.compute=bf16 \
  precision.activations=bf16 --compile 2>/dev/null | sed -nE 's/^ +activations +([0-9.]+) (K|M)iB.*/\1 \2/p' | head -1; }
a1=$(arena 1); a0=$(arena 0)
[ -n "$a1" ] && [ -n "$a0" ] || fail "inspect --compile printed no activations arena"
awk -v a="$a1" -v b="$a0" 'BEGIN { split(a, x, " "); split(b, y, " "); exit !(x[2] == y[2] && x[1] < y[1]) }' ||
  fail "bf16 logits read in place: arena $a1, not below $a0 with their f32 copy"

JDT_BF16_NO_DNNL=1 run portable run.steps=3 precision.compute=bf16
grep -qi "warn.*precision.compute bf16: .*bf16-rounded inputs" "$TMP/portable.err" || { cat "$TMP/portable.err"; fail "portable path not announced"; }
for s in 1 2 3; do
  close "$(loss bf16 $s)" "$(loss portable $s)" 1e-4 || fail "step $s: oneDNN $(loss bf16 $s) vs portable $(loss portable $s)"
done
echo ok
