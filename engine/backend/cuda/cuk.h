/*
 * cuk.h — the CUDA backend's hand-written kernels: GEMMs through cuBLASLt (TF32 tensor cores
 * for f32), the fused primitives of the IR (softmax family, cross-entropy, layer/RMS
 * normalisation, rope, gather/scatter, concat, flash-style causal attention) compiled at run
 * time by NVRTC from the .cu files of engine/backend/cuda/kernels, and NCCL collectives (libnccl
 * loaded with dlopen on first use). The CUDA backend's run loop calls these for every non-fusible
 * node.
 *
 * Conventions: every pointer below is a device pointer; every kernel is queued on the one
 * compute stream of the context (no synchronisation, no allocation: scratch comes from the
 * caller). Shapes and semantics are those of the jdt_rt_* function of the same name in
 * engine/runtime/runtime.h (f32 data, i32 indices). The void launchers cannot fail
 * synchronously: a launch error (or an unsupported shape) is kept in the context and returned
 * by the next jdt_cuk_check. No CUDA header is needed to include this file.
 * Contract with branch `cuda`: /work/briefs/cuk-interface.md (signatures are fixed).
 */
#ifndef JDT_CUK_H
#define JDT_CUK_H

#include "core/core.h"

typedef struct jdt_cuk jdt_cuk; /* per process: device, one compute stream, cuBLASLt handle and
                                   workspace, the NVRTC-compiled builtin kernels */

/* Selects CUDA device `device` (cudaSetDevice), creates the stream, the cuBLASLt handle and its
 * 32 MiB workspace, and loads one small builtin kernel source (a working NVRTC and driver);
 * every other source is compiled with NVRTC for the device's architecture at the first launch
 * of one of its kernels (or loaded from the on-disk cache under cache_dir, keyed by source +
 * NVRTC version + arch; NULL cache_dir: no cache; jdt_cuk_load). No GPU or no driver:
 * ERR_UNSUPPORTED; any other CUDA/NVRTC/cuBLASLt failure: ERR_RUNTIME-class status (ERR_INTERNAL,
 * ERR_COMPILE, ERR_NOMEM) with one line naming the failing call and its error string. *out owned by
 * the caller (jdt_cuk_free). */
jdt_status jdt_cuk_init(int device, const char *cache_dir, jdt_cuk **out, jdt_err *e);
/* Synchronises the stream, then releases everything. NULL is a no-op. */
void jdt_cuk_free(jdt_cuk *k);
/* Loads the source of builtin kernel `kernel` (a jdt_cuk_kernel, cuk-impl.h) and every kernel it
 * defines, unless loaded: from the cache, else compiled by NVRTC (logged: seconds to a minute).
 * A launcher calls it at its kernel's first launch and defers its failure to jdt_cuk_check. */
jdt_status jdt_cuk_load(jdt_cuk *k, int kernel, jdt_err *e);
/* Loads every builtin source now (tests; a warm-up). */
jdt_status jdt_cuk_load_all(jdt_cuk *k, jdt_err *e);
/* How many builtin sources are loaded. */
int jdt_cuk_n_loaded(const jdt_cuk *k);
/* Bytes of the cuBLASLt workspace jdt_cuk_init allocates (device memory accounting). */
#define JDT_CUK_WORKSPACE_BYTES (32ll << 20)
/* The cudaStream_t every call below is queued on. */
void *jdt_cuk_stream(jdt_cuk *k);
/* Compute capability * 10 of the device, e.g. 90. */
int jdt_cuk_arch(const jdt_cuk *k);
/* The first error since the last check: a launcher's recorded failure, else an asynchronous
 * CUDA error (cudaGetLastError; with sync also cudaStreamSynchronize), as one message
 * "<what>: <cuda error string>". JDT_OK when none. A sticky CUDA error (illegal address) leaves
 * the context unusable: the caller should free it and stop. */
jdt_status jdt_cuk_check(jdt_cuk *k, const char *what, bool sync, jdt_err *e);

/* Builtin kernel sources, as bits for jdt_cuk_precompile: the small ones every run loads
 * (misc, rows), and the two attentions. */
#define JDT_CUK_SRC_BASE 1u
#define JDT_CUK_SRC_ATT_FMA 2u
#define JDT_CUK_SRC_ATT_TC 4u
/* The attention source (JDT_CUK_SRC_ATT_*) that jdt_cuk_attention and its backward launch on a
 * GPU of compute capability arch for head size D with or without bf16 compute (the tensor-core
 * kernels for bf16, D <= 128, sm_80+, unless JDT_CUK_ATTENTION=fma). */
unsigned jdt_cuk_attention_sources(int arch, bool bf16, int64_t D);
/* NVRTC only (no GPU or driver needed): compiles the builtin sources in `sources` for a GPU of
 * compute capability arch (the target jdt_cuk_init picks for it) into the compile cache under
 * cache_dir, under the keys jdt_cuk_load looks up, so a run on such a GPU loads them without
 * NVRTC (NULL or "": compiled and discarded, a compile check). Sources already cached are not
 * compiled again. Adds to *n_built (compiled now) and *n_cached (found). ERR_UNSUPPORTED for an
 * arch older than NVRTC supports; ERR_COMPILE with the NVRTC log; ERR_IO when an entry it
 * compiled was not stored. */
jdt_status jdt_cuk_precompile(int arch, const char *cache_dir, unsigned sources, int *n_built,
                              int *n_cached, jdt_err *e);

/* c = a @ b (+ bias) (+ acc), shapes as jdt_rt_matmul: a (batch, M, K) or (batch, K, M) if ta;
 * b (batch|1, K, N) or (batch|1, N, K) if tb; c (batch, M, N); bias (N) or NULL; acc (batch, M,
 * N) or NULL (cuBLASLt's C with beta 1, may be c itself: the compiler's fold_addends).
 * cuBLASLt with TF32 tensor cores (f32 in/out, f32 accumulate), the bias added by the GEMM's
 * epilogue; plans (layouts + chosen algorithm) are cached per shape in the context. A single
 * matrix (batch 1 after folding) whose N or K is not a multiple of 4 (8 for bf16) runs as an
 * aligned bulk plus the remainder (cuk_gemm.c gemm; unless JDT_GEMM_SPLIT=0 was set when k was
 * made): a K remainder adds its terms separately, so the sums' order differs from one GEMM's.
 * ERR_INVALID for a dimension over INT32_MAX rows/leading dimension; ERR_INTERNAL naming the
 * cuBLASLt status. */
jdt_status jdt_cuk_matmul(jdt_cuk *k, const float *a, const float *b, const float *bias,
                          const float *acc, float *c, int64_t batch, int64_t M, int64_t N,
                          int64_t K, bool ta, bool tb, bool b_shared, jdt_err *e);

/* GEMM autotuning, JDT_CUDA_AUTOTUNE in the environment when k was made: auto (unset: the
 * default) or 1. Each GEMM plan asks cuBLASLt's heuristic for up to 8 algorithms and, at the
 * first call whose running twice gives the same result (not accumulating in place, no bias rows
 * filled first, no DGELU over its own input), times each on that call's operands and keeps the
 * fastest: the heuristic's first unless another is over 3% faster. The pick is remembered in
 * k's kernel cache ("gemmpick", keyed by the binary, the GPU, the driver's, NVRTC's and
 * cuBLASLt's versions and the plan), and with auto a later context takes it untimed; 1 times
 * every plan again; 0 takes the heuristic's first untimed. A first run's numbers depend on the
 * timing, which varies between runs; later runs on the same GPU and software take the same
 * algorithms.
 * *timed: plans timed so far; *changed: those that took another algorithm than the first. */
void jdt_cuk_gemm_tuning(const jdt_cuk *k, int *timed, int *changed);

/* The row strides (elements) of a, b and c for the next jdt_cuk_matmul, jdt_cuk_matmul_bf16_ex
 * or jdt_cuk_matmul_bf16_out call only, each 0 for rows back to back (padded rows: fuse.c
 * mark_pitched_rows). That call takes them, a single matrix (batch 1, or a batch folded into M
 * over a shared b) with its pitched operands read in place (f32 compute, or stored as bf16), or
 * fails with ERR_INTERNAL; the other GEMM entry points fail while any is pending. */
void jdt_cuk_gemm_pitch(jdt_cuk *k, int64_t lda, int64_t ldb, int64_t ldc);

/* jdt_cuk_matmul with bf16 compute (MATMUL attrs i[2], precision.compute: bf16), the meaning of
 * jdt_rt_matmul_bf16: a and b rounded to bf16 (nearest even) by a conversion kernel into
 * scratch (device memory of scratch_bytes >= jdt_cuk_matmul_bf16_scratch_bytes: the bf16
 * copies, a's first), then a bf16 x bf16 GEMM with f32 accumulation (CUBLAS_COMPUTE_32F), f32
 * bias and output. Where cuBLASLt has no bf16 algorithm for the shape/alignment, the inputs are
 * rounded into f32 copies instead (the scratch has room for them) and multiplied with TF32
 * tensor cores: a bf16 value is exact in TF32, so the products are the same. a and b are not
 * modified. Errors as jdt_cuk_matmul; ERR_INTERNAL when the scratch is smaller than the bf16
 * copies (2 bytes per input element). */
int64_t jdt_cuk_matmul_bf16_scratch_bytes(int64_t batch, int64_t M, int64_t N, int64_t K,
                                          bool b_shared);
/* The scratch a bf16 GEMM needs: the bf16 copies of its f32 operands (b's 16-byte aligned
 * after a's); 0 when a_bf16 and b_bf16. What the compiler plans. The TF32 fallback (an f32
 * output without padded rows, where cuBLASLt has no bf16 algorithm) uses the scratch when it
 * holds jdt_cuk_matmul_bf16_scratch_bytes, else allocates its copies for the call
 * (cudaMallocAsync on the stream, freed after the GEMM; ERR_NOMEM naming the GEMM when that
 * fails). */
int64_t jdt_cuk_matmul_bf16_need_bytes(int64_t batch, int64_t M, int64_t N, int64_t K,
                                       bool b_shared, bool a_bf16, bool b_bf16);
jdt_status jdt_cuk_matmul_bf16(jdt_cuk *k, const float *a, const float *b, const float *bias,
                               float *c, int64_t batch, int64_t M, int64_t N, int64_t K, bool ta,
                               bool tb, bool b_shared, void *scratch, int64_t scratch_bytes,
                               jdt_err *e);
/* jdt_cuk_matmul_bf16 where a (a_bf16) and/or b (b_bf16) are already stored as bf16 bit patterns
 * (uint16_t, the compiler's bf16 storage): cuBLASLt reads them directly, no conversion pass;
 * only an f32 operand is converted into the scratch. The TF32 fallback widens a bf16 operand
 * (exact). acc as jdt_cuk_matmul's. Same scratch size as jdt_cuk_matmul_bf16. */
jdt_status jdt_cuk_matmul_bf16_ex(jdt_cuk *k, const void *a, const void *b, const float *bias,
                                  const float *acc, float *c, int64_t batch, int64_t M, int64_t N,
                                  int64_t K, bool ta, bool tb, bool b_shared, bool a_bf16,
                                  bool b_bf16, void *scratch, int64_t scratch_bytes, jdt_err *e);
/* jdt_cuk_matmul_bf16_ex storing c as bf16 bit patterns (the f32 accumulator plus the bias,
 * rounded to nearest even once): a GEMM whose output the compiler folded a bf16 CAST into
 * (precision.activations: bf16; passes.c fold_bf16_casts). bias: bf16 bit patterns (N) or NULL
 * (cuBLASLt's bias has the output's type). No TF32 fallback: should cuBLASLt have no bf16
 * algorithm for the shape, ERR_INTERNAL naming it. */
jdt_status jdt_cuk_matmul_bf16_out(jdt_cuk *k, const void *a, const void *b, const uint16_t *bias,
                                   uint16_t *c, int64_t batch, int64_t M, int64_t N, int64_t K,
                                   bool ta, bool tb, bool b_shared, bool a_bf16, bool b_bf16,
                                   void *scratch, int64_t scratch_bytes, jdt_err *e);
/* jdt_cuk_matmul_bf16_out with cuBLASLt's GELU epilogue (passes.c fold_gelu_epilogues): pre
 * (M, N, bf16) = a @ b + bias, y (M, N, bf16) = GELU(a @ b + bias) (tanh form) from the f32
 * value, one pass over the output (CUBLASLT_EPILOGUE_GELU_AUX_BIAS, pre the aux matrix). Where
 * cuBLASLt has no such algorithm (or the batch is not 1, or N not a multiple of 8), the plain
 * GEMM writes pre and jdt_cuk_gelu_bf16 y from it: GELU of the rounded pre, the CPU's order. */
jdt_status jdt_cuk_matmul_bf16_gelu(jdt_cuk *k, const void *a, const void *b, const uint16_t *bias,
                                    uint16_t *y, uint16_t *pre, int64_t batch, int64_t M, int64_t N,
                                    int64_t K, bool ta, bool tb, bool b_shared, bool a_bf16,
                                    bool b_bf16, void *scratch, int64_t scratch_bytes, jdt_err *e);
/* The GELU backward's GEMM (passes.c fold_dgelu_epilogues): dx (M, N, bf16) = (a @ b) *
 * GELU'(pre), pre (M, N, bf16) the forward's GELU input, from the f32 product
 * (CUBLASLT_EPILOGUE_DGELU, pre the aux matrix). Fallback as jdt_cuk_matmul_bf16_gelu's: the
 * bf16 GEMM into dx, then jdt_cuk_dgelu_bf16 in place (the product rounded first). With dbias
 * (N, f32; NULL: none) also dbias = the column sums of dx over the batch's M rows, the bias
 * gradient, by the same GEMM (CUBLASLT_EPILOGUE_DGELU_BGRAD with an f32 bias type: the sums of
 * the f32 values before their rounding); where cuBLASLt has no such algorithm, the DGELU path
 * above, then jdt_cuk_colsum_bf16 of the rounded dx. */
jdt_status jdt_cuk_matmul_bf16_dgelu(jdt_cuk *k, const void *a, const void *b, const uint16_t *pre,
                                     uint16_t *dx, float *dbias, int64_t batch, int64_t M,
                                     int64_t N, int64_t K, bool ta, bool tb, bool b_shared,
                                     bool a_bf16, bool b_bf16, void *scratch, int64_t scratch_bytes,
                                     jdt_err *e);
/* y (n, bf16) = GELU (tanh form) of x (n, bf16), rounded to nearest even. */
void jdt_cuk_gelu_bf16(jdt_cuk *k, const uint16_t *x, uint16_t *y, int64_t n);
/* g (n, bf16) *= GELU'(u) (u: n bf16), in place, rounded to nearest even. */
void jdt_cuk_dgelu_bf16(jdt_cuk *k, const uint16_t *u, uint16_t *g, int64_t n);
/* y (N, f32) = the column sums of x (rows, N, bf16), each summed in f32 in one fixed order
 * that depends on the shape alone (deterministic): chunks of JDT_CUK_COLSUM_CHUNK rows (more
 * when (rows / chunk) * N * 4 bytes would pass the GEMM workspace, whose memory holds the
 * chunks' sums), in each every 8th row from r0 + w summed for w < 8, those 8 sums added in
 * order, then the chunks in order (kernels/cuk_misc.cu). Uses the GEMM workspace. */
#define JDT_CUK_COLSUM_CHUNK 512
void jdt_cuk_colsum_bf16(jdt_cuk *k, const uint16_t *x, float *y, int64_t rows, int64_t N);

/* y (n, bf16 bit patterns) = x (n) rounded to bf16: nearest even, NaN stays NaN, overflow
 * gives Inf (bitwise jdt_bf16_round). */
void jdt_cuk_to_bf16(jdt_cuk *k, const float *x, uint16_t *y, int64_t n);
/* y (n) = x rounded to bf16, kept as f32 (bitwise jdt_bf16_round). */
void jdt_cuk_bf16_round(jdt_cuk *k, const float *x, float *y, int64_t n);
/* y (n, f32) = x (n, bf16 bit patterns) widened (exact). */
void jdt_cuk_bf16_widen(jdt_cuk *k, const uint16_t *x, float *y, int64_t n);

/* out (n, C) = table (V, C) rows idx (n); out-of-range indices give zero rows (not counted: the
 * device cannot return a count without a synchronisation). */
void jdt_cuk_gather(jdt_cuk *k, const float *table, const int32_t *idx, float *out, int64_t n,
                    int64_t V, int64_t C);
/* out (V, C) = 0; out[idx[i]] += src[i] (float atomics: summation order of duplicate indices is
 * not deterministic); out-of-range indices skipped. */
void jdt_cuk_scatter_add(jdt_cuk *k, const float *src, const int32_t *idx, float *out, int64_t n,
                         int64_t V, int64_t C);

/* Row kernels over (N, C), one block per row. */
void jdt_cuk_softmax(jdt_cuk *k, const float *x, float *y, int64_t N, int64_t C);
void jdt_cuk_softmax_bwd(jdt_cuk *k, const float *y, const float *dy, float *dx, int64_t N,
                         int64_t C);
void jdt_cuk_log_softmax(jdt_cuk *k, const float *x, float *y, int64_t N, int64_t C);
void jdt_cuk_log_softmax_bwd(jdt_cuk *k, const float *y, const float *dy, float *dx, int64_t N,
                             int64_t C);
/* loss (N) = logsumexp(row) - row[target]; target < 0 -> 0; target >= V -> NaN. The logits are
 * f32, or bf16 bit patterns with logits_bf16 (precision.activations: bf16; widened exactly),
 * their rows ldx elements apart (ldx >= V; 0: V), as the cross-entropy functions below take
 * them, which write dlogits rows ldd apart (0: V): padded rows, fuse.c mark_pitched_rows. */
void jdt_cuk_softmax_xent(jdt_cuk *k, const void *logits, bool logits_bf16, const int32_t *tgt,
                          float *loss, int64_t N, int64_t V, int64_t ldx);
/* dlogits (N, V) = dloss * (softmax(row) - onehot(target)); rows with target out of range: 0.
 * loss: the forward's per-row loss of these logits and targets (jdt_cuk_softmax_xent's output)
 * or NULL; with it each row is read once (its logsumexp is loss + row[target]), without it
 * twice. logits as above. */
void jdt_cuk_softmax_xent_bwd(jdt_cuk *k, const void *logits, bool logits_bf16, const int32_t *tgt,
                              const float *dloss, const float *loss, float *dlogits, int64_t N,
                              int64_t V, int64_t ldx, int64_t ldd);
/* The same, dlogits stored as bf16 bit patterns (rounded to nearest even): the compiler's bf16
 * storage of a value only bf16 GEMMs read (jdt_rt_softmax_xent_bwd_bf16). */
void jdt_cuk_softmax_xent_bwd_bf16(jdt_cuk *k, const void *logits, bool logits_bf16,
                                   const int32_t *tgt, const float *dloss, const float *loss,
                                   uint16_t *dlogits, int64_t N, int64_t V, int64_t ldx,
                                   int64_t ldd);
/* llm.c's fused classifier (passes.c fold_xent_backwards): loss as jdt_cuk_softmax_xent's and
 * dlogits = g * (softmax(row) - onehot(target)) as jdt_cuk_softmax_xent_bwd's for a dloss of g
 * in every row, the row's logsumexp found once (the backward half reads the row again while it
 * is in cache). dlogits f32, or bf16 bit patterns (nearest even) with dlogits_bf16; logits as
 * above. */
void jdt_cuk_softmax_xent_fused(jdt_cuk *k, const void *logits, bool logits_bf16,
                                const int32_t *tgt, float g, float *loss, void *dlogits,
                                bool dlogits_bf16, int64_t N, int64_t V, int64_t ldx, int64_t ldd);
void jdt_cuk_normalize(jdt_cuk *k, const float *x, float *y, int64_t N, int64_t C, float eps);
/* The norms' backwards: dx from x and the normalised value's cotangent dxhat = dy * w, w (C)
 * the norm's scale, or dxhat = dy when w is NULL (jdt_rt_normalize_bwd's semantics then). */
void jdt_cuk_normalize_bwd(jdt_cuk *k, const float *x, const float *dy, const float *w, float *dx,
                           int64_t N, int64_t C, float eps);
void jdt_cuk_rms_normalize(jdt_cuk *k, const float *x, float *y, int64_t N, int64_t C, float eps);
void jdt_cuk_rms_normalize_bwd(jdt_cuk *k, const float *x, const float *dy, const float *w,
                               float *dx, int64_t N, int64_t C, float eps);
/* The norms with their affine: y = xhat * w + b per column (b NULL: no shift), xhat what
 * jdt_cuk_normalize / jdt_cuk_rms_normalize (rms) store; y f32, or bf16 bit patterns (rounded
 * to nearest even) when y_bf16 (passes.c fold_norm_affines). */
void jdt_cuk_normalize_affine(jdt_cuk *k, bool rms, const float *x, const float *w, const float *b,
                              void *y, bool y_bf16, int64_t N, int64_t C, float eps);
/* The norm backwards with w (not NULL) that also sum the affine's gradients: dx as above, plus
 * acc (N, C) when not NULL (passes.c folds the residual add that reads dx), and pw, pb (P, C):
 * row p the column sums of dy * xhat and of dy over the rows [p R, min(N, (p + 1) R)), R =
 * ceil(N / P) (zeros for an empty range), xhat the normalised x (rms: x * rstd). Their column
 * sums over the P rows are the gradients of the norm's scale and shift (passes.c
 * fold_norm_partials). pg (P, C), when not NULL: the same block sums of the output dx (+ acc);
 * dx16 (N, C), when not NULL: the output's bf16 copy (bit patterns, nearest even) (passes.c
 * fold_norm_cotangents). dy f32, or bf16 bit patterns with dy_bf16 (passes.c fold_norm_dy16),
 * widened exactly. dy2 and dy3, when not NULL (dy3 only with dy2), are more terms of dy of its
 * type: the kernel reads dy + dy2 + dy3, added in f32 in that order (passes.c
 * fold_norm_dy_terms). Needs 1 <= P and C <= JDT_CUK_NORM_PART_MAX_C. */
void jdt_cuk_normalize_bwd_part(jdt_cuk *k, const float *x, const void *dy, bool dy_bf16,
                                const void *dy2, const void *dy3, const float *w, const float *acc,
                                float *dx, float *pw, float *pb, float *pg, uint16_t *dx16,
                                int64_t N, int64_t C, int64_t P, float eps);
void jdt_cuk_rms_normalize_bwd_part(jdt_cuk *k, const float *x, const void *dy, bool dy_bf16,
                                    const void *dy2, const void *dy3, const float *w,
                                    const float *acc, float *dx, float *pw, float *pb, float *pg,
                                    uint16_t *dx16, int64_t N, int64_t C, int64_t P, float eps);
/* The widest row the _part kernels take: 8 columns per thread (their sums live in registers,
 * cuk_rows.cu CUK_PART_MAX) of at most 1024 threads. */
#define JDT_CUK_NORM_PART_MAX_C 8192

/* y (B, T, H, D) = rotary embedding of x (see jdt_rt_rope; sc: its frequency scaling or NULL).
 * D must be even. x16: x holds bf16
 * values; y16: y is stored as bf16 (rounded to nearest even); otherwise f32. x_bhtd: x is
 * stored in (B, H, T, D) order (the attention backward's dq or dk: passes.c
 * fold_rope_transposes), else as y. */
void jdt_cuk_rope(jdt_cuk *k, const void *x, void *y, bool x16, bool y16, bool x_bhtd, int64_t B,
                  int64_t T, int64_t H, int64_t D, double theta, const double *sc, bool inverse);

/* Concatenation along an axis: inputs viewed as (outer, len_i*inner) rows, copied into out with
 * one strided device-to-device copy per input. `in` and `len` are host arrays (of device
 * pointers / lengths); any element size. */
void jdt_cuk_concat(jdt_cuk *k, const float *const *in, const int64_t *len, int n_in, float *out,
                    int64_t outer, int64_t inner, size_t elem_bytes);

/* The collectives' block order (jdt_permute_blocks_f32 on the device): a tensor viewed as
 * (outer, k, blk) <-> the wire's (k, outer, blk). to_outer: src is (k, outer, blk), dst
 * (outer, k, blk); else the reverse. src and dst must not overlap. k strided copies on the
 * stream (cudaMemcpy2DAsync); failures deferred to jdt_cuk_check. */
void jdt_cuk_permute_blocks(jdt_cuk *k, const float *src, float *dst, int64_t n_blocks,
                            int64_t outer, int64_t blk, bool to_outer);
/* The same for blocks of blk_bytes bytes (any element type: a bf16 all-gather). */
void jdt_cuk_permute_blocks_bytes(jdt_cuk *k, const void *src, void *dst, int64_t n_blocks,
                                  int64_t outer, int64_t blk_bytes, bool to_outer);
/* A collective bucket's wire (compile-impl.h, ccoll): n_parts segments of seg_bytes, segment r
 * holding, at off_bytes, part r of member x, a tensor viewed as (outer, n_parts, blk) with
 * blocks of blk_bytes; part r is x's blocks (o, r, :) for every o, side by side. get: the parts
 * from the wire into x, else x's parts onto the wire. x and the wire must not overlap. One
 * strided copy (outer = 1) or one per part on the stream; failures deferred to jdt_cuk_check. */
void jdt_cuk_wire_bytes(jdt_cuk *k, void *x, void *wire, int64_t n_parts, int64_t outer,
                        int64_t blk_bytes, int64_t seg_bytes, int64_t off_bytes, bool get);

/* Grouped-query attention: bits 8 and up of the attention calls' bthd hold G, the query heads
 * sharing one key/value head (0 or 1: every head its own). k and v then have Hk = H / G heads
 * ((B, Hk, T, D), or (B, T, Hk, D) per their bthd bits), query head h reading head h / G; dk and
 * dv are (B, Hk, T, D), each the sum over its group's query heads, at the start of dqkv's
 * second and third n elements; copies (B, T, Hk, D); the partial sums (P, H D) for dq, then
 * (P, Hk D) for dk and for dv. H must be a multiple of G. cuDNN serves it (cuk_cudnn.c),
 * those partial sums included. */
#define JDT_CUK_ATT_GROUP(bthd) ((bthd) >> 8 ? (int64_t)((bthd) >> 8) : (int64_t)1)

/* Causal attention, q k v o (B, H, T, D); bthd as in jdt_rt_attention (bit i: input i stored
 * (B, T, H, D); backward: o = bit 3, dout = bit 4; G above in bits 8 and up). Head size D <= 256 (a
 * larger D records ERR_UNSUPPORTED for jdt_cuk_check). bf16: jdt_rt_attention's bf16 compute (the
 * products' inputs rounded to bf16, f32 accumulation), on tensor cores
 * (kernels/cuk_attention_tc.cu) when D <= 128 and the GPU is sm_80 or newer; otherwise, and without
 * bf16, the f32 FMA kernels (kernels/cuk_attention.cu; with bf16 they skip the rounding: f32
 * products). scratch: device memory of jdt_cuk_attention_scratch_bytes bytes, 16-byte aligned
 * (unused by the forward; the backward keeps the row log-sum-exp and dO.O there and, on tensor
 * cores, dO rounded to bf16 and, where the dK/dV kernel splits its key tiles over several blocks,
 * their counts and sums); G the query heads per key/value head (JDT_CUK_ATT_GROUP; 1 none). */
int64_t jdt_cuk_attention_scratch_bytes(int64_t B, int64_t H, int64_t T, int64_t D, int64_t G);
/* q, kk, v: f32, or bf16 bit patterns with qkv_bf16 (a bf16 GEMM stored them as bf16:
 * precision.activations: bf16, passes.c fold_bf16_casts; the _b kernels, which read the bits as
 * they are, so with bf16 compute the results are those of f32 inputs holding the same values);
 * o (NULL: not stored, below), dout (unless dout_bf16, below) and the outputs are f32. o2, when not
 * NULL: a second copy of o in (B, T, H, D) order, bf16 bit patterns (nearest even) with o2_bf16,
 * else f32 (passes.c fold_attention_copies: the projection's GEMM operand, which a transpose kernel
 * would otherwise make from o). lse, when not NULL: each query row's log-sum-exp of its scaled
 * causal scores (B, H, T), f32, for the backward (passes.c fold_attention_lse). */
void jdt_cuk_attention(jdt_cuk *k, const void *q, const void *kk, const void *v, bool qkv_bf16,
                       float *o, void *o2, bool o2_bf16, float *lse, int64_t B, int64_t H,
                       int64_t T, int64_t D, float scale, unsigned bthd, bool bf16, void *scratch);
/* Rows per partial column sum of the backward's cotangent form (below). */
#define JDT_CUK_ATT_PART 32
/* The largest head size of the tensor-core attention kernels (kernels/cuk_attention_tc.cu). */
#define JDT_CUK_ATT_TC_MAX_D 128

/* The backward's cotangent form (passes.c fold_attention_cotangents): what the q, k and v
 * projections' backward reads of dq, dk and dv, written by the attention's kernels instead of
 * made from the packed f32 output by a kernel per projection. */
typedef struct {
    void *copy[3];        /* dq, dk, dv in (B, T, H, D) order (the GEMMs' operand), or NULL */
    bool copy_bf16[3];    /* bf16 bit patterns (nearest even), else f32 */
    double rope_theta[3]; /* not 0: the copy is rotated as jdt_cuk_rope with this theta would
                             rotate the value (Llama's RoPE backward on dq and dk) */
    bool rope_inverse[3]; /* that rotation by minus the angle (RoPE's backward) */
    float *part;          /* (3, P, H D), P = B ceil(T / JDT_CUK_ATT_PART): the column sums of
                             dq, dk, dv viewed as (B T, H D) over each JDT_CUK_ATT_PART rows of a
                             sequence (the bias gradients' partials), of the f32 values the
                             copies round (rotated where the copy is: Qwen2's q, k), or NULL;
                             grouped-query (JDT_CUK_ATT_GROUP): (P, H D) for dq, then (P, Hk D)
                             each for dk and dv */
} jdt_cuk_att_grads;

/* dqkv (3, B, H, T, D) = (dq, dk, dv); recomputes the softmax (three kernels, deterministic:
 * no float atomics; a split dK/dV's blocks meet at an integer count, cuk.c att_dkv_split).
 * With g, also (or, when dqkv is NULL, only) g's outputs: the same values, each copy the f32
 * value or its bf16 rounding, bit for bit; each partial the f32 sum of its rows. lse, when not
 * NULL, is the forward's (jdt_cuk_attention on the same q, k, scale and bf16): the dQ kernel
 * forms the row statistics with it and the statistics kernel, a pass over the keys, does not
 * run (the same floats, so the same results). */
void jdt_cuk_attention_bwd(jdt_cuk *k, const void *q, const void *kk, const void *v, bool qkv_bf16,
                           const void *o, bool o_bf16, const void *dout, bool dout_bf16,
                           const float *lse, float *dqkv, const jdt_cuk_att_grads *g, int64_t B,
                           int64_t H, int64_t T, int64_t D, float scale, unsigned bthd, bool bf16,
                           void *scratch);
/* The largest head size for which, on a GPU of compute capability arch, jdt_cuk_attention_bwd
 * takes dout (dout_bf16) and then also o (o_bf16) as bf16 bit patterns and jdt_cuk_attention
 * stores no o (o NULL, its copy o2 only), given bf16 compute, bf16 q, k, v and a scale > 0:
 * the tensor-core kernels' (the _bg and _bgo kernels: the products read those bits as they
 * are, delta = dO . O sums the widened values); 0 where they do not serve (before sm_80,
 * JDT_CUK_ATTENTION=fma). Elsewhere those record ERR_INTERNAL for jdt_cuk_check. */
int64_t jdt_cuk_attention_dout16_d(int arch);

/* ---- cuDNN's fused attention (cuk_cudnn.c) ---------------------------------------------- */

/* Why cuDNN of version version (cudnnGetVersion's number) must not run a causal attention
 * (bwd: its backward) over T positions, or NULL when it may: versions and shapes cudnn-frontend
 * refuses or patches with a padding mask, which jdt-train's graphs do not build. */
const char *jdt_cuk_dnn_refusal(size_t version, bool bwd, int64_t T);

/* jdt_cuk_attention through cuDNN's fused-attention engine (libcudnn.so.9 loaded at the first
 * call: JDT_CUDNN_LIBRARY names it, else the loader's search and /usr/local/cuda/lib): q, kk, v
 * bf16, stored as bthd says (bits 0-2; grouped-query as JDT_CUK_ATT_GROUP says); o2 the output,
 * bf16 (B, T, H, D); lse as there or NULL.
 * Queues it and returns true, or returns false and the caller runs its kernels: cuDNN missing,
 * a version or shape jdt_cuk_dnn_refusal names, no engine taking the shape (logged once per
 * shape), or cuDNN refusing to run the plan (a warning; the shape is declined from then on). An
 * error its kernels raise later is the stream's, for jdt_cuk_check. */
bool jdt_cuk_dnn_attention(jdt_cuk *k, const void *q, const void *kk, const void *v, void *o2,
                           float *lse, int64_t B, int64_t H, int64_t T, int64_t D, float scale,
                           unsigned bthd);
/* jdt_cuk_attention_bwd's cotangent form through cuDNN: q, kk, v, o, dout bf16 (bthd bits 0-4,
 * the group above), lse the forward's; g's three copies bf16 (B, T, H, D), dk's and dv's with
 * H / G heads and no partial sums when grouped, a rotated one (RoPE's backward) rotated
 * in place after cuDNN wrote it (so rounded to bf16 twice), and its partial sums (T a multiple of
 * JDT_CUK_ATT_PART) the column sums of the copies' bf16 values before any rotation. scratch: at
 * least B H T floats (the row sums of dO . O). The same return and errors as above. */
bool jdt_cuk_dnn_attention_bwd(jdt_cuk *k, const void *q, const void *kk, const void *v,
                               const void *o, const void *dout, const float *lse,
                               const jdt_cuk_att_grads *g, int64_t B, int64_t H, int64_t T,
                               int64_t D, float scale, unsigned bthd, void *scratch);
/* JDT_CUDNN_ATTENTION=auto (the default): jdt_cuk_dnn_attention and its backward, chosen per
 * call shape (B, H, T, D, bthd, and the outputs asked for) by a trial at its first call. The
 * trial runs jdt-train's kernels into the call's outputs and cuDNN into memory of its own
 * (stream-ordered, outside the memory plan), times both (the best of three each, after one
 * untimed), and compares every output: cuDNN is kept for the shape when no output differs by
 * more than 2% of its largest value (the log-sum-exp: 1e-4 + 0.2% of each value), none is NaN,
 * and it is at least 3% faster; its outputs then replace ours for this call. Each verdict is
 * one info line (a disagreement a warning, naming the output); where every verdict so far is
 * ours, cuDNN's plans and memory are released. A settled verdict is kept in the kernel cache
 * (k's cache_dir; kind "attpick", keyed by the binary's build ID, the GPU, cuDNN's version and
 * the shape), and a later context takes it from there without a trial. The trial waits for the
 * stream. Returns true when the outputs were written (queued) here, false when the caller runs
 * its kernels: the shape's verdict was ours, or cuDNN declines it (then it is ours from then
 * on). */
bool jdt_cuk_dnn_attention_auto(jdt_cuk *k, const void *q, const void *kk, const void *v, void *o2,
                                float *lse, int64_t B, int64_t H, int64_t T, int64_t D, float scale,
                                unsigned bthd, void *scratch);
bool jdt_cuk_dnn_attention_bwd_auto(jdt_cuk *k, const void *q, const void *kk, const void *v,
                                    const void *o, const void *dout, const float *lse,
                                    const jdt_cuk_att_grads *g, int64_t B, int64_t H, int64_t T,
                                    int64_t D, float scale, unsigned bthd, void *scratch);
/* Builds the forward (with the log-sum-exp when stats) or backward graph (accum: dQ in an f32
 * accumulator, JDT_CUDNN_ATTENTION=fast's form) of that shape for an
 * H200 described to cuDNN (no GPU needed: cuDNN 9.8 or newer), picks an engine and finalizes
 * its plan, as the GPU run would. JDT_OK with info = the engine, its workspace and whether it
 * is deterministic; ERR_UNSUPPORTED when cuDNN cannot be loaded or is too old, or no engine
 * takes the graph (the message says which). */
jdt_status jdt_cuk_dnn_check_offline(bool bwd, bool stats, bool accum, int64_t B, int64_t H,
                                     int64_t T, int64_t D, unsigned bthd, char *info, size_t n,
                                     jdt_err *e);

/* ---- NCCL collectives --------------------------------------------------------------------- */

struct jdt_dist;
typedef struct jdt_cuk_comm jdt_cuk_comm;

/* A communicator over `ranks` (n_ranks global ranks, in ring order; the caller is one of them).
 * Collective over those ranks: each calls it with the same ranks and key, in the same order as
 * its other communicator creations. The lowest-listed rank makes the NCCL unique id and
 * publishes it in the rendezvous KV store under "cuk/nccl/<key>"; the others wait for it
 * (600 s at most). libnccl.so.2 is loaded on the first call: missing gives ERR_UNSUPPORTED.
 * NCCL failures: ERR_NET with ncclGetErrorString. Owned by the caller (jdt_cuk_comm_free). */
jdt_status jdt_cuk_comm_init(jdt_cuk *k, struct jdt_dist *d, const int *ranks, int n_ranks,
                             const char *key, jdt_cuk_comm **out, jdt_err *e);
/* Destroys the communicator: its collectives waited for (polled, 60 s at most) and finalized,
 * or aborted if it had failed or they do not finish. NULL is a no-op. A communicator that fails
 * anywhere (an NCCL error, a lost peer, a timeout) aborts every live communicator of its
 * context with it: they share one stream. */
void jdt_cuk_comm_free(jdt_cuk_comm *c);
/* In-place sum (average: divided by the group size) of buf (n floats) over the group. Queued on
 * the communicator's own stream, ordered after the compute stream's work so far; the compute
 * stream's later work waits for it (events), so the caller need not synchronise. Returns after
 * queuing; a peer failure shows up in a later call or jdt_cuk_comm_poll. Every member must call
 * it in the same order with the same n. */
jdt_status jdt_cuk_allreduce(jdt_cuk_comm *c, float *buf, int64_t n, bool average, jdt_err *e);
/* In-place maximum of buf (n floats) over the group; ordering as jdt_cuk_allreduce. */
jdt_status jdt_cuk_allreduce_max(jdt_cuk_comm *c, float *buf, int64_t n, jdt_err *e);
/* recv (n_ranks * n_per_rank) = every member's send (n_per_rank) in group order (ncclAllGather);
 * recv must not overlap send unless send is recv's own slot. Ordering as jdt_cuk_allreduce. */
jdt_status jdt_cuk_allgather(jdt_cuk_comm *c, const float *send, float *recv, int64_t n_per_rank,
                             jdt_err *e);
/* recv (n_per_rank) = slot <group index> of the sum (average: / group size) of every member's
 * send (n_ranks * n_per_rank) (ncclReduceScatter); recv must not overlap send unless it is
 * send's own slot. Ordering as jdt_cuk_allreduce. */
jdt_status jdt_cuk_reduce_scatter(jdt_cuk_comm *c, const float *send, float *recv,
                                  int64_t n_per_rank, bool average, jdt_err *e);
/* ---- started collectives (the CUDA backend's STEP_COLL_START / STEP_COLL_WAIT) --------------
 * A jdt_cuk_coll holds the events of one collective in flight: start queues it on the
 * communicator's stream behind an event recorded on the compute stream (so it sees the compute
 * stream's work so far, the packed buffer) and records `done` after it; compute work queued
 * after the start runs alongside it. wait makes the compute stream wait for `done` (the host
 * does not block). Between start and wait, send and recv belong to NCCL: the caller must not
 * touch them (the memory plan keeps them reserved). Every member calls start in the same order
 * with the same kind and count. The events are timed: jdt_cuk_coll_times gives how long the NCCL
 * work ran and how long the compute stream stalled at the wait. */
typedef struct jdt_cuk_coll jdt_cuk_coll;
typedef enum {
    JDT_CUK_ALLREDUCE,      /* recv (n) = op over the group of send (n); send may be recv */
    JDT_CUK_ALLGATHER,      /* recv (size * n) = every member's send (n) in group order */
    JDT_CUK_REDUCE_SCATTER, /* recv (n) = slot <index> of op over the group of send (size * n) */
    JDT_CUK_ALLGATHER_BF16  /* JDT_CUK_ALLGATHER of bf16 elements (ncclBfloat16: 2 bytes each) */
} jdt_cuk_coll_kind;
typedef enum { JDT_CUK_SUM, JDT_CUK_AVG, JDT_CUK_MAX } jdt_cuk_redop;
/* Events for one collective in flight (cudaEventCreate, timing on). ERR_INTERNAL naming the
 * CUDA error. Owned by the caller (jdt_cuk_coll_free; NULL is a no-op). */
jdt_status jdt_cuk_coll_new(jdt_cuk *k, jdt_cuk_coll **out, jdt_err *e);
void jdt_cuk_coll_free(jdt_cuk_coll *t);
/* Queues the collective on c's stream after the compute stream's work so far and returns at
 * once (polling c for asynchronous errors first). n: elements per rank for the gather and the
 * scatter (send count / receive count), the buffer length for the all-reduce; MAX is for the
 * all-reduce only. A start of t whose previous start was not waited is ERR_INTERNAL. Errors:
 * ERR_NET / ERR_PEER_LOST naming the communicator (it is aborted), ERR_INTERNAL for CUDA. */
jdt_status jdt_cuk_coll_start(jdt_cuk_comm *c, jdt_cuk_coll *t, jdt_cuk_coll_kind kind,
                              jdt_cuk_redop op, const void *send, void *recv, int64_t n,
                              jdt_err *e);
/* Makes the compute stream's later work wait for t's collective (no host wait), then polls c
 * (ncclCommGetAsyncError and the rendezvous's lost-peer signal): a dead peer found here is
 * ERR_PEER_LOST naming the rank, the communicator aborted. A wait without a start is
 * ERR_INTERNAL. */
jdt_status jdt_cuk_coll_wait(jdt_cuk_comm *c, jdt_cuk_coll *t, jdt_err *e);
/* When t's last start/wait pair has finished on the device and was not counted yet: adds the
 * NCCL stream's time from the collective's start to its end (*moving_s: waiting for peers
 * included) and the compute stream's stall at the wait (*waited_s), and returns true. Never
 * blocks: false while the work is unfinished (or nothing was started). */
bool jdt_cuk_coll_times(jdt_cuk_coll *t, double *waited_s, double *moving_s);

/* Number of ranks in the communicator. */
int jdt_cuk_comm_size(const jdt_cuk_comm *c);
/* This rank's index in the communicator's rank list (its slot in gathers and scatters). */
int jdt_cuk_comm_index(const jdt_cuk_comm *c);
/* Polls the communicator's asynchronous error (ncclCommGetAsyncError) and the rendezvous
 * (jdt_dist_check); on a failure aborts the communicator and returns ERR_PEER_LOST/ERR_NET
 * naming it. Cheap; never blocks. */
jdt_status jdt_cuk_comm_poll(jdt_cuk_comm *c, jdt_err *e);
/* Waits for every collective queued on c, polling for asynchronous errors (and the
 * rendezvous's lost-peer signal) instead of blocking inside NCCL, for at most timeout_s. */
jdt_status jdt_cuk_comm_sync(jdt_cuk_comm *c, double timeout_s, jdt_err *e);

#endif /* JDT_CUK_H */
