/*
 * cuk_attention.cu — flash-style causal attention for the CUDA backend, forward and backward,
 * f32 with FMA (the tensor-core version is cuk_attention_tc.cu). Same semantics as
 * jdt_rt_attention / jdt_rt_attention_bwd (engine/runtime/runtime.h): q k v (B, H, T, D) or,
 * per bit of bthd, (B, T, H, D); outputs (B, H, T, D); causal; scores scaled by `scale`. q, k
 * and v are f32, or bf16 bit patterns (the _b kernels), widened as they are loaded. Grouped-query
 * attention (cuk_att_group: G query heads per key/value head, bthd bits 8 and up): k, v, dk and
 * dv have H / G heads; the dK/dV kernel's block owns keys of one key/value head and streams the
 * queries of each head of its group in turn, so dk and dv sum over the group as they accumulate.
 *
 * Mapping: a block owns R = 32 rows (queries, or keys in the dK/dV kernel), 4 consecutive lanes
 * per row; lane `sub` of a row holds the row's elements d = sub + 4*i in registers (so a dot
 * product is a 4-lane shuffle reduction). The other side streams through shared memory in tiles
 * of CT rows (K and V; or Q and dO), each tile read by every row of the block. DM is the largest
 * D a variant handles (64, 128, 256; CT shrinks as DM grows so the tiles stay 32 KiB).
 *
 *   forward: online softmax over key tiles: m, l and the output accumulator rescaled per tile.
 *   stats:   per query row L = logsumexp(scores) and delta = dO . O (into the scratch).
 *   dQ:      per query block over key tiles: p = exp(s - L), ds = p (dO.v - delta), dq += ds k.
 *   dK, dV:  per key block over query tiles i >= j: dv += p dO, dk += ds q.
 * The three backward kernels recompute the scores instead of storing P (no T x T matrix) and
 * write disjoint outputs (no atomics: deterministic). Query/key blocks are visited heaviest
 * first. Rows past T compute on zeros and write nothing; every thread reaches every barrier.
 */
#include "cuk_common.cuh"

#define ATT_R 32   /* rows per block */
#define ATT_TPR 4  /* threads per row */
#define ATT_THREADS (ATT_R * ATT_TPR)

/* Element offset of row t of slice (b, h) for input `bit`: (B, H, T, D), or (B, T, H, D) when
 * that bit of bthd is set. */
__device__ __forceinline__ i64 att_row(unsigned bthd, int bit, i64 b, i64 h, i64 t, i64 H, i64 T,
                                       i64 D)
{
    return (bthd >> bit & 1u) ? ((b * T + t) * H + h) * D : ((b * H + h) * T + t) * D;
}

/* Sum over the 4 lanes of a row (all lanes of the warp must call it). */
__device__ __forceinline__ float att_row_sum(float v)
{
    v += __shfl_xor_sync(CUK_FULL, v, 1);
    v += __shfl_xor_sync(CUK_FULL, v, 2);
    return v;
}

/* tile (CT, D) = rows t0..t0+CT-1 of input `bit` of slice (b, h), times mul; rows >= T zero.
 * A thread's columns are fixed over the rows it loads (DM / TPR columns, every RP-th row): no
 * division per element, one multiply per row, and the unrolled passes keep several loads in
 * flight where a loop of one element per pass waited for each. */
template <int CT, int DM, class TX>
__device__ __forceinline__ void att_load_tile(float *tile, const TX *x, unsigned bthd, int bit,
                                              i64 b, i64 h, i64 t0, i64 H, i64 T, i64 D, float mul)
{
    constexpr int TPR = DM < ATT_THREADS ? DM : ATT_THREADS; /* threads per row */
    constexpr int RP = ATT_THREADS / TPR, CPT = DM / TPR;     /* rows per pass, columns */
    static_assert(CT % RP == 0 && DM % TPR == 0, "whole passes");
    const i64 rs = (bthd >> bit & 1u) ? H * D : D; /* elements from one row to the next */
    const i64 base = att_row(bthd, bit, b, h, t0, H, T, D);
    const int r = threadIdx.x / TPR, d0 = threadIdx.x % TPR;
#pragma unroll 4
    for (int k = 0; k < CT / RP; k++) {
        const int c = r + k * RP;
        const bool in = t0 + c < T;
#pragma unroll
        for (int m = 0; m < CPT; m++) {
            const int d = d0 + m * TPR;
            if (d < D) tile[c * D + d] = in ? cuk_ld(x, base + c * rs + d) * mul : 0.0f;
        }
    }
}

/* regs[i] = x row element sub + 4 i (times mul), 0 past D or for an inactive row. */
template <int DM, class TX>
__device__ __forceinline__ void att_load_row(float *regs, const TX *x, i64 off, i64 D, int sub,
                                             bool act, float mul)
{
#pragma unroll
    for (int i = 0; i < DM / 4; i++) {
        i64 d = sub + 4 * i;
        regs[i] = act && d < D ? cuk_ld(x, off + d) * mul : 0.0f;
    }
}

/* Partial dot of the lane's share of a row with tile row jj (reduce with att_row_sum). */
template <int DM>
__device__ __forceinline__ float att_dot(const float *regs, const float *tile, i64 jj, i64 D, int sub)
{
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < DM / 4; i++) {
        i64 d = sub + 4 * i;
        if (d < D) s += regs[i] * tile[jj * D + d];
    }
    return s;
}

template <int DM>
__device__ __forceinline__ void att_axpy(float *acc, float a, const float *tile, i64 jj, i64 D, int sub)
{
#pragma unroll
    for (int i = 0; i < DM / 4; i++) {
        i64 d = sub + 4 * i;
        if (d < D) acc[i] += a * tile[jj * D + d];
    }
}

template <int DM, int CT, class TQ>
__device__ void att_fwd(const TQ *q, const TQ *k, const TQ *v, float *o, void *o2, int o2b,
                        float *lse, i64 B, i64 H, i64 T, i64 D, float scale, unsigned bthd)
{
    CUK_DYN_SMEM(float, smem);
    float *Ks = smem, *Vs = smem + CT * D;
    int r = threadIdx.x / ATT_TPR, sub = threadIdx.x % ATT_TPR;
    i64 nqb = (T + ATT_R - 1) / ATT_R;
    for (i64 blk = blockIdx.x; blk < B * H * nqb; blk += gridDim.x) {
        i64 bh = blk / nqb, qb = nqb - 1 - blk % nqb, b = bh / H, h = bh % H;
        const i64 G = cuk_att_group(bthd), hk = h / G, Hk = H / G; /* k and v's head */
        i64 i = qb * ATT_R + r;
        bool act = i < T;
        float qr[DM / 4], acc[DM / 4];
        att_load_row<DM>(qr, q, act ? att_row(bthd, 0, b, h, i, H, T, D) : 0, D, sub, act, scale);
#pragma unroll
        for (int u = 0; u < DM / 4; u++)
            acc[u] = 0.0f;
        float m = CUK_NEG_INF, l = 0.0f;
        i64 kend = min(T, (qb + 1) * ATT_R);
        for (i64 j0 = 0; j0 < kend; j0 += CT) {
            __syncthreads(); /* the previous tile has been consumed */
            att_load_tile<CT, DM>(Ks, k, bthd, 1, b, hk, j0, Hk, T, D, 1.0f);
            att_load_tile<CT, DM>(Vs, v, bthd, 2, b, hk, j0, Hk, T, D, 1.0f);
            __syncthreads();
            float s[CT], mt = CUK_NEG_INF;
#pragma unroll
            for (int jj = 0; jj < CT; jj++) {
                float dot = att_row_sum(att_dot<DM>(qr, Ks, jj, D, sub));
                s[jj] = act && j0 + jj <= i ? dot : CUK_NEG_INF;
                mt = fmaxf(mt, s[jj]);
            }
            float mn = fmaxf(m, mt);
            if (mn == CUK_NEG_INF) continue; /* inactive row (or nothing visible yet) */
            float alpha = expf(m - mn);      /* m = -inf on the first tile: 0 */
            l *= alpha;
#pragma unroll
            for (int u = 0; u < DM / 4; u++)
                acc[u] *= alpha;
#pragma unroll
            for (int jj = 0; jj < CT; jj++) {
                float p = expf(s[jj] - mn);
                l += p;
                att_axpy<DM>(acc, p, Vs, jj, D, sub);
            }
            m = mn;
        }
        if (act) {
            float inv = 1.0f / l;
            float *orow = o + (bh * T + i) * D;
#pragma unroll
            for (int u = 0; u < DM / 4; u++) {
                i64 d = sub + 4 * u;
                if (d >= D) continue;
                orow[d] = acc[u] * inv;
                if (o2) cuk_att_store2(o2, o2b, b, h, i, d, H, T, D, orow[d]);
            }
            if (lse && sub == 0) lse[bh * T + i] = m + logf(l); /* att_stats' L */
        }
    }
}

/* Per query row: stats[bh*T + i] = logsumexp of the scaled causal scores, and
 * stats[B*H*T + bh*T + i] = dO_i . O_i. */
template <int DM, int CT, class TQ>
__device__ void att_stats(const TQ *q, const TQ *k, const float *o, const float *dout,
                          float *stats, i64 B, i64 H, i64 T, i64 D, float scale, unsigned bthd)
{
    CUK_DYN_SMEM(float, smem);
    float *Ks = smem;
    int r = threadIdx.x / ATT_TPR, sub = threadIdx.x % ATT_TPR;
    i64 nqb = (T + ATT_R - 1) / ATT_R;
    for (i64 blk = blockIdx.x; blk < B * H * nqb; blk += gridDim.x) {
        i64 bh = blk / nqb, qb = nqb - 1 - blk % nqb, b = bh / H, h = bh % H;
        const i64 G = cuk_att_group(bthd), hk = h / G, Hk = H / G; /* k and v's head */
        i64 i = qb * ATT_R + r;
        bool act = i < T;
        float qr[DM / 4], tmp[DM / 4];
        att_load_row<DM>(qr, o, act ? att_row(bthd, 3, b, h, i, H, T, D) : 0, D, sub, act, 1.0f);
        att_load_row<DM>(tmp, dout, act ? att_row(bthd, 4, b, h, i, H, T, D) : 0, D, sub, act, 1.0f);
        float delta = 0.0f;
#pragma unroll
        for (int u = 0; u < DM / 4; u++)
            delta += qr[u] * tmp[u];
        delta = att_row_sum(delta);
        att_load_row<DM>(qr, q, act ? att_row(bthd, 0, b, h, i, H, T, D) : 0, D, sub, act, scale);
        float m = CUK_NEG_INF, l = 0.0f;
        i64 kend = min(T, (qb + 1) * ATT_R);
        for (i64 j0 = 0; j0 < kend; j0 += CT) {
            __syncthreads();
            att_load_tile<CT, DM>(Ks, k, bthd, 1, b, hk, j0, Hk, T, D, 1.0f);
            __syncthreads();
            float s[CT], mt = CUK_NEG_INF;
#pragma unroll
            for (int jj = 0; jj < CT; jj++) {
                float dot = att_row_sum(att_dot<DM>(qr, Ks, jj, D, sub));
                s[jj] = act && j0 + jj <= i ? dot : CUK_NEG_INF;
                mt = fmaxf(mt, s[jj]);
            }
            float mn = fmaxf(m, mt);
            if (mn == CUK_NEG_INF) continue;
            l *= expf(m - mn);
#pragma unroll
            for (int jj = 0; jj < CT; jj++)
                l += expf(s[jj] - mn);
            m = mn;
        }
        if (act && sub == 0) {
            stats[bh * T + i] = m + logf(l);
            stats[B * H * T + bh * T + i] = delta;
        }
    }
}

/* Row r's share of an accumulator (elements d = sub + 4 i) times mul into stage (ATT_R rows of
 * stride D + 4 f32, over the tiles' shared memory: the launcher sizes it for both) for
 * cuk_att_grads_out. Every thread calls it: it begins and ends with __syncthreads. */
template <int DM>
__device__ __forceinline__ void att_stage(float *stage, const float *acc, float mul, int r, int sub,
                                          i64 D)
{
    __syncthreads();
#pragma unroll
    for (int u = 0; u < DM / 4; u++) {
        i64 d = sub + 4 * u;
        if (d < D) stage[r * (D + 4) + d] = acc[u] * mul;
    }
    __syncthreads();
}

/* dq (B, H, T, D) from the stats, or, when lse (the forward's log-sum-exp) is not NULL, from
 * lse and dO . O formed here as att_stats would (which then does not run), both also stored in
 * stats for the dK/dV kernel. */
template <int DM, int CT, class TQ>
__device__ void att_dq(const TQ *q, const TQ *k, const TQ *v, const float *o, const float *dout,
                       const float *lse, float *stats, float *dq, void *g2, int g2b, double g2rot,
                       int g2inv, float *part, i64 B, i64 H, i64 T, i64 D, float scale,
                       unsigned bthd)
{
    CUK_DYN_SMEM(float, smem);
    float *Ks = smem, *Vs = smem + CT * D;
    int r = threadIdx.x / ATT_TPR, sub = threadIdx.x % ATT_TPR;
    i64 nqb = (T + ATT_R - 1) / ATT_R;
    for (i64 blk = blockIdx.x; blk < B * H * nqb; blk += gridDim.x) {
        i64 bh = blk / nqb, qb = nqb - 1 - blk % nqb, b = bh / H, h = bh % H;
        const i64 G = cuk_att_group(bthd), hk = h / G, Hk = H / G; /* k and v's head */
        i64 i = qb * ATT_R + r;
        bool act = i < T;
        float qr[DM / 4], gr[DM / 4], acc[DM / 4];
        att_load_row<DM>(gr, dout, act ? att_row(bthd, 4, b, h, i, H, T, D) : 0, D, sub, act, 1.0f);
        float L, delta;
        if (lse) { /* the statistics here, as att_stats forms them (uniform over the grid) */
            att_load_row<DM>(qr, o, act ? att_row(bthd, 3, b, h, i, H, T, D) : 0, D, sub, act, 1.0f);
            delta = 0.0f;
#pragma unroll
            for (int u = 0; u < DM / 4; u++)
                delta += qr[u] * gr[u];
            delta = att_row_sum(delta); /* 0 for an inactive row (zeros loaded) */
            L = act ? lse[bh * T + i] : 0.0f;
            if (act && sub == 0) {
                stats[bh * T + i] = L;
                stats[B * H * T + bh * T + i] = delta;
            }
        } else {
            L = act ? stats[bh * T + i] : 0.0f;
            delta = act ? stats[B * H * T + bh * T + i] : 0.0f;
        }
        att_load_row<DM>(qr, q, act ? att_row(bthd, 0, b, h, i, H, T, D) : 0, D, sub, act, scale);
#pragma unroll
        for (int u = 0; u < DM / 4; u++)
            acc[u] = 0.0f;
        i64 kend = min(T, (qb + 1) * ATT_R);
        for (i64 j0 = 0; j0 < kend; j0 += CT) {
            __syncthreads();
            att_load_tile<CT, DM>(Ks, k, bthd, 1, b, hk, j0, Hk, T, D, 1.0f);
            att_load_tile<CT, DM>(Vs, v, bthd, 2, b, hk, j0, Hk, T, D, 1.0f);
            __syncthreads();
#pragma unroll 4
            for (int jj = 0; jj < CT; jj++) {
                float s = att_row_sum(att_dot<DM>(qr, Ks, jj, D, sub));
                float dp = att_row_sum(att_dot<DM>(gr, Vs, jj, D, sub));
                float p = act && j0 + jj <= i ? expf(s - L) : 0.0f;
                att_axpy<DM>(acc, p * (dp - delta), Ks, jj, D, sub);
            }
        }
        if (g2 || part) { /* the cotangent form (uniform over the grid) */
            att_stage<DM>(smem, acc, scale, r, sub, D);
            cuk_att_grads_out<ATT_R>(smem, (int)D + 4, dq, g2, g2b, g2rot, g2inv, part, b, h,
                                     qb * ATT_R, H, T, D);
            continue;
        }
        if (act) {
            float *row = dq + (bh * T + i) * D;
#pragma unroll
            for (int u = 0; u < DM / 4; u++) {
                i64 d = sub + 4 * u;
                if (d < D) row[d] = acc[u] * scale;
            }
        }
    }
}

/* dk, dv (B, H / G, T, D) from the stats: rows are keys, tiles stream queries i >= the block's
 * first key, of each query head of the key/value head's group in turn. */
template <int DM, int CT, class TQ>
__device__ void att_dkv(const TQ *q, const TQ *k, const TQ *v, const float *dout,
                        const float *stats, float *dk, float *dv, void *k2, void *v2, int kv2b,
                        double k2rot, double v2rot, int kv2inv, float *kpart, float *vpart, i64 B,
                        i64 H, i64 T, i64 D, float scale, unsigned bthd)
{
    CUK_DYN_SMEM(float, smem);
    float *Qs = smem, *Gs = smem + CT * D, *Ls = smem + 2 * CT * D, *Ds = Ls + CT;
    int r = threadIdx.x / ATT_TPR, sub = threadIdx.x % ATT_TPR;
    i64 nkb = (T + ATT_R - 1) / ATT_R;
    const i64 G = cuk_att_group(bthd), Hk = H / G;
    for (i64 blk = blockIdx.x; blk < B * Hk * nkb; blk += gridDim.x) {
        i64 bk = blk / nkb, kb = blk % nkb, b = bk / Hk, hk = bk % Hk;
        i64 j = kb * ATT_R + r;
        bool act = j < T;
        float kr[DM / 4], vr[DM / 4], ak[DM / 4], av[DM / 4];
        att_load_row<DM>(kr, k, act ? att_row(bthd, 1, b, hk, j, Hk, T, D) : 0, D, sub, act, 1.0f);
        att_load_row<DM>(vr, v, act ? att_row(bthd, 2, b, hk, j, Hk, T, D) : 0, D, sub, act, 1.0f);
#pragma unroll
        for (int u = 0; u < DM / 4; u++)
            ak[u] = av[u] = 0.0f;
        for (i64 h = hk * G; h < (hk + 1) * G; h++) { /* each query head of the group */
            const i64 bh = b * H + h;
            for (i64 i0 = (kb * ATT_R) / CT * CT; i0 < T; i0 += CT) {
                __syncthreads();
                att_load_tile<CT, DM>(Qs, q, bthd, 0, b, h, i0, H, T, D, scale);
                att_load_tile<CT, DM>(Gs, dout, bthd, 4, b, h, i0, H, T, D, 1.0f);
                for (int c = threadIdx.x; c < CT; c += blockDim.x) {
                    bool in = i0 + c < T;
                    Ls[c] = in ? stats[bh * T + i0 + c] : 0.0f;
                    Ds[c] = in ? stats[B * H * T + bh * T + i0 + c] : 0.0f;
                }
                __syncthreads();
#pragma unroll 4
                for (int ii = 0; ii < CT; ii++) {
                    float s = att_row_sum(att_dot<DM>(kr, Qs, ii, D, sub));
                    float dp = att_row_sum(att_dot<DM>(vr, Gs, ii, D, sub));
                    i64 i = i0 + ii;
                    float p = act && i >= j && i < T ? expf(s - Ls[ii]) : 0.0f;
                    att_axpy<DM>(av, p, Gs, ii, D, sub);
                    att_axpy<DM>(ak, p * (dp - Ds[ii]), Qs, ii, D, sub); /* Qs is pre-scaled */
                }
            }
        }
        if (k2 || v2 || kpart || vpart) { /* the cotangent form (uniform over the grid) */
            att_stage<DM>(smem, av, 1.0f, r, sub, D);
            cuk_att_grads_out<ATT_R>(smem, (int)D + 4, dv, v2, kv2b >> 1 & 1, v2rot,
                                     kv2inv >> 1 & 1, vpart, b, hk, kb * ATT_R, Hk, T, D);
            att_stage<DM>(smem, ak, 1.0f, r, sub, D);
            cuk_att_grads_out<ATT_R>(smem, (int)D + 4, dk, k2, kv2b & 1, k2rot, kv2inv & 1, kpart,
                                     b, hk, kb * ATT_R, Hk, T, D);
            continue;
        }
        if (act) {
            float *rk = dk + (bk * T + j) * D, *rv = dv + (bk * T + j) * D;
#pragma unroll
            for (int u = 0; u < DM / 4; u++) {
                i64 d = sub + 4 * u;
                if (d < D) {
                    rk[d] = ak[u];
                    rv[d] = av[u];
                }
            }
        }
    }
}

/* Entry points, one per head-size class and q/k/v type (f32, or bf16 bit patterns: the _b
 * kernels, for q, k, v a bf16 GEMM stored as bf16 under precision.activations: bf16; o, dO and
 * the outputs stay f32). Block: ATT_THREADS threads; dynamic shared memory: (2 * CT * D + 2 *
 * CT) floats, at least ATT_R (D + 4) for the backward's staging (the launcher computes it). */
#define ATT_VARIANT(DM, CT, TQ, SFX)                                                               \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                      \
        cuk_att_fwd##SFX##_d##DM(const TQ *q, const TQ *k, const TQ *v, float *o, void *o2,        \
                                 int o2b, float *lse, i64 B, i64 H, i64 T, i64 D, float scale,     \
                                 unsigned bthd)                                                    \
    {                                                                                              \
        att_fwd<DM, CT>(q, k, v, o, o2, o2b, lse, B, H, T, D, scale, bthd);                        \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                      \
        cuk_att_stats##SFX##_d##DM(const TQ *q, const TQ *k, const float *o, const float *dout,    \
                                   float *stats, i64 B, i64 H, i64 T, i64 D, float scale,          \
                                   unsigned bthd)                                                  \
    {                                                                                              \
        att_stats<DM, CT>(q, k, o, dout, stats, B, H, T, D, scale, bthd);                          \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                      \
        cuk_att_dq##SFX##_d##DM(const TQ *q, const TQ *k, const TQ *v, const float *o,             \
                                const float *dout, const float *lse, float *stats, float *dq,      \
                                void *g2, int g2b, double g2rot, int g2inv, float *part, i64 B,    \
                                i64 H, i64 T, i64 D, float scale, unsigned bthd)                   \
    {                                                                                              \
        att_dq<DM, CT>(q, k, v, o, dout, lse, stats, dq, g2, g2b, g2rot, g2inv, part, B, H, T, D,  \
                       scale, bthd);                                                               \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(ATT_THREADS)                                      \
        cuk_att_dkv##SFX##_d##DM(const TQ *q, const TQ *k, const TQ *v, const float *dout,         \
                                 const float *stats, float *dk, float *dv, void *k2, void *v2,     \
                                 int kv2b, double k2rot, double v2rot, int kv2inv, float *kpart,   \
                                 float *vpart, i64 B, i64 H, i64 T, i64 D, float scale,            \
                                 unsigned bthd)                                                    \
    {                                                                                              \
        att_dkv<DM, CT>(q, k, v, dout, stats, dk, dv, k2, v2, kv2b, k2rot, v2rot, kv2inv, kpart,   \
                        vpart, B, H, T, D, scale, bthd);                                           \
    }

ATT_VARIANT(64, 64, float, )
ATT_VARIANT(128, 32, float, )
ATT_VARIANT(256, 16, float, )
ATT_VARIANT(64, 64, unsigned short, _b)
ATT_VARIANT(128, 32, unsigned short, _b)
ATT_VARIANT(256, 16, unsigned short, _b)
