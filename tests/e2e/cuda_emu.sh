#!/usr/bin/env bash
# cuda_emu.sh — the CUDA backend end to end without a GPU, one emulated GPU: build-cuda/
# jdt-train-emu is the CUDA build linked against the host CUDA emulator (tests/infra/cudaemu:
# runtime, NVRTC, cuBLASLt, cuDNN and NCCL stand-ins that run every kernel on the CPU; the
# common set-up is tests/infra/cuda-emu-common.sh). configs/tiny.yaml with runtime.backend: cuda
# reproduces the CPU backend's losses: f32 (TF32 GEMMs), the kernels compiled ahead of time by
# inspect --cuda-arch, eval in the train arena, bf16 compute and bf16 activations (GEMMs storing
# bf16 outputs), the vector and scalar elementwise kernels, the warp-per-row norm backwards,
# cuDNN's attention through the emulator's cuDNN (where it cannot serve, asked for, and by trial
# against our kernels, the default, where a cuDNN planted 10% off is refused), GEMM autotuning
# with its picks remembered (the default), bf16 under runtime.remat: block and dots (and dots'
# planned memory for GPT-2), and the loss in sequence slices (runtime.loss_chunks, and its
# planned memory for GPT-2). tests/e2e/cuda_emu_mesh.sh has the other models and the meshes.
# `make test` builds build-cuda/jdt-train-emu first wherever CUDA's headers are installed.
# Not exclusive: no step here races a clock (the dead-peer checks are check_cuk's), and its
# single-process runs leave a core to the pool.
set -uo pipefail
. "${JDT_ROOT:?}/tests/infra/cuda-emu-common.sh"

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
# emulator's 4 algorithms once at its first call that can run twice, the first made 20 ms slower
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
# runtime.loss_chunks (models.c gpt_loss, passes.c hoist_loss_backwards): the head and the
# cross-entropy on 4 slices of the sequence, each slice's backward (the fused classifier's
# dlogits, the head's dX and dW GEMMs, dW added to the slices' sum by its GEMM in the sum's
# buffer: cuBLASLt's C = D, here the emulator's) run right after its forward: the losses of the
# whole head within bf16's bound (the dW summed slice by slice:
# seen 1.2e-5), and GPT-2 at B 32 under remat block planned with 8 slices: a train arena at
# most 0.6 of the whole head's (written: 2.52 against 4.69 GiB)
run "$EMU" "$TMP/gpu16lc" "${C[@]}" runtime.backend=cuda precision.compute=bf16 \
  precision.activations=bf16 runtime.loss_chunks=4
compare "$TMP/gpu16a/tiny/metrics.jsonl" "$TMP/gpu16lc/tiny/metrics.jsonl" "emulated GPU, bf16, loss in 4 slices" 1e-4 ||
  fail "bf16 losses differ under runtime.loss_chunks=4"
"$EMU" inspect "${C[@]}" runtime.backend=cuda precision.compute=bf16 precision.activations=bf16 \
  runtime.loss_chunks=4 >"$TMP/insp" 2>&1 || { cat "$TMP/insp"; fail "inspect runtime.loss_chunks=4"; }
grep -q "4 cross-entropy backwards in their forward's pass over the logits; 4 cross-entropy slices, each backward right after its forward; 4 dlogits written over their logits" "$TMP/insp" ||
  { cat "$TMP/insp"; fail "runtime.loss_chunks=4: the slices' backwards not moved next to their fused forwards, or their dlogits not over their logits"; }
grep -q "3 of those GEMMs add in the buffer of the input they add to" "$TMP/insp" ||
  { cat "$TMP/insp"; fail "runtime.loss_chunks=4: the slices' dW not added in the sum's buffer"; }
for k in 1 8; do
  "$EMU" inspect "${G2[@]}" runtime.remat=block runtime.loss_chunks=$k >"$TMP/insp-lc$k" 2>&1 ||
    { cat "$TMP/insp-lc$k"; fail "inspect gpt2 runtime.loss_chunks=$k"; }
done
a1=$(arena "$TMP/insp-lc1"); a8=$(arena "$TMP/insp-lc8")
awk -v a="$a1" -v b="$a8" 'BEGIN { exit !(a > 0 && b > 0 && b <= 0.6 * a) }' ||
  { cat "$TMP/insp-lc1" "$TMP/insp-lc8"; fail "runtime.loss_chunks=8: GPT-2's train arena $a8 GiB against $a1 with the whole head"; }
echo "GPT-2 B=32 on CUDA, remat block, planned: train arena $a1 GiB with the whole head, $a8 GiB with runtime.loss_chunks: 8"
echo "ok"
