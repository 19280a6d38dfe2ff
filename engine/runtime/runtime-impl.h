/*
 * runtime-impl.h — internals shared by the CPU kernels: a vectorisable f32 exp (and a cheaper
 * one for arguments <= 88, the softmax rows'), the bf16 rounding inline, branch-free selects,
 * the clone attributes, and the best-of-n timing of the GEMM MFU references.
 *
 * glibc's expf is a scalar call unless -ffast-math (which we refuse: NaN/Inf must keep their
 * meaning), so row kernels that are mostly exp (softmax, cross-entropy, attention) would run
 * one element at a time. This is the same Cody-Waite reduction + Cephes polynomial the code
 * generator emits into generated kernels (codegen.c): max relative error 8e-8 measured over
 * [-110, 95]; NaN -> NaN, +Inf -> +Inf, -Inf and x < -103.97 -> 0, x > 88.72 -> +Inf.
 * Selects are integer masks, so the loops vectorise without -fno-trapping-math.
 */
#ifndef JDT_RUNTIME_IMPL_H
#define JDT_RUNTIME_IMPL_H

#include "core/core.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* c ? a : b without a branch: a float compare is a possibly-trapping operation, so GCC keeps
 * `?:` on floats as control flow (and gives up vectorising) unless -fno-trapping-math; integer
 * masks select the same values. */
/* The library is built for baseline x86-64 (SSE2). Hot row kernels and attention are also
 * compiled for x86-64-v3 (AVX2 + FMA) and the best clone is picked at load time (GCC function
 * multiversioning, an ifunc); helpers they call are always_inline so each clone gets its own. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(JDT_NO_CLONES)
#define JDT_RT_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define JDT_RT_CLONES
#endif
#define JDT_RT_INLINE static inline __attribute__((always_inline))

JDT_RT_INLINE float jdt_rt_sel(int c, float a, float b)
{
    uint32_t ua, ub, m = (uint32_t)0 - (uint32_t)c;
    memcpy(&ua, &a, 4);
    memcpy(&ub, &b, 4);
    ua = (ua & m) | (ub & ~m);
    memcpy(&a, &ua, 4);
    return a;
}

/* e^xc = y * 2^n (returns y, sets *n_out = n) for a finite xc in [-104, 88.8]: the Cody-Waite
 * reduction and the Cephes polynomial of both exps below */
JDT_RT_INLINE float jdt_rt_exp_reduced(float xc, float *n_out)
{
    /* round to nearest with the 1.5 * 2^23 trick: floorf is a call on baseline x86-64 */
    const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = xc - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    *n_out = n;
    return p * r * r + r + 1.0f;
}

JDT_RT_INLINE float jdt_rt_expf(float x)
{
    int hi = x > 88.8f, lo = x < -104.0f, nan = x != x;
    float xc = jdt_rt_sel(hi, 88.8f, jdt_rt_sel(lo, -104.0f, jdt_rt_sel(nan, 0.0f, x)));
    float n;
    float y = jdt_rt_exp_reduced(xc, &n);
    int32_t ni = (int32_t)n, n1 = ni >> 1, n2 = ni - n1; /* two factors: no overflow */
    uint32_t u1 = (uint32_t)(n1 + 127) << 23, u2 = (uint32_t)(n2 + 127) << 23;
    float f1, f2;
    memcpy(&f1, &u1, 4);
    memcpy(&f2, &u2, 4);
    y = y * f1 * f2;
    y = jdt_rt_sel(x > 88.7228394f, (float)INFINITY, jdt_rt_sel(x < -103.9720840f, 0.0f, y));
    return jdt_rt_sel(nan, x, y);
}

/* exp(x) where x <= 88 (or NaN), for the softmax rows (x - max <= 0) and the cross-entropy's
 * x - logsumexp: the same bits as jdt_rt_expf on [-87.3, 88] (the same reduction and
 * polynomial; every float of [-87.3, 0] checked), 0 below -87.3 (where jdt_rt_expf gives values
 * under 1.2e-38, nothing to a sum that holds a 1), NaN -> NaN. With no overflow to guard, one
 * power-of-two factor and two selects replace jdt_rt_expf's four: a softmax's exp loop 2.98 ->
 * 2.22 cycles an element (AVX2, docs/perf.md Session 47). x > 88 is outside its contract. */
JDT_RT_INLINE float jdt_rt_expf_le88(float x)
{
    const int lo = x < -87.3f, nan = x != x;
    float n;
    const float y = jdt_rt_exp_reduced(jdt_rt_sel(lo, -87.3f, x), &n);
    const uint32_t u = (uint32_t)((int32_t)n + 127) << 23; /* 2^n, n in [-126, 127] */
    float f;
    memcpy(&f, &u, 4);
    return jdt_rt_sel(nan, x, jdt_rt_sel(lo, 0.0f, y * f));
}

/* The sum of a[0, 16) folded in halves (a is overwritten): the end of a sum kept in 16 explicit
 * lanes, which adds in one order whatever the build's vector width (an `omp simd reduction`
 * adds in the order of its vectors and ends in a serial sum of their lanes). */
JDT_RT_INLINE float jdt_rt_fold_sum16(float *a)
{
#pragma omp simd
    for (int c = 0; c < 8; c++)
        a[c] += a[c + 8];
#pragma omp simd
    for (int c = 0; c < 4; c++)
        a[c] += a[c + 4];
    return (a[0] + a[2]) + (a[1] + a[3]);
}

/* f32 -> bf16 bits, nearest even; a NaN stays a quiet NaN (jdt_bf16_round's rule), with
 * integer selects and no call, so conversion loops vectorise (jdt_bf16_round is out of line:
 * a call per element, ~1 ns). */
JDT_RT_INLINE uint16_t jdt_rt_bf16_bits_inline(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t q = (u | 0x00400000u) >> 16, r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

/* bf16 bits -> f32 (exact), inline for vectorised widening loops */
JDT_RT_INLINE float jdt_rt_bf16_float_inline(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

#endif /* JDT_RUNTIME_IMPL_H */
