/*
 * kernels.c — hand-written CPU kernels for the IR's non-fusible ops (see runtime.h): OpenBLAS
 * GEMMs, gather/scatter, concat and the row kernels (softmax family, cross-entropy, norms,
 * rope). Rows are independent, so every row kernel is an OpenMP loop over rows with
 * vectorisable inner loops (`omp simd` reductions: no fast-math needed).
 * Attention lives in attention.c.
 */
#include "runtime/runtime.h"
#include "runtime/runtime-impl.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#define PAR_MIN_WORK                                                                               \
    32768 /* below this many elements a parallel region costs more than it saves                   \
           */

void jdt_rt_set_threads(int nt)
{
    (void)nt;
    openblas_set_num_threads(1); /* jdt_rt_matmul's tiles are the parallelism */
    /* the teams are as large as asked: OMP_DYNAMIC=true shrinks them by the load average,
     * which counts this process's own threads (the benchmark GPT's bf16 step at 7083 against
     * 10477 tok/s on 2 CPUs); runtime.adaptive_threads is the answer to a busy machine */
    omp_set_dynamic(0);
}

const char *jdt_rt_blas_core(void)
{
    const char *c = openblas_get_corename();
    return c && *c ? c : "unknown";
}

const char *jdt_rt_blas_core_for(const char *detected, bool avx2_fma, bool avx512)
{
    /* OpenBLAS's x86-64 cores whose SGEMM kernels predate AVX2 (its fallbacks among them) */
    static const char *const old[] = {"Prescott",    "Core2",  "Penryn",      "Dunnington",
                                      "Nehalem",     "Atom",   "Sandybridge", "Barcelona",
                                      "Opteron",     "Bobcat", "Bulldozer",   "Piledriver",
                                      "Steamroller", "Katmai", "Coppermine",  "Northwood"};
    if (!detected || !avx2_fma) return NULL;
    for (size_t i = 0; i < sizeof old / sizeof old[0]; i++)
        if (strncmp(detected, old[i], strlen(old[i])) == 0) return avx512 ? "SkylakeX" : "Haswell";
    return NULL;
}

const char *jdt_rt_blas_core_fix(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
                        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                        __builtin_cpu_supports("avx512vl");
    return jdt_rt_blas_core_for(openblas_get_corename(), avx2_fma, avx512);
#else
    return NULL;
#endif
}

/* A GEMM's output cut into tiles that the threads take one at a time (schedule(dynamic)), each
 * tile a single-threaded SGEMM over all of K. Why: OpenBLAS's own threads split a GEMM evenly,
 * so when the OS gives one thread half a core (another process on it) the whole GEMM waits for
 * it; with tiles, a thread that runs slower simply takes fewer (docs/compiler.md, Threads). The
 * tiling depends on the shape only, never on the thread count, and every output element is one
 * SGEMM's dot product over all of K, so the result is bitwise the same for any thread count
 * and any order the tiles are taken in (the adaptive thread count may change it mid-run). */
#define TILE_MIN_FLOPS (1 << 24) /* below this a GEMM is one tile; docs/perf.md, Busy machines */
#define TILE_MAX 8               /* tiles per GEMM: each one re-packs the operand it shares */
#define TILE_ALIGN 16            /* rows/columns per tile: a multiple of the micro-kernels' */

typedef struct {
    int64_t n_tiles, step; /* tiles along the split dimension, rows/columns per tile */
    bool split_n;          /* split the columns (N) rather than the rows (M) */
} gemm_tiling;

static gemm_tiling tiling_for(int64_t M, int64_t N, int64_t K)
{
    gemm_tiling t = {1, M, false};
    double flops = 2.0 * (double)M * (double)N * (double)K;
    if (flops < (double)TILE_MIN_FLOPS) return t;
    t.split_n = N > M; /* cut the longer side: each tile re-packs the other operand */
    int64_t len = t.split_n ? N : M;
    int64_t n = (int64_t)(flops / (double)TILE_MIN_FLOPS);
    n = n < TILE_MAX ? n : TILE_MAX;
    if (n > len / TILE_ALIGN) n = len / TILE_ALIGN;
    if (n < 1) n = 1;
    t.step = (len + n - 1) / n;
    t.step = (t.step + TILE_ALIGN - 1) / TILE_ALIGN * TILE_ALIGN;
    t.n_tiles = (len + t.step - 1) / t.step;
    return t;
}

static int64_t g_blas_tiles; /* tiles run through OpenBLAS (jdt_rt_matmul_blas_tiles) */

int64_t jdt_rt_matmul_blas_tiles(void)
{
    return __atomic_load_n(&g_blas_tiles, __ATOMIC_RELAXED);
}

/* One tile of jdt_rt_matmul through OpenBLAS: c (m, n; row stride ldc) = bias + op(a) op(b). */
static void tile_sgemm(const float *a, const float *b, const float *bias, float *c, int64_t m,
                       int64_t n, int64_t K, bool ta, bool tb, int64_t lda, int64_t ldb,
                       int64_t ldc)
{
    __atomic_add_fetch(&g_blas_tiles, 1, __ATOMIC_RELAXED);
    if (bias)
        for (int64_t r = 0; r < m; r++)
            memcpy(c + r * ldc, bias, (size_t)n * sizeof(float));
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)m, (int)n, (int)K, 1.0f, a, (int)lda, b, (int)ldb, bias ? 1.0f : 0.0f, c,
                (int)ldc);
}

/* The oneDNN primitive of a tile of len rows (columns when t splits N) of an (Mg, N, K) GEMM. */
static const void *dnnl_tile(const gemm_tiling *t, int64_t len, int64_t Mg, int64_t N, int64_t K,
                             bool ta, bool tb, bool bias)
{
    return jdt_rt_sgemm_dnnl_tile(t->split_n ? Mg : len, t->split_n ? len : N, K, ta, tb,
                                  ta ? Mg : K, tb ? K : N, N, bias);
}

void jdt_rt_matmul(const float *a, const float *b, const float *bias, float *c, int64_t batch,
                   int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool b_shared, int nt)
{
    if (M == 0 || N == 0) return;
    if (K == 0) {
        for (int64_t r = 0; r < batch * M; r++)
            if (bias)
                memcpy(c + r * N, bias, (size_t)N * sizeof(float));
            else
                memset(c + r * N, 0, (size_t)N * sizeof(float));
        return;
    }
    int64_t lda = ta ? M : K, ldb = tb ? K : N;
    /* A shared b and a row-major, untransposed a: the batch folds into M (one big GEMM). */
    int64_t Mg = M, nb = batch;
    if (b_shared && !ta) Mg = batch * M, nb = 1;
    gemm_tiling t = tiling_for(Mg, N, K);
    int64_t n_jobs = nb * t.n_tiles;
    /* the oneDNN primitives of the full tiles [0] and of the last one [1], made here, run by any
     * thread (none: every tile on OpenBLAS) */
    const void *dt[2] = {NULL, NULL};
    if (jdt_rt_sgemm_dnnl_on()) {
        dt[1] = dnnl_tile(&t, (t.split_n ? N : Mg) - (t.n_tiles - 1) * t.step, Mg, N, K, ta, tb,
                          bias != NULL);
        dt[0] = t.n_tiles > 1 ? dnnl_tile(&t, t.step, Mg, N, K, ta, tb, bias != NULL) : dt[1];
        if (!dt[0] || !dt[1]) dt[0] = dt[1] = NULL;
    }
#pragma omp parallel for num_threads(nt > 0 ? nt : 1) schedule(dynamic, 1) if (nt > 1 && n_jobs > 1)
    for (int64_t job = 0; job < n_jobs; job++) {
        int64_t i = job / t.n_tiles, k = job % t.n_tiles, lo = k * t.step;
        const float *ai = a + (nb > 1 ? i * M * K : 0);
        const float *bi = b + (b_shared ? 0 : i * K * N);
        const float *bs = bias;
        float *ci = c + (nb > 1 ? i * M * N : 0);
        int64_t m = Mg, n = N;
        if (t.split_n) {
            n = N - lo < t.step ? N - lo : t.step;
            bi += tb ? lo * ldb : lo;
            bs = bias ? bias + lo : NULL;
            ci += lo;
        } else {
            m = Mg - lo < t.step ? Mg - lo : t.step;
            ai += ta ? lo : lo * lda;
            ci += lo * N;
        }
        const void *d = dt[k == t.n_tiles - 1];
        if (!d || !jdt_rt_sgemm_dnnl_run(d, ai, bi, bs, ci))
            tile_sgemm(ai, bi, bs, ci, m, n, K, ta, tb, lda, ldb, N);
    }
}

int64_t jdt_rt_gather(const float *table, const int32_t *idx, float *out, int64_t n, int64_t V,
                      int64_t C, int nt)
{
    int64_t bad = 0;
#pragma omp parallel for num_threads(nt) reduction(+ : bad) if (n * C >= PAR_MIN_WORK)
    for (int64_t i = 0; i < n; i++) {
        int64_t r = idx[i];
        if (r < 0 || r >= V) {
            memset(out + i * C, 0, (size_t)C * sizeof(float));
            bad++;
        } else {
            memcpy(out + i * C, table + r * C, (size_t)C * sizeof(float));
        }
    }
    return bad;
}

int64_t jdt_rt_scatter_add(const float *src, const int32_t *idx, float *out, int64_t n, int64_t V,
                           int64_t C)
{
    memset(out, 0, (size_t)(V * C) * sizeof(float));
    return jdt_rt_scatter_add_into(src, idx, out, out, n, V, C);
}

int64_t jdt_rt_scatter_add_into(const float *src, const int32_t *idx, const float *init, float *out,
                                int64_t n, int64_t V, int64_t C)
{
    int64_t bad = 0;
    if (out != init) memcpy(out, init, (size_t)(V * C) * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        int64_t r = idx[i];
        if (r < 0 || r >= V) {
            bad++;
            continue;
        }
        float *o = out + r * C;
        const float *s = src + i * C;
#pragma omp simd
        for (int64_t c = 0; c < C; c++)
            o[c] += s[c];
    }
    return bad;
}

JDT_RT_INLINE float row_max(const float *x, int64_t C)
{
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t c = 0; c < C; c++)
        m = x[c] > m ? x[c] : m;
    return m;
}

/* log(sum(exp(x - m))) + m, with m the row max (a row of -inf gives -inf). */
JDT_RT_INLINE float row_lse(const float *x, int64_t C)
{
    float m = row_max(x, C);
    if (m == -INFINITY) return -INFINITY;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; c++)
        s += jdt_rt_expf_le88(x[c] - m);
    return m + logf(s);
}

JDT_RT_CLONES void jdt_rt_softmax(const float *x, float *y, int64_t N, int64_t C, int nt)
{
#pragma omp parallel for num_threads(nt) schedule(guided) if (N * C >= PAR_MIN_WORK)
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C;
        float *yr = y + n * C;
        float m = row_max(xr, C), s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t c = 0; c < C; c++) {
            yr[c] = jdt_rt_expf_le88(xr[c] - m);
            s += yr[c];
        }
        float inv = 1.0f / s;
#pragma omp simd
        for (int64_t c = 0; c < C; c++)
            yr[c] *= inv;
    }
}

JDT_RT_CLONES void jdt_rt_softmax_bwd(const float *y, const float *dy, float *dx, int64_t N,
                                      int64_t C, int nt)
{
#pragma omp parallel for num_threads(nt) schedule(guided) if (N * C >= PAR_MIN_WORK)
    for (int64_t n = 0; n < N; n++) {
        const float *yr = y + n * C, *dyr = dy + n * C;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t c = 0; c < C; c++)
            s += dyr[c] * yr[c];
#pragma omp simd
        for (int64_t c = 0; c < C; c++)
            dx[n * C + c] = yr[c] * (dyr[c] - s);
    }
}

JDT_RT_CLONES void jdt_rt_log_softmax(const float *x, float *y, int64_t N, int64_t C, int nt)
{
#pragma omp parallel for num_threads(nt) schedule(guided) if (N * C >= PAR_MIN_WORK)
    for (int64_t n = 0; n < N; n++) {
        float l = row_lse(x + n * C, C);
#pragma omp simd
        for (int64_t c = 0; c < C; c++)
            y[n * C + c] = x[n * C + c] - l;
    }
}

JDT_RT_CLONES void jdt_rt_log_softmax_bwd(const float *y, const float *dy, float *dx, int64_t N,
                                          int64_t C, int nt)
{
#pragma omp parallel for num_threads(nt) schedule(guided) if (N * C >= PAR_MIN_WORK)
    for (int64_t n = 0; n < N; n++) {
        const float *yr = y + n * C, *dyr = dy + n * C;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t c = 0; c < C; c++)
            s += dyr[c];
#pragma omp simd
        for (int64_t c = 0; c < C; c++)
            dx[n * C + c] = dyr[c] - jdt_rt_expf(yr[c]) * s;
    }
}

/* Logit i of a row stored as f32 or (b16) as bf16 bits; b16 is a constant where these bodies
 * are inlined, so each loop is compiled for one type. */
JDT_RT_INLINE float logit(const void *x, bool b16, int64_t i)
{
    return b16 ? jdt_rt_bf16_float_inline(((const uint16_t *)x)[i]) : ((const float *)x)[i];
}

/* row_lse of a row stored as f32 or bf16, its exps summed in XENT_LANES explicit lanes folded in
 * halves: one order of the sum whatever the type (a u16 load and an f32 one vectorise at
 * different widths, and an `omp simd reduction` sums in the order of its vectors) and whatever
 * the build, so bf16 logits give the loss of f32 ones holding the same values, bit for bit. */
enum { XENT_LANES = 16 }; /* jdt_rt_fold_sum16's */
JDT_RT_INLINE float row_lse_of(const void *x, bool b16, int64_t C)
{
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int64_t c = 0; c < C; c++)
        m = logit(x, b16, c) > m ? logit(x, b16, c) : m;
    if (m == -INFINITY) return -INFINITY;
    float acc[XENT_LANES] = {0};
    int64_t j = 0;
    for (; j + XENT_LANES <= C; j += XENT_LANES)
#pragma omp simd
        for (int c = 0; c < XENT_LANES; c++)
            acc[c] += jdt_rt_expf_le88(logit(x, b16, j + c) - m);
    for (int c = 0; j + c < C; c++)
        acc[c] += jdt_rt_expf_le88(logit(x, b16, j + c) - m);
    return m + logf(jdt_rt_fold_sum16(acc));
}

/* row_lse_of with the type a literal at each call, so each call's loops are compiled for one
 * type: in an OpenMP region (its body is outlined) a flag captured from outside is no
 * constant. */
JDT_RT_INLINE float row_lse_typed(const void *x, bool b16, int64_t V)
{
    return b16 ? row_lse_of(x, true, V) : row_lse_of(x, false, V);
}

/* The cross-entropy drivers' second build: AVX-512 with 512-bit vectors (GCC keeps 256 for
 * x86-64-v4 and -march=native on these CPUs), taken where the CPU has AVX512-F and -BW unless
 * JDT_XENT_NO_AVX512 is set. The same operations in the same order as the x86-64-v3 clone
 * (row_lse_of sums in 16 explicit lanes, the rest is elementwise; -std=c11 contracts nothing
 * into FMAs), so the same bits, with the exps twice as wide: GPT-2's fused loss over 2048 x 50304
 * bf16 logits 103 -> 75 ms on 2 threads of a Sapphire Rapids box (docs/perf.md, Session 53).
 * Each driver's loop is written out in both builds: an OpenMP region's body is outlined with
 * the target of the function it is in. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10 &&           \
    !defined(JDT_NO_CLONES)
#define XENT_AVX512                                                                                \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,prefer-vector-width=512")))

static bool xent_avx512(void)
{
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           !getenv("JDT_XENT_NO_AVX512");
}
#endif

/* One row of jdt_rt_softmax_xent_ex; returns 1 for a target >= V (its loss NaN). */
JDT_RT_INLINE int64_t xent_fwd_row(const void *logits, bool logits_bf16, const int32_t *tgt,
                                   float *loss, int64_t n, int64_t V)
{
    const int64_t t = tgt[n];
    const void *x = (const char *)logits + (size_t)(n * V) * (logits_bf16 ? 2 : 4);
    if (t < 0) {
        loss[n] = 0.0f;
        return 0;
    }
    if (t >= V) {
        loss[n] = NAN;
        return 1;
    }
    loss[n] = row_lse_typed(x, logits_bf16, V) - logit(x, logits_bf16, t);
    return 0;
}

#ifdef XENT_AVX512
XENT_AVX512 static int64_t xent_fwd_avx512(const void *logits, bool logits_bf16, const int32_t *tgt,
                                           float *loss, int64_t N, int64_t V, int nt)
{
    int64_t bad = 0;
#pragma omp parallel for num_threads(nt) reduction(+ : bad) if (N * V >= PAR_MIN_WORK)
    for (int64_t n = 0; n < N; n++)
        bad += xent_fwd_row(logits, logits_bf16, tgt, loss, n, V);
    return bad;
}
#endif

JDT_RT_CLONES int64_t jdt_rt_softmax_xent_ex(const void *logits, bool logits_bf16,
                                             const int32_t *tgt, float *loss, int64_t N, int64_t V,
                                             int nt)
{
#ifdef XENT_AVX512
    if (xent_avx512()) return xent_fwd_avx512(logits, logits_bf16, tgt, loss, N, V, nt);
#endif
    int64_t bad = 0;
#pragma omp parallel for num_threads(nt) reduction(+ : bad) if (N * V >= PAR_MIN_WORK)
    for (int64_t n = 0; n < N; n++)
        bad += xent_fwd_row(logits, logits_bf16, tgt, loss, n, V);
    return bad;
}

int64_t jdt_rt_softmax_xent(const float *logits, const int32_t *tgt, float *loss, int64_t N,
                            int64_t V, int nt)
{
    return jdt_rt_softmax_xent_ex(logits, false, tgt, loss, N, V, nt);
}

/* The cross-entropy backward of one row (target t in [0, V)) whose logsumexp is l: logits x f32
 * or (b16) bf16, dlogits d f32 or (d16) bf16 bits, g the row's dloss. x[t] is read first: all of
 * a row's logits are read before its dlogits are written at the same index or later, so d may
 * lie over x. */
JDT_RT_INLINE void xent_bwd_row(const void *x, bool b16, void *d, bool d16, int64_t t, float g,
                                float l, int64_t V)
{
    const float xt = logit(x, b16, t);
    const float dt = g * jdt_rt_expf_le88(xt - l) - g; /* the target's: softmax - 1 */
    if (d16) {
        uint16_t *o = d;
#pragma omp simd
        for (int64_t c = 0; c < V; c++)
            o[c] = jdt_rt_bf16_bits_inline(g * jdt_rt_expf_le88(logit(x, b16, c) - l));
        o[t] = jdt_rt_bf16_bits_inline(dt);
    } else {
        float *o = d;
#pragma omp simd
        for (int64_t c = 0; c < V; c++)
            o[c] = g * jdt_rt_expf_le88(logit(x, b16, c) - l);
        o[t] -= g;
    }
}

/* xent_bwd_row with both types literals at each call, as row_lse_typed */
JDT_RT_INLINE void xent_bwd_typed(const void *x, bool b16, void *d, bool d16, int64_t t, float g,
                                  float l, int64_t V)
{
    if (b16 && d16)
        xent_bwd_row(x, true, d, true, t, g, l, V);
    else if (b16)
        xent_bwd_row(x, true, d, false, t, g, l, V);
    else if (d16)
        xent_bwd_row(x, false, d, true, t, g, l, V);
    else
        xent_bwd_row(x, false, d, false, t, g, l, V);
}

/* One row of jdt_rt_softmax_xent_bwd_ex. */
JDT_RT_INLINE void xent_bwd_row_n(const void *logits, bool logits_bf16, const int32_t *tgt,
                                  const float *dloss, const float *loss, void *dlogits,
                                  bool dlogits_bf16, int64_t n, int64_t V)
{
    const int64_t t = tgt[n];
    void *d = (char *)dlogits + (size_t)(n * V) * (dlogits_bf16 ? 2 : 4);
    if (t < 0 || t >= V) {
        memset(d, 0, (size_t)V * (dlogits_bf16 ? 2 : 4));
        return;
    }
    const void *x = (const char *)logits + (size_t)(n * V) * (logits_bf16 ? 2 : 4);
    /* the logsumexp from the forward's loss when given (loss = lse - x[t]), else computed */
    const float l = loss ? loss[n] + logit(x, logits_bf16, t) : row_lse_typed(x, logits_bf16, V);
    xent_bwd_typed(x, logits_bf16, d, dlogits_bf16, t, dloss[n], l, V);
}

#ifdef XENT_AVX512
XENT_AVX512 static void xent_bwd_avx512(const void *logits, bool logits_bf16, const int32_t *tgt,
                                        const float *dloss, const float *loss, void *dlogits,
                                        bool dlogits_bf16, int64_t N, int64_t V, int nt)
{
#pragma omp parallel for num_threads(nt) schedule(guided) if (N * V >= PAR_MIN_WORK)
    for (int64_t n = 0; n < N; n++)
        xent_bwd_row_n(logits, logits_bf16, tgt, dloss, loss, dlogits, dlogits_bf16, n, V);
}
#endif

JDT_RT_CLONES void jdt_rt_softmax_xent_bwd_ex(const void *logits, bool logits_bf16,
                                              const int32_t *tgt, const float *dloss,
                                              const float *loss, void *dlogits, bool dlogits_bf16,
                                              int64_t N, int64_t V, int nt)
{
#ifdef XENT_AVX512
    if (xent_avx512()) {
        xent_bwd_avx512(logits, logits_bf16, tgt, dloss, loss, dlogits, dlogits_bf16, N, V, nt);
        return;
    }
#endif
#pragma omp parallel for num_threads(nt) schedule(guided) if (N * V >= PAR_MIN_WORK)
    for (int64_t n = 0; n < N; n++)
        xent_bwd_row_n(logits, logits_bf16, tgt, dloss, loss, dlogits, dlogits_bf16, n, V);
}

/* One row of jdt_rt_softmax_xent_fused; returns 1 for a target >= V (its loss NaN). */
JDT_RT_INLINE int64_t xent_fused_row(const void *logits, bool logits_bf16, const int32_t *tgt,
                                     float g, float *loss, void *dlogits, bool dlogits_bf16,
                                     int64_t n, int64_t V)
{
    const size_t es = logits_bf16 ? 2 : 4, ds = dlogits_bf16 ? 2 : 4;
    int64_t t = tgt[n];
    void *d = (char *)dlogits + (size_t)(n * V) * ds;
    if (t < 0 || t >= V) { /* the forward's loss (0, or NaN counted), the backward's 0 */
        loss[n] = t < 0 ? 0.0f : NAN;
        memset(d, 0, (size_t)V * ds);
        return t >= V;
    }
    const void *x = (const char *)logits + (size_t)(n * V) * es;
    const float l = row_lse_typed(x, logits_bf16, V);
    loss[n] = l - logit(x, logits_bf16, t);
    xent_bwd_typed(x, logits_bf16, d, dlogits_bf16, t, g, l, V);
    return 0;
}

#ifdef XENT_AVX512
XENT_AVX512 static int64_t xent_fused_avx512(const void *logits, bool logits_bf16,
                                             const int32_t *tgt, float g, float *loss,
                                             void *dlogits, bool dlogits_bf16, int64_t N, int64_t V,
                                             int nt)
{
    int64_t bad = 0;
#pragma omp parallel for num_threads(nt) schedule(guided) reduction(+ : bad) if (N * V >= PAR_MIN_WORK)
    for (int64_t n = 0; n < N; n++)
        bad += xent_fused_row(logits, logits_bf16, tgt, g, loss, dlogits, dlogits_bf16, n, V);
    return bad;
}
#endif

JDT_RT_CLONES int64_t jdt_rt_softmax_xent_fused(const void *logits, bool logits_bf16,
                                                const int32_t *tgt, float g, float *loss,
                                                void *dlogits, bool dlogits_bf16, int64_t N,
                                                int64_t V, int nt)
{
#ifdef XENT_AVX512
    if (xent_avx512())
        return xent_fused_avx512(logits, logits_bf16, tgt, g, loss, dlogits, dlogits_bf16, N, V,
                                 nt);
#endif
    int64_t bad = 0;
#pragma omp parallel for num_threads(nt) schedule(guided) reduction(+ : bad) if (N * V >= PAR_MIN_WORK)
    for (int64_t n = 0; n < N; n++)
        bad += xent_fused_row(logits, logits_bf16, tgt, g, loss, dlogits, dlogits_bf16, n, V);
    return bad;
}

void jdt_rt_softmax_xent_bwd(const float *logits, const int32_t *tgt, const float *dloss,
                             const float *loss, float *dlogits, int64_t N, int64_t V, int nt)
{
    jdt_rt_softmax_xent_bwd_ex(logits, false, tgt, dloss, loss, dlogits, false, N, V, nt);
}

void jdt_rt_softmax_xent_bwd_bf16(const float *logits, const int32_t *tgt, const float *dloss,
                                  const float *loss, uint16_t *dlogits, int64_t N, int64_t V,
                                  int nt)
{
    jdt_rt_softmax_xent_bwd_ex(logits, false, tgt, dloss, loss, dlogits, true, N, V, nt);
}

/* Mean and 1/sqrt(var + eps) of a row, two passes in f32 (the centred second pass keeps the
 * variance accurate when |mean| >> std). */
JDT_RT_INLINE void row_moments(const float *x, int64_t C, float eps, float *mean, float *rstd)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; c++)
        s += x[c];
    float mu = s / (float)C, v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < C; c++)
        v += (x[c] - mu) * (x[c] - mu);
    *mean = mu;
    *rstd = 1.0f / sqrtf(v / (float)C + eps);
}

JDT_RT_CLONES void jdt_rt_normalize(const float *x, float *y, int64_t N, int64_t C, float eps,
                                    int nt)
{
#pragma omp parallel for num_threads(nt) schedule(guided) if (N * C >= PAR_MIN_WORK)
    for (int64_t n = 0; n < N; n++) {
        float mu, r;
        row_moments(x + n * C, C, eps, &mu, &r);
#pragma omp simd
        for (int64_t c = 0; c < C; c++)
            y[n * C + c] = (x[n * C + c] - mu) * r;
    }
}

JDT_RT_CLONES void jdt_rt_normalize_bwd(const float *x, const float *dxhat, float *dx, int64_t N,
                                        int64_t C, float eps, int nt)
{
#pragma omp parallel for num_threads(nt) schedule(guided) if (N * C >= PAR_MIN_WORK)
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C, *g = dxhat + n * C;
        float mu, r, sg = 0.0f, sgx = 0.0f;
        row_moments(xr, C, eps, &mu, &r);
#pragma omp simd reduction(+ : sg, sgx)
        for (int64_t c = 0; c < C; c++) {
            sg += g[c];
            sgx += g[c] * (xr[c] - mu) * r;
        }
        sg /= (float)C;
        sgx /= (float)C;
#pragma omp simd
        for (int64_t c = 0; c < C; c++)
            dx[n * C + c] = r * (g[c] - sg - (xr[c] - mu) * r * sgx);
    }
}

JDT_RT_CLONES void jdt_rt_rms_normalize(const float *x, float *y, int64_t N, int64_t C, float eps,
                                        int nt)
{
#pragma omp parallel for num_threads(nt) schedule(guided) if (N * C >= PAR_MIN_WORK)
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t c = 0; c < C; c++)
            s += xr[c] * xr[c];
        float r = 1.0f / sqrtf(s / (float)C + eps);
#pragma omp simd
        for (int64_t c = 0; c < C; c++)
            y[n * C + c] = xr[c] * r;
    }
}

JDT_RT_CLONES void jdt_rt_rms_normalize_bwd(const float *x, const float *dxhat, float *dx,
                                            int64_t N, int64_t C, float eps, int nt)
{
#pragma omp parallel for num_threads(nt) schedule(guided) if (N * C >= PAR_MIN_WORK)
    for (int64_t n = 0; n < N; n++) {
        const float *xr = x + n * C, *g = dxhat + n * C;
        float s = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : s, sgx)
        for (int64_t c = 0; c < C; c++) {
            s += xr[c] * xr[c];
            sgx += g[c] * xr[c];
        }
        float r = 1.0f / sqrtf(s / (float)C + eps);
        float k = r * r * r * sgx / (float)C;
#pragma omp simd
        for (int64_t c = 0; c < C; c++)
            dx[n * C + c] = r * g[c] - xr[c] * k;
    }
}

/* Frequency pairs whose cos and sin one pass of jdt_rt_rope keeps on the stack (a head of up to
 * 2 ROPE_CHUNK values takes one pass). */
#define ROPE_CHUNK 256

/* Each (position t, pair i) angle's cos and sin are computed once and applied to every batch row
 * and head at t (B H rows); before, each was computed again per batch row and the pairs were
 * walked head by head with stride D (a Llama step at B 16, T 256 spent 5% of its time here, at
 * 2.4 GB/s). The angle is the same double expression as before and as cuk_rope's, so the output
 * is bit for bit the same. */
JDT_RT_CLONES void jdt_rt_rope(const float *x, float *y, int64_t B, int64_t T, int64_t H, int64_t D,
                               double theta, const double *sc, bool inverse, int nt)
{
    const double sign = inverse ? -1.0 : 1.0;
    const int64_t half = D / 2, HD = H * D;
#pragma omp parallel num_threads(nt) if (B * T * H * D >= PAR_MIN_WORK)
    {
        double fr[ROPE_CHUNK];
        float cs[ROPE_CHUNK], sn[ROPE_CHUNK];
        for (int64_t i0 = 0; i0 < half; i0 += ROPE_CHUNK) {
            const int64_t ni = half - i0 < ROPE_CHUNK ? half - i0 : ROPE_CHUNK;
            for (int64_t i = 0; i < ni; i++)
                fr[i] = jdt_rope_freq(theta, i0 + i, D, sc);
#pragma omp for schedule(static)
            for (int64_t t = 0; t < T; t++) {
                for (int64_t i = 0; i < ni; i++) {
                    const double ang = sign * (double)t * fr[i];
                    cs[i] = (float)cos(ang);
                    sn[i] = (float)sin(ang);
                }
                for (int64_t b = 0; b < B; b++) /* (b, t): H heads back to back */
                    for (int64_t h = 0; h < H; h++) {
                        const int64_t o = (b * T + t) * HD + h * D + 2 * i0;
                        const float *xr = x + o;
                        float *yr = y + o;
#pragma omp simd
                        for (int64_t i = 0; i < ni; i++) {
                            const float x0 = xr[2 * i], x1 = xr[2 * i + 1];
                            yr[2 * i] = x0 * cs[i] - x1 * sn[i];
                            yr[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
                        }
                    }
            }
        }
    }
}

void jdt_rt_concat(const float *const *in, const int64_t *len, int n_in, float *out, int64_t outer,
                   int64_t inner, size_t elem_bytes)
{
    char *o = (char *)out;
    for (int64_t r = 0; r < outer; r++) {
        for (int k = 0; k < n_in; k++) {
            size_t nb = (size_t)(len[k] * inner) * elem_bytes;
            memcpy(o, (const char *)in[k] + (size_t)r * nb, nb);
            o += nb;
        }
    }
}
