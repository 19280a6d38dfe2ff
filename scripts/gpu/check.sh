#!/usr/bin/env bash
# check.sh — the one GPU check of jdt-train's CUDA backend, for a machine with an NVIDIA GPU
# (the H200 device machine: PyTorch, JAX, CUDA 13, none of this project's C libraries).
# Stages, each reported and each allowed to fail without stopping the next:
#   1 probe    nvidia-smi, glibc, where libcudart/libnvrtc/libcublasLt/libnccl are
#   2 tests    check_cuk (builtin kernels, bf16 GEMMs incl. bf16-stored operands, NCCL in a
#              one-rank job: blocking and started collectives, their event timing, a dead peer in
#              the rendezvous) and check_cuda's GPU case (every op graph, train steps incl. bf16,
#              the overlap step: blocking vs start/wait on NCCL's stream, bitwise) vs the CPU
#   3 tiny     configs/tiny.yaml trained on the GPU and on the CPU: the loss curves compared,
#              f32 (TF32 GEMMs) and bf16 compute (cuBLASLt bf16 GEMMs vs the CPU's bf16 path);
#              an oversized batch must be refused by the device memory check (exit 1)
#   4 gpt2     GPT-2 124M (L=12 C=768 H=12 T=1024 V=50257, synthetic tokens), bf16 compute by
#              default: tok/s, MFU against the datasheet's dense bf16 peak (989.4 TFLOP/s on
#              H100/H200 SXM), peak device memory
#   5 peers    the same model and batch in PyTorch (torch.compile) and JAX (jax.jit, cuDNN's
#              attention where it compiles: gpt_peer_gpu.py --jax-attention), ratios
#              (scripts/bench/gpt_peer_gpu.py)
#   4p profile stage 4's run again for 5 steps with run.profile: the time per kind of kernel
#              (GEMM, attention, norms, fused groups, collectives) of 3 steps, then the GEMMs by
#              shape with each shape's TFLOP/s (a cuBLASLt algorithm that serves one badly), where
#              the next optimisation should go (each step timed by a CUDA event behind it, one
#              wait per run: its tok/s should be near stage 4's);
#              then PyTorch's fused attention (SDPA: flash, cuDNN, memory-efficient) alone at the
#              same shape, TFLOP/s as the profile counts them (scripts/bench/attention_peer_gpu.py)
#   6 multi    with 2+ GPUs only: tiny on 2 GPUs (mesh.data=2, then mesh.fsdp=2: NCCL all-reduce,
#              all-gather, reduce-scatter) vs the same mesh on the CPU, and the GPU run again with
#              runtime.overlap_comm=false (blocking collectives: the same losses); the summary's
#              communication row (NCCL time: waited / moving / hidden). With one GPU it is
#              skipped and says why (NCCL refuses two ranks on one GPU).
#
# Usage: scripts/gpu/check.sh [BUNDLE_DIR]
#   On the device machine: here `scripts/gpu/bundle.sh .gpu` (ignored by git: name it in the
#   device tool's carry), there `RESULTS=$OUT bash scripts/gpu/check.sh .gpu` (RESULTS below).
#   BUNDLE_DIR (made here by scripts/gpu/bundle.sh): bin/jdt-train, bin/check_cu{k,da} built with
#   make CUDA=1, libs.tar.xz with the C libraries they need (unpacked into /tmp, never /) and
#   cache/: stages 3 and 4's kernels compiled ahead of time for sm_90 (below), copied into the
#   run's cache so the GPU's minutes are not spent in NVRTC (where its NVRTC is this one's).
#   Without it the script uses build-cuda/ of this checkout, building it if missing.
#   PRECOMPILE=DIR (no GPU needed; bundle.sh uses it): instead of the stages, compile the
#   kernels of stages 3 and 4's runs (the same configs and overrides) with `jdt-train inspect
#   --cuda-arch sm_$GPU_ARCH` (default 90) into DIR, and stop.
# Env: OUT (results dir, default /tmp/jdt-gpu-check), GPT_BATCH (default 32: about 13.7 GiB of arena for jdt-train in bf16, 25.7 in f32; Session 40), GPT_STEPS (12),
#   GPT_PRECISION (bf16: precision.compute of stage 4; f32 = TF32 GEMMs, MFU against 494.7),
#   GPT_ACTIVATIONS (precision.activations of stage 4; default bf16 with bf16 compute, as the
#   peers' autocast and MaxText store their linear layers' outputs; f32 with f32),
#   PEER_DTYPES ("bf16": the peers' precisions, stage 4's; "bf16 f32" adds TF32 matmuls: two
#   more runs, each with its torch.compile or jax.jit), STAGE_TIMEOUT_S (150: one command's limit),
#   BUDGET_S (450: the whole script's; a command gets at most what is left, a stage that would
#   start with under 20 s left is skipped and says so, so the summary is always written inside
#   the device tool's 10-minute command limit),
#   STAGES (default "2 3 4 5 4p 4c 4t nc 4w 4d 4l 6": which stages after the probe run; "4f" adds stage 4 again with
#   JDT_CUK_ATTENTION=fma, the f32 FMA attention instead of the bf16 tensor-core one; "4v" adds
#   it with JDT_CUDA_VEC=0, elementwise kernels of one element and column reductions of one
#   output per thread instead of four; "4a" with precision.activations: f32, the linear layers'
#   outputs stored in f32; "4m" with JDT_MERGE_LAUNCHES=0, one launch per fused kernel instead of
#   independent neighbours sharing one; "4n" with JDT_NORM_FOLDS=0 JDT_GELU_EPILOGUE=0
#   JDT_RESIDUAL_GEMM=0 JDT_FUSED_XENT=0 JDT_ATTENTION_COPY=0 JDT_ATTENTION_GRADS=0
#   JDT_ATTENTION_LSE=0 JDT_ATTENTION_DOUT16=0, the layer norms in five kernels, the GELU a kernel
#   after its GEMM, the residual adds kernels of their own, the cross-entropy's backward a pass of
#   its own, the attention's output transposed by a kernel, its backward's packed output read by a
#   kernel per projection, its log-sum-exp found again and its dO stored in f32 (session 16's step);
#   "4c" with the attention stage 4 did not keep (stage 4 runs the default,
#   JDT_CUDNN_ATTENTION=auto: cuDNN's fused engines tried against jdt-train's kernels once per
#   direction, cuk_cudnn.c; PyTorch's libcudnn.so.9, found by the probe: JDT_CUDNN_LIBRARY; the
#   later stages keep stage 4's verdict), then =fast (cuDNN with dQ accumulated): their tok/s,
#   and a profile of the first (its attention rows against stage 4p's);
#   "4t" with JDT_CUDA_AUTOTUNE=0, each GEMM on cuBLASLt's heuristic's first algorithm, untimed
#   (stage 4 runs the default, auto: each GEMM plan's algorithm the fastest of the heuristic's
#   first 8, timed at its first step and remembered in the cache for the later stages);
#   "4q" runs stage 4's model with Llama's layer (RMSNorm, RoPE, SwiGLU, no biases) and 4
#   key/value heads for its 12 query heads twice: the grouped-query attention kernels
#   (fold_attention_groups), then each key/value head repeated (JDT_ATTENTION_GROUPS=0);
#   "4k" runs a Llama layer with Llama-3-70B's attention per rank at tensor: 8 (8 query heads
#   of one key/value head, D 128) at B 1, T 8192 twice: the dK/dV kernel's key tiles split over
#   blocks (cuk.c att_dkv_split), then unsplit (JDT_CUK_DKV_SPLIT=1);
#   "4w" with JDT_NORM_WARPS=0, the layer norms (forwards with their affine, and the backwards'
#   _part kernels) a block per row instead of a warp per row (cuk_rows.cu norm_affine_w and
#   norm_bwd_part_w, C a multiple of 128);
#   "4x" with JDT_XENT_SMEM=0, the fused classifier reading each bf16 row twice instead of
#   staging it in shared memory (cuk_rows.cu cuk_softmax_xent_fused_bf16_bs);
#   "4d" with JDT_NORM_DY_TERMS=0, the q, k and v projections' dX summed through cuBLASLt's C
#   in f32 instead of three bf16 products that ln1's backward adds (passes.c fold_norm_dy_terms);
#   "4l" with runtime.loss_chunks=8, the head and the cross-entropy on 8 slices of the sequence,
#   each slice's backward right after its forward (docs/compiler.md "The loss in slices"): its
#   tok/s and peak device memory against stage 4's (planned 13.70 -> 11.18 GiB of arena, +3.8 GB
#   of traffic a step);
#   "4s" with JDT_GEMM_SPLIT=0, each GEMM whose M, N or K is not a multiple of 8 (bf16) as one
#   cuBLASLt call instead of an aligned bulk and remainders (cuk_gemm.c gemm: the lm head);
#   "gm" times cuBLAS through torch on the lm head's GEMMs with the vocabulary at 50257 and
#   rounded up to multiples of 8, 64 and 128 (scripts/bench/gemm_peer_gpu.py); "nc" runs Nsight
#   Compute on five attention kernels of stage 4's step at B=8 and two of its norm backwards
#   (ncu-att.log, ncu-norm.log: throughput,
#   occupancy, registers, stall reasons of the forward, dQ and dK/dV kernels);
#   "4g" with JDT_GEMM_PITCH=0, the logits' and dlogits' rows back to back (100514 bytes: the
#   lm-head GEMMs without 16-byte row alignment) instead of padded to 50304 values; these
#   variants run after
#   stage 5
#   and 4p, so the default stages keep their budget),
#   REHEARSE=1 (the whole script on the host CUDA emulator, for checking the script itself
#   before a GPU session spends its minutes: build-cuda/jdt-train-emu and the *-emu tests, two
#   emulated GPUs, GPT-2 shrunk by GPT_EXTRA, the peers on the CPU with --tiny; no numbers from
#   it mean anything), GPT_EXTRA (overrides appended to stage 4's command), PEER_PY (the peers'
#   Python, default python3).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUNDLE=${1:-}
OUT=${OUT:-/tmp/jdt-gpu-check}
B=${GPT_BATCH:-32}
STEPS=${GPT_STEPS:-12}
PEER_DTYPES=${PEER_DTYPES:-bf16}
TMO_MAX=${STAGE_TIMEOUT_S:-150}
BUDGET=${BUDGET_S:-450}
GPT_PREC=${GPT_PRECISION:-bf16}
GPT_ACT=${GPT_ACTIVATIONS:-$GPT_PREC}
STAGES=" ${STAGES:-2 3 4 5 4p 4c 4t nc 4w 4d 4l 6} "
REHEARSE=${REHEARSE:-0}
GPT_EXTRA=${GPT_EXTRA:-}
SFX=""                     # the test binaries' suffix
PEER_ARGS="--device cuda"  # the peers' device (and size)
GPT_HEADS=12; GPT_SEQ=1024; GPT_HEAD_DIM=64  # stage 4's attention shape, for its torch peer
GQA_KV=4                   # stage 4q's key/value heads (of GPT_HEADS)
ATT_PEER_ARGS="--device cuda --dtype $([ "$GPT_PREC" = bf16 ] && echo bf16 || echo f32)"
if [ "$REHEARSE" = 1 ]; then
  export JDT_CUDAEMU_DEVICES=${JDT_CUDAEMU_DEVICES:-2}
  SFX=-emu
  GPT_EXTRA=${GPT_EXTRA:-model.n_layer=1 model.n_embd=64 model.n_head=2 model.seq_len=64}
  B=${GPT_BATCH:-2}; STEPS=${GPT_STEPS:-3}; PEER_DTYPES=f32; BUDGET=${BUDGET_S:-1500}
  PEER_ARGS="--device cpu --tiny"
  GPT_HEADS=2; GPT_SEQ=64; GPT_HEAD_DIM=32; ATT_PEER_ARGS="--device cpu --dtype f32 --reps 3"
  GQA_KV=1
  # the peers' Python: one with torch (Debian's python3-torch here), as the GPU machine's has
  /usr/bin/python3 -c "import torch" 2>/dev/null && PEER_PY=${PEER_PY:-/usr/bin/python3}
fi
# the time a command may take: STAGE_TIMEOUT_S, or what is left of BUDGET_S if less
tmo() {
  local left=$((BUDGET - ($(date +%s) - t_all)))
  [ "$left" -lt "$TMO_MAX" ] && echo $((left > 1 ? left : 1)) || echo "$TMO_MAX"
}
want() {
  [[ "$STAGES" == *" $1 "* ]] || return 1
  local left=$((BUDGET - ($(date +%s) - t_all)))
  [ "$left" -ge 20 ] && return 0
  say "stage $1 skipped: ${left}s left of BUDGET_S=$BUDGET"
  return 1
}
# The runs of stages 3 and 4, as arguments after the binary (PRECOMPILE compiles the same ones).
tiny_args() { # backend precision -> TINY
  TINY=(train configs/tiny.yaml run.out_dir="$OUT/tiny-$1-$2" run.steps=30 run.eval_every=0
        checkpoint.every=0 runtime.backend="$1" precision.compute="$2")
}
gpt_args() { # out_dir [activations] -> GPT
  # shellcheck disable=SC2206 # GPT_EXTRA: one override per word
  GPT=(train configs/gpt2-124m.yaml run.out_dir="$1" run.steps="$STEPS" run.log_every=1
       run.eval_every=0 checkpoint.every=0 model.vocab_size=50257 data.format=synthetic
       data.batch_size="$B" data.micro_batch_size="$B" mesh.data=1 mesh.fsdp=1
       precision.compute="$GPT_PREC" precision.activations="${2:-$GPT_ACT}" runtime.remat=none
       runtime.backend=cuda $GPT_EXTRA)
}
if [ -n "${PRECOMPILE:-}" ]; then
  PBIN=$ROOT/build-cuda/jdt-train$SFX
  [ -x "$PBIN" ] || (cd "$ROOT" && make -j"$(nproc)" CUDA=1 "build-cuda/jdt-train$SFX" >/dev/null) || exit 1
  mkdir -p "$PRECOMPILE" || exit 1
  t0=$(date +%s)
  tiny_args cuda f32; a=("${TINY[@]}"); tiny_args cuda bf16; b=("${TINY[@]}"); gpt_args "$OUT/gpt2"
  for args in a b GPT; do
    declare -n r=$args
    (cd "$ROOT" && "$PBIN" inspect "${r[@]:1}" runtime.cache_dir="$PRECOMPILE" \
       --cuda-arch "sm_${GPU_ARCH:-90}" >"$PRECOMPILE/inspect-$args.log" 2>&1) ||
      { tail -3 "$PRECOMPILE/inspect-$args.log"; echo "precompile of ${r[1]} FAILED"; exit 1; }
    grep -E "^  (compile|device) " "$PRECOMPILE/inspect-$args.log"
    unset -n r
  done
  rm -f "$PRECOMPILE"/inspect-*.log "$PRECOMPILE"/*.lock "$PRECOMPILE"/.prune.lock
  echo "precompiled for sm_${GPU_ARCH:-90} into $PRECOMPILE in $(( $(date +%s) - t0 ))s ($(du -sh "$PRECOMPILE" | cut -f1))"
  exit 0
fi
# the device tool's $OUT is where RESULTS go: the work directory must be another (the copies at
# the end would truncate the logs they read, and the tool brings back 8 files)
[ -n "${RESULTS:-}" ] && [ "$(realpath -m "$OUT")" = "$(realpath -m "$RESULTS")" ] && OUT=/tmp/jdt-gpu-check
mkdir -p "$OUT"
# RESULTS (the device tool's $OUT, which brings back at most 8 files): summary.txt is written
# there as the stages go, and the main logs are copied there at the end
[ -n "${RESULTS:-}" ] && mkdir -p "$RESULTS"
SUMMARY="${RESULTS:-$OUT}/summary.txt"
: >"$SUMMARY"
t_all=$(date +%s)
say() { echo "== [$(( $(date +%s) - t_all ))s] $*" | tee -a "$SUMMARY"; }
export JDT_CACHE_DIR="$OUT/cache"
export OMP_WAIT_POLICY=passive
# NVRTC's split compile on every core for the kernels not in the bundle's cache: the GPU box is
# idle (the split's crash was seen only with the CPU oversubscribed, docs/backend.md) and its
# minutes are the scarce thing
export JDT_NVRTC_SPLIT=${JDT_NVRTC_SPLIT:-0}

# ---- 1: probe -------------------------------------------------------------------------------
say "stage 1 probe"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 | tee -a "$SUMMARY"
ldd --version 2>&1 | head -1 | tee -a "$SUMMARY"
# cuDNN's version decides how its fused attention could serve (docs/cuda-kernels.md)
"${PEER_PY:-python3}" -c 'import torch; print("  torch", torch.__version__, "cuDNN", torch.backends.cudnn.version())' 2>&1 | tail -1 | tee -a "$SUMMARY"
PY=$(command -v python3 || true)
SITE=$($PY -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)
libdirs=()
for lib in libcudart.so.13 libnvrtc.so.13 libnvrtc-builtins.so.13.0 libcublasLt.so.13 libnccl.so.2; do
  found=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13.0/lib64 /usr/lib/x86_64-linux-gnu; do
    [ -e "$d/$lib" ] && { found="$d/$lib"; break; }
  done
  if [ -z "$found" ]; then
    for s in $SITE; do
      found=$(find "$s/nvidia" -name "$lib" 2>/dev/null | head -1)
      [ -n "$found" ] && break
    done
  fi
  echo "  $lib: ${found:-NOT FOUND}" | tee -a "$SUMMARY"
  [ -n "$found" ] && libdirs+=("$(dirname "$found")")
done

# cuDNN for its fused attention (JDT_CUDNN_ATTENTION=1: stage 2's test_cudnn_attention, stage
# 4c): PyTorch's copy, unless JDT_CUDNN_LIBRARY names one; rehearsing, the emulator's own
# (tests/infra/cudaemu/cudnnemu.c, which the emulated runtime names)
dnn_label=""
if [ "$REHEARSE" = 1 ] && [ -z "${JDT_CUDNN_LIBRARY:-}" ]; then
  dnn_label="the host emulator's stand-in (cudnnemu.c)"
elif [ -z "${JDT_CUDNN_LIBRARY:-}" ]; then
  dnn=""
  for s in $SITE; do
    dnn=$(find "$s/nvidia" "$s/torch/lib" -name libcudnn.so.9 2>/dev/null | head -1)
    [ -n "$dnn" ] && break
  done
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu; do
    [ -z "$dnn" ] && [ -e "$d/libcudnn.so.9" ] && dnn="$d/libcudnn.so.9"
  done
  [ -n "$dnn" ] && export JDT_CUDNN_LIBRARY="$dnn"
fi
echo "  libcudnn.so.9: ${dnn_label:-${JDT_CUDNN_LIBRARY:-NOT FOUND}}" | tee -a "$SUMMARY"

# ---- the binary and its libraries ---------------------------------------------------------------
if [ -n "$BUNDLE" ]; then
  BIN="$BUNDLE/bin/jdt-train"; TESTDIR="$BUNDLE/bin"
  if [ -f "$BUNDLE/libs.tar.xz" ]; then
    mkdir -p /tmp/jdt-libs && tar -xJf "$BUNDLE/libs.tar.xz" -C /tmp/jdt-libs
    libdirs=(/tmp/jdt-libs "${libdirs[@]}")
  fi
else
  BIN="$ROOT/build-cuda/jdt-train$SFX"; TESTDIR="$ROOT/build-cuda/tests"
  if [ ! -x "$BIN" ]; then
    say "building: make CUDA=1 tests-build"
    (cd "$ROOT" && make -j"$(nproc)" CUDA=1 tests-build >"$OUT/build.log" 2>&1) || say "build FAILED (see $OUT/build.log)"
    [ -z "$SFX" ] || (cd "$ROOT" && make -j"$(nproc)" CUDA=1 build-cuda/jdt-train-emu \
      build-cuda/tests/check_cuk-emu build-cuda/tests/check_cuda-emu >>"$OUT/build.log" 2>&1)
  fi
fi
# the kernels compiled ahead of time here (bundle.sh): the GPU's runs find them in the cache
if [ -n "$BUNDLE" ] && [ -d "$BUNDLE/cache" ]; then
  mkdir -p "$JDT_CACHE_DIR" && cp -n "$BUNDLE"/cache/jdt-* "$JDT_CACHE_DIR"/ 2>/dev/null
  say "kernel cache: $(ls "$BUNDLE/cache" | wc -l) entries compiled ahead of time for sm_90 (a GPU with another NVRTC or arch compiles its own)"
fi
# the driver's libcuda.so.1: the loader's cache should know it (PyTorch finds it); the driver's
# folder of the device machine last, in case it does not
echo "  libcuda.so.1: $(ldconfig -p 2>/dev/null | grep -m1 -o '/.*libcuda\.so\.1$' || echo 'not in the loader cache')" | tee -a "$SUMMARY"
[ -d /usr/local/nvidia/lib64 ] && libdirs+=(/usr/local/nvidia/lib64)
LD_LIBRARY_PATH=$(IFS=:; echo "${libdirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LD_LIBRARY_PATH
if "$BIN" version >"$OUT/version.txt" 2>&1; then sed 's/^/  /' "$OUT/version.txt" | tee -a "$SUMMARY"; else
  say "binary does not start:"; ldd "$BIN" 2>&1 | grep -i "not found" | tee -a "$SUMMARY"
fi

# ---- 2: GPU tests ---------------------------------------------------------------------------
if want 2; then
say "stage 2 tests (check_cuk: every builtin kernel vs the CPU, NCCL one rank; check_cuda gpu case: every op graph and train step, f32 and bf16, vs the CPU)"
# check_cuk and check_cuda: only their "gpu" test cases here (CK_RUN_CASE); the NVRTC,
# emulation and no-GPU cases need no GPU and run in CI, so they do not spend device time (with
# them check_cuk alone took 170 s on the 2-core dev box, past STAGE_TIMEOUT_S). check_cuk
# shares the kernel cache ($JDT_CACHE_DIR) across its tests and with the jdt-train runs below.
# cuDNN's own log of warnings and errors (its fused attention's test): read when that test fails
for t in check_cuk check_cuda; do
  case_sel=gpu
  (cd "$ROOT" && env ${case_sel:+CK_RUN_CASE=$case_sel} CUDNN_LOGLEVEL_DBG=2 \
     CUDNN_LOGDEST_DBG="$OUT/cudnn-$t.log" timeout "$(tmo)" "$TESTDIR/$t$SFX" >"$OUT/$t.log" 2>&1); rc=$?
  grep -E "^[0-9]+%|:[EF]:|SKIP|test_cudnn" "$OUT/$t.log" | tee -a "$SUMMARY"
  if grep -qE ":[EF]:.*cudnn" "$OUT/$t.log" && [ -f "$OUT/cudnn-$t.log" ]; then
    grep -m12 -E "Error|Reason" "$OUT/cudnn-$t.log" | tee -a "$SUMMARY"
  fi
  say "stage 2 $t exit $rc"
done
grep -E "loss cpu" "$OUT/check_cuda.log" | grep "step 7" | tee -a "$SUMMARY"
grep -hE "overlap mode|started all-reduces" "$OUT/check_cuda.log" "$OUT/check_cuk.log" | tee -a "$SUMMARY"
fi

# ---- 3: tiny on GPU vs CPU --------------------------------------------------------------------
if want 3; then
say "stage 3 tiny: GPU vs CPU loss curves (f32, then bf16 compute)"
tiny() { # backend precision
  tiny_args "$1" "$2"
  (cd "$ROOT" && timeout "$(tmo)" "$BIN" "${TINY[@]}" >"$OUT/tiny-$1-$2.log" 2>&1)
}
for prec in f32 bf16; do
  tiny cpu $prec; rc_c=$?; tiny cuda $prec; rc_g=$?
  grep -hoE "step compiled in .*|compiling the builtin kernels of [^ ]*" "$OUT/tiny-cuda-$prec.log" | sed 's/^/  cuda: /' | tee -a "$SUMMARY"
  tail -3 "$OUT/tiny-cuda-$prec.log" | tee -a "$SUMMARY"
  if [ $rc_c -eq 0 ] && [ $rc_g -eq 0 ]; then
    python3 - "$OUT/tiny-cpu-$prec/tiny/metrics.jsonl" "$OUT/tiny-cuda-$prec/tiny/metrics.jsonl" "$prec" <<'PY' | tee -a "$SUMMARY"
import json, sys
def losses(p): return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
c, g = losses(sys.argv[1]), losses(sys.argv[2])
def rel(a, b): return abs(a - b) / abs(a) if a == a and b == b else float("inf")  # NaN: no match
d = max(map(rel, c, g), default=float("inf")) if len(c) == len(g) else float("inf")
# bf16: both round attention's products to bf16 (the GPU on tensor cores; the forward's
# probabilities before normalising), the GEMMs sum in another order
thr = 5e-3 if sys.argv[3] == "f32" else 2e-2
print(f"tiny {sys.argv[3]}: {len(c)} steps, cpu {c[0]:.4f} -> {c[-1]:.4f}, cuda {g[0]:.4f} -> {g[-1]:.4f}, "
      f"max relative loss difference {d:.2e} -> {'MATCH' if d < thr else 'DIFFER'} (threshold {thr:g})")
PY
  else
    say "tiny $prec FAILED (cpu exit $rc_c, cuda exit $rc_g)"; tail -3 "$OUT/tiny-cpu-$prec.log" | tee -a "$SUMMARY"
  fi
done
# the device memory check: a plan larger than the GPU (~165 GiB of arena) must be one line and
# exit 1 before its allocation, never a CUDA out-of-memory error mid-step
(cd "$ROOT" && timeout "$(tmo)" "$BIN" train configs/tiny.yaml run.out_dir="$OUT/tiny-oom" run.steps=2 \
   run.eval_every=0 checkpoint.every=0 runtime.backend=cuda data.batch_size=524288 \
   data.micro_batch_size=524288 >"$OUT/tiny-oom.log" 2>&1); rc=$?
if [ $rc -eq 1 ] && grep -q "of GPU memory but" "$OUT/tiny-oom.log"; then
  say "tiny oversized batch refused before allocating (exit 1): $(grep -o 'the compiled step needs.*' "$OUT/tiny-oom.log" | head -1)"
else
  say "tiny oversized batch NOT refused cleanly (exit $rc):"; tail -3 "$OUT/tiny-oom.log" | tee -a "$SUMMARY"
fi
fi

# ---- 4: GPT-2 124M ---------------------------------------------------------------------------
JDT_TOKS=""
# run_gpt NAME [VAR=VALUE ...]: the step gpt_args built, with those variables set, into
# $OUT/NAME.log; sets rc and toks (the last logged step's tok/s)
# (ATT_PIN, once stage 4 has set it: its attention verdicts, which a VAR=VALUE here overrides)
run_gpt() {
  local name=$1; shift
  (cd "$ROOT" && env ${ATT_PIN:+JDT_CUDNN_ATTENTION=$ATT_PIN} "$@" timeout "$(tmo)" "$BIN" "${GPT[@]}" >"$OUT/$name.log" 2>&1); rc=$?
  toks=$(grep -E "step [0-9]+/[0-9]+ \| loss" "$OUT/$name.log" | tail -1 | sed -nE 's/.* ([0-9.]+) tok\/s.*/\1/p')
}
# gpt_failed WHAT SAVE: stage 4 failed (not a timeout); say so and keep its log as SAVE.log
gpt_failed() {
  say "stage 4 $1failed (exit $rc): $(grep -m1 'error' "$OUT/gpt2.log")"
  cp "$OUT/gpt2.log" "$OUT/$2.log"
}
if want 4; then
if [ "$GPT_PREC" = bf16 ]; then what="$GPT_ACT activations, bf16 GEMMs (f32 accumulation), MFU vs dense bf16"
else what="f32 storage + TF32 GEMMs, MFU vs dense TF32"; fi
say "stage 4 gpt2-124m: B=$B T=1024, $STEPS steps, $what"
gpt_args "$OUT/gpt2"
run_gpt gpt2
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && ! grep -qi "cublas" "$OUT/gpt2.log"; then
  # a failure of code no GPU has run yet (merged launches: several fused kernels in one grid;
  # the two-kernel layer norms, the GEMM's GELU epilogue, the residual adds in the GEMMs, the
  # fused classifier, the attention's second output, its backward's cotangent form, saved
  # log-sum-exp and bf16 dO) must not cost the measurement
  # either: the step again without them, and so for the rest of the script (its kernels are
  # not in the bundle's cache)
  gpt_failed "" gpt2-merged-failed
  export JDT_MERGE_LAUNCHES=0 JDT_NORM_FOLDS=0 JDT_GELU_EPILOGUE=0 JDT_RESIDUAL_GEMM=0 JDT_FUSED_XENT=0 JDT_ATTENTION_COPY=0 JDT_ATTENTION_GRADS=0 JDT_ATTENTION_LSE=0 JDT_ATTENTION_DOUT16=0 JDT_GEMM_PITCH=0
  say "stage 4 again with one launch per fused kernel, five-kernel norms, GELU after the GEMM, residual adds as kernels, the cross-entropy's backward on its own, the attention's output transposed by a kernel, its backward's packed output read by a kernel per projection, its log-sum-exp found again, its dO stored in f32 and the logits' rows unpadded (JDT_MERGE_LAUNCHES=0 JDT_NORM_FOLDS=0 JDT_GELU_EPILOGUE=0 JDT_RESIDUAL_GEMM=0 JDT_FUSED_XENT=0 JDT_ATTENTION_COPY=0 JDT_ATTENTION_GRADS=0 JDT_ATTENTION_LSE=0 JDT_ATTENTION_DOUT16=0 JDT_GEMM_PITCH=0 from here on)"
  run_gpt gpt2
fi
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$GPT_ACT" = bf16 ]; then
  # a failure of the bf16-output GEMMs (e.g. no cuBLASLt algorithm: they have no fallback)
  # must not cost the stage: the step again with f32 activations, the previous numerics
  gpt_failed "with bf16 activations " gpt2-act16-failed
  GPT_ACT=f32; gpt_args "$OUT/gpt2"
  say "stage 4 again with precision.activations f32"
  run_gpt gpt2
fi
grep -E "device:|compiled|compiling|MFU reference|precision.compute|GPU memory|device memory|GELU epilogue|cuda: attention|cuDNN attention" "$OUT/gpt2.log" | tee -a "$SUMMARY"
tail -3 "$OUT/gpt2.log" | tee -a "$SUMMARY"
last=$(grep -E "^.*step [0-9]+/[0-9]+ \| loss" "$OUT/gpt2.log" | tail -1)
JDT_TOKS=$(echo "$last" | sed -nE 's/.* ([0-9.]+) tok\/s.*/\1/p')
JDT_MFU=$(echo "$last" | sed -nE 's/.*MFU ([0-9.]+)%.*/\1/p')
JDT_DEV=$(echo "$last" | sed -nE 's/.*peak device ([0-9]+) MB.*/\1/p')
say "stage 4 exit $rc, jdt-train $GPT_PREC (activations $GPT_ACT${JDT_MERGE_LAUNCHES:+, one launch per kernel, five-kernel norms, GELU after the GEMM}) ${JDT_TOKS:-?} tok/s, MFU ${JDT_MFU:-?}% (goal >= 45% of 989.4 TFLOP/s bf16), peak device ${JDT_DEV:-?} MB"
# stage 4's attention verdicts (JDT_CUDNN_ATTENTION=auto, the default: cuDNN tried against
# jdt-train's kernels once per direction, cuk_cudnn.c): stage 4's later variants (run_gpt, the
# profiles) keep the same choice, so what they change is their own: =1 where both directions
# kept cuDNN's, =0 where neither did (or nothing was tried); mixed verdicts cannot be pinned by
# one variable, and those runs try again (auto)
v_f=$(grep -oE "attention forward B=[^:]*: .* kept" "$OUT/gpt2.log" | head -1 | grep -oE "(cuDNN's|jdt-train's kernels) kept")
v_b=$(grep -oE "attention backward B=[^:]*: .* kept" "$OUT/gpt2.log" | head -1 | grep -oE "(cuDNN's|jdt-train's kernels) kept")
if [ -n "${JDT_CUDNN_ATTENTION:-}" ]; then
  ATT_PIN=$JDT_CUDNN_ATTENTION
else
  case "$v_f/$v_b" in
    "cuDNN's kept/cuDNN's kept") ATT_PIN=1 ;;
    "cuDNN's kept/"*|*"/cuDNN's kept") ATT_PIN=auto ;;
    *) ATT_PIN=0 ;;
  esac
fi
say "stage 4's attention: forward ${v_f:-not tried}, backward ${v_b:-not tried} (stage 4's later runs: JDT_CUDNN_ATTENTION=$ATT_PIN$([ "$ATT_PIN" = auto ] && echo ", mixed verdicts: not pinned"))"
fi
# ---- 5: peers --------------------------------------------------------------------------------
PEER="$ROOT/scripts/bench/gpt_peer_gpu.py"
for dt in $PEER_DTYPES; do
  for fw in torch jax; do
    want 5 || continue
    say "stage 5 peer $fw --dtype $dt (B=$B)"
    # shellcheck disable=SC2086 # PEER_ARGS: one argument per word
    PYTHONUNBUFFERED=1 timeout "$(tmo)" "${PEER_PY:-python3}" "$PEER" --framework $fw --batch "$B" --steps 10 \
      --dtype "$dt" $PEER_ARGS >"$OUT/peer-$fw-$dt.log" 2>&1; rc=$?
    line=$(grep -E '^\{.*"tokens_per_s"' "$OUT/peer-$fw-$dt.log" | tail -1)
    if [ -n "$line" ]; then
      echo "$line" | tee -a "$SUMMARY"
      JDT_TOKS="${JDT_TOKS:-}" python3 -c '
import json, os, sys
d = json.loads(sys.argv[1]); j = os.environ.get("JDT_TOKS"); fw = d["framework"]; t = d["tokens_per_s"]
r = ", jdt-train / %s = %.3f" % (fw, float(j) / t) if j else ""
print("%s %s (attention: %s): %.0f tok/s, MFU %.1f%%%s" % (fw, d["dtype"], d.get("attention", "?"), t, 100 * d["mfu"], r))' "$line" | tee -a "$SUMMARY"
    else
      say "peer $fw $dt FAILED (exit $rc)"; tail -3 "$OUT/peer-$fw-$dt.log" | tee -a "$SUMMARY"
    fi
  done
done
# ---- 4p: where stage 4's step spends its time ----------------------------------------------------
if want 4p; then
say "stage 4p gpt2-124m profile: time per kind of kernel over 3 steps (run.profile: an event behind each step)"
gpt_args "$OUT/gpt2-prof"
(cd "$ROOT" && env ${ATT_PIN:+JDT_CUDNN_ATTENTION=$ATT_PIN} timeout "$(tmo)" "$BIN" "${GPT[@]}" run.steps=5 \
   run.profile=true run.profile_steps=3 >"$OUT/gpt2-prof.log" 2>&1); rc=$?
sed -n '/profile of the compiled step/,/^[^ 0-9Gf]/p' "$OUT/gpt2-prof.log" | grep -v '^step ' | head -72 | tee -a "$SUMMARY"
say "stage 4p exit $rc"
# PyTorch's fused attention alone at the same shape, TFLOP/s counted as the profile's attention
# and attention_bwd rows count them: is our attention where the step loses?
if [ $((BUDGET - ($(date +%s) - t_all))) -ge 40 ]; then
  say "stage 4p attention peer: torch SDPA at B=$B H=$GPT_HEADS T=$GPT_SEQ D=$GPT_HEAD_DIM (compare the profile's attention rows)"
  # shellcheck disable=SC2086 # ATT_PEER_ARGS: one argument per word
  timeout "$(tmo)" "${PEER_PY:-python3}" "$ROOT/scripts/bench/attention_peer_gpu.py" --batch "$B" \
    --heads "$GPT_HEADS" --seq "$GPT_SEQ" --head-dim "$GPT_HEAD_DIM" $ATT_PEER_ARGS \
    >"$OUT/attention-peer.log" 2>&1; rc=$?
  grep -E '^\{' "$OUT/attention-peer.log" | tee -a "$SUMMARY"
  [ "$rc" -eq 0 ] || { tail -3 "$OUT/attention-peer.log" | tee -a "$SUMMARY"; }
  say "stage 4p attention peer exit $rc"
fi
fi
# The opt-in variants of stage 4 come after the peers and the profile: what the default STAGES
# measure is not left without budget by them.
# ---- 4f (not in the default STAGES): stage 4 again with the f32 FMA attention ---------------------
if want 4f; then
gpt_args "$OUT/gpt2-fma"
run_gpt gpt2-fma JDT_CUK_ATTENTION=fma
say "stage 4f exit $rc, attention on FMA (JDT_CUK_ATTENTION=fma): ${toks:-?} tok/s against ${JDT_TOKS:-?} with tensor-core attention"
fi
# ---- 4q (not in the default STAGES): grouped-query attention, the grouped kernels vs repeated heads
if want 4q; then
GPT_EXTRA_4=$GPT_EXTRA
GPT_EXTRA="$GPT_EXTRA model.norm=rmsnorm model.pos=rope model.activation=swiglu model.bias=false model.n_kv_head=$GQA_KV"
gpt_args "$OUT/llama-gqa"
run_gpt llama-gqa JDT_CUDNN_ATTENTION=0; q_rc=$rc; q_toks=$toks
gpt_args "$OUT/llama-gqa-rep"
run_gpt llama-gqa-rep JDT_CUDNN_ATTENTION=0 JDT_ATTENTION_GROUPS=0
GPT_EXTRA=$GPT_EXTRA_4
say "stage 4q exit $q_rc/$rc, stage 4's model with Llama's layer and $GQA_KV key/value heads for $GPT_HEADS query heads: ${q_toks:-?} tok/s with the grouped attention kernels (passes.c fold_attention_groups), ${toks:-?} with each key/value head repeated for its group (JDT_ATTENTION_GROUPS=0; check_cuk test_attention_groups ran in stage 2; their kernels are not in the bundle's cache: NVRTC time counts)"
fi
# ---- 4k (not in the default STAGES): the dK/dV kernel's split, at a shape with few key tiles ----
if want 4k; then
GPT_EXTRA_4=$GPT_EXTRA; B_4=$B; B=1
K_SHAPE="model.n_layer=4 model.n_embd=1024 model.n_head=8 model.n_kv_head=1 model.seq_len=8192"
[ "$REHEARSE" = 1 ] && K_SHAPE="model.n_layer=1 model.n_embd=256 model.n_head=8 model.n_kv_head=1 model.seq_len=256"
GPT_EXTRA="$GPT_EXTRA model.norm=rmsnorm model.pos=rope model.activation=swiglu model.bias=false $K_SHAPE"
gpt_args "$OUT/dkv-split"
run_gpt dkv-split JDT_CUDNN_ATTENTION=0; k_rc=$rc; k_toks=$toks
gpt_args "$OUT/dkv-unsplit"
run_gpt dkv-unsplit JDT_CUDNN_ATTENTION=0 JDT_CUK_DKV_SPLIT=1
GPT_EXTRA=$GPT_EXTRA_4; B=$B_4
say "stage 4k exit $k_rc/$rc, Llama-3-70B's attention per rank at tensor: 8 (8 query heads of one key/value head, D 128; $K_SHAPE, B 1): ${k_toks:-?} tok/s with the dK/dV kernel's key tiles split over blocks (cuk.c att_dkv_split; T 8192 has 128 key tiles), ${toks:-?} unsplit (JDT_CUK_DKV_SPLIT=1; its kernels are not in the bundle's cache: NVRTC time counts, once)"
fi
# ---- 4v (not in the default STAGES): stage 4 again with scalar elementwise kernels ---------------
if want 4v; then
gpt_args "$OUT/gpt2-scalar"
run_gpt gpt2-scalar JDT_CUDA_VEC=0
say "stage 4v exit $rc, scalar elementwise kernels and reductions (JDT_CUDA_VEC=0): ${toks:-?} tok/s against ${JDT_TOKS:-?} with 4-wide ones (its kernels are not in the bundle's cache: NVRTC time counts)"
fi

# ---- 4m (not in the default STAGES): stage 4 again with one launch per fused kernel -------------
if want 4m; then
gpt_args "$OUT/gpt2-unmerged"
run_gpt gpt2-unmerged JDT_MERGE_LAUNCHES=0
say "stage 4m exit $rc, one launch per fused kernel (JDT_MERGE_LAUNCHES=0): ${toks:-?} tok/s against ${JDT_TOKS:-?} with independent neighbours merged (its kernels are not in the bundle's cache: NVRTC time counts)"
fi

# ---- 4n (not in the default STAGES): stage 4 again with session 16's norms, GELU, residual adds
if want 4n; then
gpt_args "$OUT/gpt2-norm5"
run_gpt gpt2-norm5 JDT_NORM_FOLDS=0 JDT_GELU_EPILOGUE=0 JDT_RESIDUAL_GEMM=0 JDT_FUSED_XENT=0 JDT_ATTENTION_COPY=0 JDT_ATTENTION_GRADS=0 JDT_ATTENTION_LSE=0 JDT_ATTENTION_DOUT16=0
say "stage 4n exit $rc, five-kernel layer norms, the GELU after its GEMM, residual adds as kernels, the cross-entropy's backward on its own, the attention's output transposed by a kernel, its backward's packed output read by a kernel per projection, its log-sum-exp found again and its dO stored in f32 (JDT_NORM_FOLDS=0 JDT_GELU_EPILOGUE=0 JDT_RESIDUAL_GEMM=0 JDT_FUSED_XENT=0 JDT_ATTENTION_COPY=0 JDT_ATTENTION_GRADS=0 JDT_ATTENTION_LSE=0 JDT_ATTENTION_DOUT16=0): ${toks:-?} tok/s against ${JDT_TOKS:-?} with two-kernel norms, the GELU epilogue, the residual adds in the GEMMs, the fused classifier, the attention's copy, its backward's cotangent form and saved log-sum-exp (its kernels are not in the bundle's cache: NVRTC time counts)"
fi

# ---- 4t: stage 4 again with the heuristic's first GEMM algorithms, untimed ------------------
# (stage 4 runs the default, JDT_CUDA_AUTOTUNE=auto: each GEMM plan timed once on its first
# step, the picks remembered in the cache, so the later stages take them untimed)
if want 4t; then
gpt_args "$OUT/gpt2-untuned"
run_gpt gpt2-untuned JDT_CUDA_AUTOTUNE=0
say "stage 4t exit $rc, GEMMs on cuBLASLt's heuristic's first algorithm, untimed (JDT_CUDA_AUTOTUNE=0): ${toks:-?} tok/s against ${JDT_TOKS:-?} with stage 4's picks ($(grep -c 'cuBLASLt algorithm [0-9]* of [0-9]*,' "$OUT/gpt2.log") of its plans timed there left the first$(grep -q 'algorithms timed before' "$OUT/gpt2.log" && echo '; it also took picks remembered from an earlier run'))"
fi

# ---- 4g (not in the default STAGES): stage 4 again with the logits' rows back to back ----------
if want 4g; then
gpt_args "$OUT/gpt2-unpadded"
run_gpt gpt2-unpadded JDT_GEMM_PITCH=0
say "stage 4g exit $rc, logits and dlogits rows back to back (JDT_GEMM_PITCH=0: the lm-head GEMMs on 100514-byte rows): ${toks:-?} tok/s against ${JDT_TOKS:-?} with rows padded to 50304 values (its kernels are not in the bundle's cache: NVRTC time counts)"
fi

# ---- 4a (not in the default STAGES): stage 4 again with the linear layers' outputs in f32 ------
if want 4a; then
gpt_args "$OUT/gpt2-act32" f32
run_gpt gpt2-act32
say "stage 4a exit $rc, precision.activations f32: ${toks:-?} tok/s against ${JDT_TOKS:-?} with $GPT_ACT (its kernels are not in the bundle's cache: NVRTC time counts)"
fi

# ---- 4c: stage 4 again with the other attention (JDT_CUDNN_ATTENTION=0 or 1), then =fast -------
# dnn_run NAME MODE: stage 4's step with JDT_CUDNN_ATTENTION=MODE; cuDNN's own log of warnings
# and errors in $OUT/cudnn-NAME.log, its first reasons in the summary when cuDNN did not serve
dnn_run() {
  run_gpt "$1" JDT_CUDNN_ATTENTION="$2" CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG="$OUT/cudnn-$1.log"
  grep -E "cuDNN" "$OUT/$1.log" | head -6 | tee -a "$SUMMARY"
  if { [ "$rc" -ne 0 ] || grep -q "declined\|unavailable" "$OUT/$1.log"; } && [ -f "$OUT/cudnn-$1.log" ]; then
    grep -m12 -E "Error|Reason" "$OUT/cudnn-$1.log" | tee -a "$SUMMARY"
  fi
}
if want 4c; then
# the choice stage 4 did not keep: jdt-train's kernels where it kept cuDNN's, else cuDNN's
other=$([ "${ATT_PIN:-0}" = 0 ] && echo 1 || echo 0)
other_what=$([ "$other" = 0 ] && echo "on jdt-train's kernels" || echo "through cuDNN, deterministic")
gpt_args "$OUT/gpt2-att$other"
dnn_run "gpt2-att$other" "$other"
say "stage 4c exit $rc, the attention $other_what (JDT_CUDNN_ATTENTION=$other): ${toks:-?} tok/s against stage 4's ${JDT_TOKS:-?} (JDT_CUDNN_ATTENTION=auto: forward ${v_f:-not tried}, backward ${v_b:-not tried})"
dnn_mode=$other; dnn_toks=${toks:-0}
if want 4c; then
  gpt_args "$OUT/gpt2-cudnn-fast"
  dnn_run gpt2-cudnn-fast fast
  say "stage 4c exit $rc, the attention through cuDNN, dQ accumulated (JDT_CUDNN_ATTENTION=fast): ${toks:-?} tok/s"
  [ "$other" = 1 ] && [ "$rc" -eq 0 ] && awk -v a="${toks:-0}" -v b="$dnn_toks" 'BEGIN { exit !(a > b) }' && dnn_mode=fast
fi
if [ $((BUDGET - ($(date +%s) - t_all))) -ge 40 ]; then
  gpt_args "$OUT/gpt2-cudnn-prof"
  (cd "$ROOT" && JDT_CUDNN_ATTENTION=$dnn_mode timeout "$(tmo)" "$BIN" "${GPT[@]}" run.steps=5 \
     run.profile=true run.profile_steps=3 >"$OUT/gpt2-cudnn-prof.log" 2>&1); rc=$?
  sed -n '/profile of the compiled step/,/^[^ 0-9Gf]/p' "$OUT/gpt2-cudnn-prof.log" | grep -v '^step ' |
    grep -E "profile of|total|attention|colsum" | tee -a "$SUMMARY"
  say "stage 4c profile (JDT_CUDNN_ATTENTION=$dnn_mode) exit $rc (its attention rows against stage 4p's, which ran stage 4's choice)"
fi
fi

# ---- 4w: stage 4 again with the block-per-row norms (JDT_NORM_WARPS=0) --------------------------
if want 4w; then
gpt_args "$OUT/gpt2-normblocks"
run_gpt gpt2-normblocks JDT_NORM_WARPS=0
say "stage 4w exit $rc, the layer norms a block per row (JDT_NORM_WARPS=0, before Session 31): ${toks:-?} tok/s against ${JDT_TOKS:-?} a warp per row"
fi

# ---- 4x (not in the default STAGES): stage 4 again with the two-pass classifier --------------
if want 4x; then
gpt_args "$OUT/gpt2-xent2"
run_gpt gpt2-xent2 JDT_XENT_SMEM=0
say "stage 4x exit $rc, the fused classifier reading each row twice (JDT_XENT_SMEM=0, before Session 32): ${toks:-?} tok/s against ${JDT_TOKS:-?} with rows staged in shared memory"
fi

# ---- 4d: stage 4 again with the accumulating dX GEMMs (JDT_NORM_DY_TERMS=0) ----------------
if want 4d; then
gpt_args "$OUT/gpt2-dyacc"
run_gpt gpt2-dyacc JDT_NORM_DY_TERMS=0
say "stage 4d exit $rc, the q, k, v dX GEMMs accumulating in f32 (JDT_NORM_DY_TERMS=0, before Session 33): ${toks:-?} tok/s against ${JDT_TOKS:-?} with ln1's backward adding their bf16 products"
fi

# ---- 4s (not in the default STAGES): stage 4 again with unaligned GEMMs run whole ---------------
if want 4s; then
gpt_args "$OUT/gpt2-nosplit"
run_gpt gpt2-nosplit JDT_GEMM_SPLIT=0
say "stage 4s exit $rc, unaligned GEMMs as one cuBLASLt call each (JDT_GEMM_SPLIT=0: the lm head's N, K and M = 50257): ${toks:-?} tok/s against ${JDT_TOKS:-?} split into an aligned bulk and a remainder"
fi

# ---- gm (not in the default STAGES): cuBLAS on the lm head's GEMMs, vocabulary aligned or not ----
if want gm; then
say "stage gm: torch (cuBLAS, eager) on the lm head's GEMMs at M=$((B * GPT_SEQ)) C=768, V = 50257 and aligned (scripts/bench/gemm_peer_gpu.py)"
GM_ARGS="--device cuda"; [ "$REHEARSE" = 1 ] && GM_ARGS="--device cpu --tokens 256 --channels 64 --vocab 501,504 --reps 2"
# shellcheck disable=SC2086 # GM_ARGS: one argument per word
PYTHONUNBUFFERED=1 timeout "$(tmo)" "${PEER_PY:-python3}" "$ROOT/scripts/bench/gemm_peer_gpu.py" \
  --tokens $((B * GPT_SEQ)) $GM_ARGS >"$OUT/gemm-peer.log" 2>&1; rc=$?
grep -E '^\{' "$OUT/gemm-peer.log" | tee -a "$SUMMARY"
[ "$rc" -eq 0 ] || tail -3 "$OUT/gemm-peer.log" | tee -a "$SUMMARY"
say "stage gm exit $rc"
fi

# ---- nc: Nsight Compute on the attention kernels of stage 4's step -----------------------------
# at B=8 (the same blocks, fewer waves; kernel replay restores the whole arena per pass): two
# forward launches, then the first backward's dQ, dK/dV and the next dQ. ncu's own clock
# control is off (the card's clocks as found). smsp__inst_executed.sum is each kernel's
# executed warp instructions: docs/perf.md (Session 31) predicts them from the SASS
# (scripts/bench/attention_sass.py), and this checks the prediction.
if want nc; then
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -z "$NCU" ] || [ "$REHEARSE" = 1 ]; then
  say "stage nc skipped: ${NCU:-no ncu here}${NCU:+ (the emulator has no counters)}"
else
  # ncu_kernels RUN_DIR KERNEL_REGEX SKIP COUNT LOG LINES: profile COUNT launches of the kernels
  # matching KERNEL_REGEX after SKIP of them, in a one-step run of its own directory (a run
  # directory already used would resume from its checkpoint), and copy into the summary the
  # kernel lines and metrics (LINES: the kernel-name pattern, and any metric particular to it)
  ncu_kernels() {
    gpt_args "$1"
    # jdt-train's attention kernels (no cuDNN trial under the profiler)
    (cd "$ROOT" && JDT_CUDNN_ATTENTION=0 timeout "$(tmo)" "$NCU" --clock-control none --kernel-name "regex:$2" \
       --launch-skip "$3" --launch-count "$4" --section SpeedOfLight --section Occupancy \
       --section LaunchStats --section WarpStateStats --section ComputeWorkloadAnalysis \
       --section MemoryWorkloadAnalysis --metrics smsp__inst_executed.sum "$BIN" "${GPT[@]}" data.batch_size=8 data.micro_batch_size=8 \
       run.steps=1 >"$OUT/$5" 2>&1); rc=$?
    grep -E "$6|Duration|smsp__inst_executed.sum|SM Active Cycles|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Executed Ipc Active|Issue Slots Busy|Warp Cycles Per Issued" \
      "$OUT/$5" | tee -a "$SUMMARY"
  }
  say "stage nc: $NCU on the attention kernels (B=8, launches 11-15 of cuk_att_tc*)"
  ncu_kernels "$OUT/gpt2-ncu" cuk_att_tc 10 5 ncu-att.log "^  cuk_att|Block Limit Registers"
  say "stage nc exit $rc"
  # the layer norms' backward (Session 31's warp-per-row kernel unless JDT_NORM_WARPS=0): is it
  # bound by memory now? launches 3-4 of the step's norm backwards
  say "stage nc: $NCU on the norm backwards (B=8, launches 3-4 of *normalize_bwd_part*)"
  ncu_kernels "$OUT/gpt2-ncu-norm" normalize_bwd_part 2 2 ncu-norm.log "^  cuk_.*normalize|DRAM Throughput"
  say "stage nc (norms) exit $rc"
fi
fi

# ---- 4l: stage 4 again with the loss in 8 sequence slices (last of the default stages on one GPU:
# the others measure the Goal's step) --------------------------------------------------------------
if want 4l; then
GPT_EXTRA_4=$GPT_EXTRA
GPT_EXTRA="$GPT_EXTRA runtime.loss_chunks=8"
gpt_args "$OUT/gpt2-slices"
run_gpt gpt2-slices
GPT_EXTRA=$GPT_EXTRA_4
l_dev=$(grep -E "step [0-9]+/[0-9]+ \| loss" "$OUT/gpt2-slices.log" | tail -1 | sed -nE 's/.*peak device ([0-9]+) MB.*/\1/p')
say "stage 4l exit $rc, the loss in 8 sequence slices (runtime.loss_chunks=8): ${toks:-?} tok/s and peak device ${l_dev:-?} MB against ${JDT_TOKS:-?} tok/s and ${JDT_DEV:-?} MB with the whole head (its kernels are not in the bundle's cache: NVRTC time counts)"
fi

# ---- 6: more than one GPU -------------------------------------------------------------------------
if want 6; then
n_gpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "$REHEARSE" = 1 ] && n_gpu=$JDT_CUDAEMU_DEVICES
if [ "${n_gpu:-0}" -lt 2 ]; then
  say "stage 6 multi-GPU: skipped: ${n_gpu:-0} GPU(s) here; NCCL refuses two ranks on one GPU, so the NCCL all-reduce / all-gather / reduce-scatter paths need a machine with 2+ GPUs"
else
  say "stage 6 multi-GPU: tiny on 2 GPUs vs 2 CPU ranks (mesh.data=2, mesh.fsdp=2)"
  for mesh in "mesh.data=2 mesh.fsdp=1" "mesh.data=1 mesh.fsdp=2"; do
    tag=$(echo "$mesh" | tr ' =.' '__-')
    for be in cpu cuda cuda-blocking; do
      extra=""; [ "$be" = cuda-blocking ] && extra="runtime.overlap_comm=false"
      (cd "$ROOT" && timeout "$(tmo)" "$BIN" --nproc 2 configs/tiny.yaml run.out_dir="$OUT/multi-$be-$tag" \
         run.steps=20 run.eval_every=0 checkpoint.every=0 runtime.backend=${be%-blocking} $extra $mesh \
         >"$OUT/multi-$be-$tag.log" 2>&1)
      echo "  $mesh $be: exit $?" | tee -a "$SUMMARY"
      grep -m1 "communication " "$OUT/multi-$be-$tag.log" | sed 's/^/    /' | tee -a "$SUMMARY"
    done
    python3 - "$OUT/multi-cpu-$tag/tiny/metrics.jsonl" "$OUT/multi-cuda-$tag/tiny/metrics.jsonl" "$mesh" \
      "$OUT/multi-cuda-blocking-$tag/tiny/metrics.jsonl" <<'PY' 2>&1 | tee -a "$SUMMARY"
import json, sys
def losses(p): return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
c, g, b = losses(sys.argv[1]), losses(sys.argv[2]), losses(sys.argv[4])
def rel(x, y): return abs(x - y) / abs(x) if x == x and y == y else float("inf")  # NaN: no match
d = max(map(rel, c, g), default=float("inf")) if len(c) == len(g) else float("inf")
print(f"multi {sys.argv[3]}: cpu {c[0]:.4f} -> {c[-1]:.4f}, cuda {g[0]:.4f} -> {g[-1]:.4f}, "
      f"max relative difference {d:.2e} -> {'MATCH' if d < 5e-3 else 'DIFFER'}; "
      f"overlapped vs blocking NCCL: {'BITWISE' if g == b else 'DIFFER'}")
PY
  done
fi
fi

say "done in $(( $(date +%s) - t_all ))s; logs in $OUT"
if [ -n "${RESULTS:-}" ]; then
  # the device tool brings back up to 9 files: summary.txt, the 6 logs below, the peers' logs
  # (and cuDNN's attention's: stage 4c's runs, cuDNN's own logs) in one file and stage 4p's
  # Chrome trace (every step of 3 profiled steps, for ui.perfetto.dev)
  for f in check_cuk.log check_cuda.log gpt2.log gpt2-prof.log ncu-att.log ncu-norm.log; do
    if [ -f "$OUT/$f" ]; then tail -c 2000000 "$OUT/$f" > "$RESULTS/$f"; fi
  done
  for f in "$OUT"/peer-*.log "$OUT"/gemm-peer.log "$OUT"/tiny-cuda-bf16.log "$OUT"/gpt2-att[01].log \
           "$OUT"/gpt2-cudnn-fast.log "$OUT"/gpt2-cudnn-prof.log "$OUT"/cudnn-*.log; do
    [ -f "$f" ] && { echo "==== $(basename "$f")"; tail -c 1000000 "$f"; }
  done > "$RESULTS/peers.log"
  tr=$(ls "$OUT"/gpt2-prof/*/trace.rank0.json 2>/dev/null | head -1)
  if [ -n "$tr" ] && [ "$(stat -c %s "$tr")" -lt 15000000 ]; then
    cp "$tr" "$RESULTS/gpt2-prof.trace.json"
  fi
fi
exit 0 # the stages report their own failures in the summary
