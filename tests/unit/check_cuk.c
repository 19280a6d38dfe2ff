/*
 * check_cuk.c — unit tests for the CUDA kernels module (engine/backend/cuda/cuk.h).
 *
 * Without a GPU (CI): every builtin kernel source compiles under NVRTC for sm_90 (ahead of time,
 * into a cache) and those with architecture-dependent code for sm_80, and
 * jdt_cuk_init fails cleanly with ERR_UNSUPPORTED; every GPU test prints one "SKIP" line with
 * the reason. With a GPU, or on the host CUDA emulator (tests/infra/cudaemu: check_cuk-emu runs
 * this suite's gpu case there, the largest attention shape left to real GPUs): every kernel against
 * the CPU jdt_rt_* function of the same name on random inputs at odd shapes (TF32 tolerances for
 * GEMMs, ~1e-5 relative for the rest), the float4 and scalar paths, out-of-range indices, every
 * attention head-size class and layout, deferred launch errors and the on-disk cubin cache. Built
 * without CUDA=1 the suite is one skipped test.
 */
#include "core/core.h"

#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef JDT_CUDA

START_TEST(test_cuda_not_built)
{
    printf("SKIP check_cuk: built without CUDA=1\n");
}
END_TEST

static void add_tests(Suite *s)
{
    TCase *tc = tcase_create("cuk");
    tcase_add_test(tc, test_cuda_not_built);
    suite_add_tcase(s, tc);
}

#else

#include "backend/cuda/cuk-impl.h"
#include "compile/compile.h"
#include "comm/comm.h"
#include "runtime/runtime.h"
#include "tests/unit/testutil.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cuda_runtime_api.h>
#pragma GCC diagnostic pop

#include <dirent.h>
#include <nvrtc.h>
#include <unistd.h>

/* ---- NVRTC (no GPU needed) ---------------------------------------------------------------- */

/* sm_80 (A100): the sources with code that depends on the architecture (the tensor-core
 * attention's mma.sync and ldmatrix) and the small ones; the FMA attention is plain CUDA C++ with
 * no architecture-dependent code, NVRTC's longest compile (about 50 s on 2 cores), and compiled
 * for sm_90 below */
START_TEST(test_nvrtc_compile_sm80)
{
    jdt_err e;
    jdt_err_clear(&e);
    int built = 0, cached = 0;
    jdt_status s =
        jdt_cuk_precompile(80, NULL, JDT_CUK_SRC_BASE | JDT_CUK_SRC_ATT_TC, &built, &cached, &e);
    ck_assert_msg(s == JDT_OK, "%s", e.msg);
    ck_assert_int_eq(built, 3);
    ck_assert_int_eq(cached, 0);
}
END_TEST

static int count_entries(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *de; d && (de = readdir(d));) {
        size_t len = strlen(de->d_name), sl = strlen(suffix);
        n += len > sl && strcmp(de->d_name + len - sl, suffix) == 0;
    }
    if (d) closedir(d);
    return n;
}

/* sm_90 (H100/H200), every source, ahead of time into a cache (`inspect --cuda-arch`): four
 * entries stored, and a second precompile finds them all */
START_TEST(test_nvrtc_compile_sm90)
{
    jdt_err e;
    jdt_err_clear(&e);
    char dir[] = "/tmp/jdt-check-cuk-aot.XXXXXX";
    ck_assert(mkdtemp(dir) != NULL);
    const unsigned all = JDT_CUK_SRC_BASE | JDT_CUK_SRC_ATT_TC | JDT_CUK_SRC_ATT_FMA;
    int built = 0, cached = 0;
    jdt_status s = jdt_cuk_precompile(90, dir, all, &built, &cached, &e);
    ck_assert_msg(s == JDT_OK, "%s", e.msg);
    ck_assert_int_eq(built, 4);
    ck_assert_int_eq(count_entries(dir, ".cuk"), 4);
    built = cached = 0;
    s = jdt_cuk_precompile(90, dir, all, &built, &cached, &e);
    ck_assert_msg(s == JDT_OK, "%s", e.msg);
    ck_assert_int_eq(built, 0);
    ck_assert_int_eq(cached, 4);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* the attention source a run launches, as jdt_cuk_attention picks it */
START_TEST(test_attention_sources)
{
    ck_assert_uint_eq(jdt_cuk_attention_sources(90, true, 64), JDT_CUK_SRC_ATT_TC);
    ck_assert_uint_eq(jdt_cuk_attention_sources(80, true, 128), JDT_CUK_SRC_ATT_TC);
    ck_assert_uint_eq(jdt_cuk_attention_sources(90, false, 64), JDT_CUK_SRC_ATT_FMA);
    ck_assert_uint_eq(jdt_cuk_attention_sources(90, true, 256), JDT_CUK_SRC_ATT_FMA);
    ck_assert_uint_eq(jdt_cuk_attention_sources(75, true, 64), JDT_CUK_SRC_ATT_FMA);
    setenv("JDT_CUK_ATTENTION", "fma", 1);
    ck_assert_uint_eq(jdt_cuk_attention_sources(90, true, 64), JDT_CUK_SRC_ATT_FMA);
    unsetenv("JDT_CUK_ATTENTION");
}
END_TEST

/* cuDNN's fused attention graphs (cuk_cudnn.c), built without a GPU for a described H200: an
 * engine must take each (forward with and without the log-sum-exp, backward; GPT-2's layouts
 * and a (B, H, T, D) one) and its plan must finalize, kernels compiled, within the workspace.
 * Skips where cuDNN cannot be loaded or predates 9.8, or on the host emulator (which stands in
 * for the CUDA runtime cuDNN would call). */
START_TEST(test_cudnn_offline)
{
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess && strncmp(prop.name, "cudaemu", 7) == 0) {
        printf("SKIP check_cuk test_cudnn_offline: the host CUDA emulator stands in for cudart\n");
        return;
    }
    static const struct {
        bool bwd, stats, accum;
        int64_t B, H, T, D;
        unsigned bthd;
    } cases[] = {
        {false, true, false, 32, 12, 1024, 64, 7},  /* GPT-2: q, k, v (B, T, H, D) */
        {false, false, false, 32, 12, 1024, 64, 7}, /* no backward to feed */
        {true, true, false, 32, 12, 1024, 64, 31},  /* GPT-2's backward: o, dO (B, T, H, D) too */
        {true, true, true, 32, 12, 1024, 64, 31},   /* ... with dQ accumulated (=fast) */
        {false, true, false, 2, 4, 256, 128, 0},    /* (B, H, T, D) inputs, head 128 */
        {true, true, false, 2, 4, 256, 128, 8},
        /* grouped-query attention (Llama 3's 4 query heads per key/value head: G in bits 8
         * and up), k and v (B, T, Hk, D) */
        {false, true, false, 8, 32, 2048, 128, 7u | 4u << 8},
        {true, true, false, 8, 32, 2048, 128, 31u | 4u << 8},
        {true, true, true, 8, 32, 2048, 128, 31u | 4u << 8},
        {true, true, false, 32, 12, 1024, 64, 31u | 12u << 8}, /* multi-query */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        jdt_err e;
        jdt_err_clear(&e);
        char info[160];
        jdt_status s = jdt_cuk_dnn_check_offline(cases[i].bwd, cases[i].stats, cases[i].accum,
                                                 cases[i].B, cases[i].H, cases[i].T, cases[i].D,
                                                 cases[i].bthd, info, sizeof info, &e);
        if (s == JDT_ERR_UNSUPPORTED &&
            (strstr(e.msg, "cannot be loaded") || strstr(e.msg, "too old") ||
             strstr(e.msg, "cannot build plans") || strstr(e.msg, "without cuDNN") ||
             strstr(e.msg, "need libcuda"))) {
            printf("SKIP check_cuk test_cudnn_offline: %s\n", e.msg);
            return;
        }
        ck_assert_msg(s == JDT_OK, "case %zu (%s B=%lld T=%lld D=%lld bthd=%u): %s", i,
                      cases[i].bwd ? "backward" : "forward", (long long)cases[i].B,
                      (long long)cases[i].T, (long long)cases[i].D, cases[i].bthd, e.msg);
        ck_assert(strstr(info, "engine ") == info);
        printf("check_cuk test_cudnn_offline: %s%s B=%lld H=%lld T=%lld D=%lld G=%lld: %s\n",
               cases[i].bwd ? "backward" : "forward",
               !cases[i].bwd && !cases[i].stats ? " (no statistics)"
               : cases[i].accum                 ? " (dQ accumulated)"
                                                : "",
               (long long)cases[i].B, (long long)cases[i].H, (long long)cases[i].T,
               (long long)cases[i].D, (long long)JDT_CUK_ATT_GROUP(cases[i].bthd), info);
    }
}
END_TEST

/* The versions and shapes cuDNN is not asked to run (cuk_cudnn.c jdt_cuk_dnn_refusal), at their
 * edges: 9.10.0-9.10.1 refused, a backward whose T is not a multiple of 128 up to 9.15.0 (the
 * frontend's padding mask), a one-position backward always; GPT-2's shapes never. */
START_TEST(test_cudnn_refusal)
{
    ck_assert_ptr_null(jdt_cuk_dnn_refusal(90900, true, 1024));
    ck_assert_ptr_nonnull(jdt_cuk_dnn_refusal(91000, false, 1024));
    ck_assert_ptr_nonnull(jdt_cuk_dnn_refusal(91001, true, 1024));
    ck_assert_ptr_null(jdt_cuk_dnn_refusal(91002, true, 1024));
    ck_assert_ptr_null(jdt_cuk_dnn_refusal(91500, false, 100));
    ck_assert_ptr_nonnull(jdt_cuk_dnn_refusal(91500, true, 100));
    ck_assert_ptr_null(jdt_cuk_dnn_refusal(91501, true, 100));
    ck_assert_ptr_null(jdt_cuk_dnn_refusal(90800, true, 256));
    ck_assert_ptr_nonnull(jdt_cuk_dnn_refusal(91900, true, 1));
    ck_assert_ptr_null(jdt_cuk_dnn_refusal(91900, false, 1));
    ck_assert_ptr_nonnull(strstr(jdt_cuk_dnn_refusal(91400, true, 1000), "multiple of 128"));
}
END_TEST

START_TEST(test_nvrtc_bad_arch_is_compile_error)
{
    jdt_err e;
    jdt_err_clear(&e);
    int built = 0, cached = 0;
    ck_assert_int_eq(jdt_cuk_precompile(1, NULL, JDT_CUK_SRC_BASE, &built, &cached, &e),
                     JDT_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.msg, "sm_1 is older") != NULL, "%s", e.msg);
    ck_assert_int_eq(built, 0);
}
END_TEST

/* ---- GPU fixture -------------------------------------------------------------------------- */

/* A context on device 0 with the run's kernel cache, or NULL after printing one SKIP line (no GPU
 * or driver: that must be ERR_UNSUPPORTED with a message, never a crash). */
static jdt_cuk *gpu_or_skip(const char *test, char *cache_dir, size_t n)
{
    /* one cache for every test of the run (Check forks a process per test: the runner is the
     * parent): NVRTC compiles the builtin kernels once, not once per GPU test (~20-30 s each);
     * $JDT_CACHE_DIR (scripts/gpu/check.sh sets it) shares them with jdt-train's runs too */
    const char *env = getenv("JDT_CACHE_DIR");
    if (env && *env)
        snprintf(cache_dir, n, "%s", env);
    else
        snprintf(cache_dir, n, "/tmp/jdt-check-cuk-%ld", (long)getppid());
    jdt_cuk *k = NULL;
    jdt_err e;
    jdt_err_clear(&e);
    jdt_status s = jdt_cuk_init(0, cache_dir, &k, &e);
    if (s == JDT_ERR_UNSUPPORTED) {
        ck_assert(strlen(e.msg) > 0);
        size_t len = strlen(test); /* Check names the function test_x_fn */
        if (len > 3 && strcmp(test + len - 3, "_fn") == 0) len -= 3;
        printf("SKIP check_cuk %.*s: %s\n", (int)len, test, e.msg);
        return NULL;
    }
    ck_assert_msg(s == JDT_OK, "jdt_cuk_init: %s", e.msg);
    ck_assert_int_ge(jdt_cuk_arch(k), 50);
    return k;
}

#define GPU_OR_SKIP(k)                                                                             \
    char cache_dir_[256];                                                                          \
    jdt_cuk *k = gpu_or_skip(__func__, cache_dir_, sizeof cache_dir_);                             \
    if (!k) return

/* GPU_OR_SKIP for the emulator's own checks (what they check), which a GPU skips. */
#define EMU_OR_SKIP(k, what)                                                                       \
    GPU_OR_SKIP(k);                                                                                \
    if (!emulated_gpu()) {                                                                         \
        printf("SKIP %s: the emulator's own %s, not for a GPU\n", __func__, what);                 \
        jdt_cuk_free(k);                                                                           \
        return;                                                                                    \
    }

/* Whether the GPU is the host CUDA emulator (tests/infra/cudaemu), where a block's threads run
 * one after another on one core: the largest shapes are left to real GPUs. */
static bool emulated_gpu(void)
{
    struct cudaDeviceProp prop;
    return cudaGetDeviceProperties(&prop, 0) == cudaSuccess &&
           strncmp(prop.name, "cudaemu", 7) == 0;
}

static void *dev_alloc(size_t n_bytes)
{
    void *p = NULL;
    ck_assert_int_eq(cudaMalloc(&p, n_bytes ? n_bytes : 16), cudaSuccess);
    return p;
}

static void *dev_from(const void *host, size_t n_bytes)
{
    void *p = dev_alloc(n_bytes);
    if (n_bytes)
        ck_assert_int_eq(cudaMemcpy(p, host, n_bytes, cudaMemcpyHostToDevice), cudaSuccess);
    return p;
}

/* Waits for the stream, checks for errors and copies n floats back (caller frees). */
static float *dev_to_host(jdt_cuk *k, const float *dev, int64_t n)
{
    jdt_err e;
    jdt_err_clear(&e);
    jdt_status s = jdt_cuk_check(k, "test", true, &e);
    ck_assert_msg(s == JDT_OK, "%s", e.msg);
    float *h = malloc((size_t)(n ? n : 1) * sizeof(float));
    if (n)
        ck_assert_int_eq(cudaMemcpy(h, dev, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost),
                         cudaSuccess);
    return h;
}

static float *rand_floats(int64_t n, unsigned seed, float lo, float hi)
{
    float *x = malloc((size_t)(n ? n : 1) * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = lo + (hi - lo) * (float)(seed >> 8) / (float)(1u << 24);
    }
    return x;
}

/* x (n f32) on the device twice: as bf16 bit patterns (nearest even) in *d16 and as those
 * values widened to f32 in *dr; when bits is not NULL it receives the patterns too. */
static void dev_bf16_pair(const float *x, int64_t n, uint16_t **d16, float **dr, uint16_t *bits)
{
    uint16_t *h16 = malloc((size_t)(n ? n : 1) * 2);
    float *hr = malloc((size_t)(n ? n : 1) * 4);
    for (int64_t i = 0; i < n; i++) {
        h16[i] = jdt_rt_bf16_bits(x[i]);
        hr[i] = jdt_rt_bf16_round(x[i]);
    }
    if (bits) memcpy(bits, h16, (size_t)n * 2);
    *d16 = dev_from(h16, (size_t)n * 2);
    *dr = dev_from(hr, (size_t)n * 4);
    free(h16), free(hr);
}

/* |got - want| <= atol + rtol |want| everywhere; NaN must match NaN. */
static void expect_close(const char *what, const float *got, const float *want, int64_t n,
                         float atol, float rtol)
{
    for (int64_t i = 0; i < n; i++) {
        if (isnan(want[i])) {
            ck_assert_msg(isnan(got[i]), "%s[%lld]: got %g, want NaN", what, (long long)i,
                          (double)got[i]);
            continue;
        }
        float d = fabsf(got[i] - want[i]);
        ck_assert_msg(d <= atol + rtol * fabsf(want[i]), "%s[%lld]: got %.8g, want %.8g", what,
                      (long long)i, (double)got[i], (double)want[i]);
    }
}

/* ---- GEMM --------------------------------------------------------------------------------- */

static void check_matmul(jdt_cuk *k, int64_t batch, int64_t M, int64_t N, int64_t K, bool ta,
                         bool tb, bool shared, bool with_bias)
{
    int64_t na = batch * M * K, nb = (shared ? 1 : batch) * K * N, nc = batch * M * N;
    float *a = rand_floats(na, 1, -1, 1), *b = rand_floats(nb, 2, -1, 1);
    float *bias = rand_floats(N, 3, -1, 1), *want = malloc((size_t)nc * sizeof(float));
    jdt_rt_matmul(a, b, with_bias ? bias : NULL, want, batch, M, N, K, ta, tb, shared, 1);
    float *da = dev_from(a, (size_t)na * 4), *db = dev_from(b, (size_t)nb * 4);
    float *dbias = dev_from(bias, (size_t)N * 4), *dc = dev_alloc((size_t)nc * 4);
    jdt_err e;
    jdt_err_clear(&e);
    jdt_status s = jdt_cuk_matmul(k, da, db, with_bias ? dbias : NULL, NULL, dc, batch, M, N, K, ta,
                                  tb, shared, &e);
    ck_assert_msg(s == JDT_OK, "%s", e.msg);
    float *got = dev_to_host(k, dc, nc);
    char what[128];
    snprintf(what, sizeof what, "matmul b%lld M%lld N%lld K%lld ta%d tb%d shared%d bias%d",
             (long long)batch, (long long)M, (long long)N, (long long)K, ta, tb, shared, with_bias);
    /* TF32: 10-bit mantissa inputs, f32 accumulation; |a|,|b| <= 1 */
    expect_close(what, got, want, nc, 2e-3f * sqrtf((float)(K + 1)), 1e-2f);
    if (K > 0) { /* accumulating onto x (fold_addends): into a new c, then in place */
        float *x = rand_floats(nc, 9, -4, 4), *wx = malloc((size_t)nc * 4);
        for (int64_t i = 0; i < nc; i++)
            wx[i] = want[i] + x[i];
        float *dx = dev_from(x, (size_t)nc * 4);
        for (int inplace = 0; inplace < 2; inplace++) {
            s = jdt_cuk_matmul(k, da, db, with_bias ? dbias : NULL, dx, inplace ? dx : dc, batch, M,
                               N, K, ta, tb, shared, &e);
            ck_assert_msg(s == JDT_OK, "%s", e.msg);
            float *gx = dev_to_host(k, inplace ? dx : dc, nc);
            char wa[160];
            snprintf(wa, sizeof wa, "%s + acc%s", what, inplace ? " (in place)" : "");
            expect_close(wa, gx, wx, nc, 2e-3f * sqrtf((float)(K + 1)), 1e-2f);
            free(gx);
        }
        free(x), free(wx);
        cudaFree(dx);
    }
    free(a), free(b), free(bias), free(want), free(got);
    cudaFree(da), cudaFree(db), cudaFree(dbias), cudaFree(dc);
}

START_TEST(test_matmul)
{
    GPU_OR_SKIP(k);
    for (int f = 0; f < 16; f++)
        check_matmul(k, 3, 37, 53, 29, f & 1, f >> 1 & 1, f >> 2 & 1, f >> 3 & 1);
    check_matmul(k, 1, 130, 257, 300, false, true, true, true); /* a linear layer */
    check_matmul(k, 2, 5, 7, 0, false, false, false, true);     /* K = 0: bias rows */
    check_matmul(k, 2, 5, 7, 0, false, false, false, false);    /* K = 0: zeros */
    /* a repeated shape reuses its cached plan; results must not change */
    check_matmul(k, 3, 37, 53, 29, true, false, false, true);
    jdt_cuk_free(k);
}
END_TEST

/* bf16 compute vs the CPU's jdt_rt_matmul_bf16: the same bf16-rounded inputs, f32
 * accumulation on both sides, so only the summation order differs. a and b are not modified. */
static void expect_bf16_near(const char *what, const uint16_t *got, const uint16_t *want,
                             int64_t n);

static void check_matmul_bf16(jdt_cuk *k, int64_t batch, int64_t M, int64_t N, int64_t K, bool ta,
                              bool tb, bool shared, bool with_bias)
{
    int64_t na = batch * M * K, nb = (shared ? 1 : batch) * K * N, nc = batch * M * N;
    float *a = rand_floats(na, 4, -2, 2), *b = rand_floats(nb, 5, -1, 1);
    float *bias = rand_floats(N, 6, -1, 1), *want = malloc((size_t)nc * sizeof(float));
    float *scr = malloc((size_t)jdt_rt_matmul_bf16_scratch_floats(batch, M, N, K, shared) * 4 + 4);
    jdt_rt_matmul_bf16(a, b, with_bias ? bias : NULL, want, batch, M, N, K, ta, tb, shared, scr, 1);
    int64_t sb = jdt_cuk_matmul_bf16_scratch_bytes(batch, M, N, K, shared);
    float *da = dev_from(a, (size_t)na * 4), *db = dev_from(b, (size_t)nb * 4);
    float *dbias = dev_from(bias, (size_t)N * 4), *dc = dev_alloc((size_t)nc * 4);
    void *dscr = dev_alloc((size_t)sb);
    jdt_err e;
    jdt_err_clear(&e);
    jdt_status s = jdt_cuk_matmul_bf16(k, da, db, with_bias ? dbias : NULL, dc, batch, M, N, K, ta,
                                       tb, shared, dscr, sb, &e);
    ck_assert_msg(s == JDT_OK, "%s", e.msg);
    float *got = dev_to_host(k, dc, nc), *a2 = dev_to_host(k, da, na);
    char what[128];
    snprintf(what, sizeof what, "matmul_bf16 b%lld M%lld N%lld K%lld ta%d tb%d shared%d bias%d",
             (long long)batch, (long long)M, (long long)N, (long long)K, ta, tb, shared, with_bias);
    /* f32 accumulation on both sides, in different orders (and tensor-core partial sums): a
     * missing or different input rounding would be off by ~2^-9 sqrt(K) |a||b|, far above */
    expect_close(what, got, want, nc, 1e-4f * sqrtf((float)(K + 1)), 1e-4f);
    expect_close("matmul_bf16 left input unchanged", a2, a, na, 0, 0);
    /* operands stored as bf16 (the compiler's bf16 storage): read as they are, no conversion;
     * the same products (the GEMM algorithm may differ with the alignment: tolerance) */
    uint16_t *a16 = malloc((size_t)na * 2 + 2), *b16 = malloc((size_t)nb * 2 + 2);
    for (int64_t i = 0; i < na; i++) {
        float r = jdt_bf16_round(a[i]);
        uint32_t u;
        memcpy(&u, &r, 4);
        a16[i] = (uint16_t)(u >> 16);
    }
    for (int64_t i = 0; i < nb; i++) {
        float r = jdt_bf16_round(b[i]);
        uint32_t u;
        memcpy(&u, &r, 4);
        b16[i] = (uint16_t)(u >> 16);
    }
    void *da16 = dev_from(a16, (size_t)na * 2), *db16 = dev_from(b16, (size_t)nb * 2);
    for (int which = 1; which < 4; which++) {
        const bool a_bf = which & 1, b_bf = which & 2;
        ck_assert_int_eq(cudaMemset(dc, 0xff, (size_t)nc * 4), cudaSuccess);
        s = jdt_cuk_matmul_bf16_ex(k, a_bf ? da16 : (void *)da, b_bf ? db16 : (void *)db,
                                   with_bias ? dbias : NULL, NULL, dc, batch, M, N, K, ta, tb,
                                   shared, a_bf, b_bf, dscr, sb, &e);
        ck_assert_msg(s == JDT_OK, "%s", e.msg);
        float *g16 = dev_to_host(k, dc, nc);
        char w16[160];
        snprintf(w16, sizeof w16, "%s, bf16-stored a %d b %d", what, a_bf, b_bf);
        expect_close(w16, g16, want, nc, 1e-4f * sqrtf((float)(K + 1)), 1e-4f);
        free(g16);
    }
    if (K > 0) { /* accumulating onto x (fold_addends), bf16-stored operands */
        float *x = rand_floats(nc, 9, -4, 4), *wx = malloc((size_t)nc * 4);
        for (int64_t i = 0; i < nc; i++)
            wx[i] = want[i] + x[i];
        float *dx = dev_from(x, (size_t)nc * 4);
        s = jdt_cuk_matmul_bf16_ex(k, da16, db16, with_bias ? dbias : NULL, dx, dc, batch, M, N, K,
                                   ta, tb, shared, true, true, dscr, sb, &e);
        ck_assert_msg(s == JDT_OK, "%s", e.msg);
        float *gx = dev_to_host(k, dc, nc);
        char wa[160];
        snprintf(wa, sizeof wa, "%s, bf16-stored a and b, + acc", what);
        expect_close(wa, gx, wx, nc, 1e-4f * sqrtf((float)(K + 1)), 1e-4f);
        free(x), free(wx), free(gx);
        cudaFree(dx);
    }
    /* a bf16 output (precision.activations: bf16) with a bf16 bias: the f32 product plus the
     * bias, rounded, within a bf16 step of the CPU's rounding of it. cuBLASLt may round the
     * product to bf16 before it adds the bias (seen on an H200, cuBLASLt 13.0: a product of
     * 0.97169 and a bias of -0.96875 gave 2^-8, bf16(bf16(P) + bias), where bf16(P + bias) is
     * 0.0029449): half a bf16 step of the product more (2^-8 |P|), which a sum that cancels
     * shows */
    if (K > 0) {
        uint16_t *bias16 = malloc((size_t)N * 2), *c16 = malloc((size_t)nc * 2);
        float *biasr = malloc((size_t)N * 4), *wantr = malloc((size_t)nc * 4);
        for (int64_t i = 0; i < N; i++) {
            bias16[i] = jdt_rt_bf16_bits(bias[i]);
            biasr[i] = jdt_rt_bf16_round(bias[i]);
        }
        jdt_rt_matmul_bf16(a, b, with_bias ? biasr : NULL, wantr, batch, M, N, K, ta, tb, shared,
                           scr, 1);
        float *wnb = malloc((size_t)nc * 4); /* the product alone */
        jdt_rt_matmul_bf16(a, b, NULL, wnb, batch, M, N, K, ta, tb, shared, scr, 1);
#define BF16_OUT_TOL(w, p) (1e-4f * sqrtf((float)(K + 1)) + 8e-3f * fabsf(w) + 0x1p-8f * fabsf(p))
        uint16_t *dbias16 = dev_from(bias16, (size_t)N * 2), *dc16 = dev_alloc((size_t)nc * 2);
        for (int which = 0; which < 4; which++) {
            const bool a_bf = which & 1, b_bf = which & 2;
            s = jdt_cuk_matmul_bf16_out(k, a_bf ? da16 : (void *)da, b_bf ? db16 : (void *)db,
                                        with_bias ? dbias16 : NULL, dc16, batch, M, N, K, ta, tb,
                                        shared, a_bf, b_bf, dscr, sb, &e);
            ck_assert_msg(s == JDT_OK, "%s", e.msg);
            ck_assert_int_eq(cudaMemcpy(c16, dc16, (size_t)nc * 2, cudaMemcpyDeviceToHost),
                             cudaSuccess);
            for (int64_t i = 0; i < nc; i++) {
                uint32_t u = (uint32_t)c16[i] << 16;
                float g;
                memcpy(&g, &u, 4);
                float w = jdt_rt_bf16_round(wantr[i]);
                ck_assert_msg(fabsf(g - w) <= BF16_OUT_TOL(w, wnb[i]),
                              "%s, bf16 out (a %d b %d)[%lld]: got %g, want %g", what, a_bf, b_bf,
                              (long long)i, (double)g, (double)w);
            }
        }
        /* with the GELU epilogue (passes.c fold_gelu_epilogues): pre as the bf16 output above,
         * y the GELU of the f32 sum (cuBLASLt's order); then on the fallback (the GEMM, then
         * cuk_gelu_bf16: bitwise the GELU of the pre it wrote, within a step for tanhf) */
        uint16_t *dy16 = dev_alloc((size_t)nc * 2), *y16 = malloc((size_t)nc * 2),
                 *p16 = malloc((size_t)nc * 2), *w16 = malloc((size_t)nc * 2);
        for (int which = 0; which < 5; which++) {
            const bool a_bf = which & 1, b_bf = which & 2, fallback = which == 4;
            k->gelu_epilogue_off = fallback;
            s = jdt_cuk_matmul_bf16_gelu(k, a_bf ? da16 : (void *)da, b_bf ? db16 : (void *)db,
                                         with_bias ? dbias16 : NULL, dy16, dc16, batch, M, N, K, ta,
                                         tb, shared, a_bf, b_bf, dscr, sb, &e);
            ck_assert_msg(s == JDT_OK, "%s", e.msg);
            ck_assert_int_eq(cudaMemcpy(y16, dy16, (size_t)nc * 2, cudaMemcpyDeviceToHost),
                             cudaSuccess);
            ck_assert_int_eq(cudaMemcpy(p16, dc16, (size_t)nc * 2, cudaMemcpyDeviceToHost),
                             cudaSuccess);
            for (int64_t i = 0; i < nc; i++) {
                const float pv = jdt_rt_bf16_float(p16[i]), yv = jdt_rt_bf16_float(y16[i]);
                const float w = jdt_rt_bf16_round(wantr[i]), v = wantr[i];
                const float gv =
                    0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v)));
                const float gp =
                    0.5f * pv * (1.0f + tanhf(0.7978845608f * (pv + 0.044715f * pv * pv * pv)));
                w16[i] = jdt_rt_bf16_bits(gp);
                ck_assert_msg(fabsf(pv - w) <= BF16_OUT_TOL(w, wnb[i]),
                              "%s, gelu pre (a %d b %d)[%lld]: got %g, want %g", what, a_bf, b_bf,
                              (long long)i, (double)pv, (double)w);
                /* the product's early rounding through GELU's slope (within [-0.13, 1.13]) */
                ck_assert_msg(fallback || fabsf(yv - gv) <= 1.2e-4f * sqrtf((float)(K + 1)) +
                                                                8e-3f * fabsf(gv) +
                                                                1.13f * 0x1p-8f * fabsf(wnb[i]),
                              "%s, gelu (a %d b %d)[%lld]: got %g, want %g", what, a_bf, b_bf,
                              (long long)i, (double)yv, (double)gv);
            }
            if (fallback) expect_bf16_near("gelu fallback: GELU of pre", y16, w16, nc);
        }
        k->gelu_epilogue_off = false;
        /* the GELU backward's GEMM (fold_dgelu_epilogues): (a @ b) GELU'(u) as bf16, u a bf16
         * GELU input, and its column sums in f32 (the bias gradient): by the DGELU_BGRAD
         * epilogue (which 0-3), by DGELU alone (4: no sums asked), by DGELU then the column-sum
         * kernel (5) and by the GEMM, the GELU' kernel (the product rounded first) and the
         * column sums (6) */
        float *ur = rand_floats(nc, 10, -4, 4);
#undef BF16_OUT_TOL
        for (int64_t i = 0; i < nc; i++)
            p16[i] = jdt_rt_bf16_bits(ur[i]);
        uint16_t *du16 = dev_from(p16, (size_t)nc * 2);
        float *ddb = dev_alloc((size_t)N * 4), *gdb = malloc((size_t)N * 4);
        double *wdb = malloc((size_t)N * sizeof *wdb), *tdb = malloc((size_t)N * sizeof *tdb);
        for (int which = 0; which < 7; which++) {
            const bool a_bf = which & 1 && which < 4, b_bf = which & 2 && which < 4;
            const bool sums = which != 4, fallback = which == 6;
            k->dgelu_bgrad_off = which >= 5;
            k->dgelu_epilogue_off = fallback;
            ck_assert_int_eq(cudaMemset(ddb, 0xff, (size_t)N * 4), cudaSuccess); /* NaN */
            s = jdt_cuk_matmul_bf16_dgelu(k, a_bf ? da16 : (void *)da, b_bf ? db16 : (void *)db,
                                          du16, dy16, sums ? ddb : NULL, batch, M, N, K, ta, tb,
                                          shared, a_bf, b_bf, dscr, sb, &e);
            ck_assert_msg(s == JDT_OK, "%s", e.msg);
            ck_assert_int_eq(cudaMemcpy(y16, dy16, (size_t)nc * 2, cudaMemcpyDeviceToHost),
                             cudaSuccess);
            ck_assert_int_eq(cudaMemcpy(gdb, ddb, (size_t)N * 4, cudaMemcpyDeviceToHost),
                             cudaSuccess);
            for (int64_t j = 0; j < N; j++)
                wdb[j] = tdb[j] = 0.0;
            for (int64_t i = 0; i < nc; i++) {
                const float u = jdt_rt_bf16_float(p16[i]), g = jdt_rt_bf16_float(y16[i]);
                const float t = tanhf(0.7978845608f * (u + 0.044715f * u * u * u));
                const float d = 0.5f * (1.0f + t) + 0.5f * u * (1.0f - t * t) * 0.7978845608f *
                                                        (1.0f + 3.0f * 0.044715f * u * u);
                const float w = wnb[i] * d,
                            tol = 1.2e-4f * sqrtf((float)(K + 1)) + 8e-3f * fabsf(w);
                ck_assert_msg(fabsf(g - w) <= tol,
                              "%s, dgelu (a %d b %d, path %d)[%lld]: got %g, want %g", what, a_bf,
                              b_bf, which, (long long)i, (double)g, (double)w);
                wdb[i % N] += w; /* rows of N: (batch, M) of them */
                tdb[i % N] += (double)tol * tol;
            }
            for (int64_t j = 0; j < N; j++) /* 4 root-sum-squares of the elements' bounds (their
                                                 rounding errors are independent); unasked, the
                                                 sums are left alone */
                ck_assert_msg(sums ? fabs(gdb[j] - wdb[j]) <= 4 * sqrt(tdb[j]) + 1e-6 * fabs(wdb[j])
                                   : isnan(gdb[j]),
                              "%s, dgelu bias gradient (a %d b %d, path %d)[%lld]: got %g, want %g",
                              what, a_bf, b_bf, which, (long long)j, (double)gdb[j], wdb[j]);
        }
        k->dgelu_epilogue_off = k->dgelu_bgrad_off = false;
        free(gdb), free(wdb), free(tdb);
        cudaFree(ddb);
        free(wnb), free(ur);
        cudaFree(du16);
        free(y16), free(p16), free(w16);
        cudaFree(dy16);
        free(bias16), free(c16), free(biasr), free(wantr);
        cudaFree(dbias16), cudaFree(dc16);
    }
    free(a16), free(b16);
    cudaFree(da16), cudaFree(db16);
    /* too small a scratch is an error, not a write past it */
    if (K > 0) {
        s = jdt_cuk_matmul_bf16(k, da, db, NULL, dc, batch, M, N, K, ta, tb, shared, dscr, 2, &e);
        ck_assert_int_eq(s, JDT_ERR_INTERNAL);
        ck_assert_ptr_nonnull(strstr(e.msg, "scratch"));
    }
    free(a), free(b), free(bias), free(want), free(got), free(a2), free(scr);
    cudaFree(da), cudaFree(db), cudaFree(dbias), cudaFree(dc), cudaFree(dscr);
}

START_TEST(test_matmul_bf16)
{
    GPU_OR_SKIP(k);
    for (int f = 0; f < 16; f++)
        check_matmul_bf16(k, 3, 37, 53, 29, f & 1, f >> 1 & 1, f >> 2 & 1, f >> 3 & 1);
    check_matmul_bf16(k, 1, 256, 768, 512, false, false, true, true); /* aligned: a linear layer */
    check_matmul_bf16(k, 4, 64, 96, 128, true, false, false, false);  /* weight-gradient shape */
    check_matmul_bf16(k, 2, 5, 7, 0, false, false, false, true);      /* K = 0: bias rows */
    jdt_cuk_free(k);
}
END_TEST

/* The TF32 fallback where cuBLASLt has no bf16 algorithm (the emulator's
 * JDT_CUDAEMU_NO_BF16_GEMM=1; a GPU checks the bf16 path instead) with the scratch the compiler
 * plans (jdt_cuk_matmul_bf16_need_bytes: the f32 operands' bf16 copies, none for bf16-stored
 * ones): the fallback allocates its f32 copies for the call, gives them back (the device's free
 * memory as before), and computes the CPU's bf16 product; an f32 operand's copy in the
 * scratch and a bf16-stored operand alike. */
START_TEST(test_matmul_bf16_fallback)
{
    GPU_OR_SKIP(k);
    setenv("JDT_CUDAEMU_NO_BF16_GEMM", "1", 1); /* read at each plan: k has made none yet */
    const int64_t batch = 3, M = 37, N = 53, K = 29, na = batch * M * K, nb = K * N,
                  nc = batch * M * N;
    float *a = rand_floats(na, 41, -2, 2), *b = rand_floats(nb, 42, -1, 1);
    float *want = malloc((size_t)nc * 4);
    float *scr = malloc((size_t)jdt_rt_matmul_bf16_scratch_floats(batch, M, N, K, true) * 4 + 4);
    jdt_rt_matmul_bf16(a, b, NULL, want, batch, M, N, K, false, false, true, scr, 1);
    uint16_t *b16 = malloc((size_t)nb * 2);
    for (int64_t i = 0; i < nb; i++)
        b16[i] = jdt_rt_bf16_bits(b[i]);
    float *da = dev_from(a, (size_t)na * 4), *dc = dev_alloc((size_t)nc * 4);
    void *db = dev_from(b, (size_t)nb * 4), *db16 = dev_from(b16, (size_t)nb * 2);
    for (int b_bf = 0; b_bf < 2; b_bf++) {
        const int64_t sb = jdt_cuk_matmul_bf16_need_bytes(batch, M, N, K, true, false, b_bf);
        ck_assert_int_lt(sb, jdt_cuk_matmul_bf16_scratch_bytes(batch, M, N, K, true));
        void *dscr = dev_alloc((size_t)sb);
        size_t free0 = 0, free1 = 0, total = 0;
        ck_assert_int_eq(cudaMemGetInfo(&free0, &total), cudaSuccess);
        const int before = k->tf32_fallbacks;
        ck_assert_int_eq(cudaMemset(dc, 0xff, (size_t)nc * 4), cudaSuccess);
        jdt_err e;
        jdt_err_clear(&e);
        jdt_status st = jdt_cuk_matmul_bf16_ex(k, da, b_bf ? db16 : db, NULL, NULL, dc, batch, M, N,
                                               K, false, false, true, false, b_bf, dscr, sb, &e);
        ck_assert_msg(st == JDT_OK, "%s", e.msg);
        float *got = dev_to_host(k, dc, nc);
        ck_assert_int_eq(cudaMemGetInfo(&free1, &total), cudaSuccess);
        ck_assert_msg(free1 == free0, "the fallback's copies not given back: %zu -> %zu free",
                      free0, free1);
        if (emulated_gpu())
            ck_assert_msg(k->tf32_fallbacks == before + 1, "the fallback did not run");
        expect_close(b_bf ? "TF32 fallback, bf16-stored b, planned scratch"
                          : "TF32 fallback, planned scratch",
                     got, want, nc, 1e-4f * sqrtf((float)(K + 1)), 1e-4f);
        free(got);
        cudaFree(dscr);
    }
    free(a), free(b), free(want), free(scr), free(b16);
    cudaFree(da), cudaFree(dc), cudaFree(db), cudaFree(db16);
    unsetenv("JDT_CUDAEMU_NO_BF16_GEMM");
    jdt_cuk_free(k);
}
END_TEST

/* Padded rows (jdt_cuk_gemm_pitch; fuse.c mark_pitched_rows pads GPT-2's logits and dlogits):
 * a (M, K), or stored (K, M) with ta, b (K, N) and c (M, N), each with rows padded, against the
 * product of the same bf16-exact values on rows back to back: f32 operands (TF32 tensor cores,
 * exact on such values), bf16-stored operands with an f32 output, and with a bf16 output. The
 * operands' padding holds NaN (a read of it shows in c); c's must come back as it was. Then the
 * misuses are errors, and take the pending strides with them: an entry point without strides,
 * and a padded f32 operand that bf16 compute would convert. */
/* jdt_cuk_colsum_bf16's order (cuk.h) replayed on the host: the chunks, in each the 8 strided
 * sums and their sum in order, then the chunks in order. */
static void colsum_replay(const uint16_t *x, float *y, int64_t rows, int64_t N)
{
    int64_t chunk = JDT_CUK_COLSUM_CHUNK;
    const int64_t fit = JDT_CUK_WORKSPACE_BYTES / (4 * N);
    if ((rows + chunk - 1) / chunk > fit) chunk = (rows + fit - 1) / fit;
    const int64_t chunks = rows > 0 ? (rows + chunk - 1) / chunk : 1;
    for (int64_t c = 0; c < N; c++) {
        float t = 0.0f;
        for (int64_t q = 0; q < chunks; q++) {
            float s[8] = {0};
            const int64_t r1 = q * chunk + chunk < rows ? q * chunk + chunk : rows;
            for (int w = 0; w < 8; w++)
                for (int64_t r = q * chunk + w; r < r1; r += 8)
                    s[w] += jdt_rt_bf16_float(x[r * N + c]);
            float p = s[0];
            for (int w = 1; w < 8; w++)
                p += s[w];
            t = q == 0 ? p : t + p;
        }
        y[c] = t;
    }
}

/* The bias gradient's column sums (jdt_cuk_colsum_bf16): bit for bit the host's replay of their
 * order, within rounding of double sums, every column written (y poisoned first), over shapes
 * with partial tiles and chunks, no rows, one column, and GPT-2's MLP width. (Chunks grow only
 * past 4G elements, where their sums would not fit the GEMM workspace: not run here.) */
START_TEST(test_colsum_bf16)
{
    GPU_OR_SKIP(k);
    const int64_t shapes[][2] = {{1500, 130}, {0, 5}, {7, 1}, {2048, 64}, {4100, 3072}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int64_t rows = shapes[i][0], N = shapes[i][1], n = rows * N;
        float *xf = rand_floats(n, 71 + (unsigned)i, -3, 3), *want = malloc((size_t)N * 4);
        uint16_t *x = malloc((size_t)(n ? n : 1) * 2);
        for (int64_t j = 0; j < n; j++)
            x[j] = jdt_rt_bf16_bits(xf[j]);
        colsum_replay(x, want, rows, N);
        uint16_t *dx = dev_from(x, (size_t)n * 2);
        float *dy = dev_alloc((size_t)N * 4);
        ck_assert_int_eq(cudaMemset(dy, 0xff, (size_t)N * 4), cudaSuccess);
        jdt_cuk_colsum_bf16(k, dx, dy, rows, N);
        float *got = dev_to_host(k, dy, N);
        for (int64_t c = 0; c < N; c++) {
            double exact = 0.0;
            for (int64_t r = 0; r < rows; r++)
                exact += jdt_rt_bf16_float(x[r * N + c]);
            ck_assert_msg(memcmp(&got[c], &want[c], 4) == 0 &&
                              fabs(got[c] - exact) <= 1e-6 * rows * 3 + 1e-6,
                          "colsum rows %lld N %lld [%lld]: got %.9g, the replay %.9g, exact %.9g",
                          (long long)rows, (long long)N, (long long)c, (double)got[c],
                          (double)want[c], exact);
        }
        free(xf), free(want), free(x), free(got);
        cudaFree(dx), cudaFree(dy);
    }
    jdt_cuk_free(k);
}
END_TEST

START_TEST(test_matmul_pitched)
{
    GPU_OR_SKIP(k);
    const int64_t M = 37, N = 71, LB = 128, LC = 128;
    jdt_err e;
    jdt_err_clear(&e);
    /* K 53, then 1029: a bf16 output splits K only past 1024 (cuk_gemm.c gemm) */
    for (int f = 0; f < 4; f++) {
        const int ta = f & 1;
        const int64_t K = f < 2 ? 53 : 1029, LA = f < 2 ? 64 : 1040;
        const int64_t ar = ta ? K : M, ac = ta ? M : K; /* a as stored: rows, columns */
        float *a = rand_floats(ar * ac, 41, -1, 1), *b = rand_floats(K * N, 42, -1, 1);
        for (int64_t i = 0; i < ar * ac; i++)
            a[i] = jdt_rt_bf16_round(a[i]);
        for (int64_t i = 0; i < K * N; i++)
            b[i] = jdt_rt_bf16_round(b[i]);
        float *want = malloc((size_t)(M * N) * 4), *ap = malloc((size_t)(ar * LA) * 4),
              *bp = malloc((size_t)(K * LB) * 4), *cp = malloc((size_t)(M * LC) * 4);
        uint16_t *ap16 = malloc((size_t)(ar * LA) * 2), *bp16 = malloc((size_t)(K * LB) * 2),
                 *cp16 = malloc((size_t)(M * LC) * 2);
        jdt_rt_matmul(a, b, NULL, want, 1, M, N, K, ta, false, true, 1);
        for (int64_t r = 0; r < ar; r++)
            for (int64_t c = 0; c < LA; c++) {
                ap[r * LA + c] = c < ac ? a[r * ac + c] : NAN;
                ap16[r * LA + c] = c < ac ? jdt_rt_bf16_bits(a[r * ac + c]) : 0x7fc0;
            }
        for (int64_t r = 0; r < K; r++)
            for (int64_t c = 0; c < LB; c++) {
                bp[r * LB + c] = c < N ? b[r * N + c] : NAN;
                bp16[r * LB + c] = c < N ? jdt_rt_bf16_bits(b[r * N + c]) : 0x7fc0;
            }
        float *dap = dev_from(ap, (size_t)(ar * LA) * 4), *dbp = dev_from(bp, (size_t)(K * LB) * 4);
        uint16_t *dap16 = dev_from(ap16, (size_t)(ar * LA) * 2),
                 *dbp16 = dev_from(bp16, (size_t)(K * LB) * 2);
        float *dc = dev_alloc((size_t)(M * LC) * 4);
        uint16_t *dc16 = dev_alloc((size_t)(M * LC) * 2);
        /* M, N and K unaligned: each path as one GEMM, then split into aligned bulks and
         * remainders (cuk_gemm.c gemm_split: reads within the rows, writes only c's columns;
         * rows 32-36 are the M remainder's) */
        for (int path = 0; path < 6; path++) {
            const int64_t n_split = k->n_split;
            k->gemm_split = path >= 3;
            ck_assert_int_eq(cudaMemset(dc, 0xff, (size_t)(M * LC) * 4), cudaSuccess);
            ck_assert_int_eq(cudaMemset(dc16, 0xff, (size_t)(M * LC) * 2), cudaSuccess);
            jdt_cuk_gemm_pitch(k, LA, LB, LC);
            jdt_status s = path % 3 == 0 ? jdt_cuk_matmul(k, dap, dbp, NULL, NULL, dc, 1, M, N, K,
                                                          ta, false, true, &e)
                           : path % 3 == 1
                               ? jdt_cuk_matmul_bf16_ex(k, dap16, dbp16, NULL, NULL, dc, 1, M, N, K,
                                                        ta, false, true, true, true, NULL, 0, &e)
                               : jdt_cuk_matmul_bf16_out(k, dap16, dbp16, NULL, dc16, 1, M, N, K,
                                                         ta, false, true, true, true, NULL, 0, &e);
            ck_assert_msg(s == JDT_OK, "%s", e.msg);
            ck_assert_msg(k->n_split == n_split + (path >= 3),
                          "pitched matmul K %lld ta %d path %d: %s", (long long)K, ta, path,
                          path >= 3 ? "not split" : "split with JDT_GEMM_SPLIT=0");
            ck_assert_msg(jdt_cuk_check(k, "pitched matmul", true, &e) == JDT_OK, "%s", e.msg);
            ck_assert_int_eq(cudaMemcpy(cp, dc, (size_t)(M * LC) * 4, cudaMemcpyDeviceToHost),
                             cudaSuccess);
            ck_assert_int_eq(cudaMemcpy(cp16, dc16, (size_t)(M * LC) * 2, cudaMemcpyDeviceToHost),
                             cudaSuccess);
            for (int64_t r = 0; r < M; r++)
                for (int64_t c = 0; c < LC; c++) {
                    uint32_t bits;
                    memcpy(&bits, &cp[r * LC + c], 4);
                    const float g =
                        path % 3 == 2 ? jdt_rt_bf16_float(cp16[r * LC + c]) : cp[r * LC + c];
                    if (c >= N) { /* the padding of both outputs as it was */
                        ck_assert_msg(bits == 0xffffffffu &&
                                          (path % 3 < 2 || cp16[r * LC + c] == 0xffff),
                                      "pitched matmul K %lld ta %d path %d: padding (%lld, %lld) "
                                      "written",
                                      (long long)K, ta, path, (long long)r, (long long)c);
                        continue;
                    }
                    const float w = want[r * N + c];
                    /* a bf16 c split over K rounds the remainder's terms first: 2^-8 of their
                     * magnitude more */
                    float rem = 0.0f;
                    for (int64_t i = K - K % 8; path == 5 && K > 1024 && i < K; i++)
                        rem += fabsf(a[ta ? i * M + r : r * K + i] * b[i * N + c]);
                    ck_assert_msg(
                        fabsf(g - w) <= 1e-4f * sqrtf((float)K) + 8e-3f * fabsf(w) + 0x1p-8f * rem,
                        "pitched matmul K %lld ta %d path %d (%lld, %lld): got %g, want %g",
                        (long long)K, ta, path, (long long)r, (long long)c, (double)g, (double)w);
                }
        }
        k->gemm_split = true;
        free(a), free(b), free(want), free(ap), free(bp), free(cp), free(ap16), free(bp16);
        free(cp16);
        cudaFree(dap), cudaFree(dbp), cudaFree(dap16), cudaFree(dbp16), cudaFree(dc);
        cudaFree(dc16);
    }
    /* misuses: errors that name the padding, and the next call runs on dense rows */
    const int64_t n = 8;
    float *x = rand_floats(n * n, 43, -1, 1), *dx = dev_from(x, (size_t)(n * n) * 4),
          *dy = dev_alloc((size_t)(n * n) * 4);
    uint16_t *d16 = dev_alloc((size_t)(n * n) * 2), *p16 = dev_alloc((size_t)(n * n) * 2);
    void *scr = dev_alloc(4096);
    jdt_cuk_gemm_pitch(k, 0, 0, 16);
    ck_assert_int_eq(jdt_cuk_matmul_bf16_gelu(k, dx, dx, NULL, d16, p16, 1, n, n, n, false, false,
                                              true, false, false, scr, 4096, &e),
                     JDT_ERR_INTERNAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "padded rows"));
    jdt_cuk_gemm_pitch(k, 16, 0, 0);
    ck_assert_int_eq(jdt_cuk_matmul_bf16_ex(k, dx, dx, NULL, NULL, dy, 1, n, n, n, false, false,
                                            true, false, false, scr, 4096, &e),
                     JDT_ERR_INTERNAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "padded f32 operand"));
    ck_assert_msg(jdt_cuk_matmul(k, dx, dx, NULL, NULL, dy, 1, n, n, n, false, false, true, &e) ==
                      JDT_OK,
                  "%s", e.msg);
    int timed, changed;
    jdt_cuk_gemm_tuning(k, &timed, &changed);
    if (!getenv("JDT_CUDA_AUTOTUNE")) ck_assert_int_eq(timed, 0); /* no timing by default */
    free(x);
    cudaFree(dx), cudaFree(dy), cudaFree(d16), cudaFree(p16), cudaFree(scr);
    jdt_cuk_free(k);
}
END_TEST

/* A context with JDT_CUDA_AUTOTUNE set to env (NULL: unset, the default auto) on cache_dir. */
static jdt_cuk *tune_ctx(const char *cache_dir, const char *env)
{
    if (env)
        setenv("JDT_CUDA_AUTOTUNE", env, 1);
    else
        unsetenv("JDT_CUDA_AUTOTUNE");
    jdt_cuk *k = NULL;
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_msg(jdt_cuk_init(0, cache_dir, &k, &e) == JDT_OK, "%s", e.msg);
    return k;
}

/* c = a @ b (M, N, K) on k, into c (a call that may be timed), copied to the host; *timed and
 * *remembered the context's counts after it. */
static float *tune_call(jdt_cuk *k, const float *da, const float *db, float *dc, int64_t M,
                        int64_t N, int64_t K, int *timed, int *remembered)
{
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_msg(jdt_cuk_matmul(k, da, db, NULL, NULL, dc, 1, M, N, K, false, false, true, &e) ==
                      JDT_OK,
                  "%s", e.msg);
    int changed;
    jdt_cuk_gemm_tuning(k, timed, &changed);
    *remembered = k->n_remembered;
    return dev_to_host(k, dc, M * N);
}

/* The only "gemmpick" entry of dir, its key in *key; its path in path. */
static void the_pick(const char *dir, uint64_t *key, char *path, size_t n)
{
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int found = 0;
    for (struct dirent *de; (de = readdir(d));) {
        unsigned long long h;
        char kind[16];
        if (sscanf(de->d_name, "jdt-%16llx.%15s", &h, kind) == 2 && strcmp(kind, "gemmpick") == 0) {
            *key = (uint64_t)h;
            snprintf(path, n, "%s/%s", dir, de->d_name);
            found++;
        }
    }
    closedir(d);
    ck_assert_int_eq(found, 1);
}

/* The default (JDT_CUDA_AUTOTUNE unset: auto) times a plan once and remembers its pick in the
 * kernel cache: a later context takes it untimed, with the same result (bit for bit on the
 * emulator, whose algorithms compute the same); =1 times it again, =0 never times; a pick that
 * is damaged, or no longer among the heuristic's candidates, is timed again and remembered
 * anew. */
START_TEST(test_matmul_autotune_remembered)
{
    GPU_OR_SKIP(k0);
    jdt_cuk_free(k0);
    const bool emu = emulated_gpu();
    if (emu) setenv("JDT_CUDAEMU_SLOW_ALGO", "0", 1);
    char dir[] = "/tmp/jdt-check-cuk-pick.XXXXXX"; /* this test's picks alone */
    ck_assert(mkdtemp(dir) != NULL);
    char cmd[600];
    const int64_t M = 64, N = 48, K = 40;
    float *a = rand_floats(M * K, 61, -1, 1), *b = rand_floats(K * N, 62, -1, 1);
    float *want = malloc((size_t)(M * N) * 4);
    jdt_rt_matmul(a, b, NULL, want, 1, M, N, K, false, false, true, 1);
    float *da = dev_from(a, (size_t)(M * K) * 4), *db = dev_from(b, (size_t)(K * N) * 4);
    float *dc = dev_alloc((size_t)(M * N) * 4);
    const float atol = 2e-3f * sqrtf((float)(K + 1)), rtol = 1e-2f;
    int timed, remembered;
    /* auto, nothing remembered: timed, and the pick stored */
    jdt_cuk *k = tune_ctx(dir, NULL);
    float *first = tune_call(k, da, db, dc, M, N, K, &timed, &remembered);
    expect_close("autotuned matmul", first, want, M * N, atol, rtol);
    ck_assert_int_eq(timed, 1);
    ck_assert_int_eq(remembered, 0);
    jdt_cuk_free(k);
    uint64_t key = 0;
    char path[512];
    the_pick(dir, &key, path, sizeof path);
    /* auto again: the remembered pick, untimed */
    k = tune_ctx(dir, NULL);
    float *got = tune_call(k, da, db, dc, M, N, K, &timed, &remembered);
    ck_assert_int_eq(timed, 0);
    ck_assert_int_eq(remembered, 1);
    if (emu)
        ck_assert_msg(memcmp(got, first, (size_t)(M * N) * 4) == 0, "remembered pick: other bits");
    else
        expect_close("matmul on the remembered pick", got, want, M * N, atol, rtol);
    free(got);
    jdt_cuk_free(k);
    /* 1: timed again; 0: never timed, nothing taken */
    static const char *const envs[2] = {"1", "0"};
    for (int i = 0; i < 2; i++) {
        k = tune_ctx(dir, envs[i]);
        got = tune_call(k, da, db, dc, M, N, K, &timed, &remembered);
        expect_close("matmul", got, want, M * N, atol, rtol);
        ck_assert_int_eq(timed, i == 0);
        ck_assert_int_eq(remembered, 0);
        free(got);
        jdt_cuk_free(k);
    }
    /* entries that cannot be taken: another algorithm at the index (its hash), an index past
     * the candidates, bytes the cache's checksum refuses; each timed again, then remembered */
    static const char *const bad[3] = {"0 0\n", "99 0\n", NULL};
    for (int i = 0; i < 3; i++) {
        jdt_err e;
        jdt_err_clear(&e);
        if (bad[i]) {
            ck_assert_msg(jdt_compile_cache_put(dir, key, "gemmpick", bad[i], strlen(bad[i]), -1,
                                                &e) == JDT_OK,
                          "%s", e.msg);
        } else {
            FILE *f = fopen(path, "r+b");
            ck_assert_ptr_nonnull(f);
            ck_assert_int_eq(fputs("9", f) >= 0, 1);
            fclose(f);
        }
        k = tune_ctx(dir, NULL);
        got = tune_call(k, da, db, dc, M, N, K, &timed, &remembered);
        expect_close("matmul past a bad pick", got, want, M * N, atol, rtol);
        ck_assert_msg(timed == 1 && remembered == 0, "bad pick %d: timed %d, remembered %d", i,
                      timed, remembered);
        free(got);
        jdt_cuk_free(k);
        k = tune_ctx(dir, NULL);
        got = tune_call(k, da, db, dc, M, N, K, &timed, &remembered);
        ck_assert_msg(timed == 0 && remembered == 1, "after bad pick %d: timed %d, remembered %d",
                      i, timed, remembered);
        free(got);
        jdt_cuk_free(k);
    }
    /* within a context: a plan the 64-plan ring evicted, built again, takes its pick from the
     * context's memory, untimed, though the disk has none (a salt of this test's own) */
    k = tune_ctx(dir, NULL);
    k->pick_salt = (int64_t)getpid() << 20 ^ (int64_t)time(NULL);
    got = tune_call(k, da, db, dc, M, N, K, &timed, &remembered);
    free(got);
    ck_assert_int_eq(timed, 1);
    jdt_err e;
    jdt_err_clear(&e);
    for (int64_t i = 0; i < JDT_CUK_PLANS;
         i++) /* other aligned shapes (4 + 4 (i / 4), 4 + 4 (i % 4), K) */
        ck_assert_msg(jdt_cuk_matmul(k, da, db, NULL, NULL, dc, 1, 4 + 4 * (i / 4), 4 + 4 * (i % 4),
                                     K, false, false, true, &e) == JDT_OK,
                      "%s", e.msg);
    bool evicted = true;
    for (int i = 0; i < JDT_CUK_PLANS; i++)
        if (k->plans[i].used && k->plans[i].key[1] == M && k->plans[i].key[2] == N) evicted = false;
    ck_assert_msg(evicted, "the first plan is still in the ring");
    snprintf(cmd, sizeof cmd, "rm -f %s/*.gemmpick", dir);
    ck_assert_int_eq(system(cmd), 0);
    int timed_before = 0;
    jdt_cuk_gemm_tuning(k, &timed_before, &(int){0});
    got = tune_call(k, da, db, dc, M, N, K, &timed, &remembered);
    expect_close("matmul built again after eviction", got, want, M * N, atol, rtol);
    ck_assert_int_eq(timed, timed_before);
    ck_assert_int_eq(remembered, 0);
    free(got);
    jdt_cuk_free(k);
    setenv("JDT_CUDA_AUTOTUNE", "0", 1); /* main's pin, for the tests after (CK_FORK=no) */
    unsetenv("JDT_CUDAEMU_SLOW_ALGO");
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
    free(a), free(b), free(want), free(first);
    cudaFree(da), cudaFree(db), cudaFree(dc);
}
END_TEST

/* JDT_CUDA_AUTOTUNE=1: a plan is timed at its first call that gives the same result when run
 * again, never at an in-place accumulation (each timed run would add the product once more),
 * and every call's result stays the product. On the emulator, whose heuristic offers 4
 * algorithms, the slow first one is left for another and the refused second one skipped. */
START_TEST(test_matmul_autotune)
{
    setenv("JDT_CUDA_AUTOTUNE", "1", 1);
    GPU_OR_SKIP(k);
    const bool emu = emulated_gpu();
    if (emu) {
        setenv("JDT_CUDAEMU_SLOW_ALGO", "0", 1);
        setenv("JDT_CUDAEMU_BAD_ALGO", "1", 1);
    }
    const int64_t M = 64, N = 48, K = 40, nc = M * N;
    float *a = rand_floats(M * K, 51, -1, 1), *b = rand_floats(K * N, 52, -1, 1);
    float *x = rand_floats(nc, 53, -4, 4), *want = malloc((size_t)nc * 4),
          *wx = malloc((size_t)nc * 4);
    jdt_rt_matmul(a, b, NULL, want, 1, M, N, K, false, false, true, 1);
    for (int64_t i = 0; i < nc; i++)
        wx[i] = want[i] + x[i];
    float *da = dev_from(a, (size_t)(M * K) * 4), *db = dev_from(b, (size_t)(K * N) * 4);
    float *dc = dev_alloc((size_t)nc * 4);
    const float atol = 2e-3f * sqrtf((float)(K + 1)), rtol = 1e-2f;
    jdt_err e;
    jdt_err_clear(&e);
    int timed = -1, changed = -1;
    for (int pass = 0; pass < 3; pass++) { /* in place, into another c, in place again */
        float *dx = dev_from(x, (size_t)nc * 4);
        const bool inplace = pass != 1;
        jdt_status s = jdt_cuk_matmul(k, da, db, NULL, inplace ? dx : NULL, inplace ? dx : dc, 1, M,
                                      N, K, false, false, true, &e);
        ck_assert_msg(s == JDT_OK, "%s", e.msg);
        float *got = dev_to_host(k, inplace ? dx : dc, nc);
        expect_close(inplace ? "autotuned matmul + acc (in place)" : "autotuned matmul", got,
                     inplace ? wx : want, nc, atol, rtol);
        jdt_cuk_gemm_tuning(k, &timed, &changed);
        ck_assert_int_eq(timed, pass == 0 ? 0 : 1); /* pass 0 may not time, pass 1 must */
        free(got);
        cudaFree(dx);
    }
    if (emu) ck_assert_int_eq(changed, 1); /* the slow first algorithm left */
    /* a bf16-output plan of the same shape is another plan, timed at its first call */
    uint16_t *a16 = malloc((size_t)(M * K) * 2), *b16 = malloc((size_t)(K * N) * 2),
             *c16 = malloc((size_t)nc * 2);
    for (int64_t i = 0; i < M * K; i++)
        a16[i] = jdt_rt_bf16_bits(a[i]), a[i] = jdt_rt_bf16_round(a[i]);
    for (int64_t i = 0; i < K * N; i++)
        b16[i] = jdt_rt_bf16_bits(b[i]), b[i] = jdt_rt_bf16_round(b[i]);
    jdt_rt_matmul(a, b, NULL, want, 1, M, N, K, false, false, true, 1);
    uint16_t *da16 = dev_from(a16, (size_t)(M * K) * 2), *db16 = dev_from(b16, (size_t)(K * N) * 2),
             *dc16 = dev_alloc((size_t)nc * 2);
    ck_assert_msg(jdt_cuk_matmul_bf16_out(k, da16, db16, NULL, dc16, 1, M, N, K, false, false, true,
                                          true, true, NULL, 0, &e) == JDT_OK,
                  "%s", e.msg);
    ck_assert_msg(jdt_cuk_check(k, "autotuned bf16 matmul", true, &e) == JDT_OK, "%s", e.msg);
    ck_assert_int_eq(cudaMemcpy(c16, dc16, (size_t)nc * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t i = 0; i < nc; i++)
        ck_assert_msg(fabsf(jdt_rt_bf16_float(c16[i]) - want[i]) <= 1e-4f + 8e-3f * fabsf(want[i]),
                      "autotuned bf16 matmul [%lld]: got %g, want %g", (long long)i,
                      (double)jdt_rt_bf16_float(c16[i]), (double)want[i]);
    jdt_cuk_gemm_tuning(k, &timed, &changed);
    ck_assert_int_eq(timed, 2);
    if (emu) ck_assert_int_eq(changed, 2);
    free(a), free(b), free(x), free(want), free(wx), free(a16), free(b16), free(c16);
    cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(da16), cudaFree(db16), cudaFree(dc16);
    jdt_cuk_free(k);
}
END_TEST

/* The f32 -> bf16 conversion is bitwise jdt_bf16_round: ties to even, NaN, Inf, overflow,
 * subnormals, both the float4 and the scalar path. */
START_TEST(test_to_bf16)
{
    GPU_OR_SKIP(k);
    const int64_t n = 4099;
    float *x = rand_floats(n, 7, -1e4f, 1e4f);
    const uint32_t special[] = {
        0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u,
        0x7fc00001u, 0x7f800001u, 0x00000001u, 0x80008000u, 0x00018000u, 0x477fe000u, 0};
    for (int i = 0; i < (int)(sizeof special / sizeof special[0]); i++)
        memcpy(&x[i * 97], &special[i], 4);
    float *dx = dev_from(x, (size_t)n * 4), *dr = dev_alloc((size_t)n * 4);
    uint16_t *dy = dev_alloc((size_t)n * 2 + 16), *y = malloc((size_t)n * 2 + 16);
    for (int pass = 0; pass < 2; pass++) { /* n - 3: a multiple of 4 (vector path), then n */
        int64_t m = pass ? n : n - 3;
        jdt_cuk_to_bf16(k, dx, dy, m);
        jdt_err e;
        jdt_err_clear(&e);
        ck_assert_msg(jdt_cuk_check(k, "to_bf16", true, &e) == JDT_OK, "%s", e.msg);
        ck_assert_int_eq(cudaMemcpy(y, dy, (size_t)m * 2, cudaMemcpyDeviceToHost), cudaSuccess);
        for (int64_t i = 0; i < m; i++) {
            float r = jdt_bf16_round(x[i]);
            uint32_t u;
            memcpy(&u, &r, 4);
            ck_assert_msg(y[i] == (uint16_t)(u >> 16),
                          "to_bf16[%lld] of %a: got 0x%04x, want 0x%04x", (long long)i,
                          (double)x[i], y[i], (unsigned)(u >> 16));
        }
    }
    /* the f32-valued rounding (the TF32 fallback's inputs): the same bits, low half zero */
    jdt_cuk_bf16_round(k, dx, dr, n);
    float *r = dev_to_host(k, dr, n);
    for (int64_t i = 0; i < n; i++) {
        float w = jdt_bf16_round(x[i]);
        ck_assert_msg(memcmp(&w, &r[i], 4) == 0, "bf16_round[%lld] of %a: got %a, want %a",
                      (long long)i, (double)x[i], (double)r[i], (double)w);
    }
    free(x), free(y), free(r);
    cudaFree(dx), cudaFree(dy), cudaFree(dr);
    jdt_cuk_free(k);
}
END_TEST

/* The collectives' block order on the device equals the CPU's jdt_permute_blocks_f32, both
 * ways (the NCCL all-gather / reduce-scatter wire order, engine/backend/cuda/cuda.c), and a
 * bucket's wire layout (segments wider than one part) round-trips. */
START_TEST(test_permute_blocks)
{
    GPU_OR_SKIP(k);
    const int64_t shapes[][3] = {{2, 3, 5}, {4, 1, 7}, {3, 8, 1}, {8, 12, 768}, {1, 5, 9}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t nb = shapes[s][0], outer = shapes[s][1], blk = shapes[s][2], n = nb * outer * blk;
        float *x = rand_floats(n, 9 + (unsigned)s, -1, 1), *want = malloc((size_t)n * 4);
        float *dx = dev_from(x, (size_t)n * 4), *dy = dev_alloc((size_t)n * 4);
        for (int to_outer = 0; to_outer < 2; to_outer++) {
            jdt_permute_blocks_f32(x, want, nb, outer, blk, to_outer);
            jdt_cuk_permute_blocks(k, dx, dy, nb, outer, blk, to_outer);
            float *got = dev_to_host(k, dy, n);
            char what[96];
            snprintf(what, sizeof what, "permute k%lld outer%lld blk%lld to_outer%d", (long long)nb,
                     (long long)outer, (long long)blk, to_outer);
            expect_close(what, got, want, n, 0, 0);
            free(got);
        }
        /* a bucket's wire (jdt_cuk_wire_bytes): segments of seg > one part, this member's
         * part r at off in segment r; put, then get back */
        const int64_t seg = outer * blk + 5, off = 3, nw = nb * seg;
        float *wire = malloc((size_t)nw * 4), *dw = dev_alloc((size_t)nw * 4);
        ck_assert_int_eq(cudaMemset(dw, 0, (size_t)nw * 4), cudaSuccess);
        jdt_cuk_wire_bytes(k, dx, dw, nb, outer, blk * 4, seg * 4, off * 4, false);
        memset(wire, 0, (size_t)nw * 4);
        for (int64_t r = 0; r < nb; r++)
            for (int64_t o = 0; o < outer; o++)
                memcpy(wire + r * seg + off + o * blk, x + (o * nb + r) * blk, (size_t)blk * 4);
        float *got = dev_to_host(k, dw, nw);
        expect_close("wire put", got, wire, nw, 0, 0);
        free(got);
        ck_assert_int_eq(cudaMemset(dy, 0, (size_t)n * 4), cudaSuccess);
        jdt_cuk_wire_bytes(k, dy, dw, nb, outer, blk * 4, seg * 4, off * 4, true);
        got = dev_to_host(k, dy, n);
        expect_close("wire get", got, x, n, 0, 0);
        free(got), free(wire);
        cudaFree(dw);
        free(x), free(want);
        cudaFree(dx), cudaFree(dy);
    }
    jdt_cuk_free(k);
}
END_TEST

/* NCCL on one GPU: a one-rank job (a real rendezvous on loopback) makes a communicator through
 * the KV store, and every collective the backend uses runs and leaves the data as one rank's
 * sum/max/gather/scatter must (NCCL refuses two ranks on one GPU: the multi-rank paths need a
 * machine with 2+ GPUs, scripts/gpu/check.sh stage 6). Checks libnccl's loading, the
 * non-blocking init, enqueue, event ordering and polling. */
START_TEST(test_nccl_one_rank)
{
    GPU_OR_SKIP(k);
    int port, lfd = tu_free_listener(&port);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    jdt_dist_opts o;
    jdt_dist_opts_default(&o);
    o.coordinator = addr;
    o.token = "cuk-test";
    o.coord_listen_fd = lfd;
    o.connect_timeout_s = 20;
    jdt_dist *d = NULL;
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_msg(jdt_dist_init(&o, &d, &e) == JDT_OK, "dist: %s", e.msg);
    const int ranks[1] = {0};
    jdt_cuk_comm *c = NULL;
    jdt_status s = jdt_cuk_comm_init(k, d, ranks, 1, "test/one", &c, &e);
    if (s == JDT_ERR_UNSUPPORTED) { /* libnccl.so.2 not on the library path */
        printf("SKIP check_cuk test_nccl_one_rank: %s\n", e.msg);
        jdt_dist_free(d);
        jdt_cuk_free(k);
        return;
    }
    ck_assert_msg(s == JDT_OK, "comm init: %s", e.msg);
    ck_assert_int_eq(jdt_cuk_comm_size(c), 1);
    const int64_t n = 1000;
    float *x = rand_floats(n, 21, -3, 3);
    float *dx = dev_from(x, (size_t)n * 4), *dy = dev_alloc((size_t)n * 4);
    ck_assert_msg(jdt_cuk_allreduce(c, dx, n, false, &e) == JDT_OK, "sum: %s", e.msg);
    ck_assert_msg(jdt_cuk_allreduce(c, dx, n, true, &e) == JDT_OK, "mean: %s", e.msg);
    ck_assert_msg(jdt_cuk_allreduce_max(c, dx, n, &e) == JDT_OK, "max: %s", e.msg);
    ck_assert_msg(jdt_cuk_comm_sync(c, 60, &e) == JDT_OK, "sync: %s", e.msg);
    float *got = dev_to_host(k, dx, n);
    expect_close("nccl all-reduce of one rank", got, x, n, 0, 0);
    free(got);
    ck_assert_msg(jdt_cuk_allgather(c, dx, dy, n, &e) == JDT_OK, "all-gather: %s", e.msg);
    ck_assert_msg(jdt_cuk_comm_sync(c, 60, &e) == JDT_OK, "sync: %s", e.msg);
    got = dev_to_host(k, dy, n);
    expect_close("nccl all-gather of one rank", got, x, n, 0, 0);
    free(got);
    ck_assert_int_eq(cudaMemset(dy, 0, (size_t)n * 4), cudaSuccess);
    ck_assert_msg(jdt_cuk_reduce_scatter(c, dx, dy, n, false, &e) == JDT_OK, "reduce-scatter: %s",
                  e.msg);
    ck_assert_msg(jdt_cuk_comm_sync(c, 60, &e) == JDT_OK, "sync: %s", e.msg);
    got = dev_to_host(k, dy, n);
    expect_close("nccl reduce-scatter of one rank", got, x, n, 0, 0);
    free(got);
    ck_assert_msg(jdt_cuk_comm_poll(c, &e) == JDT_OK, "poll: %s", e.msg);
    jdt_cuk_comm_free(c);
    free(x);
    cudaFree(dx), cudaFree(dy);
    jdt_dist_free(d);
    jdt_cuk_free(k);
}
END_TEST

/* A job of world_size ranks on loopback whose coordinator this process hosts as rank 0 (the
 * other ranks connect to *port). */
static jdt_dist *loopback_rank0(int world_size, int lfd, int port, double peer_timeout_s)
{
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    jdt_dist_opts o;
    jdt_dist_opts_default(&o);
    o.coordinator = addr;
    o.token = "cuk-test";
    o.coord_listen_fd = lfd;
    o.connect_timeout_s = 20;
    o.world_size = world_size;
    o.rank = 0;
    o.heartbeat_s = 0.2;
    o.peer_timeout_s = peer_timeout_s;
    jdt_dist *d = NULL;
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_msg(jdt_dist_init(&o, &d, &e) == JDT_OK, "dist: %s", e.msg);
    return d;
}

/* A started collective (the backend's STEP_COLL_START / _WAIT): the all-reduce runs on the
 * communicator's stream while compute queued after the start runs on the compute stream; the
 * wait orders the compute stream after it. One rank: the sum leaves the data as it was. Its
 * NCCL time is counted once finished; a wait without a start and a second start are errors. */
START_TEST(test_coll_start_wait)
{
    GPU_OR_SKIP(k);
    int port, lfd = tu_free_listener(&port);
    jdt_dist *d = loopback_rank0(1, lfd, port, 10);
    const int ranks[1] = {0};
    jdt_cuk_comm *c = NULL;
    jdt_err e;
    jdt_err_clear(&e);
    jdt_status s = jdt_cuk_comm_init(k, d, ranks, 1, "test/coll", &c, &e);
    if (s == JDT_ERR_UNSUPPORTED) {
        printf("SKIP check_cuk test_coll_start_wait: %s\n", e.msg);
        jdt_dist_free(d);
        jdt_cuk_free(k);
        return;
    }
    ck_assert_msg(s == JDT_OK, "comm init: %s", e.msg);
    jdt_cuk_coll *t = NULL;
    ck_assert_msg(jdt_cuk_coll_new(k, &t, &e) == JDT_OK, "%s", e.msg);
    double waited = 0, moving = 0;
    ck_assert(!jdt_cuk_coll_times(t, &waited, &moving)); /* nothing started yet */
    ck_assert_int_eq(jdt_cuk_coll_wait(c, t, &e), JDT_ERR_INTERNAL);
    const int64_t n = 1 << 20;
    float *x = rand_floats(n, 31, -3, 3), *y = rand_floats(n, 32, -3, 3);
    float *dx = dev_from(x, (size_t)n * 4), *dy = dev_from(y, (size_t)n * 4);
    float *dz = dev_alloc((size_t)n * 4);
    for (int round = 0; round < 3; round++) {
        ck_assert_msg(jdt_cuk_coll_start(c, t, JDT_CUK_ALLREDUCE, JDT_CUK_SUM, dx, dx, n, &e) ==
                          JDT_OK,
                      "start: %s", e.msg);
        ck_assert_int_eq(jdt_cuk_coll_start(c, t, JDT_CUK_ALLREDUCE, JDT_CUK_SUM, dx, dx, n, &e),
                         JDT_ERR_INTERNAL);
        jdt_cuk_bf16_round(k, dy, dz, n); /* compute inside the window, other buffers */
        ck_assert_msg(jdt_cuk_coll_wait(c, t, &e) == JDT_OK, "wait: %s", e.msg);
        jdt_cuk_bf16_round(k, dx, dz, n); /* after the wait: reads the collective's result */
        ck_assert_msg(jdt_cuk_comm_sync(c, 60, &e) == JDT_OK, "sync: %s", e.msg);
        float *got = dev_to_host(k, dz, n);
        for (int64_t i = 0; i < n; i += 997)
            ck_assert_msg(got[i] == jdt_bf16_round(x[i]), "round %d [%lld]: %g vs %g", round,
                          (long long)i, (double)got[i], (double)jdt_bf16_round(x[i]));
        free(got);
        ck_assert(jdt_cuk_coll_times(t, &waited, &moving));
        ck_assert(!jdt_cuk_coll_times(t, &waited, &moving)); /* counted once */
    }
    printf("check_cuk: 3 started all-reduces of 4 MiB: NCCL %.3f ms, compute waited %.3f ms\n",
           moving * 1e3, waited * 1e3);
    ck_assert(moving > 0 && waited >= 0);
    const char *defer = getenv("JDT_CUDAEMU_DEFER");
    if (emulated_gpu() && !(defer && strcmp(defer, "0") == 0)) {
        /* the emulator's race check (tests/infra/cudaemu: collectives run at their wait, their
         * send buffer compared with what it held at the call): the collective's buffer written
         * inside the window fails the communicator instead of passing unseen */
        ck_assert_int_eq(jdt_cuk_coll_start(c, t, JDT_CUK_ALLREDUCE, JDT_CUK_SUM, dx, dx, n, &e),
                         JDT_OK);
        jdt_cuk_bf16_round(k, dy, dx, n); /* a race on a GPU */
        jdt_status ws = jdt_cuk_coll_wait(c, t, &e);
        jdt_status ss = ws == JDT_OK ? jdt_cuk_comm_sync(c, 60, &e) : ws;
        ck_assert_msg(ss != JDT_OK, "a write into an all-reduce in flight went unseen");
        printf("check_cuk: emulator race check: %s\n", e.msg);
    }
    jdt_cuk_coll_free(t);
    jdt_cuk_comm_free(c);
    free(x), free(y);
    cudaFree(dx), cudaFree(dy), cudaFree(dz);
    jdt_dist_free(d);
    jdt_cuk_free(k);
}
END_TEST

/* A dead peer while a collective is in flight ends the wait with the rank named and the
 * communicator aborted, instead of a hang: rank 1 (a child process that joins the rendezvous and
 * dies without a goodbye) is reported lost by the coordinator's heartbeat, and the polling wait
 * (jdt_cuk_comm_sync, as the backend's settle before any host wait) returns ERR_PEER_LOST. The
 * communicator is this rank's alone (NCCL refuses two ranks on one GPU), so this checks the
 * rendezvous half of the polling; ncclCommGetAsyncError's half needs two GPUs. */
START_TEST(test_nccl_dead_peer)
{
    int n_gpu = 0;
    if (cudaGetDeviceCount(&n_gpu) != cudaSuccess || n_gpu == 0) {
        printf("SKIP check_cuk test_nccl_dead_peer: no GPU\n");
        return;
    }
    int port, lfd = tu_free_listener(&port);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) { /* rank 1: joins, then dies (no CUDA here) */
        close(lfd);
        char addr[64];
        snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
        jdt_dist_opts o;
        jdt_dist_opts_default(&o);
        o.coordinator = addr;
        o.token = "cuk-test";
        o.connect_timeout_s = 20;
        o.world_size = 2;
        o.rank = 1;
        o.heartbeat_s = 0.2;
        o.peer_timeout_s = 2;
        jdt_dist *d = NULL;
        jdt_err e;
        if (jdt_dist_init(&o, &d, &e) != JDT_OK) _exit(3);
        sleep(2);
        _exit(0); /* no goodbye: a lost rank */
    }
    jdt_dist *d = loopback_rank0(2, lfd, port, 2);
    GPU_OR_SKIP(k);
    const int ranks[1] = {0};
    jdt_cuk_comm *c = NULL, *c2 = NULL;
    jdt_err e;
    jdt_err_clear(&e);
    jdt_status s = jdt_cuk_comm_init(k, d, ranks, 1, "test/dead", &c, &e);
    if (s == JDT_ERR_UNSUPPORTED) {
        printf("SKIP check_cuk test_nccl_dead_peer: %s\n", e.msg);
    } else {
        ck_assert_msg(s == JDT_OK, "comm init: %s", e.msg);
        /* a second communicator of the context (another mesh axis's): the first's failure must
         * abort it too, as they share one stream */
        ck_assert_msg(jdt_cuk_comm_init(k, d, ranks, 1, "test/dead2", &c2, &e) == JDT_OK, "%s",
                      e.msg);
        jdt_cuk_coll *t = NULL;
        ck_assert_msg(jdt_cuk_coll_new(k, &t, &e) == JDT_OK, "%s", e.msg);
        float *dx = dev_alloc(4096 * 4);
        double t0 = jdt_now_s();
        do { /* collectives keep flowing until the loss is noticed */
            s = jdt_cuk_coll_start(c, t, JDT_CUK_ALLREDUCE, JDT_CUK_SUM, dx, dx, 4096, &e);
            if (s == JDT_OK) s = jdt_cuk_coll_wait(c, t, &e);
            if (s == JDT_OK) s = jdt_cuk_comm_sync(c, 30, &e);
        } while (s == JDT_OK && jdt_now_s() - t0 < 20);
        ck_assert_msg(s == JDT_ERR_PEER_LOST, "status %s: %s", jdt_status_name(s), e.msg);
        ck_assert_msg(strstr(e.msg, "rank 1") && strstr(e.msg, "test/dead") && !strchr(e.msg, '\n'),
                      "message: %s", e.msg);
        ck_assert_msg(jdt_now_s() - t0 < 15, "took %.1f s", jdt_now_s() - t0);
        /* aborted: later calls fail at once, naming the communicator */
        ck_assert_int_eq(jdt_cuk_coll_start(c, t, JDT_CUK_ALLREDUCE, JDT_CUK_SUM, dx, dx, 1, &e),
                         JDT_ERR_NET);
        ck_assert_int_eq(jdt_cuk_coll_start(c2, t, JDT_CUK_ALLREDUCE, JDT_CUK_SUM, dx, dx, 1, &e),
                         JDT_ERR_NET);
        ck_assert_msg(strstr(e.msg, "test/dead2") && strstr(e.msg, "failed earlier"), "%s", e.msg);
        jdt_cuk_coll_free(t);
        jdt_cuk_comm_free(c2);
        jdt_cuk_comm_free(c);
        cudaFree(dx);
    }
    int status = 0;
    waitpid(child, &status, 0);
    jdt_dist_free(d);
    jdt_cuk_free(k);
}
END_TEST

/* The _part norm backward on dy stored as bf16 (passes.c fold_norm_dy16, the _bg kernels)
 * against the f32 kernel on a dy holding the same (rounded) values: dx, the partials, the
 * output's sums and bf16 copy, bit for bit. Then dy as a sum of 2 and of 3 bf16 terms (passes.c
 * fold_norm_dy_terms): the first g's rounding, the others other values, against the f32 kernel
 * on their f32 sum in the same order, bit for bit too. */
static void check_norm_dy16(jdt_cuk *k, bool rms, const float *g, const float *dxin,
                            const float *dw, const float *dacc, bool sums, bool copy, int64_t N,
                            int64_t C, int64_t P, float eps)
{
    const int64_t n = N * C, np = (sums ? 3 : 2) * P * C;
    float *dgr, *t2 = malloc((size_t)n * 4), *t3 = malloc((size_t)n * 4);
    float *s2 = malloc((size_t)n * 4), *s3 = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        t2[i] = jdt_rt_bf16_round((float)sin(0.37 * (double)i));
        t3[i] = jdt_rt_bf16_round(0.5f * (float)cos(1.3 * (double)i));
        s2[i] = jdt_rt_bf16_round(g[i]) + t2[i];
        s3[i] = s2[i] + t3[i];
    }
    uint16_t *dg16, *d2, *d3;
    float *dr2, *dr3;
    dev_bf16_pair(g, n, &dg16, &dgr, NULL);
    dev_bf16_pair(t2, n, &d2, &dr2, NULL); /* t2, t3 are bf16 values: the pairs hold them */
    dev_bf16_pair(t3, n, &d3, &dr3, NULL);
    float *ds2 = dev_from(s2, (size_t)n * 4), *ds3 = dev_from(s3, (size_t)n * 4);
    for (int terms = 1; terms <= 3; terms++) {
        float *out[2];
        uint16_t *c16[2], *h16[2];
        float *hout[2];
        for (int b = 0; b < 2; b++) {
            out[b] = dev_alloc((size_t)(n + np) * 4);
            c16[b] = copy ? dev_alloc((size_t)n * 2) : NULL;
            const void *dy = b            ? (const void *)dg16
                             : terms == 1 ? (const void *)dgr
                             : terms == 2 ? (const void *)ds2
                                          : (const void *)ds3;
            const void *dy2 = b && terms > 1 ? d2 : NULL, *dy3 = b && terms > 2 ? d3 : NULL;
            float *pw = out[b] + n, *pb = pw + P * C, *pg = sums ? pb + P * C : NULL;
            if (rms)
                jdt_cuk_rms_normalize_bwd_part(k, dxin, dy, b, dy2, dy3, dw, dacc, out[b], pw, pb,
                                               pg, c16[b], N, C, P, eps);
            else
                jdt_cuk_normalize_bwd_part(k, dxin, dy, b, dy2, dy3, dw, dacc, out[b], pw, pb, pg,
                                           c16[b], N, C, P, eps);
            hout[b] = dev_to_host(k, out[b], n + np);
            h16[b] = malloc((size_t)n * 2);
            if (copy)
                ck_assert_int_eq(cudaMemcpy(h16[b], c16[b], (size_t)n * 2, cudaMemcpyDeviceToHost),
                                 cudaSuccess);
        }
        ck_assert_msg(memcmp(hout[0], hout[1], (size_t)(n + np) * 4) == 0,
                      "%snorm_bwd_part N%lld C%lld P%lld: bf16 dy (%d terms) differs from an f32 "
                      "dy of the same values",
                      rms ? "rms_" : "", (long long)N, (long long)C, (long long)P, terms);
        ck_assert(!copy || memcmp(h16[0], h16[1], (size_t)n * 2) == 0);
        for (int b = 0; b < 2; b++) {
            free(hout[b]), free(h16[b]);
            cudaFree(out[b]), cudaFree(c16[b]);
        }
    }
    cudaFree(dgr), cudaFree(dg16), cudaFree(d2), cudaFree(dr2), cudaFree(d3), cudaFree(dr3);
    cudaFree(ds2), cudaFree(ds3);
    free(t2), free(t3), free(s2), free(s3);
}

/* ---- row kernels -------------------------------------------------------------------------- */

typedef enum { ROW_SOFTMAX, ROW_LOG_SOFTMAX, ROW_NORM, ROW_RMS } row_kind;

static void check_rows(jdt_cuk *k, row_kind kind, int64_t N, int64_t C)
{
    int64_t n = N * C;
    float eps = 1e-5f;
    float *x = rand_floats(n, 11, -3, 5), *g = rand_floats(n, 12, -1, 1);
    float *y = malloc((size_t)n * 4), *dx = malloc((size_t)n * 4);
    float *dxin = dev_from(x, (size_t)n * 4), *dg = dev_from(g, (size_t)n * 4);
    float *dy = dev_alloc((size_t)n * 4), *ddx = dev_alloc((size_t)n * 4);
    const char *name = "?";
    switch (kind) {
    case ROW_SOFTMAX:
        name = "softmax";
        jdt_rt_softmax(x, y, N, C, 1);
        jdt_rt_softmax_bwd(y, g, dx, N, C, 1);
        jdt_cuk_softmax(k, dxin, dy, N, C);
        jdt_cuk_softmax_bwd(k, dy, dg, ddx, N, C);
        break;
    case ROW_LOG_SOFTMAX:
        name = "log_softmax";
        jdt_rt_log_softmax(x, y, N, C, 1);
        jdt_rt_log_softmax_bwd(y, g, dx, N, C, 1);
        jdt_cuk_log_softmax(k, dxin, dy, N, C);
        jdt_cuk_log_softmax_bwd(k, dy, dg, ddx, N, C);
        break;
    case ROW_NORM:
        name = "normalize";
        jdt_rt_normalize(x, y, N, C, eps, 1);
        jdt_rt_normalize_bwd(x, g, dx, N, C, eps, 1);
        jdt_cuk_normalize(k, dxin, dy, N, C, eps);
        jdt_cuk_normalize_bwd(k, dxin, dg, NULL, ddx, N, C, eps);
        break;
    case ROW_RMS:
        name = "rms_normalize";
        jdt_rt_rms_normalize(x, y, N, C, eps, 1);
        jdt_rt_rms_normalize_bwd(x, g, dx, N, C, eps, 1);
        jdt_cuk_rms_normalize(k, dxin, dy, N, C, eps);
        jdt_cuk_rms_normalize_bwd(k, dxin, dg, NULL, ddx, N, C, eps);
        break;
    }
    float *gy = dev_to_host(k, dy, n), *gdx = dev_to_host(k, ddx, n);
    char what[96];
    snprintf(what, sizeof what, "%s N%lld C%lld", name, (long long)N, (long long)C);
    expect_close(what, gy, y, n, 1e-6f, 2e-5f);
    snprintf(what, sizeof what, "%s_bwd N%lld C%lld", name, (long long)N, (long long)C);
    expect_close(what, gdx, dx, n, 1e-6f, 1e-4f);
    if (kind == ROW_NORM || kind == ROW_RMS) {
        /* with the scale (passes.c fold_norm_scales): the kernel forms dy * w itself; the
         * reference is the plain backward on the host's products */
        float *w = rand_floats(C, 13, -2, 2), *gw = malloc((size_t)n * 4);
        for (int64_t i = 0; i < n; i++)
            gw[i] = g[i] * w[i % C];
        float *dw = dev_from(w, (size_t)C * 4);
        if (kind == ROW_NORM) {
            jdt_rt_normalize_bwd(x, gw, dx, N, C, eps, 1);
            jdt_cuk_normalize_bwd(k, dxin, dg, dw, ddx, N, C, eps);
        } else {
            jdt_rt_rms_normalize_bwd(x, gw, dx, N, C, eps, 1);
            jdt_cuk_rms_normalize_bwd(k, dxin, dg, dw, ddx, N, C, eps);
        }
        float *gdxw = dev_to_host(k, ddx, n);
        snprintf(what, sizeof what, "%s_bwd(scaled) N%lld C%lld", name, (long long)N, (long long)C);
        /* the kernel's dy * w rounds where the host's product did not (a fused multiply-add):
         * a few f32 steps of |dy w| times the row's 1 / sigma more, which a row whose exact
         * gradient is 0 shows (C = 1: 1 / sqrt(eps), seen on an H200: 7.3e-6 for 0) */
        for (int64_t r = 0; r < N; r++) {
            double m = 0.0, v = 0.0, gmax = 0.0;
            for (int64_t c = 0; c < C; c++)
                m += kind == ROW_NORM ? x[r * C + c] : 0.0;
            m /= (double)C;
            for (int64_t c = 0; c < C; c++) {
                v += (x[r * C + c] - m) * (x[r * C + c] - m);
                gmax = fmax(gmax, fabs(gw[r * C + c]));
            }
            const double rstd = 1.0 / sqrt(v / (double)C + eps);
            for (int64_t c = 0; c < C; c++) {
                const int64_t i = r * C + c;
                ck_assert_msg(fabsf(gdxw[i] - dx[i]) <=
                                  1e-6f + 1e-4f * fabsf(dx[i]) + 4.0 * FLT_EPSILON * rstd * gmax,
                              "%s[%lld]: got %.8g, want %.8g", what, (long long)i, (double)gdxw[i],
                              (double)dx[i]);
            }
        }
        /* the forward with the affine (passes.c fold_norm_affines): y * w + b from a kernel
         * that never stores xhat, f32 with a shift, bf16 bits without one */
        {
            float *sb = rand_floats(C, 14, -1, 1), *dsb = dev_from(sb, (size_t)C * 4);
            float *want = malloc((size_t)n * 4), *dya = dev_alloc((size_t)n * 4);
            uint16_t *want16 = malloc((size_t)n * 2);
            for (int64_t i = 0; i < n; i++) {
                want[i] = y[i] * w[i % C] + sb[i % C];
                want16[i] = jdt_rt_bf16_bits(y[i] * w[i % C]);
            }
            jdt_cuk_normalize_affine(k, kind == ROW_RMS, dxin, dw, dsb, dya, false, N, C, eps);
            float *ga = dev_to_host(k, dya, n);
            snprintf(what, sizeof what, "%s_affine N%lld C%lld", name, (long long)N, (long long)C);
            expect_close(what, ga, want, n, 1e-5f, 1e-4f);
            jdt_cuk_normalize_affine(k, kind == ROW_RMS, dxin, dw, NULL, dya, true, N, C, eps);
            float *g16 = dev_to_host(k, dya, (n + 1) / 2); /* n bf16 values */
            snprintf(what, sizeof what, "%s_affine_bf16 N%lld C%lld", name, (long long)N,
                     (long long)C);
            expect_bf16_near(what, (const uint16_t *)g16, want16, n);
            free(sb), free(want), free(want16), free(ga), free(g16);
            cudaFree(dsb), cudaFree(dya);
        }
        /* and the affine's gradient partials (passes.c fold_norm_partials): P row ranges of
         * R = ceil(N / P) rows, more partials than rows included (the empty ones are zeros);
         * the reference sums the host's xhat (y above) in double */
        if (C <= JDT_CUK_NORM_PART_MAX_C) {
            const int64_t Ps[] = {1, 3, N + 2};
            for (int q = 0; q < 3; q++) {
                const int64_t P = Ps[q], R = (N + P - 1) / P;
                float *dp = dev_alloc((size_t)(3 * P * C) * 4);
                /* the last one adds a residual cotangent to dx (passes.c folds that add) */
                float *acc = q == 2 ? rand_floats(n, 15, -1, 1) : NULL;
                float *dacc = acc ? dev_from(acc, (size_t)n * 4) : NULL;
                /* the last two also sum the output's columns and store its bf16 copy (passes.c
                 * fold_norm_cotangents) */
                float *pg = q > 0 ? dp + 2 * P * C : NULL;
                uint16_t *d16 = q > 0 ? dev_alloc((size_t)n * 2) : NULL;
                if (kind == ROW_NORM)
                    jdt_cuk_normalize_bwd_part(k, dxin, dg, false, NULL, NULL, dw, dacc, ddx, dp,
                                               dp + P * C, pg, d16, N, C, P, eps);
                else
                    jdt_cuk_rms_normalize_bwd_part(k, dxin, dg, false, NULL, NULL, dw, dacc, ddx,
                                                   dp, dp + P * C, pg, d16, N, C, P, eps);
                check_norm_dy16(k, kind == ROW_RMS, g, dxin, dw, dacc, pg != NULL, d16 != NULL, N,
                                C, P, eps);
                float *gp = dev_to_host(k, dp, 3 * P * C), *gdxp = dev_to_host(k, ddx, n);
                snprintf(what, sizeof what, "%s_bwd_part(P %lld%s%s) N%lld C%lld", name,
                         (long long)P, acc ? ", acc" : "", pg ? ", out sums, bf16 copy" : "",
                         (long long)N, (long long)C);
                if (d16) { /* the copy: the written output's rounding, bit for bit */
                    uint16_t *h16 = malloc((size_t)n * 2);
                    ck_assert_int_eq(cudaMemcpy(h16, d16, (size_t)n * 2, cudaMemcpyDeviceToHost),
                                     cudaSuccess);
                    for (int64_t i = 0; i < n; i++)
                        ck_assert_msg(h16[i] == jdt_rt_bf16_bits(gdxp[i]),
                                      "%s: bf16 copy [%lld] %04x, want %04x", what, (long long)i,
                                      h16[i], jdt_rt_bf16_bits(gdxp[i]));
                    free(h16);
                }
                float *want = calloc((size_t)(3 * P * C), 4);
                for (int64_t p = 0; p < P; p++)
                    for (int64_t c = 0; c < C; c++) {
                        double sw = 0.0, sb = 0.0, so = 0.0;
                        for (int64_t r = p * R; r < N && r < (p + 1) * R; r++) {
                            sw += (double)g[r * C + c] * y[r * C + c], sb += g[r * C + c];
                            so += (double)dx[r * C + c] + (acc ? acc[r * C + c] : 0.0);
                        }
                        want[p * C + c] = (float)sw;
                        want[(P + p) * C + c] = (float)sb;
                        want[(2 * P + p) * C + c] = (float)so;
                    }
                for (int64_t i = 0; i < n && acc; i++)
                    gdxp[i] -= acc[i];
                expect_close(what, gdxp, dx, n, 1e-5f, 1e-4f);
                expect_close(what, gp, want, (pg ? 3 : 2) * P * C, 1e-4f, 1e-4f);
                free(acc);
                cudaFree(dacc), cudaFree(d16);
                free(gp), free(gdxp), free(want);
                cudaFree(dp);
            }
        }
        free(w), free(gw), free(gdxw);
        cudaFree(dw);
    }
    free(x), free(g), free(y), free(dx), free(gy), free(gdx);
    cudaFree(dxin), cudaFree(dg), cudaFree(dy), cudaFree(ddx);
}

START_TEST(test_row_kernels)
{
    GPU_OR_SKIP(k);
    /* C = 1024, 768 and 128 also take the norm backwards' warp-per-row kernels (cuk.c
     * norm_part_launch); C = 5003 their block-per-row kernels' 1024-thread copies (_k) */
    static const int64_t shapes[][2] = {{7, 1031}, {5, 1024}, {3, 5},    {2, 12289},
                                        {1, 1},    {9, 768},  {33, 128}, {3, 5003}};
    for (int kind = 0; kind < 4; kind++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            check_rows(k, (row_kind)kind, shapes[i][0], shapes[i][1]);
    jdt_cuk_free(k);
}
END_TEST

/* got and want (n bf16 bit patterns) at most one bf16 step apart (two computations of one
 * value landing on either side of a rounding boundary) */
static void expect_bf16_near(const char *what, const uint16_t *got, const uint16_t *want, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t ug = (uint32_t)got[i] << 16, uw = (uint32_t)want[i] << 16;
        float fg, fw;
        memcpy(&fg, &ug, 4);
        memcpy(&fw, &uw, 4);
        ck_assert_msg(fabsf(fg - fw) <= 1e-7f + 8e-3f * fabsf(fw), "%s[%lld]: got %g, want %g",
                      what, (long long)i, (double)fg, (double)fw);
    }
}

/* Logits (N, V) and targets for the cross-entropy tests, with the rows that take other paths:
 * row 0 ignored (target -1: loss 0, gradient 0), row 1 out of range (target V: loss NaN,
 * gradient 0), row 3 mostly masked (-inf logits the online logsumexp skips). */
static int32_t *xent_inputs(int64_t N, int64_t V, float **x)
{
    *x = rand_floats(N * V, 21, -4, 4);
    int32_t *t = malloc((size_t)N * sizeof(int32_t));
    for (int64_t i = 0; i < N; i++)
        t[i] = (int32_t)((i * 7919) % V);
    t[0] = -1;
    if (N > 2) t[1] = (int32_t)V;
    if (N > 3)
        for (int64_t c = 0; c < V; c += 3)
            if (c != t[3]) (*x)[3 * V + c] = -INFINITY;
    return t;
}

static void check_xent(jdt_cuk *k, int64_t N, int64_t V)
{
    int64_t n = N * V;
    float *x, *dl = rand_floats(N, 22, 0.5f, 2);
    int32_t *t = xent_inputs(N, V, &x);
    float *loss = malloc((size_t)N * 4), *dx = malloc((size_t)n * 4);
    jdt_rt_softmax_xent(x, t, loss, N, V, 1);
    jdt_rt_softmax_xent_bwd(x, t, dl, NULL, dx, N, V, 1);
    float *dxd = dev_from(x, (size_t)n * 4), *dld = dev_from(dl, (size_t)N * 4);
    int32_t *td = dev_from(t, (size_t)N * 4);
    float *lossd = dev_alloc((size_t)N * 4), *dxo = dev_alloc((size_t)n * 4);
    jdt_cuk_softmax_xent(k, dxd, false, td, lossd, N, V, 0);
    float *gl = dev_to_host(k, lossd, N);
    expect_close("softmax_xent", gl, loss, N, 1e-5f, 1e-5f);
    /* the backward with its logsumexp computed, then taken from the forward's loss */
    for (int with_loss = 0; with_loss < 2; with_loss++) {
        jdt_cuk_softmax_xent_bwd(k, dxd, false, td, dld, with_loss ? lossd : NULL, dxo, N, V, 0, 0);
        float *gdx = dev_to_host(k, dxo, n);
        expect_close(with_loss ? "softmax_xent_bwd(loss)" : "softmax_xent_bwd", gdx, dx, n, 1e-7f,
                     1e-4f);
        free(gdx);
    }
    /* the bf16-storing variant against the CPU's: the same values rounded (one bf16 step apart
     * at most, where the two exps straddle a rounding boundary) */
    uint16_t *d16 = dev_alloc((size_t)n * 2), *h16 = malloc((size_t)n * 2),
             *w16 = malloc((size_t)n * 2);
    jdt_rt_softmax_xent_bwd_bf16(x, t, dl, loss, w16, N, V, 1);
    jdt_cuk_softmax_xent_bwd_bf16(k, dxd, false, td, dld, lossd, d16, N, V, 0, 0);
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_msg(jdt_cuk_check(k, "xent_bwd_bf16", true, &e) == JDT_OK, "%s", e.msg);
    ck_assert_int_eq(cudaMemcpy(h16, d16, (size_t)n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    expect_bf16_near("softmax_xent_bwd_bf16", h16, w16, n);
    /* bf16 logits (precision.activations: bf16): the three kernels read the bit patterns;
     * the reference is the CPU's on the same values widened to f32 */
    uint16_t *x16 = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) {
        x16[i] = jdt_rt_bf16_bits(x[i]);
        x[i] = jdt_rt_bf16_round(x[i]);
    }
    jdt_rt_softmax_xent(x, t, loss, N, V, 1);
    jdt_rt_softmax_xent_bwd(x, t, dl, NULL, dx, N, V, 1);
    jdt_rt_softmax_xent_bwd_bf16(x, t, dl, loss, w16, N, V, 1);
    uint16_t *x16d = dev_from(x16, (size_t)n * 2);
    jdt_cuk_softmax_xent(k, x16d, true, td, lossd, N, V, 0);
    float *gl16 = dev_to_host(k, lossd, N);
    expect_close("softmax_xent(bf16 logits)", gl16, loss, N, 1e-5f, 1e-5f);
    jdt_cuk_softmax_xent_bwd(k, x16d, true, td, dld, lossd, dxo, N, V, 0, 0);
    float *gdx16 = dev_to_host(k, dxo, n);
    expect_close("softmax_xent_bwd(bf16 logits)", gdx16, dx, n, 1e-7f, 1e-4f);
    jdt_cuk_softmax_xent_bwd_bf16(k, x16d, true, td, dld, lossd, d16, N, V, 0, 0);
    ck_assert_msg(jdt_cuk_check(k, "xent_bwd_bf16(bf16 logits)", true, &e) == JDT_OK, "%s", e.msg);
    ck_assert_int_eq(cudaMemcpy(h16, d16, (size_t)n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    expect_bf16_near("softmax_xent_bwd_bf16(bf16 logits)", h16, w16, n);
    free(x16), free(gl16), free(gdx16);
    cudaFree(x16d);
    free(h16), free(w16);
    cudaFree(d16);
    free(x), free(dl), free(t), free(loss), free(dx), free(gl);
    cudaFree(dxd), cudaFree(dld), cudaFree(td), cudaFree(lossd), cudaFree(dxo);
}

/* The fused classifier (jdt_cuk_softmax_xent_fused, the compiler's fold_xent_backwards):
 * the loss and dlogits of one pass against the CPU's forward and backward with dloss = g in
 * every row; f32 or bf16 logits (the reference on the same values widened), f32 or bf16
 * dlogits. With ld > V the rows are ld apart in both (fuse.c mark_pitched_rows): the logits'
 * padding holds NaN, which a read of it would carry into the loss, and dlogits' padding must
 * come back as it was (all bits set). */
static void check_xent_fused(jdt_cuk *k, int64_t N, int64_t V, bool logits_bf16, int64_t ld)
{
    const int64_t n = N * V, L = ld ? ld : V, np = N * L;
    const float g = 0.37f;
    float *x, *dl = malloc((size_t)N * 4), *loss = malloc((size_t)N * 4),
              *dx = malloc((size_t)n * 4), *xp = malloc((size_t)np * 4);
    int32_t *t = xent_inputs(N, V, &x);
    uint16_t *x16 = malloc((size_t)np * 2), *w16 = malloc((size_t)n * 2),
             *h16 = malloc((size_t)np * 2);
    float *hdx = malloc((size_t)np * 4);
    for (int64_t i = 0; i < N; i++)
        dl[i] = g;
    for (int64_t i = 0; logits_bf16 && i < n; i++)
        x[i] = jdt_rt_bf16_round(x[i]);
    for (int64_t r = 0; r < N; r++)
        for (int64_t c = 0; c < L; c++) {
            xp[r * L + c] = c < V ? x[r * V + c] : NAN;
            x16[r * L + c] = c < V ? jdt_rt_bf16_bits(x[r * V + c]) : 0x7fc0;
        }
    jdt_rt_softmax_xent(x, t, loss, N, V, 1);
    jdt_rt_softmax_xent_bwd(x, t, dl, NULL, dx, N, V, 1);
    jdt_rt_softmax_xent_bwd_bf16(x, t, dl, loss, w16, N, V, 1);
    void *xd =
        logits_bf16 ? (void *)dev_from(x16, (size_t)np * 2) : (void *)dev_from(xp, (size_t)np * 4);
    int32_t *td = dev_from(t, (size_t)N * 4);
    float *lossd = dev_alloc((size_t)N * 4), *dxo = dev_alloc((size_t)np * 4);
    uint16_t *d16 = dev_alloc((size_t)np * 2);
    char what[96];
    for (int out16 = 0; out16 < 2; out16++) {
        cudaMemset(lossd, 0xff, (size_t)N * 4); /* NaN: a row not written shows */
        cudaMemset(out16 ? (void *)d16 : (void *)dxo, 0xff, (size_t)np * (out16 ? 2 : 4));
        jdt_cuk_softmax_xent_fused(k, xd, logits_bf16, td, g, lossd,
                                   out16 ? (void *)d16 : (void *)dxo, out16, N, V, ld, ld);
        jdt_err e;
        jdt_err_clear(&e);
        ck_assert_msg(jdt_cuk_check(k, "xent_fused", true, &e) == JDT_OK, "%s", e.msg);
        snprintf(what, sizeof what, "softmax_xent_fused(%s logits, %s dlogits, ld %lld) loss",
                 logits_bf16 ? "bf16" : "f32", out16 ? "bf16" : "f32", (long long)ld);
        float *gl = dev_to_host(k, lossd, N);
        expect_close(what, gl, loss, N, 1e-5f, 1e-5f);
        free(gl);
        if (out16)
            ck_assert_int_eq(cudaMemcpy(h16, d16, (size_t)np * 2, cudaMemcpyDeviceToHost),
                             cudaSuccess);
        else
            ck_assert_int_eq(cudaMemcpy(hdx, dxo, (size_t)np * 4, cudaMemcpyDeviceToHost),
                             cudaSuccess);
        for (int64_t r = 0; r < N; r++) /* the padding untouched, the rows packed for the check */
            for (int64_t c = 0; c < L; c++) {
                uint32_t bits = 0;
                if (!out16) memcpy(&bits, &hdx[r * L + c], 4);
                if (c >= V)
                    ck_assert_msg(out16 ? h16[r * L + c] == 0xffff : bits == 0xffffffffu,
                                  "%s: padding (%lld, %lld) written", what, (long long)r,
                                  (long long)c);
                else if (out16)
                    h16[r * V + c] = h16[r * L + c];
                else
                    hdx[r * V + c] = hdx[r * L + c];
            }
        if (out16)
            expect_bf16_near(what, h16, w16, n);
        else
            expect_close(what, hdx, dx, n, 1e-7f, 1e-4f);
    }
    /* in place (the device's xent_inplace: dlogits over the logits, same type and pitch), staged
     * in shared memory or not: dlogits the same bits as the same kernel out of place (hdx or
     * h16, packed above) or near the CPU's, the logits' padding as it was, and the backward on
     * its own in place too */
    const size_t es = logits_bf16 ? 2 : 4;
    const void *xh = logits_bf16 ? (const void *)x16 : (const void *)xp;
    unsigned char *xi_h = malloc((size_t)np * es);
    const bool smem0 = k->xent_smem;
    for (int pass = 0; pass < (logits_bf16 ? 3 : 2); pass++) {
        /* pass 0: fused (staged where it applies), 1: the backward from the loss, 2: fused with
         * the rows read from global memory */
        void *xi = dev_from(xh, (size_t)np * es);
        float *dld = dev_from(dl, (size_t)N * 4), *gl = dev_from(loss, (size_t)N * 4);
        k->xent_smem = pass == 2 ? false : smem0;
        cudaMemset(lossd, 0xff, (size_t)N * 4);
        if (pass == 1 && logits_bf16)
            jdt_cuk_softmax_xent_bwd_bf16(k, xi, true, td, dld, gl, xi, N, V, ld, ld);
        else if (pass == 1)
            jdt_cuk_softmax_xent_bwd(k, xi, false, td, dld, gl, xi, N, V, ld, ld);
        else
            jdt_cuk_softmax_xent_fused(k, xi, logits_bf16, td, g, lossd, xi, logits_bf16, N, V, ld,
                                       ld);
        k->xent_smem = smem0;
        jdt_err e;
        jdt_err_clear(&e);
        ck_assert_msg(jdt_cuk_check(k, "xent in place", true, &e) == JDT_OK, "%s", e.msg);
        ck_assert_int_eq(cudaMemcpy(xi_h, xi, (size_t)np * es, cudaMemcpyDeviceToHost),
                         cudaSuccess);
        snprintf(what, sizeof what, "softmax_xent %s in place (%s, ld %lld)",
                 pass == 1   ? "bwd"
                 : pass == 2 ? "fused, unstaged"
                             : "fused",
                 logits_bf16 ? "bf16" : "f32", (long long)ld);
        for (int64_t r = 0; r < N; r++) {
            const unsigned char *row = xi_h + (size_t)(r * L) * es;
            ck_assert_msg(memcmp(row + V * es, (const unsigned char *)xh + (size_t)(r * L + V) * es,
                                 (size_t)(L - V) * es) == 0,
                          "%s: row %lld's padding written", what, (long long)r);
            memmove(xi_h + (size_t)(r * V) * es, row, (size_t)V * es);
        }
        if (pass != 0 && logits_bf16) /* another kernel: the lse's last bits may differ */
            expect_bf16_near(what, (const uint16_t *)xi_h, w16, n);
        else if (pass == 1)
            expect_close(what, (const float *)xi_h, dx, n, 1e-7f, 1e-4f);
        else
            ck_assert_msg(memcmp(xi_h, logits_bf16 ? (const void *)h16 : (const void *)hdx,
                                 (size_t)n * es) == 0,
                          "%s: not the bits of the out-of-place run", what);
        if (pass != 1) {
            float *gl2 = dev_to_host(k, lossd, N);
            expect_close(what, gl2, loss, N, 1e-5f, 1e-5f);
            free(gl2);
        }
        cudaFree(xi), cudaFree(dld), cudaFree(gl);
    }
    free(xi_h);
    /* the backward on its own, padded the same way (the logsumexp from the loss) */
    if (ld) {
        cudaMemset(dxo, 0xff, (size_t)np * 4);
        float *dld = dev_from(dl, (size_t)N * 4), *gl = dev_from(loss, (size_t)N * 4);
        jdt_cuk_softmax_xent_bwd(k, xd, logits_bf16, td, dld, gl, dxo, N, V, ld, ld);
        ck_assert_int_eq(cudaMemcpy(hdx, dxo, (size_t)np * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        for (int64_t r = 0; r < N; r++)
            memmove(&hdx[r * V], &hdx[r * L], (size_t)V * 4);
        snprintf(what, sizeof what, "softmax_xent_bwd(%s logits, ld %lld)",
                 logits_bf16 ? "bf16" : "f32", (long long)ld);
        expect_close(what, hdx, dx, n, 1e-7f, 1e-4f);
        cudaFree(dld), cudaFree(gl);
    }
    free(x), free(dl), free(loss), free(dx), free(t), free(x16), free(w16), free(h16), free(xp);
    free(hdx);
    cudaFree(xd), cudaFree(td), cudaFree(lossd), cudaFree(dxo), cudaFree(d16);
}

START_TEST(test_softmax_xent)
{
    GPU_OR_SKIP(k);
    check_xent(k, 9, 1037);
    check_xent(k, 6, 1024);
    check_xent(k, 4, 50257);
    for (int lb = 0; lb < 2; lb++) {
        check_xent_fused(k, 9, 1037, lb, 0);
        check_xent_fused(k, 6, 1024, lb, 0);
        check_xent_fused(k, 4, 50257, lb, 0);
        check_xent_fused(k, 5, 1037, lb, 1088); /* padded rows, scalar path */
        check_xent_fused(k, 5, 1036, lb, 1088); /* padded rows, 4-value path */
        check_xent_fused(k, 3, 50257, lb, 50304);
    }
    jdt_cuk_free(k);
}
END_TEST

/* ---- gather / scatter / rope / concat ----------------------------------------------------- */

START_TEST(test_gather_scatter)
{
    GPU_OR_SKIP(k);
    static const int64_t Cs[] = {13, 64};
    for (int ci = 0; ci < 2; ci++) {
        int64_t V = 11, C = Cs[ci], n = 9;
        int32_t idx[9] = {3, 0, 10, 3, -1, 11, 7, 3, 0}; /* duplicates and two out of range */
        float *table = rand_floats(V * C, 31, -1, 1), *src = rand_floats(n * C, 32, -1, 1);
        float *out = malloc((size_t)(n * C) * 4), *acc = malloc((size_t)(V * C) * 4);
        ck_assert_int_eq(jdt_rt_gather(table, idx, out, n, V, C, 1), 2);
        ck_assert_int_eq(jdt_rt_scatter_add(src, idx, acc, n, V, C), 2);
        float *dt = dev_from(table, (size_t)(V * C) * 4), *ds = dev_from(src, (size_t)(n * C) * 4);
        int32_t *di = dev_from(idx, sizeof idx);
        float *dout = dev_alloc((size_t)(n * C) * 4), *dacc = dev_alloc((size_t)(V * C) * 4);
        ck_assert_int_eq(cudaMemset(dacc, 0x7f, (size_t)(V * C) * 4), cudaSuccess); /* garbage */
        jdt_cuk_gather(k, dt, di, dout, n, V, C);
        jdt_cuk_scatter_add(k, ds, di, dacc, n, V, C);
        float *g1 = dev_to_host(k, dout, n * C), *g2 = dev_to_host(k, dacc, V * C);
        expect_close("gather", g1, out, n * C, 0, 0);
        expect_close("scatter_add", g2, acc, V * C, 1e-6f, 1e-6f);
        free(table), free(src), free(out), free(acc), free(g1), free(g2);
        cudaFree(dt), cudaFree(ds), cudaFree(di), cudaFree(dout), cudaFree(dacc);
    }
    jdt_cuk_free(k);
}
END_TEST

START_TEST(test_rope)
{
    GPU_OR_SKIP(k);
    int64_t B = 2, T = 37, H = 3, D = 18, n = B * T * H * D;
    float *x = rand_floats(n, 41, -2, 2), *y = malloc((size_t)n * 4);
    float *dx = dev_from(x, (size_t)n * 4), *dy = dev_alloc((size_t)n * 4);
    for (int inv = 0; inv < 2; inv++) {
        jdt_rt_rope(x, y, B, T, H, D, 10000.0, NULL, inv, 1);
        jdt_cuk_rope(k, dx, dy, false, false, false, B, T, H, D, 10000.0, NULL, inv);
        float *g = dev_to_host(k, dy, n);
        expect_close(inv ? "rope inverse" : "rope", g, y, n, 2e-6f, 1e-5f);
        free(g);
        /* x stored (B, H, T, D) (the attention backward's dq, dk: passes.c
         * fold_rope_transposes): the same y, bit for bit */
        float *xt = malloc((size_t)n * 4);
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < T; t++)
                for (int64_t h = 0; h < H; h++)
                    memcpy(xt + ((b * H + h) * T + t) * D, x + ((b * T + t) * H + h) * D,
                           (size_t)D * 4);
        float *dxt = dev_from(xt, (size_t)n * 4), *dyt = dev_alloc((size_t)n * 4);
        jdt_cuk_rope(k, dxt, dyt, false, false, true, B, T, H, D, 10000.0, NULL, inv);
        float *gy = dev_to_host(k, dy, n), *gt = dev_to_host(k, dyt, n);
        ck_assert_msg(memcmp(gt, gy, (size_t)n * 4) == 0, "rope of (B, H, T, D) x, inverse %d",
                      inv);
        free(xt), free(gy), free(gt);
        cudaFree(dxt), cudaFree(dyt);
        const double llama3[4] = {8, 1, 4, 16}; /* Llama 3's scaling, every band at T 37 */
        jdt_rt_rope(x, y, B, T, H, D, 10000.0, llama3, inv, 1);
        jdt_cuk_rope(k, dx, dy, false, false, false, B, T, H, D, 10000.0, llama3, inv);
        g = dev_to_host(k, dy, n);
        expect_close(inv ? "rope llama3 inverse" : "rope llama3", g, y, n, 2e-6f, 1e-5f);
        free(g);
    }
    /* bf16 in and/or out (fold_bf16_casts): bf16 x gives exactly the f32 kernel's result on the
     * widened values, and a bf16 y is exactly that result rounded to nearest even */
    float *xr = malloc((size_t)n * 4);
    uint16_t *x16 = malloc((size_t)n * 2), *y16 = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) {
        xr[i] = jdt_bf16_round(x[i]);
        uint32_t u;
        memcpy(&u, &xr[i], 4);
        x16[i] = (uint16_t)(u >> 16);
    }
    float *dxr = dev_from(xr, (size_t)n * 4), *dref = dev_alloc((size_t)n * 4);
    uint16_t *dx16 = dev_from(x16, (size_t)n * 2), *dy16 = dev_alloc((size_t)n * 2);
    for (int inv = 0; inv < 2; inv++) {
        jdt_cuk_rope(k, dxr, dref, false, false, false, B, T, H, D, 10000.0, NULL, inv);
        float *ref = dev_to_host(k, dref, n);
        jdt_cuk_rope(k, dx16, dy, true, false, false, B, T, H, D, 10000.0, NULL, inv);
        float *g = dev_to_host(k, dy, n);
        ck_assert_msg(memcmp(g, ref, (size_t)n * 4) == 0, "rope bf16 in, inverse %d", inv);
        for (int x_is16 = 0; x_is16 < 2; x_is16++) {
            jdt_cuk_rope(k, x_is16 ? (const void *)dx16 : (const void *)dxr, dy16, x_is16, true,
                         false, B, T, H, D, 10000.0, NULL, inv);
            free(dev_to_host(k, dref, 0)); /* waits, checks */
            ck_assert_int_eq(cudaMemcpy(y16, dy16, (size_t)n * 2, cudaMemcpyDeviceToHost),
                             cudaSuccess);
            for (int64_t i = 0; i < n; i++) {
                const float w = jdt_bf16_round(ref[i]);
                uint32_t u;
                memcpy(&u, &w, 4);
                ck_assert_msg(y16[i] == (uint16_t)(u >> 16),
                              "rope bf16 out (bf16 in %d, inverse %d) [%lld]: %04x vs %04x", x_is16,
                              inv, (long long)i, y16[i], (unsigned)(u >> 16));
            }
        }
        free(ref), free(g);
    }
    free(xr), free(x16), free(y16);
    cudaFree(dxr), cudaFree(dref), cudaFree(dx16), cudaFree(dy16);
    jdt_cuk_rope(k, dx, dy, false, false, false, B, T, H, 7, 10000.0, NULL,
                 false); /* odd D: deferred error */
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_int_eq(jdt_cuk_check(k, "rope", true, &e), JDT_ERR_INVALID);
    ck_assert(strstr(e.msg, "odd") != NULL);
    ck_assert_int_eq(jdt_cuk_check(k, "again", true, &e), JDT_OK); /* reported once */
    free(x), free(y);
    cudaFree(dx), cudaFree(dy);
    jdt_cuk_free(k);
}
END_TEST

/* Three inputs (one empty) concatenated along the middle axis of (outer, len, inner). */
static void check_concat(jdt_cuk *k, int64_t outer)
{
    int64_t inner = 3, len[3] = {2, 0, 4}, tot = 6;
    float *h[3], *d[3];
    for (int i = 0; i < 3; i++) {
        h[i] = rand_floats(outer * len[i] * inner, 51 + (unsigned)i, -1, 1);
        d[i] = dev_from(h[i], (size_t)(outer * len[i] * inner) * 4);
    }
    float *want = malloc((size_t)(outer * tot * inner) * 4);
    jdt_rt_concat((const float *const *)h, len, 3, want, outer, inner, sizeof(float));
    float *dout = dev_alloc((size_t)(outer * tot * inner) * 4);
    jdt_cuk_concat(k, (const float *const *)d, len, 3, dout, outer, inner, sizeof(float));
    float *got = dev_to_host(k, dout, outer * tot * inner);
    expect_close("concat", got, want, outer * tot * inner, 0, 0);
    for (int i = 0; i < 3; i++)
        free(h[i]), cudaFree(d[i]);
    free(want), free(got), cudaFree(dout);
}

START_TEST(test_concat)
{
    GPU_OR_SKIP(k);
    for (int64_t outer = 5; outer > 0; outer -= 4) /* 5 rows, then 1: the plain copies */
        check_concat(k, outer);
    jdt_cuk_free(k);
}
END_TEST

/* ---- attention ---------------------------------------------------------------------------- */

/* Copies x (B, H, T, D) into the (B, T, H, D) layout. */
static float *to_bthd(const float *x, int64_t B, int64_t H, int64_t T, int64_t D)
{
    float *y = malloc((size_t)(B * H * T * D) * 4);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++)
                memcpy(y + ((b * T + t) * H + h) * D, x + ((b * H + h) * T + t) * D, (size_t)D * 4);
    return y;
}

/* max |got - want| / max |want| */
static double rel_err(const float *got, const float *want, int64_t n)
{
    double d = 0.0, m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)got[i] - want[i]));
        m = fmax(m, fabs((double)want[i]));
        if (isnan(got[i])) return INFINITY;
    }
    return m > 0.0 ? d / m : d;
}

/* The backward's cotangent form (passes.c fold_attention_cotangents) against its packed
 * output dqkv (3 n, f32, from the same inputs: bf16 q, k, v in d16, o and dO in din): with
 * dqkv as well and without it, dq and dv copied as bf16, dk as f32, each bit for bit the
 * transposed value or its rounding; each partial the sum of its JDT_CUK_ATT_PART rows of a
 * sequence. */
static void check_attention_grads(jdt_cuk *k, const char *what, void *const *d16, float *const *din,
                                  const float *dqkv, int64_t B, int64_t H, int64_t T, int64_t D,
                                  float scale, unsigned bthd, bool bf16, void *dscr)
{
    const int64_t n = B * H * T * D, C = H * D, nc = (T + JDT_CUK_ATT_PART - 1) / JDT_CUK_ATT_PART;
    const int64_t P = B * nc;
    float *want_part = calloc((size_t)(3 * P * C), 4);
    for (int s = 0; s < 3; s++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t t = 0; t < T; t++)
                    for (int64_t d = 0; d < D; d++)
                        want_part[((s * P) + b * nc + t / JDT_CUK_ATT_PART) * C + h * D + d] +=
                            dqkv[s * n + ((b * H + h) * T + t) * D + d];
    /* with the packed output first: its check says whether dq itself moved */
    for (int with_packed = 1; with_packed >= 0; with_packed--) {
        jdt_cuk_att_grads g = {.copy_bf16 = {true, false, true}};
        g.copy[0] = dev_alloc((size_t)n * 2);
        g.copy[1] = dev_alloc((size_t)n * 4);
        g.copy[2] = dev_alloc((size_t)n * 2);
        g.part = dev_alloc((size_t)(3 * P * C) * 4);
        for (int s = 0; s < 3; s++) /* poison: a value never written shows as 0xff bytes */
            ck_assert_int_eq(cudaMemset(g.copy[s], 0xff, (size_t)n * (g.copy_bf16[s] ? 2 : 4)),
                             cudaSuccess);
        float *dD = with_packed ? dev_alloc((size_t)(3 * n) * 4) : NULL;
        jdt_cuk_attention_bwd(k, d16[0], d16[1], d16[2], true, din[3], false, din[4], false, NULL,
                              dD, &g, B, H, T, D, scale, bthd, bf16, dscr);
        jdt_err ce;
        jdt_err_clear(&ce);
        ck_assert_msg(jdt_cuk_check(k, "cotangent form", true, &ce) == JDT_OK, "%s: %s", what,
                      ce.msg);
        if (dD) {
            float *got = dev_to_host(k, dD, 3 * n);
            int64_t first = -1;
            for (int64_t j = 0; j < 3 * n && first < 0; j++)
                if (memcmp(&got[j], &dqkv[j], 4) != 0) first = j;
            ck_assert_msg(first < 0,
                          "%s: cotangent form: packed dqkv differs (error %g); first [%lld]: %.9g, "
                          "want %.9g",
                          what, rel_err(got, dqkv, 3 * n), (long long)first,
                          first < 0 ? 0.0 : (double)got[first],
                          first < 0 ? 0.0 : (double)dqkv[first]);
            free(got);
            cudaFree(dD);
        }
        uint16_t *c16 = malloc((size_t)n * 2);
        for (int s = 0; s < 3; s++) {
            float *want = to_bthd(dqkv + s * n, B, H, T, D);
            if (g.copy_bf16[s]) {
                ck_assert_int_eq(cudaMemcpy(c16, g.copy[s], (size_t)n * 2, cudaMemcpyDeviceToHost),
                                 cudaSuccess);
                int64_t bad = 0, unwritten = 0, first = -1;
                for (int64_t j = 0; j < n; j++)
                    if (c16[j] != jdt_rt_bf16_bits(want[j])) {
                        if (bad++ == 0) first = j;
                        unwritten += c16[j] == 0xffff;
                    }
                ck_assert_msg(bad == 0,
                              "%s: cotangent form (%s packed dqkv): bf16 copy %d differs in %lld "
                              "of %lld values (%lld never written); first [%lld]: bits %04x, "
                              "want %04x (%.8g)",
                              what, with_packed ? "with" : "without", s, (long long)bad,
                              (long long)n, (long long)unwritten, (long long)first,
                              first < 0 ? 0u : c16[first],
                              first < 0 ? 0u : jdt_rt_bf16_bits(want[first]),
                              first < 0 ? 0.0 : (double)want[first]);
            } else {
                float *got = dev_to_host(k, g.copy[s], n);
                ck_assert_msg(memcmp(got, want, (size_t)n * 4) == 0,
                              "%s: cotangent form: f32 copy %d", what, s);
                free(got);
            }
            free(want);
            cudaFree(g.copy[s]);
        }
        float *part = dev_to_host(k, g.part, 3 * P * C);
        expect_close(what, part, want_part, 3 * P * C, 1e-5f, 1e-5f);
        free(part), free(c16);
        cudaFree(g.part);
    }
    /* dq and dk rotated as RoPE's backward (jdt_cuk_rope, inverse) would rotate the copies: bf16
     * and f32, each bit for bit the rope kernel's result on the transposed packed value */
    if (D % 2 == 0) {
        jdt_cuk_att_grads g = {.copy_bf16 = {true, false, false},
                               .rope_theta = {10000.0, 500.0, 0.0},
                               .rope_inverse = {true, true, false}};
        g.copy[0] = dev_alloc((size_t)n * 2);
        g.copy[1] = dev_alloc((size_t)n * 4);
        ck_assert_int_eq(cudaMemset(g.copy[0], 0xff, (size_t)n * 2), cudaSuccess);
        ck_assert_int_eq(cudaMemset(g.copy[1], 0xff, (size_t)n * 4), cudaSuccess);
        jdt_cuk_attention_bwd(k, d16[0], d16[1], d16[2], true, din[3], false, din[4], false, NULL,
                              NULL, &g, B, H, T, D, scale, bthd, bf16, dscr);
        for (int s = 0; s < 2; s++) {
            float *t = to_bthd(dqkv + s * n, B, H, T, D);
            float *dt = dev_from(t, (size_t)n * 4);
            void *want = dev_alloc((size_t)n * (s == 0 ? 2 : 4));
            jdt_cuk_rope(k, dt, want, false, s == 0, false, B, T, H, D, g.rope_theta[s], NULL,
                         true);
            const size_t nb = (size_t)n * (s == 0 ? 2 : 4);
            char *a = malloc(nb), *w = malloc(nb);
            ck_assert_int_eq(cudaMemcpy(a, g.copy[s], nb, cudaMemcpyDeviceToHost), cudaSuccess);
            ck_assert_int_eq(cudaMemcpy(w, want, nb, cudaMemcpyDeviceToHost), cudaSuccess);
            int64_t bad = 0, unwritten = 0, first = -1, es = s == 0 ? 2 : 4;
            for (int64_t j = 0; j < n; j++)
                if (memcmp(a + j * es, w + j * es, (size_t)es) != 0) {
                    if (bad++ == 0) first = j;
                    unwritten += (unsigned char)a[j * es] == 0xff &&
                                 (unsigned char)a[j * es + es - 1] == 0xff;
                }
            float gf = 0.0f, wf = 0.0f;
            if (first >= 0 && s == 0) {
                uint16_t gb, wb;
                memcpy(&gb, a + first * 2, 2), memcpy(&wb, w + first * 2, 2);
                gf = jdt_rt_bf16_float(gb), wf = jdt_rt_bf16_float(wb);
            } else if (first >= 0) {
                memcpy(&gf, a + first * 4, 4), memcpy(&wf, w + first * 4, 4);
            }
            ck_assert_msg(bad == 0,
                          "%s: cotangent form: rotated copy %d differs in %lld of %lld values "
                          "(%lld never written); first [%lld]: %.9g, want %.9g",
                          what, s, (long long)bad, (long long)n, (long long)unwritten,
                          (long long)first, (double)gf, (double)wf);
            free(a), free(w), free(t);
            cudaFree(dt), cudaFree(want), cudaFree(g.copy[s]);
        }
    }
    free(want_part);
}

/* The forward's saved log-sum-exp (passes.c fold_attention_lse), bf16 q, k, v in d16 (the
 * bf16 roundings of the host's q and kk), o and dO in din: the forward with lse stores the
 * same o (o16, from the same inputs without it) and each row's logsumexp of its scaled causal
 * scores (against the host's, in double); the backward taking it (its dQ kernel then forms the
 * row statistics, into a fresh scratch: the emulator fills new memory with NaN, so an entry
 * it misses shows) gives dqkv16 bit for bit, and one taking it plus ln 2 (every probability
 * halved) does not, so it is read. */
static void check_attention_lse(jdt_cuk *k, const char *what, void *const *d16, float *const *din,
                                const float *q, const float *kk, const float *o16,
                                const float *dqkv16, int64_t B, int64_t H, int64_t T, int64_t D,
                                float scale, unsigned bthd, bool bf16, void *dscr)
{
    const int64_t n = B * H * T * D, nr = B * H * T;
    float *dO = dev_alloc((size_t)n * 4), *dL = dev_alloc((size_t)nr * 4);
    float *dD = dev_alloc((size_t)(3 * n) * 4);
    jdt_cuk_attention(k, d16[0], d16[1], d16[2], true, dO, NULL, false, dL, B, H, T, D, scale,
                      bthd & 7u, bf16, dscr);
    float *o = dev_to_host(k, dO, n), *L = dev_to_host(k, dL, nr);
    ck_assert_msg(memcmp(o, o16, (size_t)n * 4) == 0, "%s: lse: o differs", what);
    double worst = 0.0;
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t i = 0; i < T; i++) {
            const float *qi = q + (bh * T + i) * D;
            double m = -INFINITY, sum = 0.0;
            for (int pass = 0; pass < 2; pass++)
                for (int64_t j = 0; j <= i; j++) {
                    const float *kj = kk + (bh * T + j) * D;
                    double dot = 0.0;
                    for (int64_t d = 0; d < D; d++)
                        dot += (double)jdt_rt_bf16_round(qi[d]) * jdt_rt_bf16_round(kj[d]);
                    dot *= scale;
                    if (pass == 0)
                        m = fmax(m, dot);
                    else
                        sum += exp(dot - m);
                }
            worst = tu_worse(worst, fabs(L[bh * T + i] - (m + log(sum))) / (1.0 + fabs(m)));
        }
    printf("%s: forward's log-sum-exp within %.1e of the host's\n", what, worst);
    ck_assert_msg(worst < 2e-5, "%s: lse off by %g", what, worst);
    void *fresh = dev_alloc((size_t)jdt_cuk_attention_scratch_bytes(B, H, T, D, 1));
    jdt_cuk_attention_bwd(k, d16[0], d16[1], d16[2], true, din[3], false, din[4], false, dL, dD,
                          NULL, B, H, T, D, scale, bthd, bf16, fresh);
    cudaFree(fresh);
    float *got = dev_to_host(k, dD, 3 * n);
    ck_assert_msg(memcmp(got, dqkv16, (size_t)(3 * n) * 4) == 0,
                  "%s: lse: dqkv differs from the backward's own statistics", what);
    free(got);
    for (int64_t r = 0; r < nr; r++)
        L[r] += 0.6931472f;
    float *dL2 = dev_from(L, (size_t)nr * 4);
    jdt_cuk_attention_bwd(k, d16[0], d16[1], d16[2], true, din[3], false, din[4], false, dL2, dD,
                          NULL, B, H, T, D, scale, bthd, bf16, dscr);
    got = dev_to_host(k, dD, 3 * n);
    ck_assert_msg(rel_err(got + 2 * n, dqkv16 + 2 * n, n) > 0.3,
                  "%s: lse: the backward ignored it (dv unchanged by halved probabilities)", what);
    free(got), free(o), free(L);
    cudaFree(dO), cudaFree(dL), cudaFree(dL2), cudaFree(dD);
}

/* dO stored as bf16 (passes.c fold_attention_dout16; the _bg kernels, where the tensor-core
 * kernels serve): with bf16 q, k, v in d16 and o in din[3], the backward on dO's bf16 bits
 * (dO's layout: bthd bit 4) gives bit for bit what it gives on an f32 dO holding the same
 * (rounded) values, with its own statistics and with the forward's log-sum-exp (the dK/dV
 * kernel then tiles dO itself, not the dQ kernel's copy); a bf16 dO with f32 q, k, v is an
 * error for jdt_cuk_check, never a silent misread. */
static void check_attention_dout16(jdt_cuk *k, const char *what, void *const *d16,
                                   float *const *din, const float *go, int64_t B, int64_t H,
                                   int64_t T, int64_t D, float scale, unsigned bthd, bool bf16,
                                   void *dscr)
{
    const int64_t n = B * H * T * D, nr = B * H * T;
    float *t = (bthd >> 4 & 1u) ? to_bthd(go, B, H, T, D) : NULL;
    uint16_t *dg16;
    float *dgr, *dL = dev_alloc((size_t)nr * 4);
    dev_bf16_pair(t ? t : go, n, &dg16, &dgr, NULL);
    float *dA = dev_alloc((size_t)(3 * n) * 4), *dB = dev_alloc((size_t)(3 * n) * 4);
    float *dO = dev_alloc((size_t)n * 4);
    jdt_cuk_attention(k, d16[0], d16[1], d16[2], true, dO, NULL, false, dL, B, H, T, D, scale,
                      bthd & 7u, bf16, dscr);
    for (int with_lse = 0; with_lse < 2; with_lse++) {
        const float *lse = with_lse ? dL : NULL;
        jdt_cuk_attention_bwd(k, d16[0], d16[1], d16[2], true, din[3], false, dgr, false, lse, dA,
                              NULL, B, H, T, D, scale, bthd, bf16, dscr);
        float *want = dev_to_host(k, dA, 3 * n);
        void *fresh = dev_alloc((size_t)jdt_cuk_attention_scratch_bytes(B, H, T, D, 1));
        jdt_cuk_attention_bwd(k, d16[0], d16[1], d16[2], true, din[3], false, dg16, true, lse, dB,
                              NULL, B, H, T, D, scale, bthd, bf16, fresh);
        float *got = dev_to_host(k, dB, 3 * n);
        ck_assert_msg(memcmp(got, want, (size_t)(3 * n) * 4) == 0,
                      "%s: bf16 dO%s: dqkv differs from an f32 dO of the same values (error %g)",
                      what, with_lse ? " and the forward's lse" : "", rel_err(got, want, 3 * n));
        free(want), free(got);
        cudaFree(fresh);
    }
    /* o as the forward's bf16 (B, T, H, D) copy too (fold_attention_o16: the _bgo kernels, o's
     * layout bit 3): bit for bit the _bg kernels on an f32 o of the same values in that layout;
     * a forward storing no o writes the same copy and log-sum-exp */
    float *oh = dev_to_host(k, dO, n), *ot = to_bthd(oh, B, H, T, D), *dor;
    uint16_t *o16 = malloc((size_t)n * 2), *c16 = malloc((size_t)n * 2), *do16;
    dev_bf16_pair(ot, n, &do16, &dor, o16);
    uint16_t *dc16 = dev_alloc((size_t)n * 2);
    float *dL2 = dev_alloc((size_t)nr * 4);
    const unsigned bto = bthd | 8u;
    jdt_cuk_attention_bwd(k, d16[0], d16[1], d16[2], true, dor, false, dg16, true, dL, dA, NULL, B,
                          H, T, D, scale, bto, bf16, dscr);
    jdt_cuk_attention_bwd(k, d16[0], d16[1], d16[2], true, do16, true, dg16, true, dL, dB, NULL, B,
                          H, T, D, scale, bto, bf16, dscr);
    float *want = dev_to_host(k, dA, 3 * n), *got = dev_to_host(k, dB, 3 * n);
    ck_assert_msg(memcmp(got, want, (size_t)(3 * n) * 4) == 0,
                  "%s: bf16 o and dO: dqkv differs from an f32 o of the same values (error %g)",
                  what, rel_err(got, want, 3 * n));
    jdt_cuk_attention(k, d16[0], d16[1], d16[2], true, NULL, dc16, true, dL2, B, H, T, D, scale,
                      bthd & 7u, bf16, dscr);
    float *L1 = dev_to_host(k, dL, nr), *L2 = dev_to_host(k, dL2, nr);
    ck_assert_int_eq(cudaMemcpy(c16, dc16, (size_t)n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    ck_assert_msg(memcmp(c16, o16, (size_t)n * 2) == 0, "%s: no o: its bf16 copy differs", what);
    ck_assert_msg(memcmp(L1, L2, (size_t)nr * 4) == 0, "%s: no o: the log-sum-exp differs", what);
    /* misuses, each an error for jdt_cuk_check: a bf16 dO with f32 q, k, v; a bf16 o with an
     * f32 dO */
    jdt_err e;
    jdt_err_clear(&e);
    jdt_cuk_attention_bwd(k, din[0], din[1], din[2], false, din[3], false, dg16, true, NULL, dB,
                          NULL, B, H, T, D, scale, bthd, bf16, dscr);
    ck_assert_int_eq(jdt_cuk_check(k, "bf16 dO", true, &e), JDT_ERR_INTERNAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "bf16 dO needs"));
    jdt_cuk_attention_bwd(k, d16[0], d16[1], d16[2], true, do16, true, dgr, false, dL, dB, NULL, B,
                          H, T, D, scale, bto, bf16, dscr);
    ck_assert_int_eq(jdt_cuk_check(k, "bf16 o", true, &e), JDT_ERR_INTERNAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "bf16 o needs"));
    free(t), free(oh), free(ot), free(o16), free(c16), free(want), free(got);
    free(L1), free(L2);
    cudaFree(dg16), cudaFree(dgr), cudaFree(dL), cudaFree(dA), cudaFree(dB), cudaFree(dO);
    cudaFree(do16), cudaFree(dc16), cudaFree(dor), cudaFree(dL2);
}

/* bf16 with a scale > 0: the tensor-core kernels against jdt_rt_attention's bf16 compute (the
 * same rounding points; the forward rounds unnormalised probabilities: 5e-3 of the largest
 * output, the backward 1e-4) and, for head sizes where rounding shows, closer to it than to
 * f32's; else the FMA kernels against f32 (bf16 with a scale <= 0 runs them unrounded). */
static void check_attention_scaled(jdt_cuk *k, int64_t B, int64_t H, int64_t T, int64_t D,
                                   unsigned bthd, bool bf16, float scale)
{
    int64_t n = B * H * T * D;
    bool tc = bf16 && scale > 0.0f; /* the reference rounds as the kernels do */
    float *q = rand_floats(n, 61, -1, 1), *kk = rand_floats(n, 62, -1, 1);
    float *v = rand_floats(n, 63, -1, 1), *go = rand_floats(n, 64, -1, 1);
    float *o = malloc((size_t)n * 4), *dqkv = malloc((size_t)(3 * n) * 4);
    float *scr = malloc((size_t)jdt_rt_attention_scratch_floats(D, T, 1, true, false) * 4);
    jdt_rt_attention(q, kk, v, o, NULL, B, H, T, D, scale, 0, tc, scr, 1);
    jdt_rt_attention_bwd(q, kk, v, o, NULL, go, dqkv, B, H, T, D, scale, 0, tc, scr, 1);
    /* device inputs in the layout bthd asks for (the reference used (B, H, T, D)) */
    const float *hin[5] = {q, kk, v, o, go};
    float *din[5];
    for (int i = 0; i < 5; i++) {
        float *t = (bthd >> i & 1u) ? to_bthd(hin[i], B, H, T, D) : NULL;
        din[i] = dev_from(t ? t : hin[i], (size_t)n * 4);
        free(t);
    }
    float *dO = dev_alloc((size_t)n * 4), *dD = dev_alloc((size_t)(3 * n) * 4);
    void *dscr = dev_alloc((size_t)jdt_cuk_attention_scratch_bytes(B, H, T, D, 1));
    jdt_cuk_attention(k, din[0], din[1], din[2], false, dO, NULL, false, NULL, B, H, T, D, scale,
                      bthd & 7u, bf16, dscr);
    jdt_cuk_attention_bwd(k, din[0], din[1], din[2], false, din[3], false, din[4], false, NULL, dD,
                          NULL, B, H, T, D, scale, bthd, bf16, dscr);
    float *go_ = dev_to_host(k, dO, n), *gd = dev_to_host(k, dD, 3 * n);
    char what[96];
    snprintf(what, sizeof what, "attention%s B%lld H%lld T%lld D%lld bthd%u scale %g",
             bf16 ? " bf16" : "", (long long)B, (long long)H, (long long)T, (long long)D, bthd,
             scale);
    if (tc) {
        double eo = rel_err(go_, o, n), ed = rel_err(gd, dqkv, 3 * n);
        printf("%s: max error %.2e (o), %.2e (dq, dk, dv) of the largest value\n", what, eo, ed);
        ck_assert_msg(eo < 5e-3 && ed < 1e-4, "%s: o %g, dqkv %g", what, eo, ed);
        if (D >= 32) { /* the backward rounds where the CPU does: the f32 reference is farther
                        * (the forward's unnormalised rounding can land on either side) */
            jdt_rt_attention(q, kk, v, o, NULL, B, H, T, D, scale, 0, false, scr, 1);
            jdt_rt_attention_bwd(q, kk, v, o, NULL, go, dqkv, B, H, T, D, scale, 0, false, scr, 1);
            double fd = rel_err(gd, dqkv, 3 * n);
            ck_assert_msg(ed < fd, "%s: dqkv no closer to bf16 (%g) than to f32 (%g)", what, ed,
                          fd);
        }
    } else {
        expect_close(what, go_, o, n, 2e-5f, 1e-4f);
        expect_close(what, gd, dqkv, 3 * n, 5e-5f, 1e-3f);
    }
    /* q, k, v stored as bf16 (the _b kernels, precision.activations: bf16): the same outputs,
     * bit for bit, as f32 inputs holding the same (rounded) values */
    uint16_t *h16 = malloc((size_t)n * 2);
    float *hr = malloc((size_t)n * 4);
    void *d16[3];
    float *dr[3];
    for (int i = 0; i < 3; i++) {
        float *t = (bthd >> i & 1u) ? to_bthd(hin[i], B, H, T, D) : NULL;
        const float *src = t ? t : hin[i];
        for (int64_t j = 0; j < n; j++) {
            h16[j] = jdt_rt_bf16_bits(src[j]);
            hr[j] = jdt_rt_bf16_round(src[j]);
        }
        d16[i] = dev_from(h16, (size_t)n * 2);
        dr[i] = dev_from(hr, (size_t)n * 4);
        free(t);
    }
    float *dO2 = dev_alloc((size_t)n * 4), *dD2 = dev_alloc((size_t)(3 * n) * 4);
    /* with the (B, T, H, D) second copy of o (passes.c fold_attention_copies): f32 here, bf16
     * below, each the transposed o bit for bit (bf16: o's rounding) */
    float *dc32 = dev_alloc((size_t)n * 4);
    uint16_t *dc16 = dev_alloc((size_t)n * 2);
    jdt_cuk_attention(k, dr[0], dr[1], dr[2], false, dO, dc32, false, NULL, B, H, T, D, scale,
                      bthd & 7u, bf16, dscr);
    jdt_cuk_attention_bwd(k, dr[0], dr[1], dr[2], false, din[3], false, din[4], false, NULL, dD,
                          NULL, B, H, T, D, scale, bthd, bf16, dscr);
    jdt_cuk_attention(k, d16[0], d16[1], d16[2], true, dO2, dc16, true, NULL, B, H, T, D, scale,
                      bthd & 7u, bf16, dscr);
    jdt_cuk_attention_bwd(k, d16[0], d16[1], d16[2], true, din[3], false, din[4], false, NULL, dD2,
                          NULL, B, H, T, D, scale, bthd, bf16, dscr);
    float *a1 = dev_to_host(k, dO, n), *a2 = dev_to_host(k, dO2, n);
    float *b1 = dev_to_host(k, dD, 3 * n), *b2 = dev_to_host(k, dD2, 3 * n);
    ck_assert_msg(memcmp(a1, a2, (size_t)n * 4) == 0, "%s: bf16 q/k/v: o differs", what);
    ck_assert_msg(memcmp(b1, b2, (size_t)(3 * n) * 4) == 0, "%s: bf16 q/k/v: dqkv differs", what);
    {
        float *t1 = to_bthd(a1, B, H, T, D), *c32 = dev_to_host(k, dc32, n);
        uint16_t *c16 = malloc((size_t)n * 2);
        ck_assert_int_eq(cudaMemcpy(c16, dc16, (size_t)n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
        ck_assert_msg(memcmp(c32, t1, (size_t)n * 4) == 0, "%s: o's f32 (B, T, H, D) copy", what);
        for (int64_t j = 0; j < n; j++) /* a1 == a2 above */
            ck_assert_msg(c16[j] == jdt_rt_bf16_bits(t1[j]), "%s: o's bf16 copy [%lld]", what,
                          (long long)j);
        free(t1), free(c32), free(c16);
        cudaFree(dc32), cudaFree(dc16);
    }
    check_attention_grads(k, what, d16, din, b2, B, H, T, D, scale, bthd, bf16, dscr);
    check_attention_lse(k, what, d16, din, q, kk, a2, b2, B, H, T, D, scale, bthd, bf16, dscr);
    if (bf16 && scale > 0.0f && D <= jdt_cuk_attention_dout16_d(jdt_cuk_arch(k)))
        check_attention_dout16(k, what, d16, din, go, B, H, T, D, scale, bthd, bf16, dscr);
    free(h16), free(hr), free(a1), free(a2), free(b1), free(b2);
    for (int i = 0; i < 3; i++)
        cudaFree(d16[i]), cudaFree(dr[i]);
    cudaFree(dO2), cudaFree(dD2);
    free(q), free(kk), free(v), free(go), free(o), free(dqkv), free(scr), free(go_), free(gd);
    for (int i = 0; i < 5; i++)
        cudaFree(din[i]);
    cudaFree(dO), cudaFree(dD), cudaFree(dscr);
}

/* n bf16 bit patterns from the device, widened to f32 (after checking k's stream). */
static float *dev_bf16_to_host(jdt_cuk *k, const uint16_t *dev, int64_t n)
{
    jdt_err e;
    jdt_err_clear(&e);
    jdt_status s = jdt_cuk_check(k, "test", true, &e);
    ck_assert_msg(s == JDT_OK, "%s", e.msg);
    uint16_t *b = malloc((size_t)n * 2);
    float *f = malloc((size_t)n * 4);
    ck_assert_int_eq(cudaMemcpy(b, dev, (size_t)n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)b[i] << 16;
        memcpy(&f[i], &u, 4);
    }
    free(b);
    return f;
}

/* |got - want| <= rel * max |want| everywhere, no NaN: two computations that round different
 * intermediates (the probabilities) to bf16. */
static void expect_near_max(const char *what, const float *got, const float *want, int64_t n,
                            float rel)
{
    float m = 0.0f;
    for (int64_t i = 0; i < n; i++)
        m = fmaxf(m, fabsf(want[i]));
    ck_assert_msg(m > 0.0f, "%s: all zero", what);
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(!isnan(got[i]) && fabsf(got[i] - want[i]) <= rel * m,
                      "%s[%lld]: got %.6g, want %.6g (largest %.4g)", what, (long long)i,
                      (double)got[i], (double)want[i], (double)m);
}

/* One shape of test_cudnn_attention: kd serves through cuDNN (kd->dnn_on: 1, or 2 with dQ
 * accumulated, where two runs need not give the same bits), k through our kernels. bthd's
 * group bits (JDT_CUK_ATT_GROUP): grouped-query attention, k, v and their copies with H / G
 * heads, the bias partial sums (P, H D) for dq, then (P, H / G D) each for dk and dv. The
 * partial sums of all three are compared. Returns false (after
 * printing SKIP) when cuDNN cannot be loaded. */
static bool check_cudnn_case(jdt_cuk *k, jdt_cuk *kd, int64_t B, int64_t H, int64_t T, int64_t D,
                             unsigned bthd, bool rope)
{
    const int64_t served = kd->n_dnn, G = JDT_CUK_ATT_GROUP(bthd);
    const int64_t n = B * H * T * D, rows = B * H * T, P = B * (T / JDT_CUK_ATT_PART),
                  np = P * (H + 2 * H / G) * D; /* the partial sums' floats */
    const int64_t nx[4] = {n, n / G, n / G, n}; /* q, k, v, dO (and dq, dk, dv) */
    const float scale = 1.0f / sqrtf((float)D);
    float *hx[4] = {rand_floats(n, 11, -2, 2), rand_floats(nx[1], 12, -2, 2),
                    rand_floats(nx[2], 13, -1, 1), rand_floats(n, 14, -1, 1)};
    uint16_t *x16[4];
    float *xr[4];
    for (int i = 0; i < 4; i++)
        dev_bf16_pair(hx[i], nx[i], &x16[i], &xr[i], NULL);
    const uint16_t *q = x16[0], *kk = x16[1], *v = x16[2], *dout = x16[3];
    const int64_t sb = jdt_cuk_attention_scratch_bytes(B, H, T, D, G);
    void *scr = dev_alloc((size_t)sb), *scr2 = dev_alloc((size_t)sb);
    uint16_t *o[2] = {dev_alloc((size_t)n * 2), dev_alloc((size_t)n * 2)};
    float *lse[2] = {dev_alloc((size_t)rows * 4), dev_alloc((size_t)rows * 4)};
    const unsigned fwd = bthd & ~24u; /* the forward's layout bits and the group */
    jdt_cuk_attention(k, q, kk, v, true, NULL, o[0], true, lse[0], B, H, T, D, scale, fwd, true,
                      scr);
    jdt_cuk_attention(kd, q, kk, v, true, NULL, o[1], true, lse[1], B, H, T, D, scale, fwd, true,
                      scr2);
    bool ran = kd->n_dnn == served + 1;
    if (!ran && strstr(kd->dnn_why, "cannot be loaded")) {
        printf("SKIP check_cuk test_cudnn_attention: %s\n", kd->dnn_why);
    } else {
        ck_assert_msg(ran, "cuDNN declined the forward B=%lld H=%lld T=%lld D=%lld: %s",
                      (long long)B, (long long)H, (long long)T, (long long)D, kd->dnn_why);
        float *of[2] = {dev_bf16_to_host(k, o[0], n), dev_bf16_to_host(kd, o[1], n)};
        float *lf[2] = {dev_to_host(k, lse[0], rows), dev_to_host(kd, lse[1], rows)};
        expect_near_max("cuDNN attention o", of[1], of[0], n, 2e-2f);
        expect_close("cuDNN attention log-sum-exp", lf[1], lf[0], rows, 2e-3f, 1e-4f);
        /* the backward of both from our forward's o and log-sum-exp; cuDNN's twice */
        uint16_t *cp[3][3];
        float *part[3];
        for (int r = 0; r < 3; r++) {
            /* with rope: Llama's dq and dk through RoPE's backward; the bias partial sums are
             * of the rotated values (Qwen2's q and k biases, before the RoPE) */
            part[r] = dev_alloc((size_t)np * 4);
            jdt_cuk_att_grads g = {.part = part[r]};
            for (int j = 0; j < 3; j++) {
                g.copy[j] = cp[r][j] = dev_alloc((size_t)nx[j] * 2);
                g.copy_bf16[j] = true;
                g.rope_theta[j] = rope && j < 2 ? 10000.0 : 0.0;
                g.rope_inverse[j] = true;
            }
            jdt_cuk_attention_bwd(r ? kd : k, q, kk, v, true, o[0], true, dout, true, lse[0], NULL,
                                  &g, B, H, T, D, scale, bthd | 8u, true, r ? scr2 : scr);
        }
        ck_assert_msg(kd->n_dnn == served + 3, "cuDNN declined the backward: %s", kd->dnn_why);
        static const char *const names[3] = {"dq", "dk", "dv"};
        for (int j = 0; j < 3; j++) {
            const int64_t m = nx[j];
            float *ref = dev_bf16_to_host(k, cp[0][j], m), *got = dev_bf16_to_host(kd, cp[1][j], m),
                  *again = dev_bf16_to_host(kd, cp[2][j], m);
            char what[64];
            snprintf(what, sizeof what, "cuDNN attention backward %s", names[j]);
            expect_near_max(what, got, ref, m, 2e-2f);
            if (kd->dnn_on == 1)
                ck_assert_msg(memcmp(got, again, (size_t)m * 4) == 0,
                              "cuDNN attention backward %s: two runs differ (nondeterministic)",
                              names[j]);
            else
                expect_near_max(what, again, ref, m, 2e-2f);
            free(ref), free(got), free(again);
        }
        float *pref = dev_to_host(k, part[0], np), *pgot = dev_to_host(kd, part[1], np);
        expect_near_max("cuDNN attention backward partial sums", pgot, pref, np, 2e-2f);
        free(pref), free(pgot);
        printf("check_cuk test_cudnn_attention: B=%lld H=%lld T=%lld D=%lld G=%lld bthd=%u%s%s "
               "matches the tensor-core kernels\n",
               (long long)B, (long long)H, (long long)T, (long long)D, (long long)G, bthd & 31u,
               kd->dnn_on == 2 ? " (dQ accumulated)" : "", rope ? " (RoPE on dq, dk)" : "");
        for (int r = 0; r < 3; r++) {
            cudaFree(part[r]);
            for (int j = 0; j < 3; j++)
                cudaFree(cp[r][j]);
        }
        for (int i = 0; i < 2; i++)
            free(of[i]), free(lf[i]);
    }
    for (int i = 0; i < 4; i++)
        free(hx[i]), cudaFree(x16[i]), cudaFree(xr[i]);
    for (int i = 0; i < 2; i++)
        cudaFree(o[i]), cudaFree(lse[i]);
    cudaFree(scr), cudaFree(scr2);
    return ran;
}

/* cuDNN's fused attention (JDT_CUDNN_ATTENTION=1, cuk_cudnn.c) against jdt-train's tensor-core
 * kernels on the same bf16 inputs: the forward's o and log-sum-exp, the backward's bf16 copies
 * of dq, dk, dv (bitwise the same on a second run: the deterministic form) and the bias
 * gradients' partial sums; GPT-2's layouts, a (B, H, T, D) one with heads of 128, and Llama's
 * RoPE backward on the dq and dk copies; then GPT-2's layouts with dQ accumulated
 * (JDT_CUDNN_ATTENTION=fast). cuDNN comes from JDT_CUDNN_LIBRARY (scripts/gpu/check.sh points
 * it at PyTorch's copy); without it the test skips. On the host emulator that is cudnnemu.c's
 * stand-in, which interprets the graph cuk_cudnn.c builds on the host and checks the variant
 * pack's pointers: the layouts, the pack, the scratch, the accumulator's zeroing and what runs
 * after cuDNN are checked without a GPU; the real engines' patterns are test_cudnn_offline's. */
START_TEST(test_cudnn_attention)
{
    GPU_OR_SKIP(k);
    if (jdt_cuk_arch(k) < 80) {
        printf("SKIP check_cuk test_cudnn_attention: needs sm_80 or newer\n");
        jdt_cuk_free(k);
        return;
    }
    jdt_cuk *kd = NULL;
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_int_eq(jdt_cuk_init(0, cache_dir_, &kd, &e), JDT_OK);
    kd->dnn_on = 1;
    if (check_cudnn_case(k, kd, 2, 3, 256, 64, 31u, false)) {
        /* on the emulator's cuDNN (cudnnemu.c), a plan that wants more workspace than the
         * cuBLASLt workspace's: cuDNN's own, grown for it */
        if (emulated_gpu()) setenv("JDT_CUDNNEMU_WORKSPACE", "50331648", 1);
        check_cudnn_case(k, kd, 1, 2, 128, 128, 0u, false);
        unsetenv("JDT_CUDNNEMU_WORKSPACE");
        check_cudnn_case(k, kd, 2, 3, 256, 64, 31u, true);
        /* grouped-query attention: 2 query heads per key/value head, Llama's RoPE */
        check_cudnn_case(k, kd, 1, 4, 128, 64, 31u | 2u << 8, true);
        kd->dnn_on = 2; /* JDT_CUDNN_ATTENTION=fast: new plans, dQ accumulated */
        check_cudnn_case(k, kd, 2, 3, 256, 64, 31u, false);
        check_cudnn_case(k, kd, 1, 4, 128, 64, 31u | 4u << 8, false); /* multi-query */
    }
    jdt_cuk_free(kd);
    jdt_cuk_free(k);
}
END_TEST

/* One forward (with the log-sum-exp) and one backward (the cotangent form: bf16 copies and the
 * bias partial sums) of GPT-2's layouts on k, with G query heads per key/value head (k and v
 * read as H / G heads) and, with rope, Llama's RoPE backward on the dq and dk copies; the
 * backward reads the given o and lse (the same for every context, so each direction's outputs
 * depend only on who computed them). The outputs come back on the host, bf16 widened: out[0] o,
 * [1] lse, [2..4] dq dk dv, [5] the partial sums; cnt[i] their lengths. */
static void trial_case(jdt_cuk *k, uint16_t *const x[4], const uint16_t *o_in, const float *lse_in,
                       int64_t B, int64_t H, int64_t T, int64_t D, unsigned G, bool rope,
                       float *out[6], int64_t cnt[6])
{
    const int64_t n = B * H * T * D, rows = B * H * T,
                  np = B * (T / JDT_CUK_ATT_PART) * (H + 2 * H / G) * D;
    const float scale = 1.0f / sqrtf((float)D);
    void *scr = dev_alloc((size_t)jdt_cuk_attention_scratch_bytes(B, H, T, D, G));
    uint16_t *o = dev_alloc((size_t)n * 2);
    float *lse = dev_alloc((size_t)rows * 4), *part = dev_alloc((size_t)np * 4);
    jdt_cuk_att_grads g = {.part = part};
    for (int j = 0; j < 3; j++) {
        g.copy[j] = dev_alloc((size_t)(j ? n / G : n) * 2), g.copy_bf16[j] = true;
        g.rope_theta[j] = rope && j < 2 ? 10000.0 : 0.0, g.rope_inverse[j] = true;
    }
    jdt_cuk_attention(k, x[0], x[1], x[2], true, NULL, o, true, lse, B, H, T, D, scale, 7u | G << 8,
                      true, scr);
    jdt_cuk_attention_bwd(k, x[0], x[1], x[2], true, o_in, true, x[3], true, lse_in, NULL, &g, B, H,
                          T, D, scale, 31u | G << 8, true, scr);
    out[0] = dev_bf16_to_host(k, o, n), cnt[0] = n;
    out[1] = dev_to_host(k, lse, rows), cnt[1] = rows;
    for (int j = 0; j < 3; j++) {
        cnt[2 + j] = j ? n / G : n;
        out[2 + j] = dev_bf16_to_host(k, g.copy[j], cnt[2 + j]);
        cudaFree(g.copy[j]);
    }
    out[5] = dev_to_host(k, part, np), cnt[5] = np;
    cudaFree(scr), cudaFree(o), cudaFree(lse), cudaFree(part);
}

/* Whether outputs first..last of a and b are the same bits. */
static bool trial_same(float *const a[6], float *const b[6], const int64_t cnt[6], int first,
                       int last)
{
    for (int i = first; i <= last; i++)
        if (memcmp(a[i], b[i], (size_t)cnt[i] * 4) != 0) return false;
    return true;
}

/* A context choosing per shape (JDT_CUDNN_ATTENTION=auto), its verdicts forced to "faster"
 * for cuDNN (2), for ours (1), or left to the times (0). */
static jdt_cuk *trial_ctx(const char *cache_dir, int force)
{
    jdt_cuk *k = NULL;
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_int_eq(jdt_cuk_init(0, cache_dir, &k, &e), JDT_OK);
    k->dnn_on = 1, k->dnn_auto = true, k->att_trial_force = force;
    return k;
}

/* Two calls of trial_case on a context whose verdicts are forced (force 2: cuDNN's, 1: ours):
 * one trial per direction at the first, none at the second, which runs cuDNN for both
 * directions or for neither; both calls' outputs want's bit for bit; with verdicts for ours,
 * cuDNN released. */
static void check_forced(const char *cache_dir, int force, uint16_t *const x[4],
                         const uint16_t *o_in, const float *lse_in, int64_t B, int64_t H, int64_t T,
                         int64_t D, float *const want[6], const int64_t cnt[6])
{
    const bool dnn = force == 2;
    float *got[6], *again[6];
    int64_t c[6];
    jdt_cuk *k = trial_ctx(cache_dir, force);
    trial_case(k, x, o_in, lse_in, B, H, T, D, 1, false, got, c);
    const int64_t served = k->n_dnn;
    trial_case(k, x, o_in, lse_in, B, H, T, D, 1, false, again, c);
    ck_assert_int_eq(k->n_att_trials, 2);
    ck_assert_int_eq(k->n_att_dnn, dnn ? 2 : 0);
    if (dnn) ck_assert_int_eq(k->n_att_disagree, 0);
    ck_assert_msg(k->n_dnn == served + (dnn ? 2 : 0), "the second calls: cuDNN served %lld, not %d",
                  (long long)(k->n_dnn - served), dnn ? 2 : 0);
    if (!dnn) ck_assert_msg(k->dnn == NULL, "cuDNN not released after verdicts for ours");
    ck_assert_msg(trial_same(got, want, cnt, 0, 5), "the trial's call: not %s outputs",
                  dnn ? "cuDNN's" : "our kernels'");
    ck_assert_msg(trial_same(again, want, cnt, 0, 5), "after the trial: not %s outputs",
                  dnn ? "cuDNN's" : "our kernels'");
    for (int i = 0; i < 6; i++)
        free(got[i]), free(again[i]);
    jdt_cuk_free(k);
}

/* JDT_CUDNN_ATTENTION=auto (the default; cuk.h jdt_cuk_dnn_attention_auto): each direction is
 * tried once per shape, and its outputs are then bit for bit those of the implementation kept;
 * a later context takes the verdicts from the kernel cache without trying again.
 * A verdict for cuDNN (its times forced) gives cuDNN's outputs from the trial's call on, and the
 * next call runs cuDNN without a trial; one for ours gives ours and releases cuDNN; on the
 * emulator, a cuDNN whose outputs are planted 10% off (JDT_CUDNNEMU_PERTURB) is refused for
 * both directions, even when faster; left to the times, each direction's outputs are one of
 * the two. On a GPU this is the trial the product runs at its first step. */
START_TEST(test_cudnn_trial)
{
    GPU_OR_SKIP(k); /* JDT_CUDNN_ATTENTION=0 (main): jdt-train's kernels */
    if (jdt_cuk_arch(k) < 80) {
        printf("SKIP check_cuk test_cudnn_trial: needs sm_80 or newer\n");
        jdt_cuk_free(k);
        return;
    }
    const int64_t B = 1, H = 2, T = 128, D = 64, n = B * H * T * D;
    uint16_t *x[4];
    for (int i = 0; i < 4; i++) {
        float *h = rand_floats(n, 21 + (unsigned)i, i == 3 ? -1 : -2, i == 3 ? 1 : 2), *r;
        dev_bf16_pair(h, n, &x[i], &r, NULL);
        free(h), cudaFree(r);
    }
    /* the backward's o and lse: our forward's */
    const float scale = 1.0f / sqrtf((float)D);
    uint16_t *o_in = dev_alloc((size_t)n * 2);
    float *lse_in = dev_alloc((size_t)B * H * T * 4);
    void *scr = dev_alloc((size_t)jdt_cuk_attention_scratch_bytes(B, H, T, D, 1));
    jdt_cuk_attention(k, x[0], x[1], x[2], true, NULL, o_in, true, lse_in, B, H, T, D, scale, 7u,
                      true, scr);
    float *ours[6], *dnn[6], *got[6], *again[6];
    int64_t cnt[6];
    trial_case(k, x, o_in, lse_in, B, H, T, D, 1, false, ours, cnt);
    jdt_cuk *kd = trial_ctx(cache_dir_, 0);
    kd->dnn_auto = false; /* JDT_CUDNN_ATTENTION=1: cuDNN unchecked */
    trial_case(kd, x, o_in, lse_in, B, H, T, D, 1, false, dnn, cnt);
    if (kd->n_dnn == 0 && (strstr(kd->dnn_why, "cannot be loaded") ||
                           strstr(kd->dnn_why, "too old") || strstr(kd->dnn_why, "known bugs"))) {
        printf("SKIP check_cuk test_cudnn_trial: %s\n", kd->dnn_why);
    } else {
        ck_assert_msg(kd->n_dnn == 2, "cuDNN declined a direction: %s", kd->dnn_why);
        ck_assert_msg(!trial_same(ours, dnn, cnt, 0, 0) && !trial_same(ours, dnn, cnt, 2, 4),
                      "cuDNN's outputs are ours bit for bit: the test could not tell them apart");
        /* verdicts for cuDNN, then for ours: cuDNN released */
        check_forced(cache_dir_, 2, x, o_in, lse_in, B, H, T, D, dnn, cnt);
        check_forced(cache_dir_, 1, x, o_in, lse_in, B, H, T, D, ours, cnt);
        if (emulated_gpu()) { /* a cuDNN planted 10% off, its times forced faster */
            setenv("JDT_CUDNNEMU_PERTURB", "0.1", 1);
            jdt_cuk *kc = trial_ctx(cache_dir_, 2);
            trial_case(kc, x, o_in, lse_in, B, H, T, D, 1, false, got, cnt);
            unsetenv("JDT_CUDNNEMU_PERTURB");
            ck_assert_int_eq(kc->n_att_disagree, 2);
            ck_assert_int_eq(kc->n_att_dnn, 0);
            ck_assert_msg(trial_same(got, ours, cnt, 0, 5), "a disagreeing cuDNN: not our outputs");
            for (int i = 0; i < 6; i++)
                free(got[i]);
            jdt_cuk_free(kc);
        }
        /* grouped-query attention (2 query heads per key/value head) with Llama's RoPE on the
         * dq and dk copies: dk's and dv's sizes and partial sums are a group's */
        float *ours2[6], *dnn2[6];
        int64_t cnt2[6];
        trial_case(k, x, o_in, lse_in, B, H, T, D, 2, true, ours2, cnt2);
        jdt_cuk *kd2 = trial_ctx(cache_dir_, 0), *ka2 = trial_ctx(cache_dir_, 2);
        kd2->dnn_auto = false;
        trial_case(kd2, x, o_in, lse_in, B, H, T, D, 2, true, dnn2, cnt2);
        ck_assert_msg(kd2->n_dnn == 2, "cuDNN declined grouped-query attention: %s", kd2->dnn_why);
        trial_case(ka2, x, o_in, lse_in, B, H, T, D, 2, true, got, cnt2);
        ck_assert_int_eq(ka2->n_att_dnn, 2);
        ck_assert_int_eq(ka2->n_att_disagree, 0);
        ck_assert_msg(!trial_same(ours2, dnn2, cnt2, 2, 4), "grouped: cuDNN's copies are ours");
        ck_assert_msg(trial_same(got, dnn2, cnt2, 0, 5), "grouped: not cuDNN's outputs");
        for (int i = 0; i < 6; i++)
            free(got[i]), free(ours2[i]), free(dnn2[i]);
        jdt_cuk_free(kd2);
        jdt_cuk_free(ka2);
        /* the times decide (none remembered from an earlier run in this cache: a salt of this
         * process's own in the verdicts' key) */
        jdt_cuk *kx = trial_ctx(cache_dir_, 0);
        kx->pick_salt = (int64_t)getpid() << 20 ^ (int64_t)time(NULL);
        trial_case(kx, x, o_in, lse_in, B, H, T, D, 1, false, got, cnt);
        ck_assert_int_eq(kx->n_att_trials, 2);
        ck_assert_int_eq(kx->n_att_disagree, 0);
        const bool f_dnn = trial_same(got, dnn, cnt, 0, 1), b_dnn = trial_same(got, dnn, cnt, 2, 5);
        ck_assert_msg(f_dnn || trial_same(got, ours, cnt, 0, 1), "forward: neither's outputs");
        ck_assert_msg(b_dnn || trial_same(got, ours, cnt, 2, 5), "backward: neither's outputs");
        ck_assert_int_eq(kx->n_att_dnn, (int)f_dnn + (int)b_dnn);
        /* a later context on this GPU takes the verdicts from the kernel cache, untried: the
         * same outputs, bit for bit */
        jdt_cuk *ky = trial_ctx(cache_dir_, 0);
        ky->pick_salt = kx->pick_salt;
        trial_case(ky, x, o_in, lse_in, B, H, T, D, 1, false, again, cnt);
        ck_assert_int_eq(ky->n_att_trials, 0);
        ck_assert_int_eq(ky->n_att_remembered, 2);
        ck_assert_msg(trial_same(again, got, cnt, 0, 5), "the remembered verdicts: other outputs");
        for (int i = 0; i < 6; i++)
            free(again[i]);
        jdt_cuk_free(ky);
        printf("check_cuk test_cudnn_trial: verdicts forced each way, grouped-query with RoPE, a "
               "planted disagreement%s; "
               "by the times: forward %s, backward %s\n",
               emulated_gpu() ? "" : " (emulator only)", f_dnn ? "cuDNN" : "ours",
               b_dnn ? "cuDNN" : "ours");
        for (int i = 0; i < 6; i++)
            free(got[i]);
        jdt_cuk_free(kx);
    }
    for (int i = 0; i < 6; i++)
        free(ours[i]), free(dnn[i]);
    for (int i = 0; i < 4; i++)
        cudaFree(x[i]);
    cudaFree(o_in), cudaFree(lse_in), cudaFree(scr);
    jdt_cuk_free(kd);
    jdt_cuk_free(k);
}
END_TEST

/* The emulator's own checks (tests/infra/cudaemu/emu.hpp), which the kernel tests rely on: every
 * block starts with its static shared memory filled with 0xff bytes, and JDT_CUDAEMU_ORDER
 * changes the order in which a block's threads run between barriers. The probe kernel reads
 * shared memory before writing it (the poison, not the other block's values), then reads its
 * neighbour's slot with no barrier in between, a race: thread t + 1 has written it only when it
 * ran first. On a GPU the race's outcome is undefined: the test runs on the emulator only. */
static const char EMU_PROBE_SRC[] = "extern \"C\" __global__ void emu_probe(unsigned *out)\n"
                                    "{\n"
                                    "    __shared__ unsigned s[64];\n"
                                    "    unsigned t = threadIdx.x, b = blockIdx.x;\n"
                                    "    out[(2 * b) * 64 + t] = s[t];\n"
                                    "    s[t] = t + 1;\n"
                                    "    out[(2 * b + 1) * 64 + t] = s[(t + 1) % 64];\n"
                                    "}\n";

/* A probe program compiled for sm_90 by the (emulated) NVRTC and loaded; *image (the cubin,
 * which the library uses) is the caller's to free after cudaLibraryUnload. */
static cudaLibrary_t emu_probe_load(const char *src, const char *name, char **image)
{
    nvrtcProgram prog;
    ck_assert_int_eq(nvrtcCreateProgram(&prog, src, name, 0, NULL, NULL), NVRTC_SUCCESS);
    const char *opts[] = {"--gpu-architecture=sm_90"};
    ck_assert_int_eq(nvrtcCompileProgram(prog, 1, opts), NVRTC_SUCCESS);
    size_t n = 0;
    ck_assert_int_eq(nvrtcGetCUBINSize(prog, &n), NVRTC_SUCCESS);
    *image = malloc(n);
    ck_assert_ptr_nonnull(*image);
    ck_assert_int_eq(nvrtcGetCUBIN(prog, *image), NVRTC_SUCCESS);
    nvrtcDestroyProgram(&prog);
    cudaLibrary_t lib;
    ck_assert_int_eq(cudaLibraryLoadData(&lib, *image, NULL, NULL, 0, NULL, NULL, 0), cudaSuccess);
    return lib;
}

/* Kernel `name` of a probe library (emu_probe_load). */
static cudaKernel_t emu_probe_kernel(cudaLibrary_t lib, const char *name)
{
    cudaKernel_t fn;
    ck_assert_int_eq(cudaLibraryGetKernel(&fn, lib, name), cudaSuccess);
    return fn;
}

static void emu_probe_run(cudaKernel_t fn, const char *order, unsigned out[256])
{
    if (order)
        setenv("JDT_CUDAEMU_ORDER", order, 1);
    else
        unsetenv("JDT_CUDAEMU_ORDER");
    unsigned *d = dev_alloc(256 * sizeof(unsigned));
    void *args[] = {&d};
    dim3 g = {2, 1, 1}, b = {64, 1, 1};
    ck_assert_int_eq(cudaLaunchKernel((const void *)fn, g, b, args, 0, 0), cudaSuccess);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(out, d, 256 * sizeof(unsigned), cudaMemcpyDeviceToHost),
                     cudaSuccess);
    cudaFree(d);
    unsetenv("JDT_CUDAEMU_ORDER");
}

START_TEST(test_emulator_strict)
{
    EMU_OR_SKIP(k, "checks (a racy probe kernel)");
    char *image;
    cudaLibrary_t lib = emu_probe_load(EMU_PROBE_SRC, "emu_probe.cu", &image);
    cudaKernel_t fn = emu_probe_kernel(lib, "emu_probe");
    const unsigned P = 0xffffffffu;
    unsigned fwd[256], rev[256], shuf[256];
    char *was = getenv("JDT_CUDAEMU_ORDER") ? strdup(getenv("JDT_CUDAEMU_ORDER")) : NULL;
    emu_probe_run(fn, NULL, fwd);
    emu_probe_run(fn, "reverse", rev);
    emu_probe_run(fn, "shuffle", shuf);
    if (was) setenv("JDT_CUDAEMU_ORDER", was, 1); /* the other tests keep the caller's order */
    free(was);
    int differ = 0;
    for (unsigned b = 0; b < 2; b++)
        for (unsigned t = 0; t < 64; t++) {
            for (const unsigned *o = fwd; o; o = o == fwd ? rev : o == rev ? shuf : NULL)
                ck_assert_msg(o[2 * b * 64 + t] == P, "block %u thread %u read %#x unwritten", b, t,
                              o[2 * b * 64 + t]);
            /* forward: thread t runs before t + 1 (only thread 63 sees a write: s[0]);
             * reverse: after it (only thread 63 does not) */
            const unsigned r = (2 * b + 1) * 64 + t;
            ck_assert_uint_eq(fwd[r], t < 63 ? P : 1u);
            ck_assert_uint_eq(rev[r], t < 63 ? t + 2 : P);
            ck_assert(shuf[r] == P || shuf[r] == (t + 1) % 64 + 1);
            differ += shuf[r] != fwd[r];
        }
    ck_assert_int_gt(differ, 0); /* a permutation, not the forward order */
    cudaLibraryUnload(lib);
    free(image);
    jdt_cuk_free(k);
}
END_TEST

/* The emulator's launch bounds (cudaemu.c cudaLaunchKernel): past 256 threads a kernel must
 * declare __launch_bounds__ of at least its block, since without one ptxas may give it up to
 * 255 registers a thread and the block then fits an SM's 65536 only by luck. emu_free has none,
 * emu_512 a bound of 512 written through a macro (the emulator reads the preprocessed text),
 * emu_pair a bound of 256 with a second argument. */
static const char EMU_BOUNDS_SRC[] =
    "#define EMU_BOUND 512\n"
    "extern \"C\" __global__ void emu_free(unsigned *out) { out[threadIdx.x] = 1u; }\n"
    "extern \"C\" __global__ void __launch_bounds__(EMU_BOUND) emu_512(unsigned *out)\n"
    "{ out[threadIdx.x] = 2u; }\n"
    "extern \"C\" __global__ void __launch_bounds__(256, 2) emu_pair(unsigned *out)\n"
    "{ out[threadIdx.x] = 3u; }\n";

START_TEST(test_emulator_launch_bounds)
{
    EMU_OR_SKIP(k, "launch check");
    char *image;
    cudaLibrary_t lib = emu_probe_load(EMU_BOUNDS_SRC, "emu_bounds.cu", &image);
    static const struct {
        const char *name;
        unsigned threads;
        cudaError_t want;
        unsigned val;
    } cases[] = {
        {"emu_free", 256, cudaSuccess, 1u}, {"emu_free", 512, cudaErrorLaunchOutOfResources, 0},
        {"emu_512", 512, cudaSuccess, 2u},  {"emu_512", 1024, cudaErrorLaunchOutOfResources, 0},
        {"emu_pair", 256, cudaSuccess, 3u}, {"emu_pair", 288, cudaErrorLaunchOutOfResources, 0},
    };
    unsigned *d = dev_alloc(1024 * sizeof(unsigned)), *h = malloc(1024 * sizeof(unsigned));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cudaKernel_t fn = emu_probe_kernel(lib, cases[i].name);
        ck_assert_int_eq(cudaMemset(d, 0, 1024 * sizeof(unsigned)), cudaSuccess);
        void *args[] = {&d};
        dim3 g = {1, 1, 1}, b = {cases[i].threads, 1, 1};
        cudaError_t rc = cudaLaunchKernel((const void *)fn, g, b, args, 0, NULL);
        ck_assert_msg(rc == cases[i].want, "%s with %u threads: %s, want %s", cases[i].name,
                      cases[i].threads, cudaGetErrorString(rc), cudaGetErrorString(cases[i].want));
        (void)cudaGetLastError(); /* not sticky, as on a GPU */
        ck_assert_int_eq(cudaMemcpy(h, d, 1024 * sizeof(unsigned), cudaMemcpyDeviceToHost),
                         cudaSuccess);
        for (unsigned t = 0; t < cases[i].threads; t++)
            ck_assert_uint_eq(h[t], cases[i].val);
    }
    free(h);
    cudaFree(d);
    cudaLibraryUnload(lib);
    free(image);
    jdt_cuk_free(k);
}
END_TEST

/* The emulator's warp collectives over exited lanes (emu.hpp emu_exchange, emu_vote): lanes
 * 16-31 return at once; a shuffle from one of them is undefined on a GPU and poison here (all
 * bits set), one within the mask is the source's value, and the votes count only the 16 lanes
 * left, as a GPU's do. emu_shfl_last: every lane exits right after its last shuffle and vote;
 * the lane that opens their barrier may run on and exit before the others read, and it still
 * took part (the emulator's single barrier per collective must not take it for exited). */
static const char EMU_SHFL_SRC[] = "extern \"C\" __global__ void emu_shfl(unsigned *out)\n"
                                   "{\n"
                                   "    unsigned t = threadIdx.x;\n"
                                   "    if (t >= 16) return;\n"
                                   "    out[t] = __shfl_xor_sync(0xffffffffu, t + 1, 16);\n"
                                   "    out[32 + t] = __shfl_xor_sync(0x0000ffffu, t + 1, 1);\n"
                                   "    out[64 + t] = __ballot_sync(0xffffffffu, t != 3);\n"
                                   "    out[96 + t] = __all_sync(0xffffffffu, 1);\n"
                                   "}\n"
                                   "extern \"C\" __global__ void emu_shfl_last(unsigned *out)\n"
                                   "{\n"
                                   "    unsigned t = threadIdx.x;\n"
                                   "    out[t] = __shfl_xor_sync(0xffffffffu, t + 1, 31);\n"
                                   "    out[32 + t] = __ballot_sync(0xffffffffu, t != 5);\n"
                                   "}\n";

START_TEST(test_emulator_shuffle_sources)
{
    EMU_OR_SKIP(k, "poison");
    char *image;
    cudaLibrary_t lib = emu_probe_load(EMU_SHFL_SRC, "emu_shfl.cu", &image);
    cudaKernel_t fn = emu_probe_kernel(lib, "emu_shfl");
    unsigned *d = dev_alloc(128 * sizeof(unsigned)), h[128];
    void *args[] = {&d};
    dim3 g = {1, 1, 1}, b = {32, 1, 1};
    ck_assert_int_eq(cudaLaunchKernel((const void *)fn, g, b, args, 0, NULL), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    for (unsigned t = 0; t < 16; t++) {
        ck_assert_uint_eq(h[t], 0xffffffffu);
        ck_assert_uint_eq(h[32 + t], (t ^ 1u) + 1u);
        ck_assert_uint_eq(h[64 + t], 0xfff7u);
        ck_assert_uint_eq(h[96 + t], 1u);
    }
    fn = emu_probe_kernel(lib, "emu_shfl_last");
    ck_assert_int_eq(cudaLaunchKernel((const void *)fn, g, b, args, 0, NULL), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
    for (unsigned t = 0; t < 32; t++) {
        ck_assert_uint_eq(h[t], (t ^ 31u) + 1u);
        ck_assert_uint_eq(h[32 + t], 0xffffffdfu);
    }
    cudaFree(d);
    cudaLibraryUnload(lib);
    free(image);
    jdt_cuk_free(k);
}
END_TEST

/* A warp collective under divergent control flow (emu.hpp emu_took_part): lanes 0-15 shuffle
 * over the full mask while lanes 16-31 wait at a __syncwarp; on a GPU undefined (a hang or
 * garbage), on the emulator a failed launch, though the warp's barrier opens. */
static const char EMU_DIVERGE_SRC[] = "extern \"C\" __global__ void emu_diverge(unsigned *out)\n"
                                      "{\n"
                                      "    unsigned t = threadIdx.x;\n"
                                      "    if (t < 16)\n"
                                      "        out[t] = __shfl_xor_sync(0xffffffffu, t + 1, 1);\n"
                                      "    else\n"
                                      "        __syncwarp();\n"
                                      "}\n";

START_TEST(test_emulator_divergent_collective)
{
    EMU_OR_SKIP(k, "check");
    char *image;
    cudaLibrary_t lib = emu_probe_load(EMU_DIVERGE_SRC, "emu_diverge.cu", &image);
    cudaKernel_t fn = emu_probe_kernel(lib, "emu_diverge");
    unsigned *d = dev_alloc(32 * sizeof(unsigned));
    void *args[] = {&d};
    dim3 g = {1, 1, 1}, b = {32, 1, 1};
    cudaError_t rc = cudaLaunchKernel((const void *)fn, g, b, args, 0, NULL);
    if (rc == cudaSuccess) rc = cudaDeviceSynchronize();
    ck_assert_msg(rc == cudaErrorLaunchFailure, "a divergent shuffle: %s, want %s",
                  cudaGetErrorString(rc), cudaGetErrorString(cudaErrorLaunchFailure));
    free(image); /* the launch failure is sticky: nothing more on this device */
    jdt_cuk_free(k);
}
END_TEST

/* The emulator's warp-at-a-time order and its cp.async (emu.hpp). emu_warps: each thread
 * writes its slot, then, after a warp barrier only, reads the slot of the other warp's thread
 * t +- 32: in step (reverse) both warps have written before either reads (but for the thread
 * that opens warp 1's barrier); warp by warp ("warps", the last warp first) warp 1 reads before
 * warp 0 has written. emu_cpa: 16 bytes per thread by
 * cp.async, the first word read before the wait and after it: the copy lands at the wait
 * (by default) or when issued (JDT_CUDAEMU_CP_ASYNC=issue). Emulator only, like the above. */
static const char EMU_PROBE2_SRC[] =
    "extern \"C\" __global__ void emu_warps(unsigned *out)\n"
    "{\n"
    "    __shared__ unsigned s[64];\n"
    "    unsigned t = threadIdx.x;\n"
    "    s[t] = t + 1;\n"
    "    __syncwarp();\n"
    "    out[t] = s[(t + 32) % 64];\n"
    "}\n"
    "extern \"C\" __global__ void emu_cpa(const unsigned *src, unsigned *out)\n"
    "{\n"
    "    __shared__ float4 c[64];\n"
    "    unsigned t = threadIdx.x;\n"
    "    cuk_cp_async<16>(&c[t], src + 4 * t, t % 2 == 0);\n"
    "    cuk_cp_async_commit();\n"
    "    out[t] = __float_as_uint(c[t].x);\n"
    "    cuk_cp_async_wait<0>();\n"
    "    out[64 + t] = __float_as_uint(c[t].x);\n"
    "}\n";

/* Runs fn of the probe program (64 threads, one block) with the emulator's order and cp.async
 * switches set (NULL: unset) and copies out[0..128) back. */
static void emu_probe2_run(cudaKernel_t fn, const char *order, const char *cpa, void **args,
                           unsigned *dout, unsigned out[128])
{
    order ? setenv("JDT_CUDAEMU_ORDER", order, 1) : unsetenv("JDT_CUDAEMU_ORDER");
    cpa ? setenv("JDT_CUDAEMU_CP_ASYNC", cpa, 1) : unsetenv("JDT_CUDAEMU_CP_ASYNC");
    dim3 g = {1, 1, 1}, b = {64, 1, 1};
    ck_assert_int_eq(cudaLaunchKernel((const void *)fn, g, b, args, 0, 0), cudaSuccess);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    ck_assert_int_eq(cudaMemcpy(out, dout, 128 * sizeof(unsigned), cudaMemcpyDeviceToHost),
                     cudaSuccess);
    unsetenv("JDT_CUDAEMU_ORDER");
    unsetenv("JDT_CUDAEMU_CP_ASYNC");
}

START_TEST(test_emulator_warps_cp_async)
{
    EMU_OR_SKIP(k, "checks (racy probe kernels)");
    char *image;
    cudaLibrary_t lib = emu_probe_load(EMU_PROBE2_SRC, "emu_probe2.cu", &image);
    cudaKernel_t warps = emu_probe_kernel(lib, "emu_warps"), cpa = emu_probe_kernel(lib, "emu_cpa");
    char *was_o = getenv("JDT_CUDAEMU_ORDER") ? strdup(getenv("JDT_CUDAEMU_ORDER")) : NULL;
    char *was_c = getenv("JDT_CUDAEMU_CP_ASYNC") ? strdup(getenv("JDT_CUDAEMU_CP_ASYNC")) : NULL;
    const unsigned P = 0xffffffffu;
    unsigned src[256], out[128];
    for (unsigned i = 0; i < 256; i++)
        src[i] = 1000 + i;
    unsigned *dout = dev_alloc(128 * sizeof(unsigned)), *dsrc = dev_from(src, sizeof src);
    void *wargs[] = {&dout}, *cargs[] = {&dsrc, &dout};

    emu_probe2_run(warps, "reverse", NULL, wargs, dout, out);
    for (unsigned t = 0; t < 64; t++) /* in step: written before read, but by thread 32, the
                                       * last to reach warp 1's barrier, which runs on */
        ck_assert_uint_eq(out[t], t == 32 ? P : (t + 32) % 64 + 1);
    emu_probe2_run(warps, "warps", NULL, wargs, dout, out);
    for (unsigned t = 0; t < 64; t++) /* warp 1 alone first: warp 0's slots unwritten */
        ck_assert_uint_eq(out[t], t >= 32 ? P : t + 33);

    for (int mode = 0; mode < 2; mode++) {
        emu_probe2_run(cpa, NULL, mode ? "issue" : NULL, cargs, dout, out);
        for (unsigned t = 0; t < 64; t++) {
            unsigned want = t % 2 == 0 ? src[4 * t] : 0u; /* odd threads: zero-filled */
            ck_assert_uint_eq(out[t], mode ? want : P);   /* before the wait */
            ck_assert_uint_eq(out[64 + t], want);         /* after it */
        }
    }
    if (was_o) setenv("JDT_CUDAEMU_ORDER", was_o, 1);
    if (was_c) setenv("JDT_CUDAEMU_CP_ASYNC", was_c, 1);
    free(was_o), free(was_c);
    cudaFree(dout), cudaFree(dsrc);
    cudaLibraryUnload(lib);
    free(image);
    jdt_cuk_free(k);
}
END_TEST

static void check_attention(jdt_cuk *k, int64_t B, int64_t H, int64_t T, int64_t D, unsigned bthd,
                            bool bf16)
{
    check_attention_scaled(k, B, H, T, D, bthd, bf16, 1.0f / sqrtf((float)D));
}

START_TEST(test_attention)
{
    GPU_OR_SKIP(k);
    for (int bf = 0; bf < 2; bf++) {
        if (bf && jdt_cuk_arch(k) < 80) break;     /* no bf16 mma: the FMA kernels serve */
        check_attention(k, 2, 3, 77, 16, 0, bf);   /* d64 class, T not a multiple of any tile */
        check_attention(k, 1, 2, 130, 64, 0, bf);  /* d64, full head */
        check_attention(k, 1, 2, 65, 64, 31u, bf); /* every input (B, T, H, D) */
        check_attention(k, 1, 1, 45, 80, 5u, bf);  /* d128 class, mixed layouts */
        check_attention(k, 1, 2, 40, 30, 2u, bf);  /* D not a multiple of 4: tiles loaded one
                                                      element per thread */
        if (!emulated_gpu()) /* GPT-2's heads, many blocks per SM (a minute on the emulator) */
            check_attention(k, 2, 12, 1024, 64, 0, bf);
        check_attention(k, 1, 1, 1, 8, 0, bf); /* one token */
    }
    /* a negative scale: the FMA kernels, unrounded (the tensor-core forward takes the max of
     * the unscaled scores; here that would be the minimum) */
    check_attention_scaled(k, 1, 2, 70, 16, 0, true, -0.3f);
    check_attention(k, 1, 1, 33, 136, 0, false); /* d256 class */
    jdt_cuk_attention(k, NULL, NULL, NULL, false, NULL, NULL, false, NULL, 1, 1, 4, 300, 1.0f, 0,
                      false, NULL);
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_int_eq(jdt_cuk_check(k, "attention", false, &e), JDT_ERR_UNSUPPORTED);
    ck_assert(strstr(e.msg, "head size") != NULL);
    jdt_cuk_free(k);
}
END_TEST

/* x (B, Hk, T, D) with each head repeated for its group of G query heads: (B, Hk G, T, D). */
static float *repeat_heads(const float *x, int64_t B, int64_t Hk, int64_t G, int64_t T, int64_t D)
{
    const int64_t m = T * D;
    float *y = malloc((size_t)(B * Hk * G * m) * 4);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hk * G; h++)
            memcpy(y + (b * Hk * G + h) * m, x + (b * Hk + h / G) * m, (size_t)m * 4);
    return y;
}

/* x (B, H, ...) on the device as stored for the kernels: bthd bit `bit` set: (B, T, H, D); as
 * bf16 bit patterns with b16 (nearest even). Caller frees. */
static void *dev_att_input(const float *x, int64_t B, int64_t H, int64_t T, int64_t D,
                           unsigned bthd, int bit, bool b16)
{
    const int64_t n = B * H * T * D;
    float *t = (bthd >> bit & 1u) ? to_bthd(x, B, H, T, D) : NULL;
    const float *src = t ? t : x;
    void *d;
    if (b16) {
        uint16_t *h16 = malloc((size_t)(n ? n : 1) * 2);
        for (int64_t i = 0; i < n; i++)
            h16[i] = jdt_rt_bf16_bits(src[i]);
        d = dev_from(h16, (size_t)n * 2);
        free(h16);
    } else {
        d = dev_from(src, (size_t)n * 4);
    }
    free(t);
    return d;
}

/* Grouped-query attention (JDT_CUK_ATT_GROUP: bthd bits 8 and up): the kernels on k and v of
 * Hk = H / G heads against themselves on k and v with each head repeated for its group (G 1):
 * o, the log-sum-exp and dq bit for bit (the same products in the same order), dk and dv within
 * f32 rounding of the repeated run's sums over each group (the grouped kernels sum the group's
 * heads in one accumulator); the cotangent form's copies ((B, T, H, D) for dq, (B, T, Hk, D) for
 * dk, rotated as RoPE's backward, and dv; dq's and dv's bf16) bit for bit what the grouped
 * run's own packed output makes of them, every value written, and the partial sums ((P, H D),
 * then (P, Hk D) twice) its column sums. lay: the inputs' layout bits (k and v (B, T, Hk, D)
 * with bits 1, 2). b16: q, k, v stored as bf16. */
static void check_attention_groups(jdt_cuk *k, int64_t B, int64_t H, int64_t G, int64_t T,
                                   int64_t D, unsigned lay, bool bf16, bool b16)
{
    const int64_t Hk = H / G, n = B * H * T * D, nk = B * Hk * T * D, rows = B * H * T;
    const float scale = 1.0f / sqrtf((float)D);
    float *q = rand_floats(n, 71, -1, 1), *kh = rand_floats(nk, 72, -1, 1);
    float *vh = rand_floats(nk, 73, -1, 1), *go = rand_floats(n, 74, -1, 1);
    float *kx = repeat_heads(kh, B, Hk, G, T, D), *vx = repeat_heads(vh, B, Hk, G, T, D);
    void *dq_in = dev_att_input(q, B, H, T, D, lay, 0, b16);
    void *dkx = dev_att_input(kx, B, H, T, D, lay, 1, b16);
    void *dvx = dev_att_input(vx, B, H, T, D, lay, 2, b16);
    void *dkh = dev_att_input(kh, B, Hk, T, D, lay, 1, b16);
    void *dvh = dev_att_input(vh, B, Hk, T, D, lay, 2, b16);
    float *dgo = dev_att_input(go, B, H, T, D, lay, 4, false);
    const unsigned grp = lay | (unsigned)G << 8;
    float *o[2], *lse[2], *dqkv[2];
    void *scr = dev_alloc((size_t)jdt_cuk_attention_scratch_bytes(B, H, T, D, G));
    for (int r = 0; r < 2; r++) { /* r 0: heads repeated; 1: grouped */
        o[r] = dev_alloc((size_t)n * 4);
        lse[r] = dev_alloc((size_t)rows * 4);
        dqkv[r] = dev_alloc((size_t)(3 * n) * 4);
        ck_assert_int_eq(cudaMemset(dqkv[r], 0, (size_t)(3 * n) * 4), cudaSuccess);
        jdt_cuk_attention(k, dq_in, r ? dkh : dkx, r ? dvh : dvx, b16, o[r], NULL, false, lse[r], B,
                          H, T, D, scale, (r ? grp : lay) & ~24u, bf16, scr);
        /* o (B, H, T, D) as the forward wrote it: layout bit 3 clear */
        jdt_cuk_attention_bwd(k, dq_in, r ? dkh : dkx, r ? dvh : dvx, b16, o[r], false, dgo, false,
                              lse[r], dqkv[r], NULL, B, H, T, D, scale, (r ? grp : lay) & ~8u, bf16,
                              scr);
    }
    char what[112];
    snprintf(what, sizeof what, "grouped attention%s%s B%lld H%lld G%lld T%lld D%lld lay%u",
             bf16 ? " bf16" : "", b16 ? " (bf16 q, k, v)" : "", (long long)B, (long long)H,
             (long long)G, (long long)T, (long long)D, lay);
    float *o0 = dev_to_host(k, o[0], n), *o1 = dev_to_host(k, o[1], n);
    float *l0 = dev_to_host(k, lse[0], rows), *l1 = dev_to_host(k, lse[1], rows);
    float *g0 = dev_to_host(k, dqkv[0], 3 * n), *g1 = dev_to_host(k, dqkv[1], 3 * n);
    ck_assert_msg(memcmp(o0, o1, (size_t)n * 4) == 0, "%s: o differs", what);
    ck_assert_msg(memcmp(l0, l1, (size_t)rows * 4) == 0, "%s: log-sum-exp differs", what);
    ck_assert_msg(memcmp(g0, g1, (size_t)n * 4) == 0, "%s: dq differs", what);
    for (int s = 1; s < 3; s++) { /* dk, dv: the repeated run's per-head values summed */
        float *want = calloc((size_t)nk, 4);
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t j = 0; j < T * D; j++)
                    want[(b * Hk + h / G) * T * D + j] += g0[s * n + (b * H + h) * T * D + j];
        expect_near_max(s == 1 ? "grouped attention dk" : "grouped attention dv", g1 + s * n, want,
                        nk, 1e-5f);
        for (int64_t j = s * n + nk; j < (s + 1) * n; j++) /* nothing past them written */
            ck_assert_msg(g1[j] == 0.0f, "%s: %s written past its %lld values", what,
                          s == 1 ? "dk" : "dv", (long long)nk);
        free(want);
    }
    /* the cotangent form */
    const int64_t nc = (T + JDT_CUK_ATT_PART - 1) / JDT_CUK_ATT_PART, P = B * nc;
    const int64_t np = P * H * D + 2 * P * Hk * D;
    jdt_cuk_att_grads gr = {.copy_bf16 = {true, false, true},
                            .rope_theta = {0.0, D % 2 ? 0.0 : 10000.0, 0.0},
                            .rope_inverse = {false, true, false}};
    const int64_t cn[3] = {n, nk, nk};
    float *copied[3]; /* the copies' f32 values, (B, T, hs, D): the partial sums' rows */
    for (int s = 0; s < 3; s++) {
        gr.copy[s] = dev_alloc((size_t)cn[s] * (gr.copy_bf16[s] ? 2 : 4));
        ck_assert_int_eq(cudaMemset(gr.copy[s], 0xff, (size_t)cn[s] * (gr.copy_bf16[s] ? 2 : 4)),
                         cudaSuccess);
    }
    gr.part = dev_alloc((size_t)np * 4);
    jdt_cuk_attention_bwd(k, dq_in, dkh, dvh, b16, o[1], false, dgo, false, lse[1], NULL, &gr, B, H,
                          T, D, scale, grp & ~8u, bf16, scr);
    for (int s = 0; s < 3; s++) {
        const int64_t hs = s ? Hk : H, m = cn[s];
        float *t = to_bthd(g1 + s * n, B, hs, T, D);
        void *want = NULL;
        if (gr.rope_theta[s] != 0.0) { /* as RoPE's backward rotates the transposed value */
            float *dt = dev_from(t, (size_t)m * 4);
            want = dev_alloc((size_t)m * 4);
            jdt_cuk_rope(k, dt, want, false, false, false, B, T, hs, D, gr.rope_theta[s], NULL,
                         true);
            free(t);
            t = dev_to_host(k, want, m);
            cudaFree(dt), cudaFree(want);
        }
        const size_t es = gr.copy_bf16[s] ? 2 : 4;
        unsigned char *got = malloc((size_t)m * es);
        ck_assert_int_eq(cudaMemcpy(got, gr.copy[s], (size_t)m * es, cudaMemcpyDeviceToHost),
                         cudaSuccess);
        int64_t bad = 0;
        for (int64_t j = 0; j < m; j++) {
            uint16_t b = jdt_rt_bf16_bits(t[j]);
            bad += es == 2 ? memcmp(got + j * 2, &b, 2) != 0 : memcmp(got + j * 4, &t[j], 4) != 0;
        }
        ck_assert_msg(bad == 0, "%s: cotangent form: copy %d differs in %lld of %lld values", what,
                      s, (long long)bad, (long long)m);
        free(got);
        copied[s] = t;
        cudaFree(gr.copy[s]);
    }
    /* the partial sums of the values the copies round: dk's rotated (Qwen2's k bias, before
     * the RoPE) */
    float *want_part = calloc((size_t)np, 4);
    for (int s = 0; s < 3; s++) {
        const int64_t hs = s ? Hk : H, base = s ? P * H * D + (s - 1) * P * Hk * D : 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < hs; h++)
                for (int64_t t = 0; t < T; t++)
                    for (int64_t d = 0; d < D; d++)
                        want_part[base + (b * nc + t / JDT_CUK_ATT_PART) * hs * D + h * D + d] +=
                            copied[s][((b * T + t) * hs + h) * D + d];
        free(copied[s]);
    }
    float *part = dev_to_host(k, gr.part, np);
    expect_close(what, part, want_part, np, 1e-5f, 1e-5f);
    printf("%s: o, dq equal to the repeated heads', dk and dv their group sums, the cotangent "
           "form's copies and partial sums\n",
           what);
    free(part), free(want_part);
    cudaFree(gr.part);
    for (int r = 0; r < 2; r++)
        cudaFree(o[r]), cudaFree(lse[r]), cudaFree(dqkv[r]);
    free(o0), free(o1), free(l0), free(l1), free(g0), free(g1);
    cudaFree(dq_in), cudaFree(dkx), cudaFree(dvx), cudaFree(dkh), cudaFree(dvh), cudaFree(dgo);
    cudaFree(scr);
    free(q), free(kh), free(vh), free(go), free(kx), free(vx);
}

START_TEST(test_attention_groups)
{
    GPU_OR_SKIP(k);
    for (int bf = 0; bf < 2; bf++) {
        if (bf && jdt_cuk_arch(k) < 80) break; /* no bf16 mma: the FMA kernels serve */
        check_attention_groups(k, 2, 4, 2, 77, 16, 0, bf, false);
        check_attention_groups(k, 1, 6, 3, 70, 64, 0, bf, true);   /* bf16 q, k, v */
        check_attention_groups(k, 1, 4, 2, 65, 64, 31u, bf, bf);   /* every input (B, T, H, D) */
        check_attention_groups(k, 1, 2, 2, 45, 80, 6u, bf, false); /* one k/v head (MQA); d128 */
    }
    check_attention_groups(k, 1, 4, 2, 40, 30, 2u, false, false); /* D not a multiple of 4 */
    if (jdt_cuk_arch(k) >= 80) /* and on tensor cores: the copies' and sums' element path */
        check_attention_groups(k, 1, 4, 2, 40, 30, 2u, true, false);
    jdt_cuk_free(k);
}
END_TEST

/* The dK/dV kernel's split (cuk.c att_dkv_split, JDT_CUK_DKV_SPLIT forcing it): a key tile's
 * query heads and tiles over S blocks, their f32 sums added in a fixed order by whichever block
 * finishes last. Forced to 1, 3, 7 (7 parts of 8 heads' tiles, unequal) and 16 blocks, and chosen
 * by the GPU's multiprocessor count: dk and dv agree with the unsplit ones to the f32 sums'
 * reordering, dq is untouched (bit for bit), and a split run again gives the same bits (on the
 * emulator with its blocks in the other order, JDT_CUDAEMU_BLOCKS). */
START_TEST(test_attention_dkv_split)
{
    GPU_OR_SKIP(k);
    if (jdt_cuk_arch(k) < 80) { /* no bf16 mma: the FMA kernels, which do not split */
        printf("SKIP check_cuk test_attention_dkv_split: sm_%d has no bf16 mma\n", jdt_cuk_arch(k));
        jdt_cuk_free(k);
        return;
    }
    const int64_t B = 1, H = 8, G = 8, T = 150, D = 64, n = B * H * T * D, nk = n / G;
    const float scale = 0.125f;
    const unsigned grp = 6u | (unsigned)G << 8; /* k, v (B, T, Hk, D) */
    float *q = rand_floats(n, 81, -1, 1), *kh = rand_floats(nk, 82, -1, 1);
    float *vh = rand_floats(nk, 83, -1, 1), *go = rand_floats(n, 84, -1, 1);
    void *dq_in = dev_att_input(q, B, H, T, D, grp, 0, true);
    void *dk_in = dev_att_input(kh, B, H / G, T, D, grp, 1, true);
    void *dv_in = dev_att_input(vh, B, H / G, T, D, grp, 2, true);
    float *dgo = dev_att_input(go, B, H, T, D, grp, 4, false);
    float *o = dev_alloc((size_t)n * 4), *lse = dev_alloc((size_t)(B * H * T) * 4);
    float *dqkv = dev_alloc((size_t)(3 * n) * 4);
    /* run 2 repeats run 1 with the blocks in the other order on the emulator (the last to
     * arrive, which adds the sums, is then another block: its bits must not change); 16: the
     * last key tile (8 heads' one query tile) leaves half its blocks without work */
    const char *force[] = {"1", "3", "3", "7", "16", NULL};
    const int want_split[] = {1, 3, 3, 7, 16, 0};
    enum { RUNS = 6 };
    float *got[RUNS];
    for (int r = 0; r < RUNS; r++) {
        if (force[r])
            setenv("JDT_CUK_DKV_SPLIT", force[r], 1);
        else
            unsetenv("JDT_CUK_DKV_SPLIT");
        if (r == 2) setenv("JDT_CUDAEMU_BLOCKS", "forward", 1);
        void *scr = dev_alloc((size_t)jdt_cuk_attention_scratch_bytes(B, H, T, D, G));
        ck_assert_int_eq(
            cudaMemset(scr, 0xff, (size_t)jdt_cuk_attention_scratch_bytes(B, H, T, D, G)),
            cudaSuccess);
        jdt_cuk_attention(k, dq_in, dk_in, dv_in, true, o, NULL, false, lse, B, H, T, D, scale, grp,
                          true, scr);
        ck_assert_int_eq(cudaMemset(dqkv, 0, (size_t)(3 * n) * 4), cudaSuccess);
        jdt_cuk_attention_bwd(k, dq_in, dk_in, dv_in, true, o, false, dgo, false, lse, dqkv, NULL,
                              B, H, T, D, scale, grp, true, scr);
        got[r] = dev_to_host(k, dqkv, 3 * n);
        unsetenv("JDT_CUDAEMU_BLOCKS");
        if (force[r])
            ck_assert_int_eq(k->dkv_split, want_split[r]);
        else /* a key tile (T 150: 3) per 2 / 3 of a multiprocessor */
            ck_assert_int_eq(k->dkv_split,
                             (int)((2 * k->sms + 2) / 3 > 16 ? 16 : (2 * k->sms + 2) / 3));
        cudaFree(scr);
    }
    unsetenv("JDT_CUK_DKV_SPLIT");
    ck_assert_msg(memcmp(got[1], got[2], (size_t)(3 * n) * 4) == 0,
                  "dK/dV split over 3 blocks: two runs differ");
    for (int r = 1; r < RUNS; r++) {
        ck_assert_msg(memcmp(got[0], got[r], (size_t)n * 4) == 0, "dq changed with the split");
        expect_near_max("split dk", got[r] + n, got[0] + n, nk, 1e-6f);
        expect_near_max("split dv", got[r] + 2 * n, got[0] + 2 * n, nk, 1e-6f);
    }
    printf("dK/dV split over 3, 7, 16 and %d blocks per key tile: dk, dv as unsplit to 1e-6, dq "
           "equal, the same bits whichever block adds the sums\n",
           k->dkv_split);
    for (int r = 0; r < RUNS; r++)
        free(got[r]);
    cudaFree(dq_in), cudaFree(dk_in), cudaFree(dv_in), cudaFree(dgo), cudaFree(o), cudaFree(lse);
    cudaFree(dqkv);
    free(q), free(kh), free(vh), free(go);
    jdt_cuk_free(k);
}
END_TEST

/* ---- context ------------------------------------------------------------------------------ */

START_TEST(test_init_errors_and_cache)
{
    GPU_OR_SKIP(k);
    jdt_err le;
    jdt_err_clear(&le);
    ck_assert_msg(jdt_cuk_load_all(k, &le) == JDT_OK, "%s", le.msg); /* every kernel resolves */
    jdt_cuk_free(k);
    /* that filled the cache: one entry per .cu source */
    DIR *dir = opendir(cache_dir_);
    ck_assert_ptr_nonnull(dir);
    int n_entries = 0;
    for (struct dirent *de; (de = readdir(dir));)
        if (strncmp(de->d_name, "jdt-", 4) == 0 && strlen(de->d_name) > 4 &&
            strcmp(de->d_name + strlen(de->d_name) - 4, ".cuk") == 0)
            n_entries++;
    closedir(dir);
    ck_assert_int_ge(n_entries, 3);
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_int_eq(jdt_cuk_init(0, cache_dir_, &k, &e), JDT_OK); /* from the cache */
    ck_assert_ptr_nonnull(jdt_cuk_stream(k));
    ck_assert_int_eq(jdt_cuk_check(k, "idle", true, &e), JDT_OK);
    jdt_cuk_free(k);
    jdt_cuk_free(NULL);
    jdt_cuk *bad = NULL;
    ck_assert_int_eq(jdt_cuk_init(4096, cache_dir_, &bad, &e), JDT_ERR_UNSUPPORTED);
    ck_assert_ptr_null(bad);
    ck_assert(strstr(e.msg, "4096") != NULL);

    /* a damaged entry (in a cache of its own: the probe source alone) is recompiled and
     * replaced by a whole one */
    char own[128], cmd[400];
    snprintf(own, sizeof own, "/tmp/jdt-check-cuk-damaged-%ld", (long)getpid());
    ck_assert_int_eq(jdt_cuk_init(0, own, &k, &e), JDT_OK);
    jdt_cuk_free(k);
    snprintf(cmd, sizeof cmd,
             "ls %s/jdt-*.cuk | wc -l | grep -qx 1 && "
             "for f in %s/jdt-*.cuk; do head -c 300 /dev/urandom > $f; done",
             own, own);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_msg(jdt_cuk_init(0, own, &k, &e) == JDT_OK, "over a damaged entry: %s", e.msg);
    jdt_cuk_free(k);
    snprintf(cmd, sizeof cmd, "test $(stat -c %%s %s/jdt-*.cuk) -gt 1000", own);
    ck_assert_msg(system(cmd) == 0, "the damaged entry was not replaced");
    snprintf(cmd, sizeof cmd, "rm -rf %s", own);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* A source is compiled (or read from the cache) and loaded at its first launch, once: a run
 * never compiles the attention it does not use. */
START_TEST(test_lazy_load)
{
    GPU_OR_SKIP(k);
    ck_assert_int_eq(jdt_cuk_n_loaded(k), 1); /* the probe source (cuk_misc.cu) */
    const int64_t N = 3, C = 7;
    float *x = rand_floats(N * C, 5, -2, 2);
    float *dx = dev_from(x, (size_t)(N * C) * 4), *dy = dev_alloc((size_t)(N * C) * 4);
    jdt_cuk_to_bf16(k, dx, (uint16_t *)dy, N * C);
    ck_assert_int_eq(jdt_cuk_n_loaded(k), 1); /* the same source */
    for (int r = 0; r < 2; r++) {
        jdt_cuk_softmax(k, dx, dy, N, C); /* cuk_rows.cu, the first time only */
        float *got = dev_to_host(k, dy, N * C);
        ck_assert_float_gt(got[0], 0);
        free(got);
        ck_assert_int_eq(jdt_cuk_n_loaded(k), 2);
    }
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_msg(jdt_cuk_load_all(k, &e) == JDT_OK, "%s", e.msg);
    const int all = jdt_cuk_n_loaded(k);
    ck_assert_int_ge(all, 4);
    ck_assert_int_eq(jdt_cuk_load_all(k, &e), JDT_OK);
    ck_assert_int_eq(jdt_cuk_n_loaded(k), all);
    free(x);
    cudaFree(dx), cudaFree(dy);
    jdt_cuk_free(k);
}
END_TEST

START_TEST(test_no_gpu_is_clean_error)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) {
        printf("SKIP check_cuk test_no_gpu_is_clean_error: this machine has a GPU\n");
        return;
    }
    jdt_cuk *k = (jdt_cuk *)1;
    jdt_err e;
    jdt_err_clear(&e);
    ck_assert_int_eq(jdt_cuk_init(0, NULL, &k, &e), JDT_ERR_UNSUPPORTED);
    ck_assert_ptr_null(k);
    ck_assert(strlen(e.msg) > 10);
}
END_TEST

/* Test cases: "host" needs no GPU (NVRTC compiles, the attention emulation, the no-GPU error:
 * CI runs them, scripts/gpu/check.sh skips them to save device time), "gpu" needs one (each
 * test prints SKIP with the reason otherwise). NVRTC compiles of the attention kernels take
 * tens of seconds. */
static void add_tests(Suite *s)
{
    TCase *th = tcase_create("host");
    tcase_set_timeout(th, 300);
    tcase_add_test(th, test_nvrtc_compile_sm80);
    tcase_add_test(th, test_nvrtc_compile_sm90);
    tcase_add_test(th, test_nvrtc_bad_arch_is_compile_error);
    tcase_add_test(th, test_attention_sources);
    tcase_add_test(th, test_no_gpu_is_clean_error);
    tcase_add_test(th, test_cudnn_offline);
    tcase_add_test(th, test_cudnn_refusal);
    suite_add_tcase(s, th);
    TCase *tc = tcase_create("gpu");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_emulator_strict);
    tcase_add_test(tc, test_emulator_warps_cp_async);
    tcase_add_test(tc, test_emulator_launch_bounds);
    tcase_add_test(tc, test_emulator_shuffle_sources);
    tcase_add_test(tc, test_emulator_divergent_collective);
    tcase_add_test(tc, test_init_errors_and_cache);
    tcase_add_test(tc, test_lazy_load);
    tcase_add_test(tc, test_matmul);
    tcase_add_test(tc, test_matmul_bf16);
    tcase_add_test(tc, test_matmul_bf16_fallback);
    tcase_add_test(tc, test_matmul_pitched);
    tcase_add_test(tc, test_colsum_bf16);
    tcase_add_test(tc, test_matmul_autotune);
    tcase_add_test(tc, test_matmul_autotune_remembered);
    tcase_add_test(tc, test_to_bf16);
    tcase_add_test(tc, test_permute_blocks);
    tcase_add_test(tc, test_nccl_one_rank);
    tcase_add_test(tc, test_coll_start_wait);
    tcase_add_test(tc, test_nccl_dead_peer);
    tcase_add_test(tc, test_row_kernels);
    tcase_add_test(tc, test_softmax_xent);
    tcase_add_test(tc, test_gather_scatter);
    tcase_add_test(tc, test_rope);
    tcase_add_test(tc, test_concat);
    tcase_add_test(tc, test_attention);
    tcase_add_test(tc, test_attention_groups);
    tcase_add_test(tc, test_attention_dkv_split);
    tcase_add_test(tc, test_cudnn_attention);
    tcase_add_test(tc, test_cudnn_trial);
    suite_add_tcase(s, tc);
}

#endif /* JDT_CUDA */

int main(void)
{
    /* the kernels under test are jdt-train's: cuDNN's attention only where a test asks for it
     * (the product's default, auto, would try cuDNN against them); GEMMs untimed unless a test
     * times them (the default would time each plan's algorithms at its first call) */
    setenv("JDT_CUDNN_ATTENTION", "0", 0);
    setenv("JDT_CUDA_AUTOTUNE", "0", 0);
    Suite *s = suite_create("cuk");
    add_tests(s);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
