#!/usr/bin/env bash
# cuda_emu_mesh.sh — the CUDA backend end to end without a GPU (as tests/e2e/cuda_emu.sh, whose
# set-up it shares: tests/infra/cuda-emu-common.sh), the other models and the meshes: Llama's
# layer, Gemma's (GeGLU, scaled embeddings), grouped-query attention with and without biases (our
# kernels and the emulator's cuDNN, also under tensor=2), the GELU epilogues' fallbacks, padded
# logits rows, bf16 activations and cuDNN under tensor=2, sequence parallelism, fsdp=2 (also with
# the loss in sequence slices) and tensor=2 on two processes of one emulated GPU each (NCCL
# through shared memory) and data=2 x fsdp=2 on four, FSDP's bucketed gathers and reduce-scatters
# bit for bit those of one call per tensor and of blocking collectives; a run resumed from a
# checkpoint written from device memory continues the uninterrupted run's losses exactly; a step
# that does not fit the GPU's memory is one clear line, exit 1. Each against the CPU's losses
# (or the one-GPU run's) within its bound.
# Not exclusive: no step here races a clock; its multi-process runs are short.
set -uo pipefail
. "${JDT_ROOT:?}/tests/infra/cuda-emu-common.sh"

# the references: the CPU in f32, bf16 compute and bf16 activations, and one emulated GPU in f32
run "$BIN" "$TMP/cpu" "${C[@]}"
run "$BIN" "$TMP/cpu16" "${C[@]}" precision.compute=bf16
run "$BIN" "$TMP/cpu16a" "${C[@]}" precision.compute=bf16 precision.activations=bf16
run "$EMU" "$TMP/gpu" "${C[@]}" runtime.backend=cuda
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
# (JDT_GEMM_PITCH=0: one value per load, so another summation order) and the CPU's within
# bf16's bound. On Gemma's layer (GeGLU: the gate GEMM applies the GELU, its product with
# the up projection a kernel; embeddings times sqrt(C); 2 key/value heads of 32 in a width of
# 64): seen 4.4e-8 and 5.3e-6, and 4e-6 under sequence parallelism below
V250=("${C[@]}" precision.compute=bf16 precision.activations=bf16 model.vocab_size=250 model.norm=rmsnorm
  model.bias=false model.pos=rope model.activation=geglu model.embed_scale=true model.head_dim=32 model.n_kv_head=2)
"$EMU" inspect "${V250[@]}" runtime.backend=cuda >"$TMP/insp" 2>&1 || { cat "$TMP/insp"; fail "inspect, vocabulary 250"; }
grep -q "2 GEMM operands with rows padded" "$TMP/insp" && grep -q "2 GELUs applied by their GEMMs" "$TMP/insp" ||
  { cat "$TMP/insp"; fail "vocabulary 250, GeGLU: logits and dlogits not padded, or the gates' GELUs not in their GEMMs"; }
run "$BIN" "$TMP/cpuv" "${V250[@]}"
run "$EMU" "$TMP/gpuv" "${V250[@]}" runtime.backend=cuda
JDT_GEMM_PITCH=0 run "$EMU" "$TMP/gpuv0" "${V250[@]}" runtime.backend=cuda
compare "$TMP/gpuv0/tiny/metrics.jsonl" "$TMP/gpuv/tiny/metrics.jsonl" "emulated GPU, V=250, padded vs dense" 1e-4 ||
  fail "padded rows changed the losses"
compare "$TMP/cpuv/tiny/metrics.jsonl" "$TMP/gpuv/tiny/metrics.jsonl" "emulated GPU, V=250, padded rows" 1e-3 ||
  fail "vocabulary 250 losses differ"
# sequence parallelism (`[seq, tensor]`, docs/sharding.md) on 2 emulated GPUs (Gemma's layer,
# as above): the residual stream split on T, NCCL all-gathers and reduce-scatters along T (not the leading dim: a
# permuting copy each), each rank's head on its (B, T / 2, V) logits with padded rows
SR='sharding.rules=[[batch, [data, fsdp]], [seq, tensor], [embed, fsdp], [mlp, tensor], [heads, tensor], [kv_heads, tensor], [vocab, null], [norm, null]]'
run "$EMU" "$TMP/spv" --nproc 2 "${V250[@]}" runtime.backend=cuda mesh.tensor=2 "$SR"
compare "$TMP/cpuv/tiny/metrics.jsonl" "$TMP/spv/tiny/metrics.jsonl" "2 emulated GPUs, [seq, tensor], V=250" 1e-3 ||
  fail "sequence parallelism on 2 emulated GPUs: losses differ"
# ... with dropout: every rank's block draws the CPU's one-process masks (the counter's f64 row
# and block offsets read by the NVRTC kernels, graph.h DROPOUT): seen 4.2e-6
run "$BIN" "$TMP/cpud" "${C[@]}" model.dropout=0.1 data.batch_size=8 data.micro_batch_size=4
run "$EMU" "$TMP/spd" --nproc 2 "${C[@]}" model.dropout=0.1 data.batch_size=8 data.micro_batch_size=4 runtime.backend=cuda mesh.tensor=2 "$SR"
compare "$TMP/cpud/tiny/metrics.jsonl" "$TMP/spd/tiny/metrics.jsonl" "2 emulated GPUs, [seq, tensor], dropout" 1e-4 ||
  fail "dropout under sequence parallelism on 2 emulated GPUs: losses differ from the CPU's"
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
# ... and with the loss in 4 sequence slices (runtime.loss_chunks: the slices' GEMMs on one
# gather of the head's weight, its dX GEMMs on the forward's gather instead of a re-gather,
# passes.c share_loss_gathers; the dW summed in place, fuse.c gemm_acc_donor): the whole
# head's losses within bf16's bound (the dW summed slice by slice: seen 2e-5)
run "$EMU" "$TMP/fsdp16lc" --nproc 2 "${C[@]}" runtime.backend=cuda precision.compute=bf16 precision.activations=bf16 mesh.fsdp=2 runtime.loss_chunks=4
compare "$TMP/fsdp16a/tiny/metrics.jsonl" "$TMP/fsdp16lc/tiny/metrics.jsonl" "2 emulated GPUs, fsdp=2, loss in 4 slices" 1e-4 ||
  fail "fsdp=2 losses differ under runtime.loss_chunks=4"
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
