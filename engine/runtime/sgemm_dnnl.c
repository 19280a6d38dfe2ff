/*
 * sgemm_dnnl.c — f32 GEMM tiles through oneDNN's matmul, for jdt_rt_matmul (kernels.c).
 *
 * jdt_rt_matmul cuts a GEMM into output tiles fixed by the shape and hands them to its threads
 * as they ask; each tile is one single-threaded product over all of K. Here that product is a
 * oneDNN matmul primitive created for one thread, where oneDNN's f32 kernels are its AVX-512
 * brgemm ones ("brg:avx512_core"): on the AMD EPYC dev box they ran the benchmark model's tiles
 * 5-34% faster than OpenBLAS's single-threaded SGEMM (docs/perf.md, session 29). A primitive
 * for one thread never splits K (oneDNN's own threading does, for large K and few outputs, and
 * its bits then depend on the thread count), so the result still depends on the shape only.
 *
 * Primitives are created by the caller's thread before its parallel loop and executed by any
 * thread: they use a user-managed scratchpad (the library-managed one may not migrate between
 * threads), and each thread has its own scratchpad buffer and stream (a pthread key's value,
 * released when the thread ends). Primitives are cached by
 * tile (shape, transposes, leading dims, bias) and never destroyed; a full cache answers NULL
 * and the caller uses OpenBLAS. JDT_SGEMM_NO_DNNL=1 turns the path off (A/B runs, tests).
 */
#include "runtime/runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/dnnl-impl.h"
#include "runtime/runtime-impl.h"

#ifdef JDT_HAVE_DNNL
#include <omp.h>
#include <pthread.h>
#endif

#ifdef JDT_HAVE_DNNL
typedef struct {
    int64_t m, n, K, lda, ldb, ldc;
    bool ta, tb, bias;
    dnnl_primitive_t prim;
    size_t scratch_bytes;
} tile_prim;

enum { TILE_CACHE = 512 };
static struct {
    pthread_once_t once;
    pthread_mutex_t mu;
    bool ok;
    char impl[64], describe[128];
    dnnl_engine_t eng;
    tile_prim cache[TILE_CACHE];
    int n_cache;
} g_sg = {PTHREAD_ONCE_INIT, PTHREAD_MUTEX_INITIALIZER, false, "", "", NULL, {{0}}, 0};

/* Per thread: the stream its executions go to, and its scratchpad (well under 1 MiB for the
 * shapes measured), released when the thread ends (g_sg.key's destructor). */
typedef struct {
    dnnl_stream_t stream;
    void *scratch;
    size_t scratch_bytes;
} thread_state;

static pthread_key_t g_key;
static bool g_key_ok;

static void thread_state_free(void *p)
{
    thread_state *ts = p;
    if (ts->stream) dnnl_stream_destroy(ts->stream);
    free(ts->scratch);
    free(ts);
}

/* The calling thread's state with a scratchpad of at least need bytes; NULL when out of
 * memory or oneDNN cannot make a stream. */
static thread_state *thread_get(size_t need)
{
    if (!g_key_ok) return NULL;
    thread_state *ts = pthread_getspecific(g_key);
    if (!ts) {
        ts = calloc(1, sizeof *ts);
        if (!ts) return NULL;
        if (dnnl_stream_create(&ts->stream, g_sg.eng, dnnl_stream_default_flags) != dnnl_success ||
            pthread_setspecific(g_key, ts) != 0) {
            thread_state_free(ts);
            return NULL;
        }
    }
    if (need > ts->scratch_bytes) {
        void *sp = realloc(ts->scratch, need);
        if (!sp) return NULL;
        ts->scratch = sp, ts->scratch_bytes = need;
    }
    return ts;
}

static bool md2(dnnl_memory_desc_t *md, int64_t d0, int64_t d1, int64_t s0, int64_t s1)
{
    dnnl_dims_t dims = {d0, d1}, strides = {s0, s1};
    return dnnl_memory_desc_init_by_strides(md, 2, dims, dnnl_f32, strides) == dnnl_success;
}

/* A single-threaded primitive for c (m, n; row stride ldc) = op(a) op(b) (+ bias (n)); NULL
 * when oneDNN has none. impl (impl_n bytes, or NULL): its implementation's name, copied before the
 * descriptor that owns the string goes. Caller holds g_sg.mu or is init_once. */
static dnnl_primitive_t create(int64_t m, int64_t n, int64_t K, bool ta, bool tb, int64_t lda,
                               int64_t ldb, int64_t ldc, bool bias, size_t *scratch_bytes,
                               char *impl, size_t impl_n)
{
    dnnl_memory_desc_t src, wei, dst, bmd;
    bool ok = md2(&src, m, K, ta ? 1 : lda, ta ? lda : 1) &&
              md2(&wei, K, n, tb ? 1 : ldb, tb ? ldb : 1) && md2(&dst, m, n, ldc, 1) &&
              (!bias || md2(&bmd, 1, n, n, 1));
    dnnl_matmul_desc_t desc;
    if (!ok || dnnl_matmul_desc_init(&desc, &src, &wei, bias ? &bmd : NULL, &dst) != dnnl_success)
        return NULL;
    dnnl_primitive_attr_t attr = NULL;
    if (dnnl_primitive_attr_create(&attr) != dnnl_success) return NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    const int prev = omp_get_max_threads();
    omp_set_num_threads(1); /* oneDNN plans its work split for omp_get_max_threads() threads */
    if (dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success &&
        dnnl_primitive_desc_create(&pd, &desc, attr, g_sg.eng, NULL) == dnnl_success) {
        const dnnl_memory_desc_t *sp =
            dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        *scratch_bytes = sp ? dnnl_memory_desc_get_size(sp) : 0;
        const char *name = NULL;
        if (impl &&
            dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name) == dnnl_success)
            snprintf(impl, impl_n, "%s", name ? name : "");
        if (dnnl_primitive_create(&prim, pd) != dnnl_success) prim = NULL;
    }
    omp_set_num_threads(prev);
    if (pd) dnnl_primitive_desc_destroy(pd);
    dnnl_primitive_attr_destroy(attr);
    return prim;
}

/* On where oneDNN's f32 matmul is its AVX-512 brgemm (probed on a 256^3 product). */
static void init_once(void)
{
    const char *off = getenv("JDT_SGEMM_NO_DNNL");
    if (off && *off && strcmp(off, "0") != 0) return;
    if (dnnl_engine_create(&g_sg.eng, dnnl_cpu, 0) != dnnl_success) return;
    g_key_ok = pthread_key_create(&g_key, thread_state_free) == 0;
    size_t sb = 0;
    dnnl_primitive_t p =
        create(256, 256, 256, false, false, 256, 256, 256, false, &sb, g_sg.impl, sizeof g_sg.impl);
    if (!p) return;
    dnnl_primitive_destroy(p);
    g_sg.ok = g_key_ok && strncmp(g_sg.impl, "brg:avx512", 10) == 0;
    snprintf(g_sg.describe, sizeof g_sg.describe, "f32 GEMMs: oneDNN (%s tiles, one thread each)",
             g_sg.impl);
}
#endif

#ifdef JDT_HAVE_DNNL
bool jdt_rt_dnnl_exec(dnnl_primitive_t prim, dnnl_engine_t eng, dnnl_stream_t stream, int n,
                      const int *which, void *const *ptr)
{
    enum { MAX_ARGS = 8 };
    const_dnnl_primitive_desc_t pd;
    if (n > MAX_ARGS || dnnl_primitive_get_primitive_desc(prim, &pd) != dnnl_success) return false;
    dnnl_memory_t mem[MAX_ARGS] = {NULL};
    dnnl_exec_arg_t args[MAX_ARGS];
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        const dnnl_memory_desc_t *md =
            dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, which[i]);
        ok = md && dnnl_memory_create(&mem[i], md, eng, ptr[i]) == dnnl_success;
        args[i] = (dnnl_exec_arg_t){which[i], mem[i]};
    }
    ok = ok && dnnl_primitive_execute(prim, stream, n, args) == dnnl_success &&
         dnnl_stream_wait(stream) == dnnl_success;
    for (int i = 0; i < n; i++)
        if (mem[i]) dnnl_memory_destroy(mem[i]);
    return ok;
}
#endif

bool jdt_rt_sgemm_dnnl_on(void)
{
#ifdef JDT_HAVE_DNNL
    pthread_once(&g_sg.once, init_once);
    return g_sg.ok;
#else
    return false;
#endif
}

const char *jdt_rt_sgemm_describe(void)
{
#ifdef JDT_HAVE_DNNL
    if (jdt_rt_sgemm_dnnl_on()) return g_sg.describe;
    const char *off = getenv("JDT_SGEMM_NO_DNNL");
    if (off && *off && strcmp(off, "0") != 0)
        return "f32 GEMMs: OpenBLAS (JDT_SGEMM_NO_DNNL is set)";
#endif
    return "f32 GEMMs: OpenBLAS";
}

const void *jdt_rt_sgemm_dnnl_tile(int64_t m, int64_t n, int64_t K, bool ta, bool tb, int64_t lda,
                                   int64_t ldb, int64_t ldc, bool bias)
{
#ifdef JDT_HAVE_DNNL
    if (!jdt_rt_sgemm_dnnl_on() || m <= 0 || n <= 0 || K <= 0) return NULL;
    pthread_mutex_lock(&g_sg.mu);
    const tile_prim *hit = NULL;
    for (int i = 0; i < g_sg.n_cache && !hit; i++) {
        const tile_prim *c = &g_sg.cache[i];
        if (c->m == m && c->n == n && c->K == K && c->ta == ta && c->tb == tb && c->lda == lda &&
            c->ldb == ldb && c->ldc == ldc && c->bias == bias)
            hit = c;
    }
    if (!hit && g_sg.n_cache < TILE_CACHE) {
        size_t sb = 0;
        dnnl_primitive_t p = create(m, n, K, ta, tb, lda, ldb, ldc, bias, &sb, NULL, 0);
        if (p) {
            tile_prim *c = &g_sg.cache[g_sg.n_cache++];
            *c = (tile_prim){m, n, K, lda, ldb, ldc, ta, tb, bias, p, sb};
            hit = c;
        }
    }
    pthread_mutex_unlock(&g_sg.mu);
    return hit;
#else
    (void)m, (void)n, (void)K, (void)ta, (void)tb, (void)lda, (void)ldb, (void)ldc, (void)bias;
    return NULL;
#endif
}

bool jdt_rt_sgemm_dnnl_run(const void *tile, const float *a, const float *b, const float *bias,
                           float *c)
{
#ifdef JDT_HAVE_DNNL
    const tile_prim *t = tile;
    if (!t) return false;
    thread_state *ts = thread_get(t->scratch_bytes);
    if (!ts) return false;
    const int which[5] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD,
                          DNNL_ARG_BIAS};
    void *const ptr[5] = {(void *)a, (void *)b, c, ts->scratch, (void *)bias};
    /* on one thread, as planned, also where the caller runs it outside a parallel region
     * (jdt_rt_matmul on 1 thread or 1 job) */
    const int prev = omp_get_max_threads();
    omp_set_num_threads(1);
    bool ok = jdt_rt_dnnl_exec(t->prim, g_sg.eng, ts->stream, t->bias ? 5 : 4, which, ptr);
    omp_set_num_threads(prev);
    return ok;
#else
    (void)tile, (void)a, (void)b, (void)bias, (void)c;
    return false;
#endif
}

typedef struct {
    const float *a, *b;
    float *c;
    int nt;
} peak_ctx;

static void peak_run(void *p)
{
    const peak_ctx *x = p;
    jdt_rt_matmul(x->a, x->b, NULL, x->c, 1, 1024, 1024, 1024, false, false, false, x->nt);
}

double jdt_rt_sgemm_peak_measure(int n_rep, int nt, double *cores)
{
    enum { N = 1024 };
    const size_t n = (size_t)N * N;
    float *a = jdt_malloc(n * sizeof *a), *b = jdt_malloc(n * sizeof *b);
    float *c = jdt_malloc(n * sizeof *c);
    double best = 0;
    if (a && b && c) {
        for (size_t i = 0; i < n; i++)
            a[i] = b[i] = 1e-3f * (float)(i % 97);
        peak_ctx ctx = {a, b, c, nt};
        best = jdt_best_rate(2.0 * N * N * N, n_rep, peak_run, &ctx, cores);
    }
    jdt_free(a);
    jdt_free(b);
    jdt_free(c);
    return best;
}
