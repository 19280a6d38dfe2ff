/*
 * check_runtime.c — f32 GEMMs (oneDNN tiles and OpenBLAS, against a double product, the same
 * bits on any thread count); the CPU runtime's bf16 compute kernels (engine/runtime/bf16.c) against
 * plain references: bf16 rounding (ties to even, NaN/Inf/overflow), and bf16 GEMMs (every
 * layout flag, batch, shared b, bias) against a double-precision product of the bf16-rounded
 * inputs, on the oneDNN path where this CPU and build have it and on the portable path
 * (JDT_BF16_NO_DNNL, each test is its own process); the small packed bf16 GEMMs of
 * gemm_bf16.c (ragged shapes, transposes, beta, a prefix of a larger B pack) and the bf16
 * attention forward and backward built on them, against double references of the rounded
 * inputs, on both paths; the cross-entropy backward with its logsumexp taken from the
 * forward's loss or computed, f32 and bf16-storing, against a double reference; and the
 * adaptive thread count's decisions (jdt_rt_tuner) on simulated run times.
 */
#include "runtime/runtime.h"
#include "runtime/runtime-impl.h"
#include "tests/unit/testutil.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* jdt_rt_expf_le88 (the softmax rows' exp) gives jdt_rt_expf's bits on [-87.3, 88]: every
 * 61st float of [-87.3, 0] and of [0, 88]; 0 below (-87.31, -103, -inf), NaN stays NaN. */
START_TEST(test_expf_le88)
{
    long n = 0, differ = 0;
    const float ends[2] = {-87.3f, 88.0f};
    for (int side = 0; side < 2; side++) { /* the floats' bits count up from 0 on both sides */
        uint32_t u = side ? 0u : 0x80000000u, last;
        memcpy(&last, &ends[side], 4);
        for (; u <= last; u += 61) {
            float x, a, b;
            memcpy(&x, &u, 4);
            a = jdt_rt_expf(x);
            b = jdt_rt_expf_le88(x);
            differ += memcmp(&a, &b, sizeof a) != 0;
            n++;
        }
    }
    ck_assert_msg(differ == 0, "%ld of %ld floats differ from jdt_rt_expf", differ, n);
    ck_assert_int_gt(n, 30000000);
    ck_assert(jdt_rt_expf_le88(-87.31f) == 0.0f && jdt_rt_expf_le88(-103.0f) == 0.0f);
    ck_assert(jdt_rt_expf_le88(-INFINITY) == 0.0f && isnan(jdt_rt_expf_le88(NAN)));
    ck_assert(jdt_rt_expf_le88(0.0f) == 1.0f);
}
END_TEST

START_TEST(test_bf16_round)
{
    ck_assert_float_eq(jdt_rt_bf16_round(1.0f), 1.0f);
    /* bf16 keeps 8 significant bits: the spacing at 1 is 2^-7 */
    ck_assert_float_eq(jdt_rt_bf16_round(1.0f + 0x1p-8f), 1.0f); /* tie -> even */
    ck_assert_float_eq(jdt_rt_bf16_round(1.0f + 0x1p-7f + 0x1p-8f),
                       1.0f + 0x1p-6f); /* tie -> even */
    ck_assert_float_eq(jdt_rt_bf16_round(1.0f + 0x1p-8f + 0x1p-12f), 1.0f + 0x1p-7f); /* above */
    ck_assert_float_eq(jdt_rt_bf16_round(-3.0f), -3.0f);
    ck_assert(signbit(jdt_rt_bf16_round(-0.0f)) && jdt_rt_bf16_round(-0.0f) == 0.0f);
    ck_assert(isinf(jdt_rt_bf16_round(INFINITY)) && jdt_rt_bf16_round(-INFINITY) < 0);
    ck_assert(isinf(jdt_rt_bf16_round(FLT_MAX))); /* above bf16's largest finite value */
    ck_assert(isnan(jdt_rt_bf16_round(NAN)));
    float sub = 0x1p-130f; /* subnormals round like any other value */
    ck_assert_float_eq(jdt_rt_bf16_round(sub), sub);
}
END_TEST

static float frand(unsigned *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* a (na), b (nb) and bias (n_bias) filled from seed */
static void fill_operands(unsigned *seed, float *a, int64_t na, float *b, int64_t nb, float *bias,
                          int64_t n_bias)
{
    for (int64_t i = 0; i < na; i++)
        a[i] = frand(seed);
    for (int64_t i = 0; i < nb; i++)
        b[i] = frand(seed);
    for (int64_t i = 0; i < n_bias; i++)
        bias[i] = frand(seed);
}

/* c (batch, M, N) vs double sums of bf16-rounded products; returns the largest |error| /
 * (sum |a||b| + 1e-30) and, through dev, the largest |c - f32-unrounded product| (> 0 shows
 * that the inputs were rounded); c itself through *out (the caller frees it). */
static double check_mm(int64_t batch, int64_t M, int64_t N, int64_t K, bool ta, bool tb,
                       bool b_shared, bool with_bias, bool a_bf, bool b_bf, double *dev,
                       float **out)
{
    unsigned seed = (unsigned)(batch * 131 + M * 17 + N * 7 + K + ta * 3 + tb * 5);
    int64_t na = batch * M * K, nb = (b_shared ? 1 : batch) * K * N, nc = batch * M * N;
    float *a = malloc(sizeof(float) * (size_t)na), *b = malloc(sizeof(float) * (size_t)nb);
    float *c = malloc(sizeof(float) * (size_t)nc), *bias = malloc(sizeof(float) * (size_t)N);
    uint16_t *a16 = malloc(sizeof(uint16_t) * (size_t)na),
             *b16 = malloc(sizeof(uint16_t) * (size_t)nb);
    int64_t ns =
        a_bf || b_bf
            ? jdt_rt_matmul_bf16_scratch_bytes(batch, M, N, K, b_shared, a_bf, b_bf, false)
            : (int64_t)sizeof(float) * jdt_rt_matmul_bf16_scratch_floats(batch, M, N, K, b_shared);
    void *scratch = malloc((size_t)ns + 1); /* +1: malloc(0) may be NULL */
    ck_assert(a && b && c && bias && a16 && b16 && scratch);
    fill_operands(&seed, a, na, b, nb, bias, N);
    for (int64_t i = 0; i < na; i++)
        a16[i] = jdt_rt_bf16_bits(a[i]);
    for (int64_t i = 0; i < nb; i++)
        b16[i] = jdt_rt_bf16_bits(b[i]);
    /* operands stored as bf16 (the compiler's bf16 storage) need no scratch copy on oneDNN's
     * path, transposed or not */
    if (jdt_rt_bf16_native() && a_bf && b_bf) ck_assert_int_eq(ns, 0);
    if (a_bf || b_bf)
        jdt_rt_matmul_bf16_ex(a_bf ? (const void *)a16 : a, b_bf ? (const void *)b16 : b,
                              with_bias ? bias : NULL, c, batch, M, N, K, ta, tb, b_shared, a_bf,
                              b_bf, false, scratch, 2);
    else
        jdt_rt_matmul_bf16(a, b, with_bias ? bias : NULL, c, batch, M, N, K, ta, tb, b_shared,
                           scratch, 2);
    double worst = 0;
    *dev = 0;
    for (int64_t p = 0; p < batch; p++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double s = with_bias ? bias[j] : 0, s32 = s, mag = fabs(s);
                for (int64_t k = 0; k < K; k++) {
                    float x = a[p * M * K + (ta ? k * M + i : i * K + k)];
                    float y = b[(b_shared ? 0 : p * K * N) + (tb ? j * K + k : k * N + j)];
                    double xr = jdt_rt_bf16_round(x), yr = jdt_rt_bf16_round(y);
                    s += xr * yr;
                    s32 += (double)x * y;
                    mag += fabs(xr * yr);
                }
                double got = c[p * M * N + i * N + j];
                double err = fabs(got - s) / (mag + 1e-30);
                worst = tu_worse(worst, err);
                if (fabs(got - s32) > *dev) *dev = fabs(got - s32);
            }
    free(a);
    free(b);
    *out = c;
    free(bias);
    free(a16);
    free(b16);
    free(scratch);
    return worst;
}

/* A bf16 output (jdt_rt_matmul_bf16_ex's c_bf16, precision.activations: bf16) with its bf16
 * bias: the f32 output of the same product (the bias widened) rounded to bf16 — the same bits
 * on the portable path (SGEMM, then the rounding), at most one bf16 step apart on oneDNN's (its
 * bf16-destination kernel may sum in another order). The scratch is what the scratch query says
 * for a bf16 c, with a guard byte after it that must stay untouched. */
static void check_mm_bf16_out(int64_t batch, int64_t M, int64_t N, int64_t K, bool ta, bool tb,
                              bool b_shared, bool with_bias)
{
    unsigned seed = (unsigned)(batch * 7 + M * 3 + N * 11 + K + ta + tb * 2);
    int64_t na = batch * M * K, nb = (b_shared ? 1 : batch) * K * N, nc = batch * M * N;
    float *a = malloc(sizeof(float) * (size_t)na), *b = malloc(sizeof(float) * (size_t)nb);
    float *bias = malloc(sizeof(float) * (size_t)N), *c = malloc(sizeof(float) * (size_t)nc);
    uint16_t *a16 = malloc(2 * (size_t)na), *b16 = malloc(2 * (size_t)nb);
    uint16_t *bias16 = malloc(2 * (size_t)N), *c16 = malloc(2 * (size_t)nc);
    int64_t ns = jdt_rt_matmul_bf16_scratch_bytes(batch, M, N, K, b_shared, true, true, true);
    ck_assert_int_ge(ns,
                     jdt_rt_matmul_bf16_scratch_bytes(batch, M, N, K, b_shared, true, true, false));
    unsigned char *scratch = malloc((size_t)ns + 1);
    ck_assert(a && b && bias && c && a16 && b16 && bias16 && c16 && scratch);
    fill_operands(&seed, a, na, b, nb, bias, N);
    for (int64_t i = 0; i < na; i++)
        a16[i] = jdt_rt_bf16_bits(a[i]);
    for (int64_t i = 0; i < nb; i++)
        b16[i] = jdt_rt_bf16_bits(b[i]);
    for (int64_t j = 0; j < N; j++) {
        bias16[j] = jdt_rt_bf16_bits(bias[j]);
        bias[j] = jdt_rt_bf16_float(bias16[j]);
    }
    jdt_rt_matmul_bf16_ex(a16, b16, with_bias ? bias : NULL, c, batch, M, N, K, ta, tb, b_shared,
                          true, true, false, scratch, 2);
    scratch[ns] = 0xa5;
    jdt_rt_matmul_bf16_ex(a16, b16, with_bias ? bias16 : NULL, c16, batch, M, N, K, ta, tb,
                          b_shared, true, true, true, scratch, 2);
    ck_assert_int_eq(scratch[ns], 0xa5);
    int64_t n_same = 0;
    for (int64_t i = 0; i < nc; i++) {
        const uint16_t want = jdt_rt_bf16_bits(c[i]);
        const int d = (int)c16[i] - (int)want;
        n_same += d == 0;
        ck_assert_msg(jdt_rt_bf16_native() ? abs(d) <= 1 : d == 0,
                      "%lldx%lldx%lld element %lld: bf16 output %04x (%g), f32 output %g "
                      "rounds to %04x",
                      (long long)M, (long long)N, (long long)K, (long long)i, c16[i],
                      jdt_rt_bf16_float(c16[i]), c[i], want);
    }
    ck_assert_int_gt(n_same, nc / 2); /* a sum in another order moves few roundings */
    free(a);
    free(b);
    free(bias);
    free(c);
    free(a16);
    free(b16);
    free(bias16);
    free(c16);
    free(scratch);
}

/* every case with f32 operands, and with a, b or both stored as bf16 (jdt_rt_matmul_bf16_ex):
 * the GEMM's own conversion of f32 operands (bf16.c, the transposed one tile by tile) gives the
 * bits jdt_rt_bf16_bits gives, so all four products are the same bits */
static void mm_cases(void)
{
    static const struct {
        int64_t batch, M, N, K;
        bool ta, tb, shared, bias;
    } cases[] = {
        {1, 64, 96, 128, false, false, true, false},
        {1, 37, 53, 71, false, true, true, true},
        {3, 16, 24, 40, true, false, false, false},
        {2, 33, 17, 65, true, true, false, true},
        {4, 8, 48, 32, false, false, true, true},
        {2, 128, 384, 96, false, true, false, false},
        {1, 5, 7, 1, false, false, true, false},
        /* K past bf16.c's MM_K_SPLIT with an f32 c: products over slices of K added up (the
         * last slice shorter), a and b read at each slice's offset, transposed or not */
        {1, 9, 21, 20580, false, false, true, true},
        {2, 7, 13, 16385, true, true, false, false},
        {1, 6, 5, 24576, true, false, true, true},
        /* a transposed a with M past bf16.c's MM_M_SPLIT (one product): near-equal slices of
         * rows, the last shorter, a read at each slice's column and c (f32 or bf16) written at
         * its row; then with K past MM_K_SPLIT too, slices of both */
        {1, 4100, 6, 40, true, false, true, true},
        {1, 4200, 2, 16400, true, true, true, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float *first = NULL;
        for (int st = 0; st < 4; st++) { /* bit 0: a stored as bf16, bit 1: b */
            double dev;
            float *c = NULL;
            double err =
                check_mm(cases[i].batch, cases[i].M, cases[i].N, cases[i].K, cases[i].ta,
                         cases[i].tb, cases[i].shared, cases[i].bias, st & 1, st & 2, &dev, &c);
            if (st == 0)
                first = c;
            else {
                const size_t nc = (size_t)(cases[i].batch * cases[i].M * cases[i].N);
                ck_assert_msg(memcmp(first, c, nc * sizeof *c) == 0,
                              "case %zu: stored %d differs from f32 operands", i, st);
                free(c);
            }
            /* f32 accumulation of exact products: a few f32 ulps of the magnitude sum */
            ck_assert_msg(err < 1e-6 * (1 + cases[i].K / 64.0),
                          "case %zu, stored %d: relative error %g", i, st, err);
            ck_assert_msg(cases[i].K < 2 || dev > 1e-4,
                          "case %zu, stored %d: result equals the unrounded f32 product (dev %g)",
                          i, st, dev);
        }
        free(first);
        check_mm_bf16_out(cases[i].batch, cases[i].M, cases[i].N, cases[i].K, cases[i].ta,
                          cases[i].tb, cases[i].shared, cases[i].bias);
    }
}

/* f32 jdt_rt_matmul (its tiles through oneDNN or OpenBLAS) against a double product: shapes of
 * one tile and of several (rows or columns split, a shorter last tile), transposes, batch,
 * shared b, bias; the same bits on 1, 2 and 3 threads. Returns the largest relative error. */
static double check_mm_f32(int64_t batch, int64_t M, int64_t N, int64_t K, bool ta, bool tb,
                           bool b_shared, bool with_bias)
{
    unsigned seed = (unsigned)(batch * 31 + M * 7 + N * 5 + K + ta * 3 + tb * 11);
    int64_t na = batch * M * K, nb = (b_shared ? 1 : batch) * K * N, nc = batch * M * N;
    float *a = malloc(sizeof(float) * (size_t)na), *b = malloc(sizeof(float) * (size_t)nb);
    float *c[3], *bias = malloc(sizeof(float) * (size_t)N);
    ck_assert(a && b && bias);
    for (int t = 0; t < 3; t++)
        ck_assert_ptr_nonnull(c[t] = malloc(sizeof(float) * (size_t)nc));
    fill_operands(&seed, a, na, b, nb, bias, N);
    for (int t = 0; t < 3; t++)
        jdt_rt_matmul(a, b, with_bias ? bias : NULL, c[t], batch, M, N, K, ta, tb, b_shared, t + 1);
    for (int t = 1; t < 3; t++)
        ck_assert_msg(memcmp(c[0], c[t], sizeof(float) * (size_t)nc) == 0,
                      "%lldx%lldx%lld: %d threads differ from 1", (long long)M, (long long)N,
                      (long long)K, t + 1);
    double worst = 0;
    for (int64_t p = 0; p < batch; p++)
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double sum = with_bias ? bias[j] : 0, mag = fabs(sum);
                for (int64_t k = 0; k < K; k++) {
                    double x = a[p * M * K + (ta ? k * M + i : i * K + k)];
                    double y = b[(b_shared ? 0 : p * K * N) + (tb ? j * K + k : k * N + j)];
                    sum += x * y;
                    mag += fabs(x * y);
                }
                double err = fabs(c[0][p * M * N + i * N + j] - sum) / (mag + 1e-30);
                worst = tu_worse(worst, err);
            }
    free(a);
    free(b);
    free(bias);
    for (int t = 0; t < 3; t++)
        free(c[t]);
    return worst;
}

static void mm_f32_cases(void)
{
    jdt_rt_set_threads(3); /* as a program run does: OpenBLAS single-threaded inside the tiles */
    static const struct {
        int64_t batch, M, N, K;
        bool ta, tb, shared, bias;
    } cases[] = {
        {1, 37, 53, 71, false, true, true, true},      {3, 16, 24, 40, true, false, false, false},
        {1, 1000, 200, 300, false, false, true, true}, /* 7 row tiles, the last shorter */
        {1, 100, 1000, 200, false, true, true, true},  /* 2 column tiles, bias split with them */
        {4, 250, 130, 170, false, false, true, false}, /* the batch folded into 1000 rows */
        {1, 640, 300, 250, true, false, true, true},   /* row tiles of a transposed a */
        {2, 300, 96, 500, true, true, false, true},    {1, 5, 7, 1, false, false, true, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double err = check_mm_f32(cases[i].batch, cases[i].M, cases[i].N, cases[i].K, cases[i].ta,
                                  cases[i].tb, cases[i].shared, cases[i].bias);
        ck_assert_msg(err < 1e-6 * (1 + cases[i].K / 64.0), "case %zu: relative error %g", i, err);
    }
}

/* f32 GEMMs on the path this build and CPU choose: oneDNN tiles where its f32 matmul is its
 * AVX-512 brgemm (`jdt-train version` says which) */
START_TEST(test_matmul_f32_best_path)
{
    fprintf(stderr, "check_runtime: %s\n", jdt_rt_sgemm_describe());
    ck_assert(strstr(jdt_rt_sgemm_describe(), jdt_rt_sgemm_dnnl_on() ? "oneDNN" : "OpenBLAS"));
    mm_f32_cases();
    /* oneDNN served every tile: a transposed a's tiles included (their primitive once failed
     * for a tile rounded past the leading dim, and OpenBLAS took them silently) */
    if (jdt_rt_sgemm_dnnl_on())
        ck_assert_msg(jdt_rt_matmul_blas_tiles() == 0, "%lld tiles ran on OpenBLAS",
                      (long long)jdt_rt_matmul_blas_tiles());
}
END_TEST

START_TEST(test_matmul_f32_openblas_path)
{
    setenv("JDT_SGEMM_NO_DNNL", "1", 1); /* before the first call: the choice is made once */
    ck_assert(!jdt_rt_sgemm_dnnl_on());
    ck_assert_ptr_null(jdt_rt_sgemm_dnnl_tile(64, 64, 64, false, false, 64, 64, 64, false));
    mm_f32_cases();
    ck_assert_int_gt(jdt_rt_matmul_blas_tiles(), 0);
}
END_TEST

START_TEST(test_matmul_bf16_best_path)
{
    fprintf(stderr, "check_runtime: %s\n", jdt_rt_bf16_describe());
    mm_cases();
}
END_TEST

/* oneDNN's path where this build and CPU have it, even where the portable path is the default
 * (Intel's AVX512-BF16 without AMX): JDT_BF16_DNNL=1 */
START_TEST(test_matmul_bf16_onednn_path)
{
    setenv("JDT_BF16_DNNL", "1", 1); /* before the first call: the choice is made once */
    if (!jdt_rt_bf16_native()) {
        fprintf(stderr, "check_runtime: SKIP %s: %s\n", __func__, jdt_rt_bf16_describe());
        return;
    }
    ck_assert(!jdt_rt_bf16_warn());
    mm_cases();
}
END_TEST

START_TEST(test_matmul_bf16_portable_path)
{
    setenv("JDT_BF16_NO_DNNL", "1", 1); /* before the first call: the choice is made once */
    ck_assert(!jdt_rt_bf16_native());
    ck_assert(jdt_rt_bf16_warn()); /* chosen by the variable, not for speed: said as a warning */
    mm_cases();
}
END_TEST

START_TEST(test_matmul_bf16_empty)
{
    float a[1] = {1}, b[1] = {1}, c[4] = {7, 7, 7, 7}, bias[2] = {0.5f, -2}, scratch[4];
    jdt_rt_matmul_bf16(a, b, bias, c, 1, 2, 2, 0, false, false, true, scratch, 1); /* K = 0 */
    ck_assert_float_eq(c[0], 0.5f);
    ck_assert_float_eq(c[3], -2.0f);
    /* a bf16 output: the bf16 bias itself, with no scratch (the query says 0 bytes) */
    uint16_t a16[1] = {0x3f80}, b16[1] = {0x3f80}, c16[4] = {7, 7, 7, 7};
    uint16_t bias16[2] = {jdt_rt_bf16_bits(0.5f), jdt_rt_bf16_bits(-2.0f)};
    if (jdt_rt_bf16_native())
        ck_assert_int_eq(jdt_rt_matmul_bf16_scratch_bytes(1, 2, 2, 0, true, true, true, true), 0);
    jdt_rt_matmul_bf16_ex(a16, b16, bias16, c16, 1, 2, 2, 0, false, false, true, true, true, true,
                          NULL, 1);
    ck_assert_int_eq(c16[0], bias16[0]);
    ck_assert_int_eq(c16[3], bias16[1]);
}
END_TEST

/* The packed small GEMM against a double product of the rounded inputs: a (M x K) and b (K x N)
 * given through the transposed layouts too, b packed for a larger (Kb x Nb) and used as a
 * prefix, beta 0 and 1. */
static void check_packed_alpha(int64_t M, int64_t N, int64_t K, int64_t Kb, int64_t Nb, bool ta,
                               bool tb, float alpha, float beta)
{
    unsigned seed = (unsigned)(M * 7 + N * 13 + K * 3 + Kb + Nb + ta + 2 * tb);
    float *a = malloc(sizeof(float) * (size_t)(M * K)),
          *b = malloc(sizeof(float) * (size_t)(Kb * Nb));
    float *c = malloc(sizeof(float) * (size_t)(M * N)),
          *c0 = malloc(sizeof(float) * (size_t)(M * N));
    const size_t na = sizeof(float) * (size_t)jdt_rt_bf16_pack_a_floats(M, K);
    const size_t nb = sizeof(float) * (size_t)jdt_rt_bf16_pack_b_floats(Kb, Nb);
    float *ap = malloc(na), *bp = malloc(nb);
    ck_assert(a && b && c && c0 && ap && bp);
    /* NaN everywhere first: padding a kernel reads but the packer leaves unwritten shows */
    memset(ap, 0xff, na);
    memset(bp, 0xff, nb);
    for (int64_t i = 0; i < M * K; i++)
        a[i] = frand(&seed);
    for (int64_t i = 0; i < Kb * Nb; i++)
        b[i] = frand(&seed);
    for (int64_t i = 0; i < M * N; i++)
        c[i] = c0[i] = frand(&seed);
    /* a stored (M, K), or (K, M) when ta; b stored (Kb, Nb), or (Nb, Kb) when tb */
    jdt_rt_bf16_pack_a(a, ta ? M : K, ta, M, K, ap);
    jdt_rt_bf16_pack_b(b, tb ? Kb : Nb, tb, Kb, Nb, bp);
    jdt_rt_bf16_gemm_packed(ap, bp, Nb, M, N, K, alpha, beta, c, N);
    double worst = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double sum = 0, mag = 1e-30;
            for (int64_t k = 0; k < K; k++) {
                double x = jdt_rt_bf16_round(ta ? a[k * M + i] : a[i * K + k]);
                double y = jdt_rt_bf16_round(tb ? b[j * Kb + k] : b[k * Nb + j]);
                sum += x * y;
                mag += fabs(x * y);
            }
            double want = alpha * sum + beta * c0[i * N + j];
            double err =
                fabs(c[i * N + j] - want) / (alpha * mag + fabs(beta * c0[i * N + j]) + 1e-30);
            worst = tu_worse(worst, err);
        }
    ck_assert_msg(worst < 1e-6 * (1 + K / 64.0),
                  "M %lld N %lld K %lld (of %lld x %lld) ta %d tb %d alpha %g: %g", (long long)M,
                  (long long)N, (long long)K, (long long)Kb, (long long)Nb, ta, tb, alpha, worst);
    free(a), free(b), free(c), free(c0), free(ap), free(bp);
}

/* ... with alpha 0.5 and 1: C = A B (alpha 1, beta 0) stores AMX's whole tiles straight to C */
static void check_packed(int64_t M, int64_t N, int64_t K, int64_t Kb, int64_t Nb, bool ta, bool tb,
                         float beta)
{
    check_packed_alpha(M, N, K, Kb, Nb, ta, tb, 0.5f, beta);
    check_packed_alpha(M, N, K, Kb, Nb, ta, tb, 1.0f, beta);
}

/* A pack read through the transposed layout holds the same words as the pack of the
 * transposed copy read directly: op(B) (rows K x cols N, tb) when !is_a, op(A) (rows M x cols
 * K, ta) when is_a; odd and even K, ragged N or M, past one block of the transposed packers
 * (B: 128 values of K; A: 64 rows and 16 pairs). */
static void check_pack_transposed(bool is_a, int64_t rows, int64_t cols)
{
    unsigned seed = (unsigned)(is_a ? rows * 3 + cols : rows * 5 + cols);
    float *m = malloc(sizeof(float) * (size_t)(rows * cols)),
          *mt = malloc(sizeof(float) * (size_t)(rows * cols));
    const size_t n = sizeof(float) * (size_t)(is_a ? jdt_rt_bf16_pack_a_floats(rows, cols)
                                                   : jdt_rt_bf16_pack_b_floats(rows, cols));
    unsigned char *p0 = malloc(n), *p1 = malloc(n);
    ck_assert(m && mt && p0 && p1);
    /* and now and then a value the rounding treats apart: a quiet NaN, a signalling one (made
     * quiet, not rounded to inf), infinities, a subnormal, -0, a tie that rounds to even, the
     * largest finite float (rounds to inf) */
    const uint32_t snan_bits = 0x7f800001u;
    float snan;
    memcpy(&snan, &snan_bits, 4);
    const float special[] = {NAN, snan, INFINITY, -INFINITY, 1e-40f, -0.0f, 1.00390625f, FLT_MAX};
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            const int64_t x = i * cols + j;
            mt[j * rows + i] = m[x] = x % 23 == 5 ? special[x / 23 % 8] : frand(&seed);
        }
    memset(p0, 0xa5, n);
    memset(p1, 0xa5, n);
    if (is_a) {
        jdt_rt_bf16_pack_a(m, cols, false, rows, cols, p0);
        jdt_rt_bf16_pack_a(mt, rows, true, rows, cols, p1);
    } else {
        jdt_rt_bf16_pack_b(m, cols, false, rows, cols, p0);
        jdt_rt_bf16_pack_b(mt, rows, true, rows, cols, p1);
    }
    ck_assert_msg(!memcmp(p0, p1, n), "%s %lld x %lld: the transposed pack differs",
                  is_a ? "A" : "B", (long long)rows, (long long)cols);
    free(m), free(mt), free(p0), free(p1);
}

/* jdt_rt_bf16_pack_a_scaled: the bits of scaling A's rows in place and packing them (rows of
 * stride lda > cols; an odd cols leaves half a pair) */
static void check_pack_scaled(int64_t rows, int64_t cols)
{
    unsigned seed = (unsigned)(rows * 7 + cols);
    const int64_t lda = cols + 3;
    float *m = malloc(sizeof(float) * (size_t)(rows * lda)),
          *rs = malloc(sizeof(float) * (size_t)rows);
    const size_t n = sizeof(float) * (size_t)jdt_rt_bf16_pack_a_floats(rows, cols);
    unsigned char *p0 = malloc(n), *p1 = malloc(n);
    ck_assert(m && rs && p0 && p1);
    for (int64_t i = 0; i < rows * lda; i++)
        m[i] = frand(&seed);
    for (int64_t i = 0; i < rows; i++)
        rs[i] = 1.0f / (0.37f + 3.0f * (float)i);
    memset(p0, 0xa5, n);
    memset(p1, 0xa5, n);
    jdt_rt_bf16_pack_a_scaled(m, lda, rows, cols, rs, p1);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            m[i * lda + j] *= rs[i];
    jdt_rt_bf16_pack_a(m, lda, false, rows, cols, p0);
    ck_assert_msg(!memcmp(p0, p1, n), "%lld x %lld: the scaled pack differs", (long long)rows,
                  (long long)cols);
    free(m), free(rs), free(p0), free(p1);
}

static void packed_cases(void)
{
    check_pack_scaled(64, 256);
    check_pack_scaled(45, 7);
    check_pack_scaled(17, 131);
    check_pack_transposed(true, 256, 64);
    check_pack_transposed(true, 45, 7);
    check_pack_transposed(true, 17, 131);
    check_pack_transposed(true, 130, 33);
    check_pack_transposed(false, 64, 256);
    check_pack_transposed(false, 7, 45);
    check_pack_transposed(false, 131, 17);
    check_pack_transposed(false, 300, 33);
    check_packed(64, 64, 64, 64, 64, false, false, 0.0f);
    check_packed(13, 45, 7, 7, 45, false, true, 1.0f);     /* ragged M, N; odd K */
    check_packed(64, 130, 64, 64, 256, false, true, 0.0f); /* a prefix of B's columns */
    check_packed(9, 64, 77, 256, 64, true, false, 1.0f);   /* a prefix of B's rows, odd */
    check_packed(200, 64, 64, 64, 64, true, false, 1.0f);
    check_packed(1, 1, 1, 1, 1, false, false, 0.0f);
    check_packed(40, 40, 40, 40, 40, false, true, 1.0f);   /* ragged halves of a 32 x 32 block */
    check_packed(64, 96, 64, 128, 96, false, false, 0.0f); /* a prefix of 32 pairs of 64 */
}

/* Attention (B, H, T, D) against a double reference with the same rounding points: with bf16
 * compute q, k, v, dout, the probabilities and dS rounded where they enter a product, with f32
 * none. */
/* q scaled by amp: at amp 100 the scores reach the hundreds, so a row max that misses a
 * value (the softmax's shift) overflows exp and the outputs go non-finite */
/* with_lse: the forward also stores each row's log-sum-exp (checked against the reference's)
 * and the backward recomputes the probabilities from it (passes.c fold_attention_lse) */
static void attention_case_lse(int64_t B, int64_t H, int64_t T, int64_t D, float amp, bool with_lse,
                               bool bf16)
{
    const int64_t n = B * H * T * D;
    unsigned seed = (unsigned)(T * 31 + D);
    float *x = malloc(sizeof(float) * (size_t)(4 * n)), *o = malloc(sizeof(float) * (size_t)n);
    float *d = malloc(sizeof(float) * (size_t)(3 * n));
    float *scr =
        malloc(sizeof(float) * (size_t)jdt_rt_attention_scratch_floats(D, T, 2, bf16, false));
    double *ro = calloc((size_t)n, sizeof(double)), *rd = calloc((size_t)(3 * n), sizeof(double));
    double *p = malloc(sizeof(double) * (size_t)T), *dp = malloc(sizeof(double) * (size_t)T);
    double *rl = malloc(sizeof(double) * (size_t)(B * H * T));
    float *lse = with_lse ? malloc(sizeof(float) * (size_t)(B * H * T)) : NULL;
    ck_assert(x && o && d && scr && ro && rd && p && dp && rl && (lse || !with_lse));
    for (int64_t i = 0; i < 4 * n; i++)
        x[i] = (i < n ? amp : 1.0f) * 2.0f * frand(&seed);
    const float *q = x, *k = x + n, *v = x + 2 * n, *g = x + 3 * n;
    const float sc = 1.0f / sqrtf((float)D);
#define R(z) ((double)(bf16 ? jdt_rt_bf16_round(z) : (z)))
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t i = 0; i < T; i++) {
            const int64_t b0 = bh * T * D;
            double mx = -INFINITY, sum = 0, pdp = 0;
            for (int64_t j = 0; j <= i; j++) {
                double s = 0;
                for (int64_t e = 0; e < D; e++)
                    s += R(q[b0 + i * D + e]) * R(k[b0 + j * D + e]);
                p[j] = s * sc;
                mx = p[j] > mx ? p[j] : mx;
            }
            for (int64_t j = 0; j <= i; j++)
                sum += (p[j] = exp(p[j] - mx));
            rl[bh * T + i] = mx + log1p(sum - 1.0); /* sum >= 1: the max's own term */
            for (int64_t j = 0; j <= i; j++)
                p[j] = (float)(p[j] / sum);
            for (int64_t j = 0; j <= i; j++) {
                dp[j] = 0;
                for (int64_t e = 0; e < D; e++) {
                    ro[b0 + i * D + e] += R((float)p[j]) * R(v[b0 + j * D + e]);
                    dp[j] += R(g[b0 + i * D + e]) * R(v[b0 + j * D + e]);
                }
            }
            for (int64_t e = 0; e < D; e++) /* delta = dO . O, unrounded, as the kernel */
                pdp += g[b0 + i * D + e] * ro[b0 + i * D + e];
            for (int64_t j = 0; j <= i; j++) {
                double ds = R((float)(p[j] * (dp[j] - pdp) * sc));
                for (int64_t e = 0; e < D; e++) {
                    rd[b0 + i * D + e] += ds * R(k[b0 + j * D + e]);
                    rd[n + b0 + j * D + e] += ds * R(q[b0 + i * D + e]);
                    rd[2 * n + b0 + j * D + e] += R((float)p[j]) * R(g[b0 + i * D + e]);
                }
            }
        }
#undef R
    jdt_rt_attention(q, k, v, o, lse, B, H, T, D, sc, 0, bf16, scr, 2);
    jdt_rt_attention_bwd(q, k, v, o, lse, g, d, B, H, T, D, sc, 0, bf16, scr, 2);
    double el = 0; /* the log-sum-exp: f32 sums of bf16 products against double ones */
    for (int64_t i = 0; with_lse && i < B * H * T; i++)
        el = fmax(el, fabs(lse[i] - rl[i]) / (1.0 + fabs(rl[i])));
    ck_assert_msg(el < 1e-5, "T %lld D %lld: log-sum-exp err %g", (long long)T, (long long)D, el);
    double eo = 0, ed = 0, mo = 0, md = 0;
    int64_t bad = 0; /* fmax passes NaNs by: count the non-finite outputs */
    for (int64_t i = 0; i < n; i++)
        eo = fmax(eo, fabs(o[i] - ro[i])), mo = fmax(mo, fabs(ro[i])), bad += !isfinite(o[i]);
    for (int64_t i = 0; i < 3 * n; i++)
        ed = fmax(ed, fabs(d[i] - rd[i])), md = fmax(md, fabs(rd[i])), bad += !isfinite(d[i]);
    ck_assert_msg(bad == 0, "T %lld D %lld: %lld non-finite outputs", (long long)T, (long long)D,
                  (long long)bad);
    /* f32 sums against double ones, and now and then a probability that the kernel's f32 exp
     * and the reference's double exp round to neighbouring bf16 values (one such flip moves an
     * output by p * v * 2^-8): measured 4.8e-4 of the largest value at T 150, 1.3e-6 at T 64;
     * the unrounded f32 kernel misses by 3.4e-3 to 4.4e-3. f32 compute: f32 sums against double
     * ones, measured at most 4.2e-7 of the largest value at amp 1, 2.7e-5 at amp 100 (a score's
     * f32 error grows with its size, and exp turns it into a relative one) */
    const double tol = bf16 ? 1e-3 : amp > 1.0f ? 1e-4 : 2e-6;
    ck_assert_msg(eo < tol * mo && ed < tol * md,
                  "T %lld D %lld bf16 %d: out err %g (max %g), grad err %g (max %g)", (long long)T,
                  (long long)D, bf16, eo, mo, ed, md);
    free(x), free(o), free(d), free(scr), free(ro), free(rd), free(p), free(dp), free(rl);
    free(lse);
}

static void attention_case_amp(int64_t B, int64_t H, int64_t T, int64_t D, float amp)
{
    attention_case_lse(B, H, T, D, amp, false, true);
    attention_case_lse(B, H, T, D, amp, true, true);
}

/* bf16 q, k, v (JDT_RT_ATT_QKV_BF16): the forward's o and log-sum-exp and the backward's dq,
 * dk, dv equal, bit for bit, those of f32 inputs holding the same (rounded) values, with bf16
 * compute and without, the inputs read (B, H, T, D) and (B, T, H, D); the scratch the query
 * gives for bf16 inputs is enough (a canary after it stays) */
static void attention_qkv_bf16_case(int64_t B, int64_t H, int64_t T, int64_t D)
{
    const int64_t n = B * H * T * D, nl = B * H * T;
    unsigned seed = (unsigned)(T * 7 + D);
    float *x = malloc(sizeof(float) * (size_t)(4 * n)), *out[2];
    uint16_t *x16 = malloc(2 * (size_t)(3 * n));
    const int64_t ns = jdt_rt_attention_scratch_floats(D, T, 2, true, true);
    ck_assert_int_ge(ns, jdt_rt_attention_scratch_floats(D, T, 2, false, true));
    float *scr = malloc(sizeof(float) * (size_t)(ns + 1));
    ck_assert(x && x16 && scr);
    for (int r = 0; r < 2; r++)
        ck_assert_ptr_nonnull(out[r] = malloc(sizeof(float) * (size_t)(4 * n + nl)));
    for (int64_t i = 0; i < 4 * n; i++)
        x[i] = 2.0f * frand(&seed);
    for (int64_t i = 0; i < 3 * n; i++) {
        x16[i] = jdt_rt_bf16_bits(x[i]);
        x[i] = jdt_rt_bf16_float(x16[i]);
    }
    const float sc = 1.0f / sqrtf((float)D);
    for (int bf = 0; bf < 2; bf++)
        for (unsigned bthd = 0; bthd <= 7; bthd += 7)
            for (int r = 0; r < 2; r++) { /* r = 0: f32 inputs, 1: bf16 */
                float *o = out[r], *lse = o + n, *d = lse + nl;
                const void *q = r ? (const void *)x16 : x, *k = r ? (const void *)(x16 + n) : x + n,
                           *v = r ? (const void *)(x16 + 2 * n) : x + 2 * n;
                const unsigned m = bthd | (r ? JDT_RT_ATT_QKV_BF16 : 0u);
                scr[ns] = 12345.0f;
                jdt_rt_attention(q, k, v, o, lse, B, H, T, D, sc, m, bf, scr, 2);
                jdt_rt_attention_bwd(q, k, v, o, lse, x + 3 * n, d, B, H, T, D, sc, m, bf, scr, 2);
                ck_assert_float_eq(scr[ns], 12345.0f);
                if (r)
                    ck_assert_msg(memcmp(out[0], out[1], sizeof(float) * (size_t)(4 * n + nl)) == 0,
                                  "T %lld D %lld bf16 compute %d bthd %u: bf16 q, k, v give other "
                                  "results than f32 ones of the same values",
                                  (long long)T, (long long)D, bf, bthd);
            }
    free(x), free(x16), free(scr), free(out[0]), free(out[1]);
}

static void attention_case(int64_t B, int64_t H, int64_t T, int64_t D)
{
    attention_case_amp(B, H, T, D, 1.0f);
    attention_qkv_bf16_case(B, H, T, D);
}

START_TEST(test_bf16_tiles_best_path)
{
    fprintf(stderr, "check_runtime: bf16 tiles %s\n",
            jdt_rt_bf16_tiles_amx()      ? "AMX"
            : jdt_rt_bf16_tiles_native() ? "AVX512-BF16"
                                         : "portable (rounded SGEMM)");
    packed_cases();
    attention_case(2, 3, 150, 32); /* three blocks, the last ragged */
    attention_case(1, 2, 64, 64);
    attention_case(1, 2, 70, 24);              /* D not a multiple of the row loops' 16 lanes */
    attention_case_amp(1, 2, 150, 32, 100.0f); /* scores in the hundreds */
}
END_TEST

/* f32 compute against the double reference: rows whose valid keys end inside a 16-lane chunk,
 * at the end of a row that is not a multiple of 16 (T 150, 70, 5), D not a multiple of 16 */
START_TEST(test_attention_f32)
{
    const int64_t shapes[][4] = {{2, 3, 150, 32}, {1, 2, 70, 24}, {1, 1, 5, 3}, {1, 2, 64, 64}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int lse = 0; lse < 2; lse++)
            attention_case_lse(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], 1.0f, lse,
                               false);
    attention_case_lse(1, 2, 150, 32, 100.0f, true, false);
}
END_TEST

/* AVX512-BF16's kernel where the best path is AMX's (JDT_BF16_NO_AMX): both run on such a CPU */
START_TEST(test_bf16_tiles_avx512_path)
{
    setenv("JDT_BF16_NO_AMX", "1", 1); /* before the first call: the choice is made once */
    ck_assert(!jdt_rt_bf16_tiles_amx());
    if (!jdt_rt_bf16_tiles_native()) {
        fprintf(stderr, "check_runtime: SKIP %s: no AVX512-BF16 here\n", __func__);
        return;
    }
    packed_cases();
    attention_case(2, 3, 150, 32);
}
END_TEST

START_TEST(test_bf16_tiles_portable_path)
{
    setenv("JDT_BF16_NO_DNNL", "1", 1);
    ck_assert(!jdt_rt_bf16_tiles_native());
    packed_cases();
    attention_case(2, 3, 150, 32);
}
END_TEST

/* ---- the adaptive thread count (engine/runtime/threads.c) ---------------------------------- */

/* Runs the tuner for n_runs runs in a simulated machine where a run takes t_one seconds on 1
 * thread and t_all on the budget, each times (1 + noise * u), u uniform in [-1, 1) from *seed.
 * Counts the runs made with 1 thread and the changes of choice. */
typedef struct {
    int ones, changes;
} tuner_sim;

static tuner_sim simulate(jdt_rt_tuner *t, int n_runs, double t_one, double t_all, double noise,
                          unsigned *seed)
{
    tuner_sim r = {0, 0};
    for (int i = 0; i < n_runs; i++) {
        int nt = jdt_rt_tuner_threads(t);
        ck_assert(nt == 1 || nt == t->max_threads);
        double u = seed ? (double)frand(seed) : 0.0;
        r.ones += nt == 1;
        r.changes += jdt_rt_tuner_record(t, (nt == 1 ? t_one : t_all) * (1.0 + noise * u));
    }
    return r;
}

START_TEST(test_tuner_switches_and_back)
{
    jdt_rt_tuner t;
    jdt_rt_tuner_init(&t, 2, 50);
    ck_assert_int_eq(jdt_rt_tuner_threads(&t), 2); /* starts with the budget */
    /* 1 thread 20% faster (the busy-core case): 2 warm-up runs, 2 timed runs with 2 threads,
     * then probe runs with 1 alternating with runs with 2 (k = 8: 10 ms runs, 0.5 s is more
     * than 8 samples); after 3 a side 1 thread is clearly faster (JDT_RT_TUNER_EARLY_WIN), so
     * the switch comes after run 10, not 20 */
    tuner_sim r = simulate(&t, 9, 0.008, 0.010, 0.0, NULL);
    ck_assert_int_eq(r.changes, 0);
    ck_assert_int_eq(r.ones, 3);
    ck_assert(t.probing && t.k == 8 && t.n_probe == 3 && t.n_pbase == 2);
    r = simulate(&t, 1, 0.008, 0.010, 0.0, NULL);
    ck_assert_int_eq(r.changes, 1);
    ck_assert_int_eq(r.ones, 0);
    ck_assert_int_eq(t.chosen, 1);
    ck_assert_int_eq(jdt_rt_tuner_threads(&t), 1);
    ck_assert_double_eq_tol(t.last_probe_s, 0.008, 1e-12);
    ck_assert_double_eq_tol(t.last_base_s, 0.010, 1e-12);
    /* it stays while 1 thread stays faster: probes of 2 threads every 50, 100, 200 ... runs */
    r = simulate(&t, 1000, 0.008, 0.010, 0.0, NULL);
    ck_assert_int_eq(r.changes, 0);
    ck_assert_int_ge(r.ones, 1000 - 5 * 8);
    /* the machine gets quiet (2 threads twice as fast): back to 2 at the next probe, within
     * the longest interval (16 x 50 runs) plus one probe */
    int runs = 0;
    while (!jdt_rt_tuner_record(&t, jdt_rt_tuner_threads(&t) == 1 ? 0.008 : 0.004))
        ck_assert_int_le(++runs, 16 * 50 + 16);
    ck_assert_int_eq(t.chosen, 2);
    ck_assert_int_eq(t.interval, 50);                /* a change resets the interval */
    r = simulate(&t, 1000, 0.008, 0.004, 0.0, NULL); /* and 2 it stays */
    ck_assert_int_eq(r.changes, 0);
}
END_TEST

START_TEST(test_tuner_hysteresis)
{
    /* 1 thread 1% faster: never flips (the switch to 1 needs JDT_RT_TUNER_HYST_DOWN = 2%) */
    jdt_rt_tuner t;
    jdt_rt_tuner_init(&t, 4, 50);
    tuner_sim r = simulate(&t, 3000, 0.0099, 0.0100, 0.0, NULL);
    ck_assert_int_eq(r.changes, 0);
    ck_assert_int_eq(t.chosen, 4);
    ck_assert_int_ge(t.n_probes, 4);
    ck_assert_int_eq(t.interval, 16 * 50); /* each held choice doubles the interval, capped */
    /* 1 thread 3% faster: as fast within noise on a fraction of the CPU, so it wins, once */
    jdt_rt_tuner_init(&t, 4, 50);
    r = simulate(&t, 3000, 0.0097, 0.0100, 0.0, NULL);
    ck_assert_int_eq(r.changes, 1);
    ck_assert_int_eq(t.chosen, 1);
    /* on 1 thread, 4 threads 4% faster is not enough to go back (JDT_RT_TUNER_HYST_UP = 5%) */
    r = simulate(&t, 3000, 0.0100, 0.0096, 0.0, NULL);
    ck_assert_int_eq(r.changes, 0);
    ck_assert_int_eq(t.chosen, 1);
    /* and 6% faster is */
    r = simulate(&t, 3000, 0.0100, 0.0094, 0.0, NULL);
    ck_assert_int_eq(r.changes, 1);
    ck_assert_int_eq(t.chosen, 4);
    /* with +-10% noise on every run, a 25% difference is still found once and kept */
    unsigned seed = 7;
    jdt_rt_tuner_init(&t, 2, 50);
    r = simulate(&t, 3000, 0.008, 0.010, 0.10, &seed);
    ck_assert_int_eq(r.changes, 1);
    ck_assert_int_eq(t.chosen, 1);
    /* over many noise sequences (3000 runs each, +-10% per run): with no real difference most
     * probes keep the choice (a flip costs nothing then, but each one restarts the probing);
     * with a real 10% difference either way the choice flips at most twice */
    int changes = 0, probes = 0;
    for (unsigned s = 1; s <= 50; s++) {
        seed = s;
        jdt_rt_tuner_init(&t, 2, 50);
        changes += simulate(&t, 3000, 0.010, 0.010, 0.10, &seed).changes;
        probes += t.n_probes;
        for (int d = -1; d <= 1; d += 2) {
            jdt_rt_tuner_init(&t, 2, 50);
            ck_assert_int_le(
                simulate(&t, 3000, 0.010 * (1.0 + 0.1 * d), 0.010, 0.10, &seed).changes, 2);
        }
    }
    ck_assert_int_lt(changes, probes / 3);
}
END_TEST

START_TEST(test_tuner_early_stop)
{
    /* on 1 thread, with 2 threads 10% slower (too little for the 1.25x abort): each probe of 2
     * threads stops after JDT_RT_TUNER_EARLY_RUNS runs a side instead of k = 8 */
    jdt_rt_tuner t;
    jdt_rt_tuner_init(&t, 2, 50);
    tuner_sim r = simulate(&t, 30, 0.008, 0.010, 0.0, NULL);
    ck_assert_int_eq(t.chosen, 1);
    int probes = t.n_probes;
    r = simulate(&t, 1600, 0.010, 0.011, 0.0, NULL);
    ck_assert_int_eq(r.changes, 0);
    ck_assert_int_eq(t.chosen, 1);
    ck_assert_int_ge(t.n_probes - probes, 4);
    ck_assert_int_eq(1600 - r.ones, JDT_RT_TUNER_EARLY_RUNS * (t.n_probes - probes));
    ck_assert_double_eq_tol(t.last_probe_s, 0.011, 1e-12);
    /* a probe that is winning runs to k a side and switches (2 threads 10% faster) */
    r = simulate(&t, 1000, 0.011, 0.010, 0.0, NULL);
    ck_assert_int_eq(r.changes, 1);
    ck_assert_int_eq(t.chosen, 2);
}
END_TEST

START_TEST(test_tuner_load_change)
{
    /* a burst of load ends just as the probe starts (every run 3x faster from run 5 on): 1
     * thread's probe runs look faster than the 2-thread runs before it, but the probe compares
     * against 2-thread runs interleaved with its own, so it keeps 2 threads */
    jdt_rt_tuner t;
    jdt_rt_tuner_init(&t, 2, 50);
    tuner_sim r = simulate(&t, 4, 0.024, 0.012, 0.0, NULL);
    ck_assert_int_eq(r.changes, 0);
    ck_assert(t.probing && t.n_probe == 0);
    r = simulate(&t, 200, 0.0048, 0.004, 0.0, NULL);
    ck_assert_int_eq(r.changes, 0);
    ck_assert_int_eq(t.chosen, 2);
    ck_assert_double_eq_tol(t.last_base_s, 0.004, 1e-12);
}
END_TEST

START_TEST(test_tuner_quiet_machine_cost)
{
    /* 1 thread twice as slow (a quiet machine): each probe stops after one run, and probes
     * thin out (at run 5, then 100, 200, 400, 800 runs apart): 5 one-thread runs in 1600 */
    jdt_rt_tuner t;
    jdt_rt_tuner_init(&t, 2, 50);
    tuner_sim r = simulate(&t, 1600, 0.020, 0.010, 0.0, NULL);
    ck_assert_int_eq(r.changes, 0);
    ck_assert_int_eq(r.ones, t.n_probes);
    ck_assert_int_eq(r.ones, 5);
    /* slow runs (1 s): 2 samples per side, so the first probe starts after 2 + 2 runs */
    jdt_rt_tuner_init(&t, 2, 50);
    r = simulate(&t, 4, 2.0, 1.0, 0.0, NULL);
    ck_assert_int_eq(r.ones, 0);
    ck_assert_int_eq(jdt_rt_tuner_threads(&t), 1);
    ck_assert_int_eq(t.k, 2);
}
END_TEST

START_TEST(test_tuner_one_thread_budget)
{
    jdt_rt_tuner t;
    jdt_rt_tuner_init(&t, 1, 0);
    tuner_sim r = simulate(&t, 500, 0.001, 0.002, 0.0, NULL);
    ck_assert_int_eq(r.ones, 500);
    ck_assert_int_eq(r.changes, 0);
    ck_assert_int_eq(t.n_probes, 0);
    jdt_rt_tuner_init(&t, 0, 0); /* 0 or negative: 1 */
    ck_assert_int_eq(jdt_rt_tuner_threads(&t), 1);
    ck_assert_int_eq(t.probe_every, 50);
    /* a non-finite or negative time is ignored */
    jdt_rt_tuner_init(&t, 2, 50);
    for (int i = 0; i < 100; i++)
        ck_assert(!jdt_rt_tuner_record(&t, -1.0) && !jdt_rt_tuner_record(&t, NAN));
    ck_assert_int_eq(t.n_probes, 0);
}
END_TEST

/* xent backward at (N, V): from the loss (as the compiled step calls it) and without, f32 and
 * bf16 stores, against double arithmetic; a row with masked (-inf) logits, an ignored target
 * (-1) and one out of range (V) included. A wrong loss must move the result (it is read). */
static void check_xent_bwd(int64_t N, int64_t V)
{
    int64_t n = N * V;
    float *x = malloc((size_t)n * 4), *dl = malloc((size_t)N * 4), *loss = malloc((size_t)N * 4);
    float *dx = malloc((size_t)n * 4);
    uint16_t *d16 = malloc((size_t)n * 2);
    int32_t *t = malloc((size_t)N * 4);
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < n; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(r >> 11) / 9007199254740992.0 * 16.0 - 8.0);
    }
    for (int64_t i = 0; i < N; i++) {
        dl[i] = 0.5f + (float)i / (float)N;
        t[i] = (int32_t)((i * 7919 + 3) % V);
    }
    t[0] = -1;
    if (N > 1) t[1] = (int32_t)V;
    if (N > 2)
        for (int64_t c = 0; c < V; c += 2)
            if (c != t[2]) x[2 * V + c] = -INFINITY;
    ck_assert_int_eq(jdt_rt_softmax_xent(x, t, loss, N, V, 2), N > 1);
    for (int from_loss = 0; from_loss < 2; from_loss++) {
        const float *lp = from_loss ? loss : NULL;
        jdt_rt_softmax_xent_bwd(x, t, dl, lp, dx, N, V, 2);
        jdt_rt_softmax_xent_bwd_bf16(x, t, dl, lp, d16, N, V, 2);
        for (int64_t i = 0; i < N; i++) {
            const float *xr = x + i * V;
            double m = -INFINITY, s = 0;
            for (int64_t c = 0; c < V; c++)
                m = xr[c] > m ? xr[c] : m;
            for (int64_t c = 0; c < V; c++)
                s += exp((double)xr[c] - m);
            const bool in = t[i] >= 0 && t[i] < V;
            for (int64_t c = 0; c < V; c++) {
                double want = in ? (exp((double)xr[c] - m - log(s)) - (c == t[i])) * dl[i] : 0.0;
                double got = dx[i * V + c], tol = 1e-7 + 2e-5 * fabs(want);
                ck_assert_msg(fabs(got - want) <= tol,
                              "xent_bwd(%s) N=%lld V=%lld [%lld,%lld]: %g, want %g",
                              from_loss ? "loss" : "computed", (long long)N, (long long)V,
                              (long long)i, (long long)c, got, want);
                uint32_t u = (uint32_t)d16[i * V + c] << 16;
                float h;
                memcpy(&h, &u, 4);
                ck_assert_msg(fabs(h - want) <= 1e-7 + 8e-3 * fabs(want),
                              "xent_bwd_bf16(%s) [%lld,%lld]: %g, want %g",
                              from_loss ? "loss" : "computed", (long long)i, (long long)c,
                              (double)h, want);
            }
        }
    }
    if (N > 3) { /* the loss is read: a loss off by 0.5 scales row 3's softmax by e^-0.5 */
        loss[3] += 0.5f;
        jdt_rt_softmax_xent_bwd(x, t, dl, loss, dx, N, V, 2);
        int64_t c = t[3] == 0 ? 1 : 0;
        float want = dl[3] * expf(x[3 * V + c] - (loss[3] - 0.5f + x[3 * V + t[3]]) - 0.5f);
        ck_assert_msg(fabsf(dx[3 * V + c] - want) <= 1e-5f * fabsf(want), "%g vs %g",
                      (double)dx[3 * V + c], (double)want);
    }
    free(x), free(dl), free(loss), free(dx), free(d16), free(t);
}

/* bf16 logits (jdt_rt_softmax_xent_ex, _bwd_ex: precision.activations: bf16's lm head): the loss
 * and dlogits (f32 and bf16) of f32 logits holding the same values, bit for bit, with the loss
 * given and computed; bf16 dlogits written over the bf16 logits too (the backends'
 * xent_inplace) */
static void check_xent_bf16_logits(int64_t N, int64_t V)
{
    const int64_t n = N * V;
    float *x = malloc((size_t)n * 4), *dl = malloc((size_t)N * 4), *loss[2], *dx[2];
    uint16_t *x16 = malloc((size_t)n * 2), *d16[2], *io = malloc((size_t)n * 2);
    int32_t *t = malloc((size_t)N * 4);
    ck_assert(x && dl && x16 && io && t);
    for (int k = 0; k < 2; k++) {
        ck_assert_ptr_nonnull(loss[k] = malloc((size_t)N * 4));
        ck_assert_ptr_nonnull(dx[k] = malloc((size_t)n * 4));
        ck_assert_ptr_nonnull(d16[k] = malloc((size_t)n * 2));
    }
    unsigned seed = (unsigned)(N * 131 + V);
    for (int64_t i = 0; i < n; i++) {
        x16[i] = jdt_rt_bf16_bits(8.0f * frand(&seed));
        x[i] = jdt_rt_bf16_float(x16[i]);
    }
    for (int64_t i = 0; i < N; i++) {
        dl[i] = 0.25f + (float)i / (float)N;
        t[i] = (int32_t)((i * 7919 + 5) % V);
    }
    t[0] = -1;                  /* a row with no target: loss and dlogits 0 */
    for (int k = 0; k < 2; k++) /* k = 0: f32 logits, 1: bf16 */
        ck_assert_int_eq(jdt_rt_softmax_xent_ex(k ? (const void *)x16 : x, k, t, loss[k], N, V, 2),
                         0);
    ck_assert(!memcmp(loss[0], loss[1], (size_t)N * 4));
    for (int from_loss = 0; from_loss < 2; from_loss++) {
        const float *lp = from_loss ? loss[0] : NULL;
        for (int k = 0; k < 2; k++) {
            const void *xk = k ? (const void *)x16 : x;
            jdt_rt_softmax_xent_bwd_ex(xk, k, t, dl, lp, dx[k], false, N, V, 2);
            jdt_rt_softmax_xent_bwd_ex(xk, k, t, dl, lp, d16[k], true, N, V, 2);
        }
        ck_assert_msg(!memcmp(dx[0], dx[1], (size_t)n * 4), "N %lld V %lld: f32 dlogits differ",
                      (long long)N, (long long)V);
        ck_assert_msg(!memcmp(d16[0], d16[1], (size_t)n * 2), "N %lld V %lld: bf16 dlogits differ",
                      (long long)N, (long long)V);
        memcpy(io, x16, (size_t)n * 2);
        jdt_rt_softmax_xent_bwd_ex(io, true, t, dl, lp, io, true, N, V, 2);
        ck_assert_msg(!memcmp(io, d16[0], (size_t)n * 2), "N %lld V %lld: in place differs",
                      (long long)N, (long long)V);
    }
    /* the fused classifier (a dloss of g in every row; a target >= V counted, its row 0): the
     * forward's loss and the backward's dlogits with the logsumexp computed, bit for bit, for
     * either logits type and either dlogits type, and in place */
    const float g = 0.375f;
    for (int64_t i = 0; i < N; i++)
        dl[i] = g;
    t[N - 1] = (int32_t)V;
    for (int k = 0; k < 2; k++) {
        const void *xk = k ? (const void *)x16 : x;
        ck_assert_int_eq(jdt_rt_softmax_xent_ex(xk, k, t, loss[0], N, V, 2), 1);
        jdt_rt_softmax_xent_bwd_ex(xk, k, t, dl, NULL, dx[0], false, N, V, 2);
        jdt_rt_softmax_xent_bwd_ex(xk, k, t, dl, NULL, d16[0], true, N, V, 2);
        for (int out16 = 0; out16 < 2; out16++) {
            void *d = out16 ? (void *)d16[1] : dx[1];
            memset(loss[1], 0x7f, (size_t)N * 4);
            ck_assert_int_eq(jdt_rt_softmax_xent_fused(xk, k, t, g, loss[1], d, out16, N, V, 2), 1);
            ck_assert_msg(!memcmp(loss[0], loss[1], (size_t)N * 4), "fused: loss differs");
            ck_assert_msg(!memcmp(out16 ? (void *)d16[0] : dx[0], d, (size_t)n * (out16 ? 2 : 4)),
                          "N %lld V %lld logits bf16 %d dlogits bf16 %d: fused dlogits differ",
                          (long long)N, (long long)V, k, out16);
        }
    }
    memcpy(io, x16, (size_t)n * 2);
    jdt_rt_softmax_xent_fused(io, true, t, g, loss[1], io, true, N, V, 2);
    jdt_rt_softmax_xent_bwd_ex(x16, true, t, dl, NULL, d16[0], true, N, V, 2);
    ck_assert_msg(!memcmp(io, d16[0], (size_t)n * 2), "fused in place differs");
    for (int k = 0; k < 2; k++)
        free(loss[k]), free(dx[k]), free(d16[k]);
    free(x), free(dl), free(x16), free(io), free(t);
}

START_TEST(test_xent_bwd_from_loss)
{
    check_xent_bwd(7, 37);
    check_xent_bwd(5, 1024);
    check_xent_bwd(4, 50304);
    check_xent_bf16_logits(7, 37);
    check_xent_bf16_logits(3, 50304);
}
END_TEST

/* The cross-entropy's outputs of every driver (jdt_rt_softmax_xent_ex, _bwd_ex from the loss
 * and without, _fused; f32 and bf16 logits and dlogits) into out, nt threads. */
static void xent_all(const float *x, const uint16_t *x16, const int32_t *t, const float *dl,
                     int64_t N, int64_t V, void *out, int nt)
{
    const int64_t n = N * V;
    size_t off = 0;
#define AT(o) ((void *)((unsigned char *)out + (o)))
    for (int k = 0; k < 2; k++) { /* logits f32, bf16 */
        const void *xk = k ? (const void *)x16 : x;
        float *loss = AT(off);
        off += (size_t)N * 4;
        jdt_rt_softmax_xent_ex(xk, k, t, loss, N, V, nt);
        for (int from = 0; from < 2; from++)
            for (int d16 = 0; d16 < 2; d16++) {
                jdt_rt_softmax_xent_bwd_ex(xk, k, t, dl, from ? loss : NULL, AT(off), d16, N, V,
                                           nt);
                off += (size_t)n * (d16 ? 2 : 4);
            }
        for (int d16 = 0; d16 < 2; d16++) {
            jdt_rt_softmax_xent_fused(xk, k, t, 0.375f, AT(off), AT(off + (size_t)N * 4), d16, N, V,
                                      nt);
            off += (size_t)N * 4 + (size_t)n * (d16 ? 2 : 4);
        }
    }
#undef AT
}

/* The cross-entropy's AVX-512 build (kernels.c XENT_AVX512, taken where the CPU has AVX512-F
 * and -BW) gives the same bits as the generic clones (JDT_XENT_NO_AVX512): losses and dlogits
 * of every driver, both storage types, rows with targets out of range, lengths that are not a
 * multiple of 16, logits in the hundreds */
START_TEST(test_xent_avx512_same_bits)
{
    static const int64_t shapes[][2] = {{7, 37}, {5, 1000}, {3, 50304}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        const int64_t N = shapes[s][0], V = shapes[s][1], n = N * V;
        const size_t bytes = 2 * (size_t)(3 * N * 4 + 6 * n * 4 + 3 * n * 2);
        float *x = malloc((size_t)n * 4), *dl = malloc((size_t)N * 4);
        uint16_t *x16 = malloc((size_t)n * 2);
        int32_t *t = malloc((size_t)N * 4);
        void *out[2] = {malloc(bytes), malloc(bytes)};
        ck_assert(x && dl && x16 && t && out[0] && out[1]);
        unsigned seed = (unsigned)(N * 977 + V);
        for (int64_t i = 0; i < n; i++) {
            const float scale = i / V == 1 ? 300.0f : 8.0f; /* row 1 in the hundreds */
            x16[i] = jdt_rt_bf16_bits(scale * frand(&seed));
            x[i] = jdt_rt_bf16_float(x16[i]);
        }
        for (int64_t i = 0; i < N; i++) {
            dl[i] = 0.25f + (float)i / (float)N;
            t[i] = (int32_t)((i * 7919 + 5) % V);
        }
        t[0] = -1, t[N - 1] = (int32_t)V; /* no target; one past the vocabulary */
        for (int k = 0; k < 2; k++) {
            memset(out[k], 0x5a, bytes);
            if (k == 0) setenv("JDT_XENT_NO_AVX512", "1", 1);
            xent_all(x, x16, t, dl, N, V, out[k], 2);
            unsetenv("JDT_XENT_NO_AVX512");
        }
        ck_assert_msg(!memcmp(out[0], out[1], bytes), "N %lld V %lld: the builds differ",
                      (long long)N, (long long)V);
        free(x), free(dl), free(x16), free(t), free(out[0]), free(out[1]);
    }
    if (!__builtin_cpu_supports("avx512bw"))
        fprintf(stderr, "note: no AVX512-BW here: both runs took the generic clones\n");
}
END_TEST

/* jdt_rt_rope against the rotation written out per element (each angle in double, as cuk_rope
 * and the decoder compute it): bit for bit, forward and inverse, out of place and in place, on 1
 * and 2 threads, for heads of one pass of cached angles and of several (D = 2 * 256 + 6). */
static void check_rope(int64_t B, int64_t T, int64_t H, int64_t D, int nt, const double *sc)
{
    const int64_t n = B * T * H * D;
    float *x = malloc((size_t)n * sizeof(float)), *y = malloc((size_t)n * sizeof(float));
    float *want = malloc((size_t)n * sizeof(float)), *io = malloc((size_t)n * sizeof(float));
    ck_assert(x && y && want && io);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)((i * 7919) % 2003) / 1001.0f - 1.0f;
    const double theta = 10000.0;
    for (int inv = 0; inv < 2; inv++) {
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 0; t < T; t++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t i = 0; i < D / 2; i++) {
                        const double ang = (inv ? -1.0 : 1.0) * (double)t *
                                           (sc ? jdt_rope_freq(theta, i, D, sc)
                                               : pow(theta, -2.0 * (double)i / (double)D));
                        const float c = (float)cos(ang), sn = (float)sin(ang);
                        const int64_t o = ((b * T + t) * H + h) * D + 2 * i;
                        want[o] = x[o] * c - x[o + 1] * sn;
                        want[o + 1] = x[o] * sn + x[o + 1] * c;
                    }
        memset(y, 0xff, (size_t)n * sizeof(float));
        jdt_rt_rope(x, y, B, T, H, D, theta, sc, inv, nt);
        memcpy(io, x, (size_t)n * sizeof(float));
        jdt_rt_rope(io, io, B, T, H, D, theta, sc, inv, nt);
        for (int64_t i = 0; i < n; i++) {
            ck_assert_msg(!memcmp(&y[i], &want[i], sizeof(float)),
                          "rope B%lld T%lld H%lld D%lld inv %d nt %d: y[%lld] %.9g, want %.9g",
                          (long long)B, (long long)T, (long long)H, (long long)D, inv, nt,
                          (long long)i, (double)y[i], (double)want[i]);
            ck_assert_msg(!memcmp(&io[i], &want[i], sizeof(float)), "in place: io[%lld] %.9g",
                          (long long)i, (double)io[i]);
        }
    }
    free(x), free(y), free(want), free(io);
}

START_TEST(test_rope_per_element)
{
    check_rope(3, 37, 5, 64, 2, NULL);      /* parallel (above the work floor) */
    check_rope(2, 5, 3, 10, 2, NULL);       /* below it: one thread */
    check_rope(2, 9, 2, 518, 2, NULL);      /* three passes of 256, 256 and 3 pairs */
    check_rope(1, 300, 1, 128, 1, NULL);    /* long sequence, one thread */
    const double llama3[4] = {8, 1, 4, 16}; /* an original context of 16: every band at D 64 */
    check_rope(3, 37, 5, 64, 2, llama3);
    check_rope(2, 9, 2, 518, 2, llama3);
}
END_TEST

/* Llama 3's frequency scaling by hand, theta 10000, D 8 (frequencies 1, 0.1, 0.01, 0.001;
 * wavelengths 2 pi / f), factor 8, low/high frequency factors 1 and 4, original context 16:
 * wavelengths below 16 / 4 keep f, above 16 / 1 give f / 8, between blend by (16 / wavelength
 * - 1) / 3. */
START_TEST(test_rope_llama3_freq)
{
    const double sc[4] = {8, 1, 4, 16}, none[4] = {0, 0, 0, 0};
    const double s0 = (16.0 / (2 * M_PI) - 1.0) / 3.0; /* pair 0: wavelength 6.28, in between */
    ck_assert_double_eq_tol(jdt_rope_freq(10000, 0, 8, sc), (1 - s0) / 8 + s0, 1e-15);
    ck_assert_double_eq_tol(jdt_rope_freq(10000, 1, 8, sc), 0.1 / 8, 1e-15);
    ck_assert_double_eq_tol(jdt_rope_freq(10000, 3, 8, sc), 0.001 / 8, 1e-15);
    const double hi[4] = {8, 1, 4, 100}; /* wavelength 6.28 < 100 / 4: kept */
    ck_assert(jdt_rope_freq(10000, 0, 8, hi) == 1.0);
    for (int i = 0; i < 4; i++) /* factor 0: none, the plain power bit for bit */
        ck_assert(jdt_rope_freq(500000, i, 128, none) == pow(500000, -2.0 * i / 128.0) &&
                  jdt_rope_freq(500000, i, 128, NULL) == pow(500000, -2.0 * i / 128.0));
}
END_TEST

/* OpenBLAS's kernels: only a pre-AVX2 core on a CPU with AVX2 is replaced, by the widest
 * kernels the CPU runs; OpenBLAS's own choice of AVX2/AVX-512 kernels is kept. */
START_TEST(test_blas_core_for)
{
    ck_assert_str_eq(jdt_rt_blas_core_for("Prescott", true, true), "SkylakeX");
    ck_assert_str_eq(jdt_rt_blas_core_for("Prescott", true, false), "Haswell");
    ck_assert_str_eq(jdt_rt_blas_core_for("Sandybridge", true, false), "Haswell");
    ck_assert_str_eq(jdt_rt_blas_core_for("Nehalem", true, true), "SkylakeX");
    ck_assert_ptr_null(jdt_rt_blas_core_for("Prescott", false, false)); /* SSE-only CPU */
    ck_assert_ptr_null(jdt_rt_blas_core_for("Haswell", true, true));
    ck_assert_ptr_null(jdt_rt_blas_core_for("Zen", true, true));
    ck_assert_ptr_null(jdt_rt_blas_core_for("SkylakeX", true, true));
    ck_assert_ptr_null(jdt_rt_blas_core_for("Cooperlake", true, true));
    ck_assert_ptr_null(jdt_rt_blas_core_for(NULL, true, true));
    /* this process: whatever OpenBLAS chose, the fix (if any) is one of the two cores */
    const char *fix = jdt_rt_blas_core_fix();
    ck_assert(!fix || !strcmp(fix, "SkylakeX") || !strcmp(fix, "Haswell"));
}
END_TEST

static Suite *runtime_suite(void)
{
    Suite *s = suite_create("runtime");
    TCase *tc = tcase_create("bf16");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_bf16_round);
    tcase_add_test(tc, test_expf_le88);
    tcase_add_test(tc, test_matmul_f32_best_path);
    tcase_add_test(tc, test_matmul_f32_openblas_path);
    tcase_add_test(tc, test_matmul_bf16_best_path);
    tcase_add_test(tc, test_bf16_tiles_best_path);
    tcase_add_test(tc, test_attention_f32);
    tcase_add_test(tc, test_bf16_tiles_avx512_path);
    tcase_add_test(tc, test_bf16_tiles_portable_path);
    tcase_add_test(tc, test_matmul_bf16_portable_path);
    tcase_add_test(tc, test_matmul_bf16_onednn_path);
    tcase_add_test(tc, test_matmul_bf16_empty);
    tcase_add_test(tc, test_xent_bwd_from_loss);
    tcase_add_test(tc, test_xent_avx512_same_bits);
    tcase_add_test(tc, test_blas_core_for);
    tcase_add_test(tc, test_rope_per_element);
    tcase_add_test(tc, test_rope_llama3_freq);
    suite_add_tcase(s, tc);
    TCase *tt = tcase_create("threads");
    tcase_set_timeout(tt, 60);
    tcase_add_test(tt, test_tuner_switches_and_back);
    tcase_add_test(tt, test_tuner_hysteresis);
    tcase_add_test(tt, test_tuner_early_stop);
    tcase_add_test(tt, test_tuner_load_change);
    tcase_add_test(tt, test_tuner_quiet_machine_cost);
    tcase_add_test(tt, test_tuner_one_thread_budget);
    suite_add_tcase(s, tt);
    return s;
}

int main(void)
{
    return tu_run_suite(runtime_suite());
}
