/*
 * runtime.h — the CPU backend's hand-written kernels: GEMMs through OpenBLAS, and the fused
 * primitives of the IR (softmax family, cross-entropy, layer/RMS normalisation, rope,
 * gather/scatter, concat and the tiled causal attention with an online softmax). The compiled
 * program (engine/compile) calls these for every non-fusible node; generated loop nests cover
 * the rest.
 *
 * Conventions: all tensors are contiguous row-major f32 (indices i32); shapes are passed as
 * flattened sizes. `nt` is the thread budget for the call (OpenMP over the outer dimension).
 * Kernels never allocate: scratch comes from the caller (sized by the *_scratch_floats
 * functions). Dimension letters: N rows, C row length, V vocab/table rows, B, H, T, D.
 */
#ifndef JDT_RUNTIME_H
#define JDT_RUNTIME_H

#include "core/core.h"

/* Prepares the process-wide GEMM library for a program run on up to nt threads: OpenBLAS is
 * kept single-threaded, since jdt_rt_matmul shares a GEMM's tiles among the nt threads itself
 * (generated kernels and the functions below take `nt` explicitly), and the calling thread's
 * OpenMP teams are not shrunk by the runtime (omp_set_dynamic(0): OMP_DYNAMIC is overridden).
 * Call before a program run (another program may have changed the setting), not concurrently
 * with a GEMM. */
void jdt_rt_set_threads(int nt);

/* The OPENBLAS_CORETYPE to force (a process must set it before OpenBLAS loads: cmd/main.c
 * re-executes itself), or NULL when OpenBLAS's choice is to be kept. A DYNAMIC_ARCH OpenBLAS
 * that does not know a CPU model falls back to pre-AVX2 kernels ("Prescott", SSE3): Debian
 * 12's 0.3.21 does so on Sapphire Rapids, where its SGEMM then runs 4-5x slower (docs/perf.md,
 * "OpenBLAS on CPUs it does not know"). jdt_rt_blas_core_for is the decision on given inputs:
 * `detected` a core name, avx2_fma (AVX2 and FMA) and avx512 (AVX-512 F, CD, BW, DQ, VL) the
 * CPU's features; jdt_rt_blas_core_fix asks OpenBLAS and the CPU. Only a core without AVX2
 * kernels on a CPU with AVX2 is replaced: "SkylakeX" with AVX-512, else "Haswell". */
const char *jdt_rt_blas_core_for(const char *detected, bool avx2_fma, bool avx512);
/* The kernels OpenBLAS runs in this process ("SkylakeX", ...; "unknown" if it does not say). */
const char *jdt_rt_blas_core(void);
const char *jdt_rt_blas_core_fix(void);

/* The adaptive thread count (engine/runtime/threads.c). On a machine where another process
 * keeps a core busy, a team of n threads splits every parallel loop and GEMM evenly while one
 * thread gets a fraction of a core, and every region waits for it: 1 thread can then be faster
 * than n. The tuner is fed the wall time of every run of one program and answers how many
 * threads the next run should use: the budget n, or 1. After JDT_RT_TUNER_WARMUP runs it
 * times JDT_RT_TUNER_FIRST_RUNS runs of the current choice (k before later probes, so the first
 * decision comes early), then probes: k runs of the other count alternating with k runs of the
 * current one (so a change of load hits both), stopping at once when the
 * first probe run is JDT_RT_TUNER_ABORT x slower than the runs before, or when after
 * JDT_RT_TUNER_EARLY_RUNS runs a side the other count's median is JDT_RT_TUNER_EARLY_LOSS
 * slower than the current one's (a probe that is losing costs 3 slow runs, not 8); it switches
 * at that point when the other count is JDT_RT_TUNER_EARLY_WIN faster, and otherwise when the
 * probe's median run is faster than the current choice's median in the same stretch by at least
 * JDT_RT_TUNER_HYST_DOWN (a switch to 1 thread) or JDT_RT_TUNER_HYST_UP (back to n). The
 * thresholds are hysteresis (a tie never flips the choice back and forth) and lopsided: 1 thread
 * that is as fast as n within noise wins, because it does the same work on a fraction of the CPU
 * (the core goes back to whoever keeps it busy). Probes recur every `probe_every` runs, the
 * interval doubling (up to 16x) each time the choice holds and resetting when it changes. Samples
 * per side: enough runs for JDT_RT_TUNER_PROBE_S seconds, 2..JDT_RT_TUNER_MAX_SAMPLES. Pure
 * bookkeeping (no clock, no threads): the caller times the runs. Not thread-safe; one tuner per
 * program. */
#define JDT_RT_TUNER_WARMUP 2
#define JDT_RT_TUNER_FIRST_RUNS 2
#define JDT_RT_TUNER_MAX_SAMPLES 8
#define JDT_RT_TUNER_PROBE_S 0.5
#define JDT_RT_TUNER_HYST_UP 0.05
#define JDT_RT_TUNER_HYST_DOWN 0.02
#define JDT_RT_TUNER_ABORT 1.25
#define JDT_RT_TUNER_EARLY_RUNS 3
#define JDT_RT_TUNER_EARLY_LOSS 0.05
#define JDT_RT_TUNER_EARLY_WIN 0.10
typedef struct {
    int max_threads;      /* n, the budget; <= 1: the tuner always answers 1 */
    int chosen;           /* the count that won the last comparison (starts at n) */
    int probe_every;      /* runs between probes after a change */
    int interval;         /* runs between probes now */
    int until_probe;      /* runs of `chosen` left before the next probe */
    int n_runs;           /* runs recorded */
    int n_probes;         /* probes started (for logs and tests) */
    bool probing;         /* a probe is under way */
    bool alt_next;        /* while probing: the next run uses the other count */
    int k;                /* samples per side of the current probe */
    int n_base;           /* run times of `chosen` in base[] (a ring, newest at (n_base-1) % MAX) */
    int n_probe, n_pbase; /* samples of this probe: the other count, the current one */
    double base[JDT_RT_TUNER_MAX_SAMPLES];
    double probe[JDT_RT_TUNER_MAX_SAMPLES];
    double pbase[JDT_RT_TUNER_MAX_SAMPLES];
    double last_base_s, last_probe_s; /* medians of the last completed comparison (for logs) */
} jdt_rt_tuner;

/* Starts a tuner for a budget of max_threads; probe_every <= 0 means 50 runs. */
void jdt_rt_tuner_init(jdt_rt_tuner *t, int max_threads, int probe_every);
/* The thread count the next run should use (max_threads or 1). */
int jdt_rt_tuner_threads(const jdt_rt_tuner *t);
/* Records the wall time of the run that just finished (run with jdt_rt_tuner_threads()).
 * Returns true when the choice changed (the caller logs it once); t->last_base_s and
 * t->last_probe_s then hold the medians it compared. */
bool jdt_rt_tuner_record(jdt_rt_tuner *t, double run_s);

/* c = a @ b (+ bias) for `batch` independent products. a (batch, M, K) or (batch, K, M) if ta;
 * b (batch|1, K, N) or (batch|1, N, K) if tb (b_shared: one b for every batch); c (batch, M, N);
 * bias (N) or NULL: added to every row (the GEMM accumulates onto rows initialised to it).
 * Accumulates in f32: each tile one single-threaded oneDNN matmul where jdt_rt_sgemm_dnnl_on(),
 * else cblas_sgemm. Runs on up to nt threads, which take output tiles one at a time; the tiling
 * depends on the shape only, so the result is bitwise the same for every nt. */
void jdt_rt_matmul(const float *a, const float *b, const float *bias, float *c, int64_t batch,
                   int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool b_shared, int nt);

/* f32 GEMM tiles through oneDNN (engine/runtime/sgemm_dnnl.c), which jdt_rt_matmul uses for its
 * tiles where jdt_rt_sgemm_dnnl_on(): a build with oneDNN whose f32 matmul on this CPU is its
 * AVX-512 brgemm, and JDT_SGEMM_NO_DNNL unset. jdt_rt_sgemm_dnnl_tile: the cached
 * single-threaded primitive for c (m, n; row stride ldc) = op(a) (lda) op(b) (ldb) (+ bias (n)),
 * created on first use by the calling thread; NULL when the path is off, oneDNN has no such
 * primitive or the cache is full (use OpenBLAS). jdt_rt_sgemm_dnnl_run: runs it on the calling
 * thread (any thread: each has its own stream and scratchpad); false on a oneDNN failure, c then
 * undefined. jdt_rt_sgemm_describe: one line naming the f32 GEMM path. jdt_rt_sgemm_peak_measure:
 * the best of n_rep 1024^3 jdt_rt_matmul products on nt threads, FLOP/s (the MFU reference where
 * jdt_rt_sgemm_dnnl_on()), and in *cores (may be NULL) how many cores the process held while
 * they ran (CPU seconds per wall second; more products than n_rep where they took under 0.2 s,
 * jdt_best_rate); 0 when out of memory. */
bool jdt_rt_sgemm_dnnl_on(void);
/* The tiles jdt_rt_matmul has run through OpenBLAS in this process (tests: none where oneDNN
 * serves every tile). */
int64_t jdt_rt_matmul_blas_tiles(void);
const char *jdt_rt_sgemm_describe(void);
const void *jdt_rt_sgemm_dnnl_tile(int64_t m, int64_t n, int64_t K, bool ta, bool tb, int64_t lda,
                                   int64_t ldb, int64_t ldc, bool bias);
bool jdt_rt_sgemm_dnnl_run(const void *tile, const float *a, const float *b, const float *bias,
                           float *c);
double jdt_rt_sgemm_peak_measure(int n_rep, int nt, double *cores);

/* bf16 compute (engine/runtime/bf16.c). jdt_rt_bf16_round: x rounded to the nearest bf16
 * (ties to even; NaN stays NaN, overflow gives Inf), returned as f32.
 * jdt_rt_matmul_bf16: jdt_rt_matmul with a and b rounded to bf16 first, f32 accumulation, f32
 * bias and output; scratch: jdt_rt_matmul_bf16_scratch_floats(...) floats (a, b are not
 * modified). oneDNN's bf16 matmul where jdt_rt_bf16_native() (a build with oneDNN on a CPU with
 * AVX512-BF16 whose bf16 products outrun its f32 FMAs: AMX or AMD, else only with
 * JDT_BF16_DNNL=1; never with JDT_BF16_NO_DNNL=1), else SGEMM on the rounded inputs (the same
 * products). nt: thread budget. jdt_rt_bf16_describe: one line naming the path, for the caller
 * to log once, as a warning where jdt_rt_bf16_warn (bf16 compute brings no speed-up here for
 * want of hardware, oneDNN or by JDT_BF16_NO_DNNL). */
float jdt_rt_bf16_round(float x);
bool jdt_rt_bf16_native(void);
bool jdt_rt_bf16_warn(void);
const char *jdt_rt_bf16_describe(void);
int64_t jdt_rt_matmul_bf16_scratch_floats(int64_t batch, int64_t M, int64_t N, int64_t K,
                                          bool b_shared);
void jdt_rt_matmul_bf16(const float *a, const float *b, const float *bias, float *c, int64_t batch,
                        int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool b_shared,
                        float *scratch, int nt);
/* The same product with operands that may already be stored as bf16 (a_bf16 / b_bf16: the
 * operand is uint16_t bf16 bits, as the compiler stores values read only by bf16 GEMMs;
 * otherwise f32). Such an operand needs no conversion: on the oneDNN path it is used in place,
 * transposed or not (oneDNN reads a transposed one by its strides), on the portable path it
 * is widened into the scratch. c_bf16: c (and the bias, which then has c's type) is bf16 bits,
 * the f32 sum rounded to nearest even once as it is stored (precision.activations: bf16, passes.c
 * fold_bf16_casts; oneDNN's kernels round as they store). The scratch is what
 * jdt_rt_matmul_bf16_scratch_bytes returns for the same arguments — computed on this host: the
 * oneDNN path needs 2 bytes per converted element, the portable path 4 per element and, for a bf16
 * c, 4 per element of c and of the bias. Same numbers as jdt_rt_matmul_bf16 on the bf16-rounded f32
 * operands. */
int64_t jdt_rt_matmul_bf16_scratch_bytes(int64_t batch, int64_t M, int64_t N, int64_t K,
                                         bool b_shared, bool a_bf16, bool b_bf16, bool c_bf16);
void jdt_rt_matmul_bf16_ex(const void *a, const void *b, const void *bias, void *c, int64_t batch,
                           int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool b_shared,
                           bool a_bf16, bool b_bf16, bool c_bf16, void *scratch, int nt);
/* The best of n_rep (after one warm-up) 1024^3 products of bf16 operands through
 * jdt_rt_matmul_bf16_ex on nt threads, FLOP/s: the MFU reference of precision.compute: bf16 where
 * jdt_rt_bf16_native(); *cores (may be NULL): the cores the process held, as
 * jdt_rt_sgemm_peak_measure. 0 when out of memory. */
double jdt_rt_bf16_peak_measure(int n_rep, int nt, double *cores);
/* bf16 storage: x rounded to the nearest bf16 (as jdt_rt_bf16_round), its 16 bits; and back. */
uint16_t jdt_rt_bf16_bits(float x);
float jdt_rt_bf16_float(uint16_t h);

/* out (n, C) = table (V, C) rows idx (n). Returns the number of out-of-range indices (their
 * rows are zero-filled); the caller reports them. */
int64_t jdt_rt_gather(const float *table, const int32_t *idx, float *out, int64_t n, int64_t V,
                      int64_t C, int nt);
/* out (V, C) = 0; out[idx[i]] += src[i] for i < n. Returns the number of out-of-range indices
 * (skipped). Serial over rows (duplicate indices), vectorised over C. */
int64_t jdt_rt_scatter_add(const float *src, const int32_t *idx, float *out, int64_t n, int64_t V,
                           int64_t C);
/* The same onto an initial value: out (V, C) = init; out[idx[i]] += src[i]. out may be init
 * (in place: nothing is copied). */
int64_t jdt_rt_scatter_add_into(const float *src, const int32_t *idx, const float *init, float *out,
                                int64_t n, int64_t V, int64_t C);

/* Row kernels over x (N, C). */
void jdt_rt_softmax(const float *x, float *y, int64_t N, int64_t C, int nt);
void jdt_rt_softmax_bwd(const float *y, const float *dy, float *dx, int64_t N, int64_t C, int nt);
void jdt_rt_log_softmax(const float *x, float *y, int64_t N, int64_t C, int nt);
void jdt_rt_log_softmax_bwd(const float *y, const float *dy, float *dx, int64_t N, int64_t C,
                            int nt);
/* loss (N) = logsumexp(logits row) - logits[target]; target < 0 -> 0. Returns the number of
 * targets >= V (loss set to NAN). */
int64_t jdt_rt_softmax_xent(const float *logits, const int32_t *tgt, float *loss, int64_t N,
                            int64_t V, int nt);
/* dlogits (N, V) = dloss * (softmax(row) - onehot(target)); rows with target < 0 or >= V are 0.
 * loss: the forward's per-row loss of these logits and targets (jdt_rt_softmax_xent's output),
 * or NULL. With it a row's logsumexp is loss + row[target] (no max and sum passes; within an
 * ulp or two of the computed one), without it it is computed. */
void jdt_rt_softmax_xent_bwd(const float *logits, const int32_t *tgt, const float *dloss,
                             const float *loss, float *dlogits, int64_t N, int64_t V, int nt);
/* The same, each value computed in f32 and stored rounded to bf16 (nearest even; uint16_t
 * bits): dlogits that only bf16 GEMMs read (the compiler's bf16 storage). */
void jdt_rt_softmax_xent_bwd_bf16(const float *logits, const int32_t *tgt, const float *dloss,
                                  const float *loss, uint16_t *dlogits, int64_t N, int64_t V,
                                  int nt);
/* Both, with the logits stored as f32 or (logits_bf16) as bf16 bits (uint16_t), and (the
 * backward) dlogits as f32 or bf16 bits: the results of f32 logits holding the same values, bit
 * for bit (precision.activations: bf16, whose lm head stores its logits rounded; passes.c
 * fold_bf16_casts then drops their widening). The backward reads each row's logits before it
 * writes its dlogits at the same index or later, so dlogits may lie over logits of the same
 * element size. */
int64_t jdt_rt_softmax_xent_ex(const void *logits, bool logits_bf16, const int32_t *tgt,
                               float *loss, int64_t N, int64_t V, int nt);
void jdt_rt_softmax_xent_bwd_ex(const void *logits, bool logits_bf16, const int32_t *tgt,
                                const float *dloss, const float *loss, void *dlogits,
                                bool dlogits_bf16, int64_t N, int64_t V, int nt);
/* llm.c's fused classifier (passes.c fold_xent_backwards): the loss of jdt_rt_softmax_xent_ex
 * and the dlogits of jdt_rt_softmax_xent_bwd_ex for a dloss of g in every row, each row's
 * logsumexp found once and its dlogits written while the row is in cache (dlogits may lie over
 * logits of the same element size). Returns the number of targets >= V. */
int64_t jdt_rt_softmax_xent_fused(const void *logits, bool logits_bf16, const int32_t *tgt, float g,
                                  float *loss, void *dlogits, bool dlogits_bf16, int64_t N,
                                  int64_t V, int nt);
void jdt_rt_normalize(const float *x, float *y, int64_t N, int64_t C, float eps, int nt);
void jdt_rt_normalize_bwd(const float *x, const float *dxhat, float *dx, int64_t N, int64_t C,
                          float eps, int nt);
void jdt_rt_rms_normalize(const float *x, float *y, int64_t N, int64_t C, float eps, int nt);
void jdt_rt_rms_normalize_bwd(const float *x, const float *dxhat, float *dx, int64_t N, int64_t C,
                              float eps, int nt);

/* y (B, T, H, D) = rotary embedding of x, pairs (2i, 2i+1), angle t * theta^(-2i/D) (scaled
 * by sc as jdt_rope_freq does; NULL: none), negated when inverse. D must be even. */
void jdt_rt_rope(const float *x, float *y, int64_t B, int64_t T, int64_t H, int64_t D, double theta,
                 const double *sc, bool inverse, int nt);

/* Copies `n_in` inputs into out along an axis: inputs viewed as (outer, len_i*inner). */
void jdt_rt_concat(const float *const *in, const int64_t *len, int n_in, float *out, int64_t outer,
                   int64_t inner, size_t elem_bytes);

/* Causal attention, q k v o (B, H, T, D). Softmax rows are exact per block of 64 queries (the
 * block's scores against its causal keys fit the scratch): no T x T matrix.
 * bthd: bit i set = input i (q, k, v; for the backward also o = bit 3, dout = bit 4) is stored
 * (B, T, H, D) instead (a head-major view read strided: no transpose copy). Outputs are always
 * (B, H, T, D). bf16: bf16 compute (precision.compute: bf16), every product's inputs (q, k, v,
 * dout, the probabilities, dS) rounded to bf16 and accumulated in f32 (jdt_rt_bf16_gemm_packed);
 * the softmax and dS stay f32. scratch: jdt_rt_attention_scratch_floats(D, T, nt, bf16) floats.
 * lse: NULL, or (B, H, T) floats that the forward fills with each query row's log-sum-exp of
 * its scaled causal scores (max + log of the sum of exp(s - max)) and the backward reads to
 * recompute the probabilities in one pass, exp(s - lse), instead of three (max, sum,
 * normalise); FlashAttention's saved statistics (passes.c fold_attention_lse).
 * JDT_RT_ATT_QKV_BF16 set in bthd: q, k and v are bf16 bits (uint16_t), all three
 * (precision.activations: bf16); the results are those of f32 inputs holding the same values,
 * bit for bit. The scratch then needs qkv_bf16 in its query (3 widened (T, D) slices a thread). */
#define JDT_RT_ATT_QKV_BF16 (1u << 8)
int64_t jdt_rt_attention_scratch_floats(int64_t D, int64_t T, int nt, bool bf16, bool qkv_bf16);
void jdt_rt_attention(const void *q, const void *k, const void *v, float *o, float *lse, int64_t B,
                      int64_t H, int64_t T, int64_t D, float scale, unsigned bthd, bool bf16,
                      float *scratch, int nt);
/* dqkv (3, B, H, T, D) = (dq, dk, dv) of the above; recomputes the softmax (from lse when not
 * NULL: the forward's). */
void jdt_rt_attention_bwd(const void *q, const void *k, const void *v, const float *o,
                          const float *lse, const float *dout, float *dqkv, int64_t B, int64_t H,
                          int64_t T, int64_t D, float scale, unsigned bthd, bool bf16,
                          float *scratch, int nt);

/* Small bf16 GEMMs for hand-written kernels (engine/runtime/gemm_bf16.c): inputs rounded to
 * bf16 (nearest even) while packed, f32 accumulation and result.
 * jdt_rt_bf16_pack_a: op(A) (M x K; A[i][k] = a[i * lda + k], or a[k * lda + i] when ta) into
 * pack (jdt_rt_bf16_pack_a_floats(M, K) floats of 4 bytes; its format is private).
 * jdt_rt_bf16_pack_b: op(B) (K x N; B[k][j] = b[k * ldb + j], or b[j * ldb + k] when tb) into pack
 * (jdt_rt_bf16_pack_b_floats(K, N)). jdt_rt_bf16_gemm_packed: C (M x N, row stride ldc) = alpha * A
 * B + beta * C (beta 0: C is not read), A an M x K pack, B a pack built with N = ldb_n columns and
 * at least K rows (a prefix of a larger B pack's rows and columns may be used). AMX tiles
 * (TDPBF16PS) where jdt_rt_bf16_tiles_amx() (the CPU has AMX-BF16, the kernel grants the tile
 * data, JDT_BF16_NO_AMX unset), else AVX512-BF16 (VDPBF16PS) where jdt_rt_bf16_tiles_native(),
 * else SGEMM on the rounded values (the same products; the pack formats differ, so packs are not
 * kept across processes). Single-threaded: callers parallelise over their own tiles. */
bool jdt_rt_bf16_tiles_native(void);
bool jdt_rt_bf16_tiles_amx(void);
/* The CPU has AMX-BF16 and AVX512-BF16 and the kernel granted this process the tile data
 * (whatever JDT_BF16_* say): oneDNN's bf16 matmul can take its tiles. */
bool jdt_rt_cpu_amx(void);
int64_t jdt_rt_bf16_pack_a_floats(int64_t M, int64_t K);
int64_t jdt_rt_bf16_pack_b_floats(int64_t K, int64_t N);
void jdt_rt_bf16_pack_a(const float *a, int64_t lda, bool ta, int64_t M, int64_t K, void *pack);
/* jdt_rt_bf16_pack_a of an untransposed A with row i multiplied by row_scale[i] (in f32, before
 * the rounding: the same pack as scaling the rows in place, then packing them). */
void jdt_rt_bf16_pack_a_scaled(const float *a, int64_t lda, int64_t M, int64_t K,
                               const float *row_scale, void *pack);
void jdt_rt_bf16_pack_b(const float *b, int64_t ldb, bool tb, int64_t K, int64_t N, void *pack);
void jdt_rt_bf16_gemm_packed(const void *apack, const void *bpack, int64_t ldb_n, int64_t M,
                             int64_t N, int64_t K, float alpha, float beta, float *c, int64_t ldc);

#endif /* JDT_RUNTIME_H */
