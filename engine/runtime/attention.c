/*
 * attention.c — memory-efficient causal attention for the CPU (see runtime.h), built on small
 * SGEMMs.
 *
 * Each (batch, head) slice is one task of an OpenMP loop (slices are disjoint, so threads never
 * share an output; OpenBLAS's OpenMP build runs the GEMMs of a task single-threaded inside the
 * parallel region). Queries are taken in blocks of ATT_BQ rows; a block only attends to keys
 * [0, end of block), so its causal score rows fit a (ATT_BQ, T) scratch tile and the softmax of
 * each row is exact (no running rescale): no T x T matrix exists, scratch is O(ATT_BQ * T) per
 * thread.
 *
 *   forward:  S = scale * Q_b K^T (GEMM), P = masked row softmax of S, O_b = P V (GEMM)
 *   backward: recompute P as above; dP = dO_b V^T; delta_i = dO_i . O_i;
 *             dS = P * (dP - delta) * scale;  dQ_b = dS K;  dK += dS^T Q_b;  dV += P^T dO_b
 *
 * Rows of a block beyond their diagonal get p = 0 (and so dS = 0): the upper triangle of the
 * diagonal block is computed by the GEMM and discarded, a waste of at most ATT_BQ / T of the
 * work. Row softmax uses the vectorisable exp of runtime-impl.h.
 *
 * bf16 compute (`precision.compute: bf16`): the same blocks, with every GEMM a small bf16 GEMM
 * of gemm_bf16.c (inputs rounded to bf16, f32 accumulation): q, k, v, dout, the probabilities P
 * and dS are rounded where they enter a product; scores, the softmax, delta and dS are computed
 * in f32. A head's k and v are packed once for all its query blocks. The forward leaves each
 * row's exps unnormalised and scales them by 1 / sum as it packs them (the same bits as
 * normalising first, one pass over the tile less).
 *
 * bf16 q, k, v (JDT_RT_ATT_QKV_BF16 in bthd: precision.activations: bf16, whose projections
 * store bf16, passes.c fold_bf16_casts): each head's q, k and v are widened into the thread's
 * scratch, rows back to back, and the head proceeds as with f32 inputs holding those values
 * (the same bits: widening is exact, and bf16 compute's rounding of a bf16 value is itself).
 * The step reads 2 bytes an element of them instead of 4, and the kernel that widened them
 * for the whole batch goes.
 *
 * The saved log-sum-exp (lse, passes.c fold_attention_lse): the forward stores each row's
 * L = max + log(sum) and the backward recomputes P = exp(s - L) in one pass instead of the
 * row max, the exps and their sum, and the normalisation (FlashAttention's statistics). P then
 * differs from the forward's by the rounding of L (an f32 ulp or so), so a P rounded to bf16
 * can land on the neighbouring bf16 value.
 */
#include "runtime/runtime.h"
#include "runtime/runtime-impl.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#define ATT_BQ 64 /* query rows per block */

/* The bf16 attention's second build: AVX-512 with 512-bit vectors (GCC keeps 256 for x86-64-v4
 * and -march=native on these CPUs), taken where the bf16 tiles are native (AVX512-BF16, so
 * AVX512-F/BW/VL, AVX2 and FMA are there too). Its exps, softmax sums and dS ran 10-18% faster
 * than the x86-64-v3 clone at T 1024 on 2 threads of a Sapphire Rapids box (docs/perf.md,
 * Session 50); its 16-lane sums round differently from the 8-lane ones. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10 &&           \
    !defined(JDT_NO_CLONES)
#define ATT_AVX512                                                                                 \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,"                         \
                          "prefer-vector-width=512")))
#endif

/* Element offset and row stride of slice bh = b * H + h of input bit `bit`: (B, H, T, D)
 * contiguous, or (B, T, H, D) when the bit is set in bthd. */
JDT_RT_INLINE int64_t slice_off(unsigned bthd, int bit, int64_t bh, int64_t H, int64_t T, int64_t D,
                                int *ld)
{
    if (bthd >> bit & 1u) {
        *ld = (int)(H * D);
        return (bh / H) * T * H * D + (bh % H) * D;
    }
    *ld = (int)D;
    return bh * T * D;
}

JDT_RT_INLINE const float *slice_of(const float *x, unsigned bthd, int bit, int64_t bh, int64_t H,
                                    int64_t T, int64_t D, int *ld)
{
    return x + slice_off(bthd, bit, bh, H, T, D, ld);
}

/* A thread's widened q, k and v of one head (bf16 inputs): 3 (T, D) f32 slices */
static int64_t att_widened(int64_t D, int64_t T, bool qkv_bf16)
{
    return qkv_bf16 ? 3 * T * D : 0;
}

/* bthd's bf16 bit set: head bh's q, k, v (read as bits 0-2 of bthd say) widened into w, (T, D)
 * each, and their slices pointed there (row stride D); else the slices of the f32 inputs. */
JDT_RT_INLINE void head_qkv(const void *q, const void *k, const void *v, unsigned bthd, int64_t bh,
                            int64_t H, int64_t T, int64_t D, float *w, const float **qb,
                            const float **kb, const float **vb, int *lq, int *lk, int *lv)
{
    if (!(bthd & JDT_RT_ATT_QKV_BF16)) {
        *qb = slice_of(q, bthd, 0, bh, H, T, D, lq);
        *kb = slice_of(k, bthd, 1, bh, H, T, D, lk);
        *vb = slice_of(v, bthd, 2, bh, H, T, D, lv);
        return;
    }
    const void *in[3] = {q, k, v};
    const float **out[3] = {qb, kb, vb};
    int *ld[3] = {lq, lk, lv};
    for (int i = 0; i < 3; i++) {
        int rs; /* the source's row stride */
        const uint16_t *src = (const uint16_t *)in[i] + slice_off(bthd, i, bh, H, T, D, &rs);
        float *dst = w + i * T * D;
        for (int64_t t = 0; t < T; t++)
#pragma omp simd
            for (int64_t d = 0; d < D; d++)
                dst[t * D + d] = jdt_rt_bf16_float_inline(src[t * rs + d]);
        *out[i] = dst;
        *ld[i] = (int)D;
    }
}

/* Per-thread scratch: the score/probability tile and the dP tile (ATT_BQ, T). */
static int64_t att_per_thread(int64_t D, int64_t T)
{
    (void)D;
    return 2 * ATT_BQ * T + 16;
}

/* bf16: the two tiles, three packs of a head's k / v, one A pack and one B pack of a block. */
static int64_t att_pack_b_max(int64_t D, int64_t T)
{
    int64_t x = jdt_rt_bf16_pack_b_floats(D, T), y = jdt_rt_bf16_pack_b_floats(T, D);
    return x > y ? x : y;
}

static int64_t att_pack_a_max(int64_t D, int64_t T)
{
    int64_t x = jdt_rt_bf16_pack_a_floats(ATT_BQ, D > T ? D : T);
    int64_t y = jdt_rt_bf16_pack_a_floats(T, ATT_BQ);
    return x > y ? x : y;
}

static int64_t att_per_thread_bf16(int64_t D, int64_t T)
{
    return 2 * ATT_BQ * T + 3 * att_pack_b_max(D, T) + att_pack_a_max(D, T) +
           jdt_rt_bf16_pack_b_floats(ATT_BQ, D) + 16;
}

int64_t jdt_rt_attention_scratch_floats(int64_t D, int64_t T, int nt, bool bf16, bool qkv_bf16)
{
    return (int64_t)(nt > 0 ? nt : 1) * ((bf16 ? att_per_thread_bf16(D, T) : att_per_thread(D, T)) +
                                         att_widened(D, T, qkv_bf16));
}

/* The rows' loops run in chunks of ATT_VL lanes. A row's valid keys (i0 + r + 1 of the row's
 * n_keys) seldom end on a chunk: the chunk holding the last one is computed whole, the lanes
 * past it selected away (the tile's row goes on to n_keys, so the chunk reads and writes inside
 * it; a select instead of a masked load or store, which GCC vectorised in one inlining of these
 * loops and not another). At T 256 a remainder done one key at a time, up to 15 exps a row,
 * took more of the bf16 forward than its vector exps. Only a chunk that would cross the row's
 * end (n_keys not a multiple of ATT_VL) goes a key at a time. Sums and maxima are kept in
 * ATT_VL lanes folded in halves (an `omp simd reduction` ended each row in a serial sum of its
 * lanes): the lanes are explicit, so an AVX2 build (two 8-lane vectors) and an AVX-512 one (one
 * of 16) sum in the same order, to the same bits. */
#define ATT_VL 16

/* The largest of a[0, ATT_VL) (a is overwritten; a NaN is never taken) */
JDT_RT_INLINE float fold_max(float *a)
{
#pragma omp simd
    for (int c = 0; c < 8; c++)
        a[c] = a[c + 8] > a[c] ? a[c + 8] : a[c];
#pragma omp simd
    for (int c = 0; c < 4; c++)
        a[c] = a[c + 4] > a[c] ? a[c + 4] : a[c];
    const float x = a[2] > a[0] ? a[2] : a[0], y = a[3] > a[1] ? a[3] : a[1];
    return y > x ? y : x;
}

/* The largest of s[0, n) that compares greater than -inf (a NaN is never taken, as in one
 * running max); s[n, n_row) may be read and is ignored. Two chunks of lanes keep two compare
 * chains in flight (one running max chained every compare through one register:
 * softmax_causal_rows' max pass took a third of the bf16 forward's own time that way). */
JDT_RT_INLINE float row_max(const float *s, int64_t n, int64_t n_row)
{
    float mm[2 * ATT_VL];
    for (int c = 0; c < 2 * ATT_VL; c++)
        mm[c] = -INFINITY;
    int64_t j = 0;
    for (; j + 2 * ATT_VL <= n; j += 2 * ATT_VL)
#pragma omp simd
        for (int c = 0; c < 2 * ATT_VL; c++)
            mm[c] = s[j + c] > mm[c] ? s[j + c] : mm[c];
    for (; j < n; j += ATT_VL) {
        const int64_t rem = n - j;
        if (j + ATT_VL <= n_row) {
#pragma omp simd
            for (int c = 0; c < ATT_VL; c++) {
                const float y = jdt_rt_sel(c < rem, s[j + c], -INFINITY);
                mm[c] = y > mm[c] ? y : mm[c];
            }
        } else {
            for (int c = 0; c < rem; c++)
                mm[c] = s[j + c] > mm[c] ? s[j + c] : mm[c];
        }
    }
#pragma omp simd
    for (int c = 0; c < ATT_VL; c++)
        mm[c] = mm[c + ATT_VL] > mm[c] ? mm[c + ATT_VL] : mm[c];
    return fold_max(mm);
}

/* Row s[0, n_keys) of a block: s[j] = exp(s[j] - sub) for j < nv, 0 for later keys; returns
 * the sum of the exps. */
JDT_RT_INLINE float exp_row(float *s, int64_t nv, int64_t n_keys, float sub)
{
    float acc[ATT_VL] = {0};
    int64_t j = 0;
    for (; j + ATT_VL <= nv; j += ATT_VL)
#pragma omp simd
        for (int c = 0; c < ATT_VL; c++) {
            const float e = jdt_rt_expf_le88(s[j + c] - sub);
            s[j + c] = e;
            acc[c] += e;
        }
    if (j < nv) { /* the chunk with the last valid key */
        const int64_t rem = nv - j;
        if (j + ATT_VL <= n_keys) {
#pragma omp simd
            for (int c = 0; c < ATT_VL; c++) {
                const int in = c < rem;
                const float y = jdt_rt_expf_le88(jdt_rt_sel(in, s[j + c], sub) - sub);
                const float e = jdt_rt_sel(in, y, 0.0f);
                s[j + c] = e;
                acc[c] += e;
            }
            j += ATT_VL;
        } else {
            for (int c = 0; c < rem; c++) {
                s[j + c] = jdt_rt_expf_le88(s[j + c] - sub);
                acc[c] += s[j + c];
            }
            j = nv;
        }
    }
    for (; j < n_keys; j++)
        s[j] = 0.0f;
    return jdt_rt_fold_sum16(acc);
}

/* S (nq, n_keys) holds scale * q.k of rows i0..i0+nq-1; turns each row r into exp(s - max)
 * over its causal keys [0, i0 + r] (later keys 0) and sets inv[r] to 1 / the row's sum: the
 * softmax is row r times inv[r]. lse: NULL, or row r's log-sum-exp to lse[r]. */
JDT_RT_INLINE void exp_causal_rows(float *S, int64_t nq, int64_t n_keys, int64_t i0, float *inv,
                                   float *lse)
{
    for (int64_t r = 0; r < nq; r++) {
        float *s = S + r * n_keys;
        const int64_t nv = i0 + r + 1; /* valid keys */
        const float m = row_max(s, nv, n_keys), l = exp_row(s, nv, n_keys, m);
        inv[r] = 1.0f / l;
        if (lse) lse[r] = m + logf(l);
    }
}

/* exp_causal_rows, then each row's valid keys scaled by its inv: the causal softmax in place */
JDT_RT_INLINE void softmax_causal_rows(float *S, int64_t nq, int64_t n_keys, int64_t i0, float *lse)
{
    float inv[ATT_BQ];
    exp_causal_rows(S, nq, n_keys, i0, inv, lse);
    for (int64_t r = 0; r < nq; r++) {
        float *s = S + r * n_keys;
        const float f = inv[r];
        const int64_t nv = i0 + r + 1;
        int64_t j = 0;
        for (; j + ATT_VL <= nv; j += ATT_VL)
#pragma omp simd
            for (int c = 0; c < ATT_VL; c++)
                s[j + c] *= f;
        const int64_t rem = nv - j;
        if (rem > 0 && j + ATT_VL <= n_keys) {
#pragma omp simd
            for (int c = 0; c < ATT_VL; c++) {
                const float x = s[j + c];
                s[j + c] = jdt_rt_sel(c < rem, x * f, x);
            }
        } else {
            for (int c = 0; c < rem; c++)
                s[j + c] *= f;
        }
    }
}

/* The backward's probabilities from the forward's log-sum-exp: row r of S becomes
 * exp(s - lse[r]) over its causal keys (later keys 0), one pass where softmax_causal_rows takes
 * three. s - lse <= 0 up to rounding (lse >= max), inside jdt_rt_expf_le88's range. */
JDT_RT_INLINE void probs_from_lse(float *S, int64_t nq, int64_t n_keys, int64_t i0,
                                  const float *lse)
{
    for (int64_t r = 0; r < nq; r++)
        (void)exp_row(S + r * n_keys, i0 + r + 1, n_keys, lse[r]);
}

/* The backward's P for a block: from the forward's log-sum-exp when it was kept, else the
 * softmax again. */
JDT_RT_INLINE void block_probs(float *P, int64_t nq, int64_t nk, int64_t i0, const float *lse)
{
    if (lse)
        probs_from_lse(P, nq, nk, i0, lse + i0);
    else
        softmax_causal_rows(P, nq, nk, i0, NULL);
}

/* The bf16 forward of head bh: k packed as B of q k^T and v as B of P v; per block of queries
 * the q block and P packed as A. S: the thread's scratch (att_per_thread_bf16 + att_widened). */
JDT_RT_INLINE void attention_bf16_head(const void *q, const void *k, const void *v, float *o,
                                       float *lse, int64_t bh, int64_t H, int64_t T, int64_t D,
                                       float scale, unsigned bthd, float *S)
{
    const int64_t pb = att_pack_b_max(D, T);
    float *kp = S + 2 * ATT_BQ * T, *vp = kp + pb, *ap = vp + 2 * pb, inv[ATT_BQ];
    int lq, lk, lv;
    const float *qb, *kb, *vb;
    head_qkv(q, k, v, bthd, bh, H, T, D, S + att_per_thread_bf16(D, T), &qb, &kb, &vb, &lq, &lk,
             &lv);
    float *ob = o + bh * T * D;
    jdt_rt_bf16_pack_b(kb, lk, true, D, T, kp);  /* B(d, j) = k[j][d] */
    jdt_rt_bf16_pack_b(vb, lv, false, T, D, vp); /* B(j, d) = v[j][d] */
    for (int64_t i0 = 0; i0 < T; i0 += ATT_BQ) {
        int64_t nq = T - i0 < ATT_BQ ? T - i0 : ATT_BQ, nk = i0 + nq;
        jdt_rt_bf16_pack_a(qb + i0 * lq, lq, false, nq, D, ap);
        jdt_rt_bf16_gemm_packed(ap, kp, T, nq, nk, D, scale, 0.0f, S, nk);
        /* P = the rows' exps times their 1 / sum, scaled as they are packed */
        exp_causal_rows(S, nq, nk, i0, inv, lse ? lse + bh * T + i0 : NULL);
        jdt_rt_bf16_pack_a_scaled(S, nk, nq, nk, inv, ap);
        jdt_rt_bf16_gemm_packed(ap, vp, D, nq, D, nk, 1.0f, 0.0f, ob + i0 * D, D);
    }
}

/* The bf16 forward, a head a task. Built twice: the generic clones, and (ATT_AVX512) for
 * AVX-512 with 512-bit vectors, which jdt_rt_attention takes where jdt_rt_bf16_tiles_native().
 * The task loop is written out in each: an OpenMP region's body is outlined with the target of
 * the function it is in, so one shared loop would run every head at that one target. */
JDT_RT_CLONES static void attention_bf16(const void *q, const void *k, const void *v, float *o,
                                         float *lse, int64_t B, int64_t H, int64_t T, int64_t D,
                                         float scale, unsigned bthd, float *scratch, int nt)
{
    const int64_t per = att_per_thread_bf16(D, T) + att_widened(D, T, bthd & JDT_RT_ATT_QKV_BF16);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * H; bh++)
        attention_bf16_head(q, k, v, o, lse, bh, H, T, D, scale, bthd,
                            scratch + (int64_t)omp_get_thread_num() * per);
}

#ifdef ATT_AVX512
ATT_AVX512 static void attention_bf16_avx512(const void *q, const void *k, const void *v, float *o,
                                             float *lse, int64_t B, int64_t H, int64_t T, int64_t D,
                                             float scale, unsigned bthd, float *scratch, int nt)
{
    const int64_t per = att_per_thread_bf16(D, T) + att_widened(D, T, bthd & JDT_RT_ATT_QKV_BF16);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * H; bh++)
        attention_bf16_head(q, k, v, o, lse, bh, H, T, D, scale, bthd,
                            scratch + (int64_t)omp_get_thread_num() * per);
}
#endif

JDT_RT_CLONES void jdt_rt_attention(const void *q, const void *k, const void *v, float *o,
                                    float *lse, int64_t B, int64_t H, int64_t T, int64_t D,
                                    float scale, unsigned bthd, bool bf16, float *scratch, int nt)
{
    const bool w16 = bthd & JDT_RT_ATT_QKV_BF16;
    int64_t per = att_per_thread(D, T) + att_widened(D, T, w16);
    if (B * H * T * D == 0) return;
    if (bf16) {
#ifdef ATT_AVX512
        if (jdt_rt_bf16_tiles_native()) {
            attention_bf16_avx512(q, k, v, o, lse, B, H, T, D, scale, bthd, scratch, nt);
            return;
        }
#endif
        attention_bf16(q, k, v, o, lse, B, H, T, D, scale, bthd, scratch, nt);
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * H; bh++) {
        float *S = scratch + (int64_t)omp_get_thread_num() * per;
        int lq, lk, lv;
        const float *qb, *kb, *vb;
        head_qkv(q, k, v, bthd, bh, H, T, D, S + att_per_thread(D, T), &qb, &kb, &vb, &lq, &lk,
                 &lv);
        float *ob = o + bh * T * D;
        for (int64_t i0 = 0; i0 < T; i0 += ATT_BQ) {
            int64_t nq = T - i0 < ATT_BQ ? T - i0 : ATT_BQ, nk = i0 + nq;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nq, (int)nk, (int)D, scale,
                        qb + i0 * lq, lq, kb, lk, 0.0f, S, (int)nk);
            softmax_causal_rows(S, nq, nk, i0, lse ? lse + bh * T + i0 : NULL);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nq, (int)D, (int)nk, 1.0f,
                        S, (int)nk, vb, lv, 0.0f, ob + i0 * D, (int)D);
        }
    }
}

/* One head's slices for the backward: the five inputs with their row strides, and its dq,
 * dk, dv blocks of dqkv, dk and dv zeroed (they accumulate over query blocks). */
typedef struct {
    const float *q, *k, *v, *o, *g;
    int lq, lk, lv, lo, lg;
    float *dq, *dk, *dv;
} att_head;

JDT_RT_INLINE void att_head_bwd(att_head *h, const void *q, const void *k, const void *v,
                                const float *o, const float *dout, float *dqkv, unsigned bthd,
                                int64_t bh, int64_t B, int64_t H, int64_t T, int64_t D, float *w)
{
    const int64_t n = B * H * T * D, off = bh * T * D;
    head_qkv(q, k, v, bthd, bh, H, T, D, w, &h->q, &h->k, &h->v, &h->lq, &h->lk, &h->lv);
    h->o = slice_of(o, bthd, 3, bh, H, T, D, &h->lo);
    h->g = slice_of(dout, bthd, 4, bh, H, T, D, &h->lg);
    h->dq = dqkv + off;
    h->dk = dqkv + n + off;
    h->dv = dqkv + 2 * n + off;
    memset(h->dk, 0, (size_t)(T * D) * sizeof(float));
    memset(h->dv, 0, (size_t)(T * D) * sizeof(float));
}

/* delta_i = dO_i . O_i and dS = P * (dP - delta) * scale over a block's rows, into dP. */
JDT_RT_INLINE void att_ds(const float *P, float *dP, const float *gi, int lg, const float *ob,
                          int lo, int64_t i0, int64_t nq, int64_t nk, int64_t D, float scale)
{
    for (int64_t r = 0; r < nq; r++) {
        const float *gr = gi + r * lg, *orow = ob + (i0 + r) * lo;
        float dl[ATT_VL] = {0};
        int64_t d = 0;
        for (; d + ATT_VL <= D; d += ATT_VL)
#pragma omp simd
            for (int c = 0; c < ATT_VL; c++)
                dl[c] += gr[d + c] * orow[d + c];
        for (int c = 0; d + c < D; c++) /* D not a multiple of ATT_VL */
            dl[c] += gr[d + c] * orow[d + c];
        const float delta = jdt_rt_fold_sum16(dl);
        const float *pr = P + r * nk;
        float *dpr = dP + r * nk;
#pragma omp simd
        for (int64_t j = 0; j < nk; j++)
            dpr[j] = pr[j] * (dpr[j] - delta) * scale;
    }
}

/* The bf16 backward of head bh: k packed as B of q k^T and of dS k, v as B of dO v^T; per block
 * q, dO, P^T, dS and dS^T packed as A, dO and q as B. P: the thread's scratch. */
JDT_RT_INLINE void attention_bwd_bf16_head(const void *q, const void *k, const void *v,
                                           const float *o, const float *lse, const float *dout,
                                           float *dqkv, int64_t bh, int64_t B, int64_t H, int64_t T,
                                           int64_t D, float scale, unsigned bthd, float *P)
{
    const int64_t pb = att_pack_b_max(D, T);
    float *dP = P + ATT_BQ * T;
    float *kpt = dP + ATT_BQ * T, *vpt = kpt + pb, *kp = vpt + pb, *ap = kp + pb;
    float *bq = ap + att_pack_a_max(D, T);
    att_head h;
    att_head_bwd(&h, q, k, v, o, dout, dqkv, bthd, bh, B, H, T, D, P + att_per_thread_bf16(D, T));
    const float *qb = h.q, *kb = h.k, *vb = h.v, *ob = h.o, *gb = h.g;
    const int lq = h.lq, lk = h.lk, lv = h.lv, lo = h.lo, lg = h.lg;
    float *dqb = h.dq, *dkb = h.dk, *dvb = h.dv;
    jdt_rt_bf16_pack_b(kb, lk, true, D, T, kpt); /* B(d, j) = k[j][d] */
    jdt_rt_bf16_pack_b(vb, lv, true, D, T, vpt); /* B(d, j) = v[j][d] */
    jdt_rt_bf16_pack_b(kb, lk, false, T, D, kp); /* B(j, d) = k[j][d] */
    for (int64_t i0 = 0; i0 < T; i0 += ATT_BQ) {
        int64_t nq = T - i0 < ATT_BQ ? T - i0 : ATT_BQ, nk = i0 + nq;
        const float *qi = qb + i0 * lq, *gi = gb + i0 * lg;
        jdt_rt_bf16_pack_a(qi, lq, false, nq, D, ap);
        jdt_rt_bf16_gemm_packed(ap, kpt, T, nq, nk, D, scale, 0.0f, P, nk);
        block_probs(P, nq, nk, i0, lse ? lse + bh * T : NULL);
        jdt_rt_bf16_pack_a(gi, lg, false, nq, D, ap);
        jdt_rt_bf16_gemm_packed(ap, vpt, T, nq, nk, D, 1.0f, 0.0f, dP, nk);
        att_ds(P, dP, gi, lg, ob, lo, i0, nq, nk, D, scale);
        /* dV += P^T dO_b */
        jdt_rt_bf16_pack_a(P, nk, true, nk, nq, ap);
        jdt_rt_bf16_pack_b(gi, lg, false, nq, D, bq);
        jdt_rt_bf16_gemm_packed(ap, bq, D, nk, D, nq, 1.0f, 1.0f, dvb, D);
        /* dQ_b = dS K */
        jdt_rt_bf16_pack_a(dP, nk, false, nq, nk, ap);
        jdt_rt_bf16_gemm_packed(ap, kp, D, nq, D, nk, 1.0f, 0.0f, dqb + i0 * D, D);
        /* dK += dS^T Q_b */
        jdt_rt_bf16_pack_a(dP, nk, true, nk, nq, ap);
        jdt_rt_bf16_pack_b(qi, lq, false, nq, D, bq);
        jdt_rt_bf16_gemm_packed(ap, bq, D, nk, D, nq, 1.0f, 1.0f, dkb, D);
    }
}

/* The bf16 backward, a head a task, built twice as the forward */
JDT_RT_CLONES static void attention_bwd_bf16(const void *q, const void *k, const void *v,
                                             const float *o, const float *lse, const float *dout,
                                             float *dqkv, int64_t B, int64_t H, int64_t T,
                                             int64_t D, float scale, unsigned bthd, float *scratch,
                                             int nt)
{
    const int64_t per = att_per_thread_bf16(D, T) + att_widened(D, T, bthd & JDT_RT_ATT_QKV_BF16);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * H; bh++)
        attention_bwd_bf16_head(q, k, v, o, lse, dout, dqkv, bh, B, H, T, D, scale, bthd,
                                scratch + (int64_t)omp_get_thread_num() * per);
}

#ifdef ATT_AVX512
ATT_AVX512 static void attention_bwd_bf16_avx512(const void *q, const void *k, const void *v,
                                                 const float *o, const float *lse,
                                                 const float *dout, float *dqkv, int64_t B,
                                                 int64_t H, int64_t T, int64_t D, float scale,
                                                 unsigned bthd, float *scratch, int nt)
{
    const int64_t per = att_per_thread_bf16(D, T) + att_widened(D, T, bthd & JDT_RT_ATT_QKV_BF16);
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * H; bh++)
        attention_bwd_bf16_head(q, k, v, o, lse, dout, dqkv, bh, B, H, T, D, scale, bthd,
                                scratch + (int64_t)omp_get_thread_num() * per);
}
#endif

JDT_RT_CLONES void jdt_rt_attention_bwd(const void *q, const void *k, const void *v, const float *o,
                                        const float *lse, const float *dout, float *dqkv, int64_t B,
                                        int64_t H, int64_t T, int64_t D, float scale, unsigned bthd,
                                        bool bf16, float *scratch, int nt)
{
    const bool w16 = bthd & JDT_RT_ATT_QKV_BF16;
    int64_t per = att_per_thread(D, T) + att_widened(D, T, w16), n = B * H * T * D;
    if (n == 0) return;
    if (bf16) {
#ifdef ATT_AVX512
        if (jdt_rt_bf16_tiles_native()) {
            attention_bwd_bf16_avx512(q, k, v, o, lse, dout, dqkv, B, H, T, D, scale, bthd, scratch,
                                      nt);
            return;
        }
#endif
        attention_bwd_bf16(q, k, v, o, lse, dout, dqkv, B, H, T, D, scale, bthd, scratch, nt);
        return;
    }
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (int64_t bh = 0; bh < B * H; bh++) {
        float *P = scratch + (int64_t)omp_get_thread_num() * per, *dP = P + ATT_BQ * T;
        att_head h;
        att_head_bwd(&h, q, k, v, o, dout, dqkv, bthd, bh, B, H, T, D, P + att_per_thread(D, T));
        const float *qb = h.q, *kb = h.k, *vb = h.v, *ob = h.o, *gb = h.g;
        const int lq = h.lq, lk = h.lk, lv = h.lv, lo = h.lo, lg = h.lg;
        float *dqb = h.dq, *dkb = h.dk, *dvb = h.dv;
        for (int64_t i0 = 0; i0 < T; i0 += ATT_BQ) {
            int64_t nq = T - i0 < ATT_BQ ? T - i0 : ATT_BQ, nk = i0 + nq;
            const float *qi = qb + i0 * lq, *gi = gb + i0 * lg;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nq, (int)nk, (int)D, scale,
                        qi, lq, kb, lk, 0.0f, P, (int)nk);
            block_probs(P, nq, nk, i0, lse ? lse + bh * T : NULL);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nq, (int)nk, (int)D, 1.0f, gi,
                        lg, vb, lv, 0.0f, dP, (int)nk);
            att_ds(P, dP, gi, lg, ob, lo, i0, nq, nk, D, scale);
            /* dV += P^T dO_b, dQ_b = dS K, dK += dS^T Q_b */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nk, (int)D, (int)nq, 1.0f, P,
                        (int)nk, gi, lg, 1.0f, dvb, (int)D);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)nq, (int)D, (int)nk, 1.0f,
                        dP, (int)nk, kb, lk, 0.0f, dqb + i0 * D, (int)D);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nk, (int)D, (int)nq, 1.0f, dP,
                        (int)nk, qi, lq, 1.0f, dkb, (int)D);
        }
    }
}
