#!/usr/bin/env bash
# cuda_emu.sh — the CUDA backend end to end without a GPU: build-cuda/jdt-train-emu is the CUDA
# build linked against the host CUDA emulator (tests/infra/cudaemu: runtime, NVRTC, cuBLASLt, cuDNN and
# NCCL stand-ins that run every kernel on the CPU). On emulated GPUs, configs/tiny.yaml with
# runtime.backend: cuda reproduces the CPU backend's losses: f32 (TF32 GEMMs), bf16 compute and
# bf16 activations (GEMMs storing bf16 outputs; also under tensor=2), cuDNN's attention through the
# emulator's cuDNN (GPT-2's and Llama's layers, grouped-query attention with and without biases, and under tensor=2;
# by trial against our kernels, the default, where a cuDNN planted 10% off is refused),
# GEMM autotuning with its picks remembered (the default), bf16 under runtime.remat: block and
# dots (and dots' planned memory for GPT-2) on one GPU, fsdp=2 and tensor=2 on two processes of one emulated GPU each (NCCL through shared
# memory) and data=2 x fsdp=2 on four, FSDP's bucketed gathers and reduce-scatters bit for bit
# those of one call per tensor and of blocking collectives; a run resumed from a checkpoint written from device memory continues the uninterrupted
# run's losses exactly; a step that does not fit the GPU's memory is one clear line, exit 1.
# `make test` builds build-cuda/jdt-train-emu first wherever CUDA's headers are installed.
# Not exclusive: no step here races a clock (the dead-peer checks are check_cuk's), and its
# single-process runs leave a core to the pool.
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}; ROOT=${JDT_ROOT:?}
EMU=${JDT_CUDA_EMU_BIN:-$ROOT/build-cuda/jdt-train-emu}
fail() { echo "FAIL: $*"; exit 1; }
if [ ! -x "$EMU" ]; then # make test builds it wherever CUDA's headers are installed
  echo "SKIP: no $EMU (make CUDA=1 build-cuda/jdt-train-emu; needs the CUDA toolkit's headers)"
  exit 77
fi
cd "$ROOT" || exit 1
export JDT_RUNTIME_CACHE_DIR="$TMP/cache" JDT_CUDAEMU_DEVICES=4
C=(configs/tiny.yaml run.steps=6 run.eval_every=0 runtime.threads=1 checkpoint.every=0)
# jdt-train's attention kernels unless a run asks for cuDNN's: the default, auto, tries cuDNN
# (here the emulator's) against them and keeps the faster by the clock (its own block below)
export JDT_CUDNN_ATTENTION=0
# GEMMs on cuBLASLt's heuristic's first algorithm unless a run asks otherwise: the default times
# each plan's candidates at its first call (the emulator's compute the same; its own block below)
export JDT_CUDA_AUTOTUNE=0

losses() { grep -o '"loss": [0-9.e+-]*' "$1" | awk '{print $2}'; }
compare() { # $1 reference metrics, $2 metrics, $3 label, $4 relative tolerance
  losses "$1" > "$TMP/a"; losses "$2" > "$TMP/b"
  paste "$TMP/a" "$TMP/b" | awk -v l="$3" -v t="$4" '{ d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > m) m = r }
    END { printf "%-36s max relative loss difference %.2g over %d steps\n", l, m, NR; exit !(m <= t && NR == 6) }'
}
run() { # $1 binary, $2 out dir, rest: overrides (and --nproc N first)
  local b=$1 out=$2; shift 2
  "$b" "$@" run.out_dir="$out" >"$TMP/out" 2>"$TMP/err" || { tail -n 5 "$TMP/err"; fail "$b $*"; }
}

run "$BIN" "$TMP/cpu" "${C[@]}"
run "$BIN" "$TMP/cpu16" "${C[@]}" precision.compute=bf16

# ahead of time (inspect --cuda-arch, docs/backend.md): the step's kernels and the builtins it
# launches compiled into the cache with no GPU opened; the run on the (emulated) sm_90 GPU then
# finds every entry it needs and compiles nothing: the keys are the run's
"$EMU" inspect "${C[@]}" runtime.backend=cuda --cuda-arch sm_90 >"$TMP/aot" 2>&1 || { cat "$TMP/aot"; fail "inspect --cuda-arch sm_90"; }
grep -q "cache miss" "$TMP/aot" || { cat "$TMP/aot"; fail "inspect --cuda-arch did not compile the step"; }
grep -qE "builtin kernel sources: [1-9] compiled" "$TMP/aot" || { cat "$TMP/aot"; fail "inspect --cuda-arch did not compile the builtins"; }
ls "$TMP/cache" | grep -v '\.lock$' > "$TMP/aot.before"
run "$EMU" "$TMP/gpu" "${C[@]}" runtime.backend=cuda
grep -q "cudaemu (host emulation)" "$TMP/out" "$TMP/err" || fail "the device is not the emulator"
ls "$TMP/cache" | grep -v '\.lock$' > "$TMP/aot.after"
grep -q "compiling the builtin" "$TMP/err" && { cat "$TMP/err"; fail "the run compiled builtins inspect --cuda-arch had compiled"; }
cmp -s "$TMP/aot.before" "$TMP/aot.after" || { diff "$TMP/aot.before" "$TMP/aot.after"; fail "the run compiled what inspect --cuda-arch had compiled"; }
echo "inspect --cuda-arch sm_90: $(grep -o 'builtin kernel sources: [0-9]* compiled' "$TMP/aot"), $(wc -l < "$TMP/aot.before") cache entries; the run on the emulated sm_90 GPU compiled nothing"
# TF32 GEMMs (10-bit mantissa) against f32: seen 1e-6 on these sizes
compare "$TMP/cpu/tiny/metrics.jsonl" "$TMP/gpu/tiny/metrics.jsonl" "emulated GPU, f32 (TF32)" 1e-4 ||
  fail "f32 losses differ"
# the eval program runs in the train step's arena (docs/backend.md) between steps, and dlogits
# overwrite the dying logits (the device's xent_inplace): evaluating every 2 steps leaves the
# train losses bit for bit those of the run without eval, and the val losses are the CPU's
run "$BIN" "$TMP/cpue" "${C[@]}" run.eval_every=2
run "$EMU" "$TMP/gpue" "${C[@]}" run.eval_every=2 runtime.backend=cuda
"$EMU" inspect "${C[@]}" run.eval_every=2 runtime.backend=cuda >"$TMP/insp" 2>&1 || { cat "$TMP/insp"; fail "inspect, eval"; }
grep -q "arena of the eval program, inside the arena above" "$TMP/insp" || { cat "$TMP/insp"; fail "the eval program has an arena of its own on CUDA"; }
grep -q "1 dlogits written over their logits" "$TMP/insp" || { cat "$TMP/insp"; fail "dlogits not planned over the logits"; }
losses "$TMP/gpu/tiny/metrics.jsonl" > "$TMP/a"; losses "$TMP/gpue/tiny/metrics.jsonl" > "$TMP/b"
cmp -s "$TMP/a" "$TMP/b" && [ "$(wc -l < "$TMP/a")" -eq 6 ] || { paste "$TMP/a" "$TMP/b"; fail "eval between steps changed the GPU's train losses"; }
vals() { grep -o '"val_loss": [0-9.e+-]*' "$1" | awk '{print $2}'; }
vals "$TMP/cpue/tiny/metrics.jsonl" > "$TMP/a"; vals "$TMP/gpue/tiny/metrics.jsonl" > "$TMP/b"
paste "$TMP/a" "$TMP/b" | awk '{ d = $1 - $2; if (d < 0) d = -d; r = d / $1; if (r > m) m = r }
  END { printf "eval in the train arena (emulated GPU) max relative val loss difference %.2g over %d evals\n", m, NR; exit !(m <= 1e-4 && NR == 3) }' ||
  fail "the GPU's val losses differ from the CPU's"
run "$EMU" "$TMP/gpu16" "${C[@]}" runtime.backend=cuda precision.compute=bf16
grep -q "precision.compute bf16: cuBLASLt" "$TMP/err" || { cat "$TMP/err"; fail "bf16 GEMM path not named"; }
# the same rounding points but the attention forward's (docs/backend.md): seen 1e-5
compare "$TMP/cpu16/tiny/metrics.jsonl" "$TMP/gpu16/tiny/metrics.jsonl" "emulated GPU, bf16" 1e-3 ||
  fail "bf16 losses differ"
# block rematerialisation (gpt2-124m.yaml's default): the backward's recomputed attention
# forwards are the ones that store the log-sum-exp (passes.c fold_attention_lse); the CPU
# reference does not recompute (the same values): seen 1.2e-5
# (with JDT_CUDNN_ATTENTION=1, which f32 activations leave unasked: said once per direction)
JDT_CUDNN_ATTENTION=1 run "$EMU" "$TMP/gpu16r" "${C[@]}" runtime.backend=cuda precision.compute=bf16 runtime.remat=block
compare "$TMP/cpu16/tiny/metrics.jsonl" "$TMP/gpu16r/tiny/metrics.jsonl" "emulated GPU, bf16, remat block" 1e-3 ||
  fail "bf16 losses differ under runtime.remat=block"
[ "$(grep -c "cuDNN attention .* not asked, jdt-train's kernels run it" "$TMP/err")" -eq 2 ] ||
  { cat "$TMP/err"; fail "JDT_CUDNN_ATTENTION=1 with f32 activations: not said once per direction why cuDNN is not asked"; }
# the elementwise kernels' vector form (4 elements per thread, float4 / bf16 x 4 accesses) computes
# every element as the scalar form does: the same losses to the last digit
JDT_CUDA_VEC=0 run "$EMU" "$TMP/gpu16s" "${C[@]}" runtime.backend=cuda precision.compute=bf16
losses "$TMP/gpu16/tiny/metrics.jsonl" > "$TMP/a"; losses "$TMP/gpu16s/tiny/metrics.jsonl" > "$TMP/b"
[ "$(wc -l < "$TMP/a")" -eq 6 ] && cmp -s "$TMP/a" "$TMP/b" || { paste "$TMP/a" "$TMP/b"; fail "JDT_CUDA_VEC=0 changed the losses"; }
echo "emulated GPU, bf16: scalar elementwise kernels (JDT_CUDA_VEC=0) give the vector kernels' losses exactly"

# C = 128: the layer norms' backwards take the warp-per-row kernels (cuk.c norm_part_launch: C a
# multiple of 128), against the CPU and against the block-per-row ones (JDT_NORM_WARPS=0: the
# same terms, their column sums in another order)
W=(model.n_embd=128 model.n_head=2)
run "$BIN" "$TMP/cpu16w" "${C[@]}" "${W[@]}" precision.compute=bf16
run "$EMU" "$TMP/gpu16w" "${C[@]}" "${W[@]}" runtime.backend=cuda precision.compute=bf16
compare "$TMP/cpu16w/tiny/metrics.jsonl" "$TMP/gpu16w/tiny/metrics.jsonl" "emulated GPU, bf16, C=128" 1e-3 ||
  fail "bf16 losses differ at C=128 (the warp-per-row norm backwards)"
# the sums' order moves an f32 value by an ulp here and there, and the bf16 copy of dx then
# rounds it to a neighbouring bf16 now and then: seen 1.9e-5 between the two
JDT_NORM_WARPS=0 run "$EMU" "$TMP/gpu16wb" "${C[@]}" "${W[@]}" runtime.backend=cuda precision.compute=bf16
compare "$TMP/cpu16w/tiny/metrics.jsonl" "$TMP/gpu16wb/tiny/metrics.jsonl" "  blocks (JDT_NORM_WARPS=0), C=128" 1e-3 ||
  fail "bf16 losses differ at C=128 (the block-per-row norm backwards)"
compare "$TMP/gpu16wb/tiny/metrics.jsonl" "$TMP/gpu16w/tiny/metrics.jsonl" "  warps against blocks" 2e-4 ||
  fail "the warp-per-row norm backwards moved the losses"

# precision.activations: bf16: the GEMMs store the linear layers' and the head's outputs as
# bf16 (the bias bf16 in the epilogue) and the cross-entropy reads the bf16 logits (compiler:
# fold_bf16_casts); the CPU computes the same roundings in fused kernels. Seen 2e-5. Then under
# tensor=2, where the row-parallel GEMMs' partial sums are all-reduced in f32 before the cast
run "$BIN" "$TMP/cpu16a" "${C[@]}" precision.compute=bf16 precision.activations=bf16
run "$EMU" "$TMP/gpu16a" "${C[@]}" runtime.backend=cuda precision.compute=bf16 precision.activations=bf16 \
  --profile run.profile_steps=2
grep -q "bf16 outputs of the linear layers" "$TMP/err" || { cat "$TMP/err"; fail "bf16 activations not named"; }
# the profile (steps 2-3, the warm-up left out) names the MLP's dgelu GEMM with its bias
# gradient's column sums, whose time its row then holds
grep -q "profile of the compiled step, steps 2-3" "$TMP/err" && grep -q " dgelu +colsum" "$TMP/err" ||
  { grep -A30 "profile of" "$TMP/err"; fail "the profile's steps or its dgelu +colsum row"; }
compare "$TMP/cpu16a/tiny/metrics.jsonl" "$TMP/gpu16a/tiny/metrics.jsonl" "emulated GPU, bf16 activations" 1e-3 ||
  fail "bf16 activations losses differ"
# JDT_CUDNN_ATTENTION=1 where cuDNN cannot serve (here no library where JDT_CUDNN_LIBRARY
# points): one info line, then jdt-train's attention kernels, so exactly the same losses
JDT_CUDNN_LIBRARY=$TMP/no/libcudnn.so.9 JDT_CUDNN_ATTENTION=1 run "$EMU" "$TMP/gpu16d" "${C[@]}" \
  runtime.backend=cuda precision.compute=bf16 precision.activations=bf16
grep -q "cuDNN attention unavailable, using jdt-train's kernels" "$TMP/err" ||
  { cat "$TMP/err"; fail "JDT_CUDNN_ATTENTION=1 without a usable cuDNN not said"; }
cmp -s <(losses "$TMP/gpu16a/tiny/metrics.jsonl") <(losses "$TMP/gpu16d/tiny/metrics.jsonl") ||
  fail "JDT_CUDNN_ATTENTION=1's fallback changed the losses"
echo "emulated GPU, bf16 activations: JDT_CUDNN_ATTENTION=1 without a usable cuDNN falls back, the same losses"
# ... and where it serves: the emulator's cuDNN (tests/infra/cudaemu/cudnnemu.c) runs the graphs
# cuk_cudnn.c builds, forward and backward, through the training step's own buffers; its
# arithmetic is not the tensor-core kernels' (f32 probabilities, sums in double): seen 1.3e-5
JDT_CUDNN_ATTENTION=1 run "$EMU" "$TMP/gpu16n" "${C[@]}" runtime.backend=cuda precision.compute=bf16 \
  precision.activations=bf16
grep -q "cuDNN attention forward B=.*: engine" "$TMP/err" && grep -q "cuDNN attention backward B=.*: engine" "$TMP/err" ||
  { cat "$TMP/err"; fail "JDT_CUDNN_ATTENTION=1 with the emulator's cuDNN: no plan built"; }
grep -qE "declined|failed to run" "$TMP/err" && { cat "$TMP/err"; fail "JDT_CUDNN_ATTENTION=1: cuDNN declined a call"; }
compare "$TMP/gpu16a/tiny/metrics.jsonl" "$TMP/gpu16n/tiny/metrics.jsonl" "emulated GPU, bf16, cuDNN attention" 1e-3 ||
  fail "JDT_CUDNN_ATTENTION=1 (cuDNN serving) changed the losses beyond bf16's reach"
# JDT_CUDNN_ATTENTION=auto, the product's default (cuk_cudnn.c jdt_cuk_dnn_attention_auto):
# each direction is tried once against jdt-train's kernels, one verdict line each, whichever the
# emulator's clock keeps; then with the emulator's cuDNN planted 10% off (JDT_CUDNNEMU_PERTURB),
# one warning per direction and jdt-train's kernels at every step: the losses of
# JDT_CUDNN_ATTENTION=0 bit for bit
JDT_CUDNN_ATTENTION=auto run "$EMU" "$TMP/gpu16t" "${C[@]}" runtime.backend=cuda precision.compute=bf16 \
  precision.activations=bf16
[ "$(grep -cE "cuda: attention (forward|backward) B=.*outputs agree" "$TMP/err")" = 2 ] ||
  { cat "$TMP/err"; fail "JDT_CUDNN_ATTENTION=auto: not one verdict per direction"; }
compare "$TMP/gpu16a/tiny/metrics.jsonl" "$TMP/gpu16t/tiny/metrics.jsonl" "emulated GPU, bf16, attention by trial" 1e-3 ||
  fail "JDT_CUDNN_ATTENTION=auto changed the losses beyond bf16's reach"
# the verdicts are remembered in the kernel cache: a second run takes them, untried, and its
# losses are the first run's bit for bit (the trial's step ran the kept implementation's values)
JDT_CUDNN_ATTENTION=auto run "$EMU" "$TMP/gpu16t2" "${C[@]}" runtime.backend=cuda precision.compute=bf16 \
  precision.activations=bf16
[ "$(grep -c "as tried before on this GPU" "$TMP/err")" = 2 ] && ! grep -q "outputs agree" "$TMP/err" ||
  { cat "$TMP/err"; fail "JDT_CUDNN_ATTENTION=auto: the second run did not take the remembered verdicts"; }
cmp -s <(losses "$TMP/gpu16t/tiny/metrics.jsonl") <(losses "$TMP/gpu16t2/tiny/metrics.jsonl") ||
  fail "JDT_CUDNN_ATTENTION=auto: the remembered verdicts gave other losses"
rm -f "$TMP"/cache/*.attpick # forgotten: the next run tries again
JDT_CUDNNEMU_PERTURB=0.1 JDT_CUDNN_ATTENTION=auto run "$EMU" "$TMP/gpu16p" "${C[@]}" runtime.backend=cuda \
  precision.compute=bf16 precision.activations=bf16
[ "$(grep -c "cuDNN's outputs differ from jdt-train's kernels" "$TMP/err")" = 2 ] ||
  { cat "$TMP/err"; fail "JDT_CUDNN_ATTENTION=auto with a cuDNN 10% off: not one warning per direction"; }
cmp -s <(losses "$TMP/gpu16a/tiny/metrics.jsonl") <(losses "$TMP/gpu16p/tiny/metrics.jsonl") ||
  fail "JDT_CUDNN_ATTENTION=auto kept a cuDNN 10% off: the losses are not JDT_CUDNN_ATTENTION=0's"
# a disagreement is not remembered (the next run tries again)
compgen -G "$TMP/cache/*.attpick" >/dev/null && fail "JDT_CUDNN_ATTENTION=auto remembered a disagreement"
echo "emulated GPU, bf16: JDT_CUDNN_ATTENTION=auto tries each direction once, a second run takes the remembered verdicts (the same losses); a cuDNN planted 10% off is refused, the losses of our kernels bit for bit, and not remembered"
# JDT_CUDA_AUTOTUNE=auto, the product's default (cuk_gemm.c): each GEMM plan times the
# emulator's 4 algorithms once at its first call that can run twice, the first made 2 ms slower
# (JDT_CUDAEMU_SLOW_ALGO=0) so that every timed plan leaves it, one line each, and its pick is
# remembered in the kernel cache; a second run times nothing and says once that it takes the
# picks. The emulator's algorithms compute the same: both runs' losses are those of
# JDT_CUDA_AUTOTUNE=0 bit for bit.
JDT_CUDAEMU_SLOW_ALGO=0 JDT_CUDA_AUTOTUNE=auto run "$EMU" "$TMP/gpu16g" "${C[@]}" runtime.backend=cuda \
  precision.compute=bf16 precision.activations=bf16
tuned=$(grep -c "cuBLASLt algorithm [0-9]* of [0-9]*," "$TMP/err")
picks=$(ls "$TMP"/cache/*.gemmpick 2>/dev/null | wc -l)
[ "$tuned" -ge 4 ] && [ "$picks" = "$tuned" ] ||
  { cat "$TMP/err"; fail "JDT_CUDA_AUTOTUNE=auto: $tuned plans left the slow first algorithm, $picks picks remembered"; }
cmp -s <(losses "$TMP/gpu16a/tiny/metrics.jsonl") <(losses "$TMP/gpu16g/tiny/metrics.jsonl") ||
  fail "JDT_CUDA_AUTOTUNE=auto: other losses than the untimed run's"
JDT_CUDAEMU_SLOW_ALGO=0 JDT_CUDA_AUTOTUNE=auto run "$EMU" "$TMP/gpu16g2" "${C[@]}" runtime.backend=cuda \
  precision.compute=bf16 precision.activations=bf16
[ "$(grep -c "GEMMs take the cuBLASLt algorithms timed before" "$TMP/err")" = 1 ] &&
  ! grep -q "cuBLASLt algorithm [0-9]* of [0-9]*," "$TMP/err" ||
  { cat "$TMP/err"; fail "JDT_CUDA_AUTOTUNE=auto: the second run did not take the remembered picks"; }
cmp -s <(losses "$TMP/gpu16a/tiny/metrics.jsonl") <(losses "$TMP/gpu16g2/tiny/metrics.jsonl") ||
  fail "JDT_CUDA_AUTOTUNE=auto: the remembered picks gave other losses"
echo "emulated GPU, bf16: JDT_CUDA_AUTOTUNE=auto times $tuned GEMM plans once and remembers each pick; a second run times none and takes them; both runs' losses those of =0 bit for bit"
# runtime.remat: dots (docs/autodiff.md): the blocks' GEMMs and attentions kept, the norms,
# activations and residual adds recomputed before each block's backward. With bf16 activations
# the forward differs from remat none's where a kept GEMM's output has a second, recomputed
# reader, so a fold into the GEMM (the GELU epilogue, a residual add) is not taken: bf16
# roundings, seen 1.6e-5.
# GPT-2 at check.sh's B 32, planned without a GPU: the train arena at most 0.8 of none's.
run "$EMU" "$TMP/gpu16dots" "${C[@]}" runtime.backend=cuda precision.compute=bf16 \
  precision.activations=bf16 runtime.remat=dots
compare "$TMP/gpu16a/tiny/metrics.jsonl" "$TMP/gpu16dots/tiny/metrics.jsonl" "emulated GPU, bf16, remat dots" 1e-4 ||
  fail "bf16 losses differ under runtime.remat=dots"
G2=(configs/gpt2-124m.yaml model.vocab_size=50257 data.format=synthetic data.batch_size=32 data.micro_batch_size=32
  mesh.data=1 mesh.fsdp=1 precision.compute=bf16 precision.activations=bf16 runtime.backend=cuda)
for r in none dots; do
  "$EMU" inspect "${G2[@]}" runtime.remat=$r >"$TMP/insp-$r" 2>&1 || { cat "$TMP/insp-$r"; fail "inspect gpt2 runtime.remat=$r"; }
done
arena() { sed -nE 's/^ *activations +([0-9.]+) GiB +arena of the train-step program.*/\1/p' "$1"; }
a_none=$(arena "$TMP/insp-none"); a_dots=$(arena "$TMP/insp-dots")
awk -v a="$a_none" -v b="$a_dots" 'BEGIN { exit !(a > 0 && b > 0 && b <= 0.8 * a) }' ||
  { cat "$TMP/insp-none" "$TMP/insp-dots"; fail "runtime.remat=dots: GPT-2's train arena $a_dots GiB against $a_none without remat"; }
echo "GPT-2 B=32 on CUDA, planned: train arena $a_none GiB without remat, $a_dots GiB with runtime.remat: dots"
# Llama's layer (RMSNorm, RoPE, SwiGLU, no biases) on the emulated GPU against the CPU, then
# with cuDNN's attention: without biases the attention backward forms no partial sums (passes.c
# fold_attention_cotangents), so cuDNN serves the backward too, RoPE's backward applied to its
# dq and dk after it: seen 2.2e-5 and 1.2e-5
L=(model.norm=rmsnorm model.pos=rope model.activation=swiglu model.bias=false precision.compute=bf16 precision.activations=bf16)
# vs_cpu_and_cudnn TAG LABEL WHAT overrides...: the CPU's losses ($TMP/cpu16TAG), the emulated
# GPU's with jdt-train's kernels, then with cuDNN's attention serving both directions (its
# log's "B=WHAT: engine" lines), each within bf16's bound of the CPU's
vs_cpu_and_cudnn() {
  local t=$1 l=$2 w=$3; shift 3
  run "$BIN" "$TMP/cpu16$t" "${C[@]}" "$@"
  run "$EMU" "$TMP/gpu16$t" "${C[@]}" "$@" runtime.backend=cuda
  compare "$TMP/cpu16$t/tiny/metrics.jsonl" "$TMP/gpu16$t/tiny/metrics.jsonl" "emulated GPU, $l" 1e-3 ||
    fail "$l: the GPU's losses differ from the CPU's"
  JDT_CUDNN_ATTENTION=1 run "$EMU" "$TMP/gpu16${t}n" "${C[@]}" "$@" runtime.backend=cuda
  grep -q "cuDNN attention forward B=$w: engine" "$TMP/err" && grep -q "cuDNN attention backward B=$w: engine" "$TMP/err" ||
    { cat "$TMP/err"; fail "$l with JDT_CUDNN_ATTENTION=1: cuDNN did not serve both directions"; }
  compare "$TMP/cpu16$t/tiny/metrics.jsonl" "$TMP/gpu16${t}n/tiny/metrics.jsonl" "emulated GPU, $l, cuDNN" 1e-3 ||
    fail "$l with cuDNN's attention: the losses differ from the CPU's"
}
vs_cpu_and_cudnn l "Llama's layer" ".*" "${L[@]}"
# grouped-query attention (2 key/value heads for 4 query heads; models.c repeats each for its
# group by a broadcast, and sums dk and dv over it): the attention kernels take the group
# themselves (passes.c fold_attention_groups, cuk.h JDT_CUK_ATT_GROUP), so the step has no
# broadcast or sum kernels and the backward writes the projections' copies (RoPE's on dk); then
# with cuDNN's attention, whose graphs read k and v with fewer heads and sum dk and dv over each
# group (cuk_cudnn.c), both directions; then tensor=2 with cuDNN (one key/value head and its
# two query heads a rank): seen 2.7e-5, 2.1e-5 and 1.6e-5
G=("${L[@]}" model.n_kv_head=2)
"$EMU" inspect "${C[@]}" "${G[@]}" runtime.backend=cuda >"$TMP/insp" 2>&1 || { cat "$TMP/insp"; fail "inspect, grouped-query attention"; }
grep -q "4 attentions (forward or backward) read grouped-query k and v unrepeated; 2 attention backwards store the projections' copies of dq, dk, dv (4 of them rotated" "$TMP/insp" ||
  { cat "$TMP/insp"; fail "grouped-query attention: k and v repeated, or no cotangent copies"; }
vs_cpu_and_cudnn q "grouped-query attention" "4 H=4 .*" "${G[@]}"
JDT_CUDNN_ATTENTION=1 run "$EMU" "$TMP/tp16q" --nproc 2 "${C[@]}" "${G[@]}" runtime.backend=cuda mesh.tensor=2
[ "$(grep -c "cuDNN attention .*ward B=4 H=2 .*: engine" "$TMP/err")" -eq 4 ] ||
  { cat "$TMP/err"; fail "grouped-query attention, tensor=2 with JDT_CUDNN_ATTENTION=1: not both directions on both ranks"; }
compare "$TMP/cpu16q/tiny/metrics.jsonl" "$TMP/tp16q/tiny/metrics.jsonl" "2 emulated GPUs, tensor=2, grouped-query, cuDNN" 1e-3 ||
  fail "grouped-query attention, tensor=2: losses differ"
# and with biases on q, k and v before the RoPE (Qwen2's attention, in GPT-2's layer): the
# backward's partial sums of dk and dv have the key/value heads' columns (passes.c
# sum_partials), those of dq and dk are of the rotated values, whose bf16 copies the kernels
# store (passes.c rotated_sums), formed by our kernels and, under cuDNN, from its bf16 copies
# after their rotation (cuk_cudnn.c), which serves this backward since: seen 8.4e-6 and 1.2e-5
GB=(precision.compute=bf16 precision.activations=bf16 model.n_kv_head=2 model.pos=rope)
"$EMU" inspect "${C[@]}" "${GB[@]}" runtime.backend=cuda >"$TMP/insp" 2>&1 || { cat "$TMP/insp"; fail "inspect, grouped-query attention with biases"; }
grep -q "read grouped-query k and v unrepeated; 2 attention backwards store the projections' copies of dq, dk, dv (4 of them rotated: RoPE's backward, their bias partials summed rotated)" "$TMP/insp" ||
  { cat "$TMP/insp"; fail "grouped-query attention with biases and RoPE: no cotangent copies, or the q, k bias sums not in the kernels"; }
vs_cpu_and_cudnn b "grouped-query attention with biases" "4 H=4 .*" "${GB[@]}"
# the MLP's GELU and its backward by GEMMs (cuBLASLt's GELU_AUX_BIAS and DGELU_BGRAD, compiler:
# fold_gelu_epilogues, fold_dgelu_epilogues); where cuBLASLt refuses them, each GEMM and then a
# kernel (the backward's bias gradient: a column-sum kernel), said once at info level
JDT_CUDAEMU_NO_GELU_EPILOGUE=1 run "$EMU" "$TMP/gpu16g" "${C[@]}" runtime.backend=cuda precision.compute=bf16 precision.activations=bf16
grep -q "no cuBLASLt GELU epilogue" "$TMP/err" && grep -q "no cuBLASLt DGELU epilogue" "$TMP/err" &&
  grep -q "no cuBLASLt DGELU_BGRAD epilogue" "$TMP/err" ||
  { cat "$TMP/err"; fail "the GELU epilogues' fallbacks not named"; }
compare "$TMP/cpu16a/tiny/metrics.jsonl" "$TMP/gpu16g/tiny/metrics.jsonl" "emulated GPU, bf16 act., GEMM then GELU" 1e-3 ||
  fail "GELU fallback losses differ"
# padded rows (compiler: fuse.c mark_pitched_rows): a vocabulary of 250 (500-byte bf16 rows,
# not a multiple of 16) stores the logits and dlogits with rows of 256 for cuBLASLt's aligned
# kernels (and the cross-entropy's 4-value loads); the losses are those of rows back to back
# (JDT_GEMM_PITCH=0: one value per load, so another summation order; seen 1.2e-5) and the
# CPU's within bf16's bound
V250=("${C[@]}" precision.compute=bf16 precision.activations=bf16 model.vocab_size=250)
"$EMU" inspect "${V250[@]}" runtime.backend=cuda >"$TMP/insp" 2>&1 || { cat "$TMP/insp"; fail "inspect, vocabulary 250"; }
grep -q "2 GEMM operands with rows padded" "$TMP/insp" || { cat "$TMP/insp"; fail "vocabulary 250: logits and dlogits not padded"; }
run "$BIN" "$TMP/cpuv" "${V250[@]}"
run "$EMU" "$TMP/gpuv" "${V250[@]}" runtime.backend=cuda
JDT_GEMM_PITCH=0 run "$EMU" "$TMP/gpuv0" "${V250[@]}" runtime.backend=cuda
compare "$TMP/gpuv0/tiny/metrics.jsonl" "$TMP/gpuv/tiny/metrics.jsonl" "emulated GPU, V=250, padded vs dense" 1e-4 ||
  fail "padded rows changed the losses"
compare "$TMP/cpuv/tiny/metrics.jsonl" "$TMP/gpuv/tiny/metrics.jsonl" "emulated GPU, V=250, padded rows" 1e-3 ||
  fail "vocabulary 250 losses differ"
run "$EMU" "$TMP/tp16a" --nproc 2 "${C[@]}" runtime.backend=cuda precision.compute=bf16 precision.activations=bf16 mesh.tensor=2
compare "$TMP/cpu16a/tiny/metrics.jsonl" "$TMP/tp16a/tiny/metrics.jsonl" "2 emulated GPUs, tensor=2, bf16 act." 1e-3 ||
  fail "bf16 activations tensor=2 losses differ"
# ... with cuDNN's attention on each rank's heads (its work queued on the compute stream beside
# NCCL's on its own): seen 1.6e-5
JDT_CUDNN_ATTENTION=1 run "$EMU" "$TMP/tp16n" --nproc 2 "${C[@]}" runtime.backend=cuda precision.compute=bf16 precision.activations=bf16 mesh.tensor=2
[ "$(grep -c "cuDNN attention .*ward B=.*: engine" "$TMP/err")" -eq 4 ] ||
  { cat "$TMP/err"; fail "tensor=2 with JDT_CUDNN_ATTENTION=1: not both directions on both ranks"; }
compare "$TMP/cpu16a/tiny/metrics.jsonl" "$TMP/tp16n/tiny/metrics.jsonl" "2 emulated GPUs, tensor=2, cuDNN" 1e-3 ||
  fail "tensor=2 with cuDNN's attention: losses differ"

# data x fsdp: two communicators per process (the data group's all-reduce, the fsdp group's
# gathers and reduce-scatters) on one NCCL stream
for mesh in "2 mesh.fsdp=2" "2 mesh.tensor=2" "4 mesh.data=2 mesh.fsdp=2"; do
  read -r np axes <<<"$mesh"
  tag=${axes// /+}
  # ahead of time for the mesh (inspect plans rank 0; SPMD: every rank's program is the same
  # source), then no rank of the run compiles
  # shellcheck disable=SC2086 # axes: one override per word
  "$EMU" inspect "${C[@]}" runtime.backend=cuda $axes dist.world_size="$np" --cuda-arch sm_90 >"$TMP/aot" 2>&1 ||
    { cat "$TMP/aot"; fail "inspect --cuda-arch sm_90 $axes"; }
  ls "$TMP/cache" | grep -v '\.lock$' > "$TMP/aot.before"
  # shellcheck disable=SC2086 # axes: one override per word
  run "$EMU" "$TMP/$tag" --nproc "$np" "${C[@]}" runtime.backend=cuda $axes
  ls "$TMP/cache" | grep -v '\.lock$' > "$TMP/aot.after"
  cmp -s "$TMP/aot.before" "$TMP/aot.after" || { diff "$TMP/aot.before" "$TMP/aot.after"; fail "$axes: a rank compiled what inspect --cuda-arch had compiled"; }
  compare "$TMP/cpu/tiny/metrics.jsonl" "$TMP/$tag/tiny/metrics.jsonl" "$np emulated GPUs, $axes" 1e-4 ||
    fail "$axes losses differ"
done

# bf16 compute under FSDP on 2 emulated GPUs: bf16 weight gathers, the backward's cotangent
# casts built on the partitioned graph, against the one-process CPU bf16 run
run "$EMU" "$TMP/fsdp16" --nproc 2 "${C[@]}" runtime.backend=cuda precision.compute=bf16 mesh.fsdp=2
compare "$TMP/cpu16/tiny/metrics.jsonl" "$TMP/fsdp16/tiny/metrics.jsonl" "2 emulated GPUs, mesh.fsdp=2, bf16" 1e-3 ||
  fail "bf16 fsdp=2 losses differ"
# and bf16 activations under FSDP: the gathered biases (their all-gathers and casts come after
# the GEMMs in node order; compiler: fold_bias_adds moves them ahead) and the residual stream
# (fold_residual_gemms) added by the GEMMs on gathered weights: 4 residual adds; the q, k and v
# projections' dX summed by ln1's backward from their bf16 products (fold_norm_dy_terms), 2
run "$EMU" "$TMP/fsdp16a" --nproc 2 "${C[@]}" runtime.backend=cuda precision.compute=bf16 precision.activations=bf16 mesh.fsdp=2
compare "$TMP/cpu16a/tiny/metrics.jsonl" "$TMP/fsdp16a/tiny/metrics.jsonl" "2 emulated GPUs, mesh.fsdp=2, bf16 act." 1e-3 ||
  fail "bf16 activations fsdp=2 losses differ"
"$EMU" inspect "${C[@]}" runtime.backend=cuda precision.compute=bf16 precision.activations=bf16 mesh.fsdp=2 dist.world_size=2 >"$TMP/insp" 2>&1 &&
  grep -q "4 adds done by the GEMMs computing an operand (4 residual adds of unrounded bf16 branch outputs)" "$TMP/insp" &&
  grep -q "2 norm backwards sum dy from several GEMMs' bf16 products" "$TMP/insp" ||
  { cat "$TMP/insp"; fail "fsdp=2: the biases and residual adds are not in the GEMMs, or ln1's dy not from bf16 terms"; }

# odd sizes (C = 66: a 66-float norm weight puts the next gradient's slot of the data
# all-reduce's bucket 8 bytes past a 16-byte boundary): the elementwise kernels read such a
# slot one element per thread, not as float4 (a misaligned vector access: a fault on a GPU, a
# trap on the emulator)
O=(model.n_embd=66 model.n_head=2)
run "$BIN" "$TMP/cpu66" "${C[@]}" "${O[@]}"
run "$EMU" "$TMP/gpu66" --nproc 2 "${C[@]}" "${O[@]}" runtime.backend=cuda mesh.data=2
compare "$TMP/cpu66/tiny/metrics.jsonl" "$TMP/gpu66/tiny/metrics.jsonl" "2 emulated GPUs, mesh.data=2, C=66" 1e-4 ||
  fail "C=66 data=2 losses differ"

# FSDP's gathers and reduce-scatters are bucketed on CUDA as on the CPU (segmented wire buffers,
# docs/backend.md): the CUDA step issues the CPU step's calls, and its losses equal those of
# one call per tensor (runtime.bucket_mb=0) bit for bit (the same sums, other packing)
plan() { "$1" inspect "${C[@]}" mesh.fsdp=2 runtime.backend="$2" | grep "issued by"; }
plan "$BIN" cpu > "$TMP/plan.cpu"; plan "$EMU" cuda > "$TMP/plan.cuda"
grep -q "coalesced into buckets" "$TMP/plan.cpu" || { cat "$TMP/plan.cpu"; fail "no buckets planned"; }
cmp -s "$TMP/plan.cpu" "$TMP/plan.cuda" || { diff "$TMP/plan.cpu" "$TMP/plan.cuda"; fail "the CUDA step's collectives differ from the CPU's"; }
run "$EMU" "$TMP/fsdp-b0" --nproc 2 "${C[@]}" runtime.backend=cuda mesh.fsdp=2 runtime.bucket_mb=0
losses "$TMP/mesh.fsdp=2/tiny/metrics.jsonl" > "$TMP/a"; losses "$TMP/fsdp-b0/tiny/metrics.jsonl" > "$TMP/b"
cmp -s "$TMP/a" "$TMP/b" || { paste "$TMP/a" "$TMP/b"; fail "bucketed FSDP losses differ from one call per tensor"; }
# blocking NCCL (runtime.overlap_comm=false: each collective a step of its own, staged in its
# step's planned scratch, not a program-long buffer): the same numbers, bit for bit
run "$EMU" "$TMP/fsdp-blk" --nproc 2 "${C[@]}" runtime.backend=cuda mesh.fsdp=2 runtime.overlap_comm=false
losses "$TMP/fsdp-blk/tiny/metrics.jsonl" > "$TMP/b"
cmp -s "$TMP/a" "$TMP/b" || { paste "$TMP/a" "$TMP/b"; fail "blocking FSDP losses differ from started collectives"; }
echo "2 emulated GPUs, fsdp=2: $(head -1 "$TMP/plan.cuda" | sed 's/^ *//'); losses equal runtime.bucket_mb=0's and runtime.overlap_comm=false's"

# checkpoints come from device memory (parameters and optimizer state pulled to the host) and
# resume onto it: 3 steps, a checkpoint, 3 more from it = the 6-step run
R=(configs/tiny.yaml run.eval_every=0 runtime.threads=1 runtime.backend=cuda checkpoint.every=3)
run "$EMU" "$TMP/res" "${R[@]}" run.steps=3
run "$EMU" "$TMP/res" "${R[@]}" run.steps=6 checkpoint.resume=auto
grep -q "resum" "$TMP/out" "$TMP/err" || { cat "$TMP/err"; fail "the second run did not resume"; }
losses "$TMP/gpu/tiny/metrics.jsonl" | tail -3 > "$TMP/a"
losses "$TMP/res/tiny/metrics.jsonl" | tail -3 > "$TMP/b"
cmp -s "$TMP/a" "$TMP/b" || { paste "$TMP/a" "$TMP/b"; fail "resumed losses differ from the uninterrupted run"; }
echo "emulated GPU: resumed from a device checkpoint, losses of steps 4-6 equal the uninterrupted run's"

# a GPU too small for the step: one line naming the need, before anything runs
JDT_CUDAEMU_MEM_MB=40 "$EMU" "${C[@]}" runtime.backend=cuda run.out_dir="$TMP/small" >"$TMP/out" 2>"$TMP/err"; rc=$?
[ $rc -eq 1 ] || { cat "$TMP/err"; fail "too small a GPU: exit $rc, expected 1"; }
[ "$(grep -c 'jdt-train: error' "$TMP/err")" -eq 1 ] || { cat "$TMP/err"; fail "expected one error line"; }
grep -q "GPU memory" "$TMP/err" || { cat "$TMP/err"; fail "the error does not name GPU memory"; }
echo "emulated 40 MiB GPU: $(grep 'jdt-train: error' "$TMP/err" | cut -c1-160)"
echo "ok"
