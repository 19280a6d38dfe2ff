/*
 * bf16.c — GEMMs in bf16 compute precision for `precision.compute: bf16` (issue 14): the
 * inputs are rounded to bf16 (round to nearest even, as PyTorch's CPU autocast and JAX do),
 * products accumulate in f32, the output and the bias are f32 (or, through
 * jdt_rt_matmul_bf16_ex, bf16: precision.activations: bf16 stores a GEMM's output rounded to
 * bf16 by the GEMM itself, as PyTorch's autocast does).
 *
 * Two paths with the same numbers up to the order of the f32 accumulation:
 *   - oneDNN (JDT_HAVE_DNNL, Debian's libdnnl-dev; oneDNN 2.x C API) on a CPU with
 *     AVX512-BF16: the inputs are converted to bf16 into the caller's scratch and multiplied
 *     by oneDNN's bf16 matmul (VDPBF16PS), f32 destination;
 *   - everywhere else: the inputs are rounded to bf16 *in f32* into the scratch and multiplied
 *     by OpenBLAS's SGEMM. A bf16 x bf16 product is exact in f32 (8 + 8 significant bits), so
 *     this computes what the hardware path computes, only slower.
 * jdt_rt_bf16_describe() names the path once for the caller to log. oneDNN runs on libgomp's
 * pool (Debian's build uses OpenMP), like OpenBLAS and the generated kernels.
 *
 * Process-wide state: the oneDNN engine and stream (created once) and a small cache of matmul
 * primitives keyed by shape, behind a mutex (oneDNN's own primitive cache still costs a
 * primitive-descriptor creation per call).
 */
#include "runtime/runtime.h"

#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/dnnl-impl.h"
#include "runtime/runtime-impl.h"

float jdt_rt_bf16_round(float x)
{
    return jdt_bf16_round(x);
}

uint16_t jdt_rt_bf16_bits(float x)
{
    return jdt_rt_bf16_bits_inline(x);
}

float jdt_rt_bf16_float(uint16_t h)
{
    return jdt_rt_bf16_float_inline(h);
}

static void widen(const uint16_t *x, float *y, int64_t n, int nt)
{
#pragma omp parallel for num_threads(nt) if (n >= 32768)
    for (int64_t i = 0; i < n; i++)
        y[i] = jdt_rt_bf16_float_inline(x[i]);
}

JDT_RT_CLONES static void round_f32(const float *x, float *y, int64_t n, int nt)
{
#pragma omp parallel for simd num_threads(nt) if (n >= 32768)
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)jdt_rt_bf16_bits_inline(x[i]) << 16;
        memcpy(&y[i], &u, 4);
    }
}

JDT_RT_CLONES static void to_bf16(const float *x, uint16_t *y, int64_t n, int nt)
{
#pragma omp parallel for simd num_threads(nt) if (n >= 32768)
    for (int64_t i = 0; i < n; i++)
        y[i] = jdt_rt_bf16_bits_inline(x[i]);
}

/* a (batch, K, M) -> y (batch, M, K) in bf16: the transpose is free while converting, and
 * oneDNN's bf16 kernels are much faster on a row-major source (measured 1.2x vs 5-6x over
 * SGEMM for the weight-gradient GEMMs). 32 x 32 tiles keep both sides in cache. */
JDT_RT_CLONES static void to_bf16_t(const float *x, uint16_t *y, int64_t batch, int64_t K,
                                    int64_t M, int nt)
{
    int64_t tk = (K + 31) / 32, tm = (M + 31) / 32;
#pragma omp parallel for collapse(2) num_threads(nt) if (batch * K * M >= 32768)
    for (int64_t p = 0; p < batch; p++)
        for (int64_t t = 0; t < tk * tm; t++) {
            int64_t k0 = (t / tm) * 32, m0 = (t % tm) * 32;
            int64_t k1 = k0 + 32 < K ? k0 + 32 : K, m1 = m0 + 32 < M ? m0 + 32 : M;
            uint16_t tile[32][32]; /* tile[k - k0][m - m0]: converted along x's rows */
            for (int64_t k = k0; k < k1; k++)
#pragma omp simd
                for (int64_t m = m0; m < m1; m++)
                    tile[k - k0][m - m0] = jdt_rt_bf16_bits_inline(x[p * K * M + k * M + m]);
            for (int64_t m = m0; m < m1; m++)
                for (int64_t k = k0; k < k1; k++)
                    y[p * M * K + m * K + k] = tile[k - k0][m - m0];
        }
}

#ifdef JDT_HAVE_DNNL
typedef struct {
    int64_t batch, M, N, K, ldk; /* ldk: the K of the operands' strides (K but in a K slice) */
    int64_t ldm;                 /* the M of a transposed a's stride (M but in an M slice) */
    bool ta, tb, b_shared, bias, c_bf16; /* c_bf16: a bf16 destination and bias */
    bool acc;                            /* the product added to the destination (sum post-op) */
    int nt; /* the OpenMP threads it was created for: oneDNN plans its work split then */
    dnnl_primitive_t prim;
} mm_entry;

enum { MM_CACHE = 128 };
static struct {
    pthread_once_t once;
    pthread_mutex_t mu;
    bool ok;
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    mm_entry cache[MM_CACHE];
    int n_cache, next;
} g_dnnl = {PTHREAD_ONCE_INIT, PTHREAD_MUTEX_INITIALIZER, false, NULL, NULL, {{0}}, 0, 0};

/* Whether this CPU's bf16 GEMMs beat OpenBLAS's SGEMM: with AMX (Intel's tile unit, which
 * oneDNN uses where the CPU and OS offer it), or on AMD (Zen 4 and later: a VDPBF16PS does twice
 * an FMA's multiply-adds). Intel's AVX512-BF16 without AMX (Cooper Lake; Sapphire Rapids in a VM
 * that hides AMX) runs VDPBF16PS at the FMA's rate: there oneDNN's bf16 GEMMs reached half of
 * SGEMM's rate and the step ran faster as SGEMMs on rounded inputs (docs/perf.md, session 21). */
static bool bf16_gemm_fast(void)
{
    /* AMX counts only where the kernel granted this process the tile data: a CPU that has it
     * under a kernel or hypervisor that refuses it leaves oneDNN on VDPBF16PS */
    if (jdt_rt_cpu_amx()) return true;
    return __builtin_cpu_is("amd");
}

/* The GEMM path that the environment and the CPU ask for, in this order: JDT_BF16_NO_DNNL (tests:
 * the portable path), no AVX512-BF16, bf16 no faster than f32 here (unless JDT_BF16_DNNL),
 * else oneDNN (which may still fail to start: jdt_rt_bf16_native). */
enum bf16_ask { ASK_ENV_OFF, ASK_NO_ISA, ASK_SLOW_ISA, ASK_ONEDNN };

static enum bf16_ask bf16_ask(void)
{
    if (getenv("JDT_BF16_NO_DNNL")) return ASK_ENV_OFF;
    if (!__builtin_cpu_supports("avx512bf16")) return ASK_NO_ISA;
    if (!bf16_gemm_fast() && !getenv("JDT_BF16_DNNL")) return ASK_SLOW_ISA;
    return ASK_ONEDNN;
}

static void dnnl_init_once(void)
{
    if (bf16_ask() != ASK_ONEDNN) return;
    if (dnnl_engine_create(&g_dnnl.eng, dnnl_cpu, 0) != dnnl_success) return;
    if (dnnl_stream_create(&g_dnnl.stream, g_dnnl.eng, dnnl_stream_default_flags) != dnnl_success)
        return;
    g_dnnl.ok = true;
}

static bool md3(dnnl_memory_desc_t *md, int64_t d0, int64_t d1, int64_t d2, int64_t s0, int64_t s1,
                int64_t s2, dnnl_data_type_t dt)
{
    dnnl_dims_t dims = {d0, d1, d2}, strides = {s0, s1, s2};
    return dnnl_memory_desc_init_by_strides(md, 3, dims, dt, strides) == dnnl_success;
}

/* The matmul primitive for this shape, these bias and destination types and nt threads
 * (cached); NULL if oneDNN has none. Caller holds mu and has set OpenMP's thread count to nt:
 * oneDNN fixes a primitive's work split (its thread count) when it creates it, from
 * omp_get_max_threads(), which OpenBLAS's OpenMP build leaves at 1 (jdt_rt_set_threads) — a
 * primitive created then runs on one thread for good. c_bf16: a bf16 destination, the f32 sum
 * (the bias, then bf16 too, included) rounded to nearest even as the kernel stores it. ldk: the
 * operands are strided as for a K of ldk (a slice of K columns of a and rows of b), and a
 * transposed a as for an M of ldm (a slice of M rows of a and c; ldm is M without one). acc: the
 * product is added to the destination (oneDNN's sum post-op; an f32 destination). */
static dnnl_primitive_t mm_primitive(int64_t batch, int64_t M, int64_t N, int64_t K, int64_t ldk,
                                     int64_t ldm, bool ta, bool tb, bool b_shared, bool bias,
                                     bool c_bf16, bool acc, int nt)
{
    for (int i = 0; i < g_dnnl.n_cache; i++) {
        mm_entry *c = &g_dnnl.cache[i];
        if (c->batch == batch && c->M == M && c->N == N && c->K == K && c->ldk == ldk &&
            c->ldm == ldm && c->ta == ta && c->tb == tb && c->b_shared == b_shared &&
            c->bias == bias && c->c_bf16 == c_bf16 && c->acc == acc && c->nt == nt)
            return c->prim;
    }
    dnnl_memory_desc_t src, wei, dst, bmd;
    int64_t wb = b_shared ? 1 : batch;
    bool ok = md3(&src, batch, M, K, ldm * ldk, ta ? 1 : ldk, ta ? ldm : 1, dnnl_bf16) &&
              md3(&wei, wb, K, N, ldk * N, tb ? 1 : N, tb ? ldk : 1, dnnl_bf16) &&
              md3(&dst, batch, M, N, M * N, N, 1, c_bf16 ? dnnl_bf16 : dnnl_f32) &&
              (!bias || md3(&bmd, 1, 1, N, N, N, 1, c_bf16 ? dnnl_bf16 : dnnl_f32));
    if (!ok) return NULL;
    dnnl_matmul_desc_t desc;
    if (dnnl_matmul_desc_init(&desc, &src, &wei, bias ? &bmd : NULL, &dst) != dnnl_success)
        return NULL;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    if (acc && (dnnl_primitive_attr_create(&attr) != dnnl_success ||
                dnnl_post_ops_create(&po) != dnnl_success ||
                dnnl_post_ops_append_sum(po, 1.0f) != dnnl_success ||
                dnnl_primitive_attr_set_post_ops(attr, po) != dnnl_success))
        ok = false;
    dnnl_primitive_desc_t pd = NULL;
    ok = ok && dnnl_primitive_desc_create(&pd, &desc, attr, g_dnnl.eng, NULL) == dnnl_success;
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (!ok) return NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_status_t st = dnnl_primitive_create(&prim, pd);
    dnnl_primitive_desc_destroy(pd);
    if (st != dnnl_success) return NULL;
    mm_entry *c = &g_dnnl.cache[g_dnnl.n_cache < MM_CACHE ? g_dnnl.n_cache++ : g_dnnl.next++];
    g_dnnl.next %= MM_CACHE;
    if (c->prim) dnnl_primitive_destroy(c->prim);
    *c = (mm_entry){batch, M, N, K, ldk, ldm, ta, tb, b_shared, bias, c_bf16, acc, nt, prim};
    return prim;
}

/* A product with an f32 destination and K past MM_K_SPLIT runs as products over slices of
 * MM_K_SLICE of K, each after the first added to the destination. oneDNN's own plan for GPT-2's
 * lm-head input gradient (2048 x 768, K = 50304, 2 threads of a Sapphire Rapids box) ran at
 * 0.54 TFLOP/s against 1.36 for K 4096 and 1.07 for K 32768 (its rate goes up and down with K);
 * as slices of 4096 it runs at the slices' rate (docs/perf.md, Session 51). The sums then add
 * in slices: the result depends on the shape only, as before.
 * A single product with a transposed a (a weight gradient: a's columns are the rows of c) and M
 * past MM_M_SPLIT runs as products over near-equal slices of at most MM_M_SLICE rows (multiples
 * of 32 but the last): oneDNN's rate fell with M on the same box (tn, N 768, K 2048: 1.14
 * TFLOP/s at M 2048, 0.88 at 8192, 0.84 in the GPT-2 step at its tied embedding's 50304), and
 * as slices: 8192 rows 29.6 -> 23.9 ms alone, 50304 rows 188 -> 159 ms in the step. Untransposed
 * products with many rows (the tokens) ran slower as slices (8192 x 3072 x 768 nn 34.4 -> 42.3
 * ms) and stay whole (docs/perf.md, Session 52). Each row's sums are those of a product of the
 * slice's shape. */
enum { MM_K_SPLIT = 16384, MM_K_SLICE = 4096, MM_M_SPLIT = 4096, MM_M_SLICE = 2048 };

/* One product (or its slices: K past MM_K_SPLIT with an f32 destination, M past MM_M_SPLIT
 * with a transposed a and no batch) through oneDNN. Caller holds mu and has set OpenMP's thread
 * count to nt. False when oneDNN refused a primitive or failed (c is then undefined). */
static bool mm_exec(const uint16_t *a, const uint16_t *b, const void *bias, void *c, int64_t batch,
                    int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool b_shared, bool c_bf16,
                    int nt)
{
    const int64_t slice = !c_bf16 && K > MM_K_SPLIT ? MM_K_SLICE : K;
    int64_t mslice = M;
    if (ta && batch == 1 && M > MM_M_SPLIT) {
        const int64_t n = (M + MM_M_SLICE - 1) / MM_M_SLICE;
        mslice = ((M + n - 1) / n + 31) / 32 * 32;
    }
    const size_t c_size = c_bf16 ? sizeof(uint16_t) : sizeof(float);
    for (int64_t m0 = 0; m0 < M; m0 += mslice) {
        const int64_t mc = M - m0 < mslice ? M - m0 : mslice;
        const uint16_t *am = a + (ta ? m0 : m0 * K);
        void *cm = (char *)c + (size_t)(m0 * N) * c_size;
        for (int64_t k0 = 0; k0 < K; k0 += slice) {
            const int64_t kc = K - k0 < slice ? K - k0 : slice;
            const bool first = k0 == 0, with_bias = first && bias;
            dnnl_primitive_t prim = mm_primitive(batch, mc, N, kc, K, M, ta, tb, b_shared,
                                                 with_bias, c_bf16, !first, nt);
            if (!prim) return false;
            const int which[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_BIAS};
            void *const ptr[4] = {(void *)(am + (ta ? k0 * M : k0)),
                                  (void *)(b + (tb ? k0 : k0 * N)), cm, (void *)bias};
            if (!jdt_rt_dnnl_exec(prim, g_dnnl.eng, g_dnnl.stream, with_bias ? 4 : 3, which, ptr))
                return false;
        }
    }
    return true;
}

static bool mm_run_io(const uint16_t *a, const uint16_t *b, const void *bias, void *c,
                      int64_t batch, int64_t M, int64_t N, int64_t K, bool ta, bool tb,
                      bool b_shared, bool c_bf16, int nt)
{
    pthread_mutex_lock(&g_dnnl.mu);
    const int prev = omp_get_max_threads(), prev_dynamic = omp_get_dynamic();
    nt = nt > 0 ? nt : 1;
    /* the primitive's work split is for nt threads, and a team of fewer leaves part of the
     * product unwritten (NaN gradients with OMP_DYNAMIC=true or OMP_THREAD_LIMIT=1, docs/perf.md
     * Session 53): no more than the limit, and no team that the runtime may shrink */
    if (nt > omp_get_thread_limit()) nt = omp_get_thread_limit();
    omp_set_dynamic(0);
    omp_set_num_threads(nt);
    const bool done = mm_exec(a, b, bias, c, batch, M, N, K, ta, tb, b_shared, c_bf16, nt);
    omp_set_num_threads(prev);
    omp_set_dynamic(prev_dynamic);
    pthread_mutex_unlock(&g_dnnl.mu);
    return done;
}

static bool mm_run(const uint16_t *a, const uint16_t *b, const float *bias, float *c, int64_t batch,
                   int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool b_shared, int nt)
{
    return mm_run_io(a, b, bias, c, batch, M, N, K, ta, tb, b_shared, false, nt);
}
#endif

bool jdt_rt_bf16_native(void)
{
#ifdef JDT_HAVE_DNNL
    pthread_once(&g_dnnl.once, dnnl_init_once);
    return g_dnnl.ok;
#else
    return false;
#endif
}

bool jdt_rt_bf16_warn(void)
{
    if (jdt_rt_bf16_native()) return false;
#ifdef JDT_HAVE_DNNL
    if (bf16_ask() == ASK_SLOW_ISA) return false; /* by choice: as fast as oneDNN, or faster */
#endif
    return true;
}

const char *jdt_rt_bf16_describe(void)
{
    if (jdt_rt_bf16_native()) {
        if (jdt_rt_cpu_amx()) /* oneDNN's matmul takes the tiles too */
            return jdt_rt_bf16_tiles_amx() ? "bf16 GEMMs: oneDNN on AMX (bf16 inputs, f32 "
                                             "accumulation); attention tiles on AMX"
                                           : "bf16 GEMMs: oneDNN on AMX (bf16 inputs, f32 "
                                             "accumulation); attention tiles on AVX512-BF16";
        return "bf16 GEMMs: oneDNN on AVX512-BF16 (bf16 inputs, f32 accumulation)";
    }
#ifdef JDT_HAVE_DNNL
    switch (bf16_ask()) {
    case ASK_ENV_OFF:
        return "bf16 GEMMs: JDT_BF16_NO_DNNL is set; using f32 GEMMs on bf16-rounded inputs "
               "(same numbers, no speed-up)";
    case ASK_NO_ISA:
        return "bf16 GEMMs: this CPU has no AVX512-BF16; using f32 GEMMs on bf16-rounded inputs "
               "(same numbers, no speed-up)";
    case ASK_SLOW_ISA:
        return "bf16 GEMMs: this CPU's AVX512-BF16 runs at the f32 FMA's rate (no AMX), so f32 "
               "GEMMs on bf16-rounded inputs, faster here (same numbers; JDT_BF16_DNNL=1 forces "
               "oneDNN)";
    case ASK_ONEDNN: /* asked for, but it did not start */
        break;
    }
#endif
    return "bf16 GEMMs: this build has no oneDNN (libdnnl-dev); using f32 GEMMs on bf16-rounded "
           "inputs (same numbers, no speed-up)";
}

int64_t jdt_rt_matmul_bf16_scratch_floats(int64_t batch, int64_t M, int64_t N, int64_t K,
                                          bool b_shared)
{
    return batch * M * K + (b_shared ? 1 : batch) * K * N;
}

int64_t jdt_rt_matmul_bf16_scratch_bytes(int64_t batch, int64_t M, int64_t N, int64_t K,
                                         bool b_shared, bool a_bf16, bool b_bf16, bool c_bf16)
{
    int64_t na = batch * M * K, nb = (b_shared ? 1 : batch) * K * N;
    if (!jdt_rt_bf16_native()) /* f32 copies for SGEMM; its f32 result and bias for a bf16 c */
        return 4 * (na + nb + (c_bf16 ? batch * M * N + N : 0));
    return 2 * ((a_bf16 ? 0 : na) + (b_bf16 ? 0 : nb));
}

void jdt_rt_matmul_bf16_ex(const void *a, const void *b, const void *bias, void *c, int64_t batch,
                           int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool b_shared,
                           bool a_bf16, bool b_bf16, bool c_bf16, void *scratch, int nt)
{
    if (!a_bf16 && !b_bf16 && !c_bf16 && !jdt_rt_bf16_native()) {
        jdt_rt_matmul_bf16(a, b, bias, c, batch, M, N, K, ta, tb, b_shared, scratch, nt);
        return;
    }
    int64_t na = batch * M * K, nb = (b_shared ? 1 : batch) * K * N, nc = batch * M * N;
    if (M == 0 || N == 0) return;
    if (K == 0 && c_bf16) { /* an empty sum: the bias (bf16 already), or +0 */
        for (int64_t i = 0; i < nc; i++)
            ((uint16_t *)c)[i] = bias ? ((const uint16_t *)bias)[i % N] : 0;
        return;
    }
#ifdef JDT_HAVE_DNNL
    if (K > 0 && jdt_rt_bf16_native()) {
        uint16_t *s16 = scratch;
        const uint16_t *a16 = a, *b16 = b;
        /* a bf16 a is read in place, transposed or not: oneDNN's matmul takes a transposed
         * source by its strides (the brgemm kernels copy blocks of it as they go), so the
         * transposing dW GEMMs need no scratch copy of their activations */
        bool ta16 = a_bf16 && ta;
        if (!a_bf16) {
            uint16_t *t = s16;
            s16 += na;
            if (ta)
                to_bf16_t(a, t, batch, K, M, nt);
            else
                to_bf16(a, t, na, nt);
            a16 = t;
        }
        if (!b_bf16) {
            to_bf16(b, s16, nb, nt);
            b16 = s16;
        }
        if (mm_run_io(a16, b16, bias, c, batch, M, N, K, ta16, tb, b_shared, c_bf16, nt)) return;
        /* oneDNN refused the shape: there is no room for f32 copies in this scratch, so
         * multiply the bf16 values directly (exact products, f32 sums) */
        for (int64_t p = 0; p < batch; p++) {
            const uint16_t *ap = a16 + p * M * K, *bp = b16 + (b_shared ? 0 : p * K * N);
#pragma omp parallel for num_threads(nt) if (M * N * K >= 32768)
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                    float acc = !bias    ? 0.0f
                                : c_bf16 ? jdt_rt_bf16_float_inline(((const uint16_t *)bias)[j])
                                         : ((const float *)bias)[j];
                    for (int64_t k = 0; k < K; k++)
                        acc += jdt_rt_bf16_float_inline(ta16 ? ap[k * M + i] : ap[i * K + k]) *
                               jdt_rt_bf16_float_inline(tb ? bp[j * K + k] : bp[k * N + j]);
                    const int64_t o = p * M * N + i * N + j;
                    if (c_bf16)
                        ((uint16_t *)c)[o] = jdt_rt_bf16_bits_inline(acc);
                    else
                        ((float *)c)[o] = acc;
                }
        }
        return;
    }
#endif
    float *ar = scratch, *br = (float *)scratch + na;
    if (a_bf16)
        widen(a, ar, na, nt);
    else
        round_f32(a, ar, na, nt);
    if (b_bf16)
        widen(b, br, nb, nt);
    else
        round_f32(b, br, nb, nt);
    if (!c_bf16) {
        jdt_rt_matmul(ar, br, bias, c, batch, M, N, K, ta, tb, b_shared, nt);
        return;
    }
    float *cr = br + nb, *biasr = cr + nc; /* the f32 result, then rounded into c */
    if (bias) widen(bias, biasr, N, 1);
    jdt_rt_matmul(ar, br, bias ? biasr : NULL, cr, batch, M, N, K, ta, tb, b_shared, nt);
    to_bf16(cr, c, nc, nt);
}

void jdt_rt_matmul_bf16(const float *a, const float *b, const float *bias, float *c, int64_t batch,
                        int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool b_shared,
                        float *scratch, int nt)
{
    int64_t na = batch * M * K, nb = (b_shared ? 1 : batch) * K * N;
    if (M == 0 || N == 0) return;
#ifdef JDT_HAVE_DNNL
    if (K > 0 && jdt_rt_bf16_native()) {
        uint16_t *a16 = (uint16_t *)scratch, *b16 = a16 + na;
        if (ta)
            to_bf16_t(a, a16, batch, K, M, nt);
        else
            to_bf16(a, a16, na, nt);
        to_bf16(b, b16, nb, nt);
        if (mm_run(a16, b16, bias, c, batch, M, N, K, false, tb, b_shared, nt)) return;
    }
#endif
    float *ar = scratch, *br = scratch + na;
    round_f32(a, ar, na, nt);
    round_f32(b, br, nb, nt);
    jdt_rt_matmul(ar, br, bias, c, batch, M, N, K, ta, tb, b_shared, nt);
}

typedef struct {
    const uint16_t *a, *b;
    float *c;
    void *scratch;
    int nt;
} peak_ctx;

static void peak_run(void *p)
{
    const peak_ctx *x = p;
    jdt_rt_matmul_bf16_ex(x->a, x->b, NULL, x->c, 1, 1024, 1024, 1024, false, false, false, true,
                          true, false, x->scratch, x->nt);
}

double jdt_rt_bf16_peak_measure(int n_rep, int nt, double *cores)
{
    enum { N = 1024 };
    const size_t n = (size_t)N * N;
    const int64_t ns = jdt_rt_matmul_bf16_scratch_bytes(1, N, N, N, false, true, true, false);
    uint16_t *a = jdt_malloc(n * sizeof *a), *b = jdt_malloc(n * sizeof *b);
    float *c = jdt_malloc(n * sizeof *c);
    void *scratch = ns > 0 ? jdt_malloc((size_t)ns) : NULL;
    double best = 0;
    if (a && b && c && (ns == 0 || scratch)) {
        for (size_t i = 0; i < n; i++) {
            a[i] = jdt_rt_bf16_bits(1e-3f * (float)(i % 97));
            b[i] = jdt_rt_bf16_bits(1e-3f * (float)(i % 89));
        }
        peak_ctx ctx = {a, b, c, scratch, nt};
        best = jdt_best_rate(2.0 * N * N * N, n_rep, peak_run, &ctx, cores);
    }
    jdt_free(a);
    jdt_free(b);
    jdt_free(c);
    jdt_free(scratch);
    return best;
}
