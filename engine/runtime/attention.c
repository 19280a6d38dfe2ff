/*
 * attention.c — memory-efficient causal attention for the CPU (see runtime.h).
 *
 * Forward: for each (batch, head) — the OpenMP loop — and each query row, keys are visited in
 * blocks of ATT_BC; a block's scores live in a small scratch row, and the running max, the
 * running denominator and the output accumulator are rescaled once per block (the online
 * softmax of Milakov & Gimelshein 2018, as used by FlashAttention). No T x T matrix exists.
 * Backward recomputes each row's log-sum-exp, then, per row i and key j <= i, recomputes
 * p = exp(s - lse) and accumulates dq, dk, dv; (batch, head) slices are disjoint, so threads
 * never share an output.
 */
#include "runtime/runtime.h"
#include "runtime/runtime-impl.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#define ATT_BC 64 /* keys per block */


int64_t jdt_rt_attention_scratch_floats(int64_t D, int64_t T, int nt)
{
    return (int64_t)(nt > 0 ? nt : 1) * (D + ATT_BC + 2 * T);
}

static inline __attribute__((always_inline)) float dot(const float *a, const float *b, int64_t n)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* One query row against keys [0, n_keys): writes o (D) and returns the row's log-sum-exp of the
 * scaled scores. acc (D) and s (ATT_BC) are scratch. */
static inline __attribute__((always_inline)) float attend_row(const float *qi, const float *k, const float *v, int64_t n_keys,
                        int64_t D, float scale, float *o, float *acc, float *s)
{
    float m = -INFINITY, l = 0.0f;
    memset(acc, 0, (size_t)D * sizeof(float));
    for (int64_t j0 = 0; j0 < n_keys; j0 += ATT_BC) {
        int64_t jn = n_keys - j0 < ATT_BC ? n_keys - j0 : ATT_BC;
        float bm = -INFINITY;
        for (int64_t jj = 0; jj < jn; jj++) {
            s[jj] = scale * dot(qi, k + (j0 + jj) * D, D);
            bm = s[jj] > bm ? s[jj] : bm;
        }
        float mn = bm > m ? bm : m;
        float corr = m == -INFINITY ? 0.0f : jdt_rt_expf(m - mn);
        l *= corr;
#pragma omp simd
        for (int64_t d = 0; d < D; d++) acc[d] *= corr;
        for (int64_t jj = 0; jj < jn; jj++) {
            float p = jdt_rt_expf(s[jj] - mn);
            const float *vj = v + (j0 + jj) * D;
            l += p;
#pragma omp simd
            for (int64_t d = 0; d < D; d++) acc[d] += p * vj[d];
        }
        m = mn;
    }
    if (o) {
        float inv = 1.0f / l;
        for (int64_t d = 0; d < D; d++) o[d] = acc[d] * inv;
    }
    return m + logf(l);
}

JDT_RT_CLONES void jdt_rt_attention(const float *q, const float *k, const float *v, float *o, int64_t B,
                      int64_t H, int64_t T, int64_t D, float scale, float *scratch, int nt)
{
    int64_t per = D + ATT_BC + 2 * T;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * H; bh++) {
        float *acc = scratch + (int64_t)omp_get_thread_num() * per, *s = acc + D;
        const float *qb = q + bh * T * D, *kb = k + bh * T * D, *vb = v + bh * T * D;
        for (int64_t i = 0; i < T; i++)
            attend_row(qb + i * D, kb, vb, i + 1, D, scale, o + bh * T * D + i * D, acc, s);
    }
}

JDT_RT_CLONES void jdt_rt_attention_bwd(const float *q, const float *k, const float *v, const float *o,
                          const float *dout, float *dqkv, int64_t B, int64_t H, int64_t T,
                          int64_t D, float scale, float *scratch, int nt)
{
    int64_t per = D + ATT_BC + 2 * T, n = B * H * T * D;
    float *dq = dqkv, *dk = dqkv + n, *dv = dqkv + 2 * n;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * H; bh++) {
        float *acc = scratch + (int64_t)omp_get_thread_num() * per, *s = acc + D;
        float *lse = s + ATT_BC, *delta = lse + T;
        int64_t off = bh * T * D;
        const float *qb = q + off, *kb = k + off, *vb = v + off, *ob = o + off, *gb = dout + off;
        float *dqb = dq + off, *dkb = dk + off, *dvb = dv + off;
        for (int64_t i = 0; i < T; i++) {
            lse[i] = attend_row(qb + i * D, kb, vb, i + 1, D, scale, NULL, acc, s);
            delta[i] = dot(gb + i * D, ob + i * D, D);
        }
        memset(dqb, 0, (size_t)(T * D) * sizeof(float));
        memset(dkb, 0, (size_t)(T * D) * sizeof(float));
        memset(dvb, 0, (size_t)(T * D) * sizeof(float));
        for (int64_t i = 0; i < T; i++) {
            const float *qi = qb + i * D, *gi = gb + i * D;
            float *dqi = dqb + i * D;
            for (int64_t j = 0; j <= i; j++) {
                const float *kj = kb + j * D, *vj = vb + j * D;
                float p = jdt_rt_expf(scale * dot(qi, kj, D) - lse[i]);
                float ds = p * (dot(gi, vj, D) - delta[i]) * scale;
                float *dkj = dkb + j * D, *dvj = dvb + j * D;
                /* dq, dk, dv and the inputs are disjoint arrays: safe to vectorise */
#pragma omp simd
                for (int64_t d = 0; d < D; d++) {
                    dqi[d] += ds * kj[d];
                    dkj[d] += ds * qi[d];
                    dvj[d] += p * gi[d];
                }
            }
        }
    }
}
