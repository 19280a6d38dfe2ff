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

#define ATT_BR 4 /* query rows processed together (they share every key/value load) */

/* Per-thread scratch: ATT_BR accumulators (D) and score rows (ATT_BC), plus lse and delta (T)
 * for the backward pass. */
static int64_t att_per_thread(int64_t D, int64_t T)
{
    return ATT_BR * (D + ATT_BC) + 2 * T;
}

int64_t jdt_rt_attention_scratch_floats(int64_t D, int64_t T, int nt)
{
    return (int64_t)(nt > 0 ? nt : 1) * att_per_thread(D, T);
}

static inline __attribute__((always_inline)) float dot(const float *a, const float *b, int64_t n)
{
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* One query row against keys [0, n_keys): writes o (D) and returns the row's log-sum-exp of the
 * scaled scores. acc (D) and s (ATT_BC) are scratch. */
static inline __attribute__((always_inline)) float attend_row(const float *qi, const float *k,
                                                              const float *v, int64_t n_keys,
                                                              int64_t D, float scale, float *o,
                                                              float *acc, float *s)
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
        for (int64_t d = 0; d < D; d++)
            acc[d] *= corr;
        for (int64_t jj = 0; jj < jn; jj++) {
            float p = jdt_rt_expf(s[jj] - mn);
            const float *vj = v + (j0 + jj) * D;
            l += p;
#pragma omp simd
            for (int64_t d = 0; d < D; d++)
                acc[d] += p * vj[d];
        }
        m = mn;
    }
    if (o) {
        float inv = 1.0f / l;
        for (int64_t d = 0; d < D; d++)
            o[d] = acc[d] * inv;
    }
    return m + logf(l);
}

/* ATT_BR query rows i0..i0+3 at once: per key block, the 4 score rows are computed with each
 * key loaded once, then each row's running max/denominator is updated and the 4 accumulators
 * take p * v_j with each value row loaded once. Keys beyond a row's diagonal score -inf. */
JDT_RT_INLINE void attend_rows4(const float *q4, const float *k, const float *v, int64_t i0,
                                int64_t D, float scale, float *o4, float *acc, float *s)
{
    float m[ATT_BR], l[ATT_BR];
    const float *q0 = q4, *q1 = q4 + D, *q2 = q4 + 2 * D, *q3 = q4 + 3 * D;
    for (int r = 0; r < ATT_BR; r++)
        m[r] = -INFINITY, l[r] = 0.0f;
    memset(acc, 0, sizeof(float) * (size_t)(ATT_BR * D));
    int64_t n_keys = i0 + ATT_BR;
    for (int64_t j0 = 0; j0 < n_keys; j0 += ATT_BC) {
        int64_t jn = n_keys - j0 < ATT_BC ? n_keys - j0 : ATT_BC;
        for (int64_t jj = 0; jj < jn; jj++) {
            const float *kj = k + (j0 + jj) * D;
            float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
            for (int64_t d = 0; d < D; d++) {
                s0 += q0[d] * kj[d];
                s1 += q1[d] * kj[d];
                s2 += q2[d] * kj[d];
                s3 += q3[d] * kj[d];
            }
            int64_t j = j0 + jj;
            s[0 * ATT_BC + jj] = j <= i0 ? scale * s0 : -INFINITY;
            s[1 * ATT_BC + jj] = j <= i0 + 1 ? scale * s1 : -INFINITY;
            s[2 * ATT_BC + jj] = j <= i0 + 2 ? scale * s2 : -INFINITY;
            s[3 * ATT_BC + jj] = j <= i0 + 3 ? scale * s3 : -INFINITY;
        }
        for (int r = 0; r < ATT_BR; r++) {
            float *sr = s + r * ATT_BC, bm = -INFINITY;
            for (int64_t jj = 0; jj < jn; jj++)
                bm = sr[jj] > bm ? sr[jj] : bm;
            float mn = bm > m[r] ? bm : m[r];
            float corr = m[r] == -INFINITY ? 0.0f : jdt_rt_expf(m[r] - mn);
            l[r] *= corr;
            float *ar = acc + r * D;
#pragma omp simd
            for (int64_t d = 0; d < D; d++)
                ar[d] *= corr;
            for (int64_t jj = 0; jj < jn; jj++) {
                sr[jj] = jdt_rt_expf(sr[jj] - mn); /* now p */
                l[r] += sr[jj];
            }
            m[r] = mn;
        }
        for (int64_t jj = 0; jj < jn; jj++) {
            const float *vj = v + (j0 + jj) * D;
            float p0 = s[jj], p1 = s[ATT_BC + jj], p2 = s[2 * ATT_BC + jj], p3 = s[3 * ATT_BC + jj];
            float *a0 = acc, *a1 = acc + D, *a2 = acc + 2 * D, *a3 = acc + 3 * D;
#pragma omp simd
            for (int64_t d = 0; d < D; d++) {
                a0[d] += p0 * vj[d];
                a1[d] += p1 * vj[d];
                a2[d] += p2 * vj[d];
                a3[d] += p3 * vj[d];
            }
        }
    }
    for (int r = 0; r < ATT_BR; r++) {
        float inv = 1.0f / l[r];
        for (int64_t d = 0; d < D; d++)
            o4[r * D + d] = acc[r * D + d] * inv;
    }
}

JDT_RT_CLONES void jdt_rt_attention(const float *q, const float *k, const float *v, float *o,
                                    int64_t B, int64_t H, int64_t T, int64_t D, float scale,
                                    float *scratch, int nt)
{
    int64_t per = att_per_thread(D, T);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * H; bh++) {
        float *acc = scratch + (int64_t)omp_get_thread_num() * per, *s = acc + ATT_BR * D;
        const float *qb = q + bh * T * D, *kb = k + bh * T * D, *vb = v + bh * T * D;
        float *ob = o + bh * T * D;
        int64_t i = 0;
        for (; i + ATT_BR <= T; i += ATT_BR)
            attend_rows4(qb + i * D, kb, vb, i, D, scale, ob + i * D, acc, s);
        for (; i < T; i++)
            attend_row(qb + i * D, kb, vb, i + 1, D, scale, ob + i * D, acc, s);
    }
}

/* Log-sum-exp of the scaled, causally masked scores of rows i0..i0+3 (online, one pass). */
JDT_RT_INLINE void lse_rows4(const float *q4, const float *k, int64_t i0, int64_t D, float scale,
                             float *lse4)
{
    const float *q0 = q4, *q1 = q4 + D, *q2 = q4 + 2 * D, *q3 = q4 + 3 * D;
    float m[ATT_BR], l[ATT_BR];
    for (int r = 0; r < ATT_BR; r++)
        m[r] = -INFINITY, l[r] = 0.0f;
    for (int64_t j = 0; j < i0 + ATT_BR; j++) {
        const float *kj = k + j * D;
        float sc[ATT_BR] = {0.0f, 0.0f, 0.0f, 0.0f}, s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
        for (int64_t d = 0; d < D; d++) {
            s0 += q0[d] * kj[d];
            s1 += q1[d] * kj[d];
            s2 += q2[d] * kj[d];
            s3 += q3[d] * kj[d];
        }
        sc[0] = s0, sc[1] = s1, sc[2] = s2, sc[3] = s3;
        for (int r = 0; r < ATT_BR; r++) {
            if (j > i0 + r) continue;
            float x = scale * sc[r];
            if (x > m[r]) {
                l[r] = l[r] * jdt_rt_expf(m[r] - x) + 1.0f;
                m[r] = x;
            } else {
                l[r] += jdt_rt_expf(x - m[r]);
            }
        }
    }
    for (int r = 0; r < ATT_BR; r++)
        lse4[r] = m[r] + logf(l[r]);
}

/* Backward for rows i0..i0+3: per key j, the 8 dot products (q.k and do.v of 4 rows) share one
 * load of k_j and v_j, and dk_j, dv_j are updated once with the 4 rows' contributions. */
JDT_RT_INLINE void bwd_rows4(const float *q, const float *k, const float *v, const float *g,
                             float *dq, float *dk, float *dv, int64_t i0, int64_t D, float scale,
                             const float *lse4, const float *delta4)
{
    const float *q0 = q + i0 * D, *q1 = q0 + D, *q2 = q0 + 2 * D, *q3 = q0 + 3 * D;
    const float *g0 = g + i0 * D, *g1 = g0 + D, *g2 = g0 + 2 * D, *g3 = g0 + 3 * D;
    float *dq0 = dq + i0 * D, *dq1 = dq0 + D, *dq2 = dq0 + 2 * D, *dq3 = dq0 + 3 * D;
    for (int64_t j = 0; j < i0 + ATT_BR; j++) {
        const float *kj = k + j * D, *vj = v + j * D;
        float s0 = 0, s1 = 0, s2 = 0, s3 = 0, t0 = 0, t1 = 0, t2 = 0, t3 = 0;
#pragma omp simd reduction(+ : s0, s1, s2, s3, t0, t1, t2, t3)
        for (int64_t d = 0; d < D; d++) {
            s0 += q0[d] * kj[d];
            s1 += q1[d] * kj[d];
            s2 += q2[d] * kj[d];
            s3 += q3[d] * kj[d];
            t0 += g0[d] * vj[d];
            t1 += g1[d] * vj[d];
            t2 += g2[d] * vj[d];
            t3 += g3[d] * vj[d];
        }
        float sv[ATT_BR] = {s0, s1, s2, s3}, tv[ATT_BR] = {t0, t1, t2, t3}, p[ATT_BR], ds[ATT_BR];
        for (int r = 0; r < ATT_BR; r++) {
            p[r] = j <= i0 + r ? jdt_rt_expf(scale * sv[r] - lse4[r]) : 0.0f;
            ds[r] = p[r] * (tv[r] - delta4[r]) * scale;
        }
        float *dkj = dk + j * D, *dvj = dv + j * D;
        float p0 = p[0], p1 = p[1], p2 = p[2], p3 = p[3];
        float e0 = ds[0], e1 = ds[1], e2 = ds[2], e3 = ds[3];
#pragma omp simd
        for (int64_t d = 0; d < D; d++) {
            float kd = kj[d];
            dq0[d] += e0 * kd;
            dq1[d] += e1 * kd;
            dq2[d] += e2 * kd;
            dq3[d] += e3 * kd;
            dkj[d] += e0 * q0[d] + e1 * q1[d] + e2 * q2[d] + e3 * q3[d];
            dvj[d] += p0 * g0[d] + p1 * g1[d] + p2 * g2[d] + p3 * g3[d];
        }
    }
}

JDT_RT_CLONES void jdt_rt_attention_bwd(const float *q, const float *k, const float *v,
                                        const float *o, const float *dout, float *dqkv, int64_t B,
                                        int64_t H, int64_t T, int64_t D, float scale,
                                        float *scratch, int nt)
{
    int64_t per = att_per_thread(D, T), n = B * H * T * D;
    float *dq = dqkv, *dk = dqkv + n, *dv = dqkv + 2 * n;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * H; bh++) {
        float *acc = scratch + (int64_t)omp_get_thread_num() * per, *s = acc + ATT_BR * D;
        float *lse = s + ATT_BR * ATT_BC, *delta = lse + T;
        int64_t off = bh * T * D;
        const float *qb = q + off, *kb = k + off, *vb = v + off, *ob = o + off, *gb = dout + off;
        float *dqb = dq + off, *dkb = dk + off, *dvb = dv + off;
        int64_t i = 0;
        for (; i + ATT_BR <= T; i += ATT_BR)
            lse_rows4(qb + i * D, kb, i, D, scale, lse + i);
        for (; i < T; i++)
            lse[i] = attend_row(qb + i * D, kb, vb, i + 1, D, scale, NULL, acc, s);
        for (i = 0; i < T; i++)
            delta[i] = dot(gb + i * D, ob + i * D, D);
        memset(dqb, 0, (size_t)(T * D) * sizeof(float));
        memset(dkb, 0, (size_t)(T * D) * sizeof(float));
        memset(dvb, 0, (size_t)(T * D) * sizeof(float));
        for (i = 0; i + ATT_BR <= T; i += ATT_BR)
            bwd_rows4(qb, kb, vb, gb, dqb, dkb, dvb, i, D, scale, lse + i, delta + i);
        for (; i < T; i++) {
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
