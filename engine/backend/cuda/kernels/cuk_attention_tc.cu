/*
 * cuk_attention_tc.cu — causal attention on tensor cores for bf16 compute (ATTENTION's bf16
 * flag, precision.compute: bf16), forward and backward, sm_80 and newer. The semantics of
 * jdt_rt_attention / jdt_rt_attention_bwd with bf16 = true (engine/runtime/runtime.h): every
 * product's inputs (q, k, v, dO, the probabilities, dS) rounded to bf16 (nearest even,
 * cuk_bf16_bits), products accumulated in f32 by mma.sync.m16n8k16 (bf16 x bf16 -> f32); the
 * softmax, its statistics and dS in f32. Same layouts as cuk_attention.cu (bthd bit i: input i
 * stored (B, T, H, D)); outputs (B, H, T, D). Head sizes up to 128 (the launcher, cuk.c, uses
 * cuk_attention.cu beyond that and below sm_80).
 *
 * Mapping (FlashAttention-2's): a block of 4 warps owns TC_BR = 64 rows (queries; keys in the
 * dK/dV kernel), a warp 16 of them; the other side streams through shared memory in tiles of
 * BC rows, rounded to bf16 once as it is stored (row-major, and transposed where a product
 * needs the tile as its k x n operand). The warp's rows sit in registers as mma A fragments;
 * scores come out in C fragments, whose layout is the A layout of the next product (P V, dS K,
 * ...), so probabilities never leave registers. Fragment layouts are PTX's for m16n8k16
 * (lane = 4 * group + t: A rows group and group + 8, columns 2t, 2t + 1 and + 8; B columns
 * group, rows 2t, 2t + 1 and + 8; C rows group and group + 8, columns 2t, 2t + 1).
 *
 *   forward: online softmax per key tile: m, l and the output accumulator rescaled per tile.
 *   stats:   per query row L = logsumexp(scores) (the forward without P V) and delta = dO . O.
 *   dQ:      per query block over key tiles: p = exp(s - L), ds = p (dO.v - delta), dq += ds k.
 *   dK, dV:  per key block over query tiles i >= the block's first key: dv += p dO, dk += ds q.
 * As in cuk_attention.cu the backward recomputes the scores (no T x T matrix) and its kernels
 * write disjoint outputs (no atomics: deterministic). Rows past T compute on zeros and write
 * nothing; a warp whose rows are all masked from a tile skips its products (warp-uniform, so
 * every lane still reaches every __syncthreads). Not yet: ldmatrix, cp.async double buffering,
 * bf16-stored inputs (the inputs are f32 and converted as tiles are stored).
 */
#include "cuk_common.cuh"

#define TC_BR 64 /* rows per block */
#define TC_THREADS 128

/* d (16 x 8, f32) += a (16 x 16, bf16) b (16 x 8, bf16): one warp, every lane. The host
 * emulation (check_cuk) defines JDT_CUK_EMU and its own cuk_mma_bf16 with these layouts. */
#ifndef JDT_CUK_EMU
__device__ __forceinline__ void cuk_mma_bf16(float d[4], const unsigned a[4], const unsigned b[2])
{
#if __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    __trap(); /* the launcher picks these kernels on sm_80+ only */
#endif
}
#endif

__device__ __forceinline__ float tc_shfl_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(CUK_FULL, v, 1));
    return fmaxf(v, __shfl_xor_sync(CUK_FULL, v, 2));
}

__device__ __forceinline__ float tc_shfl_sum(float v)
{
    v += __shfl_xor_sync(CUK_FULL, v, 1);
    return v + __shfl_xor_sync(CUK_FULL, v, 2);
}

/* Two f32 rounded to bf16, lo in the low half: one 32-bit fragment register. */
__device__ __forceinline__ unsigned tc_pack(float lo, float hi)
{
    return (unsigned)cuk_bf16_bits(lo) | (unsigned)cuk_bf16_bits(hi) << 16;
}

__device__ __forceinline__ unsigned tc_u32(const unsigned short *p)
{
    return *(const unsigned *)p;
}

/* Element offset of row t of slice (b, h) for input `bit` (as cuk_attention.cu's att_row). */
__device__ __forceinline__ i64 tc_row(unsigned bthd, int bit, i64 b, i64 h, i64 t, i64 H, i64 T,
                                      i64 D)
{
    return (bthd >> bit & 1u) ? ((b * T + t) * H + h) * D : ((b * H + h) * T + t) * D;
}

/* Rows t0..t0+R-1 of input `bit` of slice (b, h) rounded to bf16 into X (R x DM, row stride
 * lx) and/or Xt (DM x R, its transpose, row stride lt); zeros past T and past D. */
template <int R, int DM>
__device__ __forceinline__ void tc_load(unsigned short *X, int lx, unsigned short *Xt, int lt,
                                        const float *x, unsigned bthd, int bit, i64 b, i64 h,
                                        i64 t0, i64 H, i64 T, i64 D)
{
    for (int e = threadIdx.x; e < R * DM; e += blockDim.x) {
        int r = e / DM, d = e - r * DM;
        i64 t = t0 + r;
        unsigned short u = 0;
        if (t < T && d < D) u = cuk_bf16_bits(x[tc_row(bthd, bit, b, h, t, H, T, D) + d]);
        if (X) X[r * lx + d] = u;
        if (Xt) Xt[d * lt + r] = u;
    }
}

/* A fragment (16 x 16) of row-major X at rows r0.., columns k0... */
__device__ __forceinline__ void tc_frag_a(unsigned a[4], const unsigned short *X, int lx, int r0,
                                          int k0, int g, int t)
{
    const unsigned short *p = X + (r0 + g) * lx + k0 + 2 * t;
    a[0] = tc_u32(p);
    a[1] = tc_u32(p + 8 * lx);
    a[2] = tc_u32(p + 8);
    a[3] = tc_u32(p + 8 * lx + 8);
}

/* B fragment (16 x 8, k x n) of a matrix stored n-major: Y[n][k] (row stride ly), n0.., k0... */
__device__ __forceinline__ void tc_frag_b(unsigned b[2], const unsigned short *Y, int ly, int n0,
                                          int k0, int g, int t)
{
    const unsigned short *p = Y + (n0 + g) * ly + k0 + 2 * t;
    b[0] = tc_u32(p);
    b[1] = tc_u32(p + 8);
}

/* The block's TC_BR rows from row r0 of input bx (x) and, unless y is null, of input by (y), as
 * the A fragments of each warp's 16 rows (xa, ya: DM / 16 each), staged through sm (TC_BR
 * (DM + 8) halves per input). Begins and ends with __syncthreads: every thread calls it. */
template <int DM>
__device__ __forceinline__ void tc_rows_a(unsigned (*xa)[4], unsigned (*ya)[4], unsigned short *sm,
                                          const float *x, int bx, const float *y, int by,
                                          unsigned bthd, i64 b, i64 h, i64 r0, i64 H, i64 T, i64 D)
{
    constexpr int L = DM + 8;
    int w = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
    __syncthreads(); /* the previous block's tiles have been consumed */
    tc_load<TC_BR, DM>(sm, L, nullptr, 0, x, bthd, bx, b, h, r0, H, T, D);
    if (y) tc_load<TC_BR, DM>(sm + TC_BR * L, L, nullptr, 0, y, bthd, by, b, h, r0, H, T, D);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < DM / 16; kk++) {
        tc_frag_a(xa[kk], sm, L, w * 16, kk * 16, g, t);
        if (y) tc_frag_a(ya[kk], sm + TC_BR * L, L, w * 16, kk * 16, g, t);
    }
}

/* C fragments c[N/8] (16 x N) of the warp as the A fragment of k-step kk (columns 16 kk..). */
__device__ __forceinline__ void tc_c_to_a(unsigned a[4], const float (*c)[4], int kk)
{
    a[0] = tc_pack(c[2 * kk][0], c[2 * kk][1]);
    a[1] = tc_pack(c[2 * kk][2], c[2 * kk][3]);
    a[2] = tc_pack(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[3] = tc_pack(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

/* c[N/8] = A (the warp's 16 x DM rows, fragments a) times Y^T, Y (N x DM) stored row-major. */
template <int DM, int N>
__device__ __forceinline__ void tc_rows_by(float (*c)[4], const unsigned (*a)[4],
                                           const unsigned short *Y, int ly, int g, int t)
{
#pragma unroll
    for (int nt = 0; nt < N / 8; nt++) {
        c[nt][0] = c[nt][1] = c[nt][2] = c[nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < DM / 16; kk++) {
            unsigned bf[2];
            tc_frag_b(bf, Y, ly, nt * 8, kk * 16, g, t);
            cuk_mma_bf16(c[nt], a[kk], bf);
        }
    }
}

/* acc[DM/8] += P (the warp's 16 x N C fragments p) times Z (N x DM), Z stored transposed
 * (Zt: DM x N, row stride lz). */
template <int DM, int N>
__device__ __forceinline__ void tc_acc_by(float (*acc)[4], const float (*p)[4],
                                          const unsigned short *Zt, int lz, int g, int t)
{
#pragma unroll
    for (int kk = 0; kk < N / 16; kk++) {
        unsigned pa[4];
        tc_c_to_a(pa, p, kk);
#pragma unroll
        for (int dn = 0; dn < DM / 8; dn++) {
            unsigned bf[2];
            tc_frag_b(bf, Zt, lz, dn * 8, kk * 16, g, t);
            cuk_mma_bf16(acc[dn], pa, bf);
        }
    }
}

/* The warp's 16 x DM accumulator (rows i0, i0 + 8 of the C layout) times mul[r] into out
 * (B, H, T, D) slice bh; rows past T and columns past D are not written. */
template <int DM>
__device__ __forceinline__ void tc_store(float *out, const float (*acc)[4], i64 bh, i64 i0, i64 T,
                                         i64 D, const float mul[2], int t)
{
#pragma unroll
    for (int r = 0; r < 2; r++) {
        i64 i = i0 + 8 * r;
        if (i >= T) continue;
        float *row = out + (bh * T + i) * D;
#pragma unroll
        for (int dn = 0; dn < DM / 8; dn++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                i64 d = dn * 8 + 2 * t + c;
                if (d < D) row[d] = acc[dn][2 * r + c] * mul[r];
            }
    }
}

/* Forward (STATS false: o) or the backward's row statistics (STATS true: stats[bh*T + i] = L_i,
 * stats[B*H*T + bh*T + i] = dO_i . O_i). */
template <int DM, int BC, bool STATS>
__device__ void tc_fwd(const float *q, const float *k, const float *v, float *o, const float *dout,
                       float *stats, i64 B, i64 H, i64 T, i64 D, float scale, unsigned bthd)
{
    constexpr int LQ = DM + 8, LK = DM + 8, LV = BC + 8;
    constexpr int NQ = TC_BR * LQ, NKV = BC * LK + DM * LV;
    __shared__ unsigned sm32[(NQ > NKV ? NQ : NKV) / 2];
    unsigned short *sm = (unsigned short *)sm32, *Ks = sm, *Vt = sm + BC * LK;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    i64 nqb = (T + TC_BR - 1) / TC_BR;
    for (i64 blk = blockIdx.x; blk < B * H * nqb; blk += gridDim.x) {
        i64 bh = blk / nqb, qb = nqb - 1 - blk % nqb, b = bh / H, h = bh % H;
        i64 i0 = qb * TC_BR + w * 16 + g; /* this lane's rows: i0 and i0 + 8 */
        unsigned qa[DM / 16][4];
        tc_rows_a<DM>(qa, nullptr, sm, q, 0, nullptr, 0, bthd, b, h, qb * TC_BR, H, T, D);
        float acc[DM / 8][4];
#pragma unroll
        for (int dn = 0; dn < DM / 8; dn++)
            acc[dn][0] = acc[dn][1] = acc[dn][2] = acc[dn][3] = 0.0f;
        float m[2] = {CUK_NEG_INF, CUK_NEG_INF}, l[2] = {0.0f, 0.0f};
        i64 kend = min(T, (qb + 1) * TC_BR);
        for (i64 j0 = 0; j0 < kend; j0 += BC) {
            __syncthreads();
            tc_load<BC, DM>(Ks, LK, nullptr, 0, k, bthd, 1, b, h, j0, H, T, D);
            if (!STATS) tc_load<BC, DM>(nullptr, 0, Vt, LV, v, bthd, 2, b, h, j0, H, T, D);
            __syncthreads();
            if (j0 > qb * TC_BR + w * 16 + 15) continue; /* the warp's rows see none of it */
            float s[BC / 8][4];
            tc_rows_by<DM, BC>(s, qa, Ks, LK, g, t);
            float mt[2] = {CUK_NEG_INF, CUK_NEG_INF};
#pragma unroll
            for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    i64 i = i0 + 8 * (e >> 1), j = j0 + nt * 8 + 2 * t + (e & 1);
                    s[nt][e] = j <= i ? s[nt][e] * scale : CUK_NEG_INF;
                    mt[e >> 1] = fmaxf(mt[e >> 1], s[nt][e]);
                }
            float alpha[2], mu[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                float mn = fmaxf(m[r], tc_shfl_max(mt[r]));
                mu[r] = mn == CUK_NEG_INF ? 0.0f : mn; /* nothing visible yet: p = 0 */
                alpha[r] = expf(m[r] - mu[r]);         /* m = -inf before the first key: 0 */
                m[r] = mn;
                l[r] *= alpha[r];
            }
#pragma unroll
            for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = expf(s[nt][e] - mu[e >> 1]);
                    s[nt][e] = p;
                    l[e >> 1] += p; /* this lane's share; summed over the row's 4 lanes below */
                }
            if (!STATS) {
#pragma unroll
                for (int dn = 0; dn < DM / 8; dn++) {
                    acc[dn][0] *= alpha[0], acc[dn][1] *= alpha[0];
                    acc[dn][2] *= alpha[1], acc[dn][3] *= alpha[1];
                }
                tc_acc_by<DM, BC>(acc, s, Vt, LV, g, t);
            }
        }
        l[0] = tc_shfl_sum(l[0]);
        l[1] = tc_shfl_sum(l[1]);
        if (!STATS) {
            float inv[2] = {1.0f / l[0], 1.0f / l[1]};
            tc_store<DM>(o, acc, bh, i0, T, D, inv, t);
            continue;
        }
        if (t == 0)
            for (int r = 0; r < 2; r++)
                if (i0 + 8 * r < T) stats[bh * T + i0 + 8 * r] = m[r] + logf(l[r]);
        /* delta = dO . O, f32: the warp's 16 rows one after another, lanes along d */
        for (int r = 0; r < 16; r++) {
            i64 i = qb * TC_BR + w * 16 + r;
            float dsum = 0.0f;
            if (i < T) {
                const float *orow = o + tc_row(bthd, 3, b, h, i, H, T, D);
                const float *grow = dout + tc_row(bthd, 4, b, h, i, H, T, D);
                for (i64 d = lane; d < D; d += 32)
                    dsum += orow[d] * grow[d];
            }
            dsum = cuk_warp_sum(dsum);
            if (lane == 0 && i < T) stats[B * H * T + bh * T + i] = dsum;
        }
    }
}

/* dq (B, H, T, D) from the stats. */
template <int DM, int BC>
__device__ void tc_dq(const float *q, const float *k, const float *v, const float *dout,
                      const float *stats, float *dq, i64 B, i64 H, i64 T, i64 D, float scale,
                      unsigned bthd)
{
    constexpr int LQ = DM + 8, LK = DM + 8, LKT = BC + 8;
    constexpr int N1 = 2 * TC_BR * LQ, N2 = 2 * BC * LK + DM * LKT;
    __shared__ unsigned sm32[(N1 > N2 ? N1 : N2) / 2];
    unsigned short *sm = (unsigned short *)sm32;
    unsigned short *Ks = sm, *Vs = sm + BC * LK, *Kt = sm + 2 * BC * LK;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    i64 nqb = (T + TC_BR - 1) / TC_BR;
    for (i64 blk = blockIdx.x; blk < B * H * nqb; blk += gridDim.x) {
        i64 bh = blk / nqb, qb = nqb - 1 - blk % nqb, b = bh / H, h = bh % H;
        i64 i0 = qb * TC_BR + w * 16 + g;
        unsigned qa[DM / 16][4], ga[DM / 16][4];
        tc_rows_a<DM>(qa, ga, sm, q, 0, dout, 4, bthd, b, h, qb * TC_BR, H, T, D);
        float L[2], dl[2];
        for (int r = 0; r < 2; r++) {
            bool in = i0 + 8 * r < T;
            L[r] = in ? stats[bh * T + i0 + 8 * r] : 0.0f;
            dl[r] = in ? stats[B * H * T + bh * T + i0 + 8 * r] : 0.0f;
        }
        float acc[DM / 8][4];
#pragma unroll
        for (int dn = 0; dn < DM / 8; dn++)
            acc[dn][0] = acc[dn][1] = acc[dn][2] = acc[dn][3] = 0.0f;
        i64 kend = min(T, (qb + 1) * TC_BR);
        for (i64 j0 = 0; j0 < kend; j0 += BC) {
            __syncthreads();
            tc_load<BC, DM>(Ks, LK, Kt, LKT, k, bthd, 1, b, h, j0, H, T, D);
            tc_load<BC, DM>(Vs, LK, nullptr, 0, v, bthd, 2, b, h, j0, H, T, D);
            __syncthreads();
            if (j0 > qb * TC_BR + w * 16 + 15) continue;
            float s[BC / 8][4], dp[BC / 8][4];
            tc_rows_by<DM, BC>(s, qa, Ks, LK, g, t);
            tc_rows_by<DM, BC>(dp, ga, Vs, LK, g, t);
#pragma unroll
            for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = e >> 1;
                    i64 i = i0 + 8 * r, j = j0 + nt * 8 + 2 * t + (e & 1);
                    float p = j <= i && i < T ? expf(s[nt][e] * scale - L[r]) : 0.0f;
                    s[nt][e] = p * (dp[nt][e] - dl[r]) * scale; /* dS, rounded as the CPU's */
                }
            tc_acc_by<DM, BC>(acc, s, Kt, LKT, g, t);
        }
        float one[2] = {1.0f, 1.0f};
        tc_store<DM>(dq, acc, bh, i0, T, D, one, t);
    }
}

/* dk, dv (B, H, T, D) from the stats: rows are keys, tiles stream queries i >= the block's
 * first key. */
template <int DM, int BQ>
__device__ void tc_dkv(const float *q, const float *k, const float *v, const float *dout,
                       const float *stats, float *dk, float *dv, i64 B, i64 H, i64 T, i64 D,
                       float scale, unsigned bthd)
{
    constexpr int LK = DM + 8, LQ = DM + 8, LQT = BQ + 8;
    constexpr int N1 = 2 * TC_BR * LK, N2 = 2 * BQ * LQ + 2 * DM * LQT;
    __shared__ unsigned sm32[(N1 > N2 ? N1 : N2) / 2];
    __shared__ float Ls[BQ], Ds[BQ];
    unsigned short *sm = (unsigned short *)sm32;
    unsigned short *Qs = sm, *Gs = sm + BQ * LQ, *Qt = sm + 2 * BQ * LQ, *Gt = Qt + DM * LQT;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    i64 nkb = (T + TC_BR - 1) / TC_BR;
    for (i64 blk = blockIdx.x; blk < B * H * nkb; blk += gridDim.x) {
        i64 bh = blk / nkb, kb = blk % nkb, b = bh / H, h = bh % H;
        i64 j0 = kb * TC_BR + w * 16 + g; /* this lane's keys: j0 and j0 + 8 */
        unsigned ka[DM / 16][4], va[DM / 16][4];
        tc_rows_a<DM>(ka, va, sm, k, 1, v, 2, bthd, b, h, kb * TC_BR, H, T, D);
        float ak[DM / 8][4], av[DM / 8][4];
#pragma unroll
        for (int dn = 0; dn < DM / 8; dn++)
            for (int e = 0; e < 4; e++)
                ak[dn][e] = av[dn][e] = 0.0f;
        for (i64 q0 = (kb * TC_BR) / BQ * BQ; q0 < T; q0 += BQ) {
            __syncthreads();
            tc_load<BQ, DM>(Qs, LQ, Qt, LQT, q, bthd, 0, b, h, q0, H, T, D);
            tc_load<BQ, DM>(Gs, LQ, Gt, LQT, dout, bthd, 4, b, h, q0, H, T, D);
            for (int c = threadIdx.x; c < BQ; c += blockDim.x) {
                bool in = q0 + c < T;
                Ls[c] = in ? stats[bh * T + q0 + c] : 0.0f;
                Ds[c] = in ? stats[B * H * T + bh * T + q0 + c] : 0.0f;
            }
            __syncthreads();
            if (q0 + BQ - 1 < kb * TC_BR + w * 16) continue; /* every query before the keys */
            float s[BQ / 8][4], dp[BQ / 8][4];
            tc_rows_by<DM, BQ>(s, ka, Qs, LQ, g, t);  /* k . q */
            tc_rows_by<DM, BQ>(dp, va, Gs, LQ, g, t); /* v . dO */
#pragma unroll
            for (int nt = 0; nt < BQ / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int c = nt * 8 + 2 * t + (e & 1);
                    i64 j = j0 + 8 * (e >> 1), i = q0 + c;
                    float p = i >= j && i < T ? expf(s[nt][e] * scale - Ls[c]) : 0.0f;
                    s[nt][e] = p;
                    dp[nt][e] = p * (dp[nt][e] - Ds[c]) * scale;
                }
            tc_acc_by<DM, BQ>(av, s, Gt, LQT, g, t);
            tc_acc_by<DM, BQ>(ak, dp, Qt, LQT, g, t);
        }
        float one[2] = {1.0f, 1.0f};
        tc_store<DM>(dv, av, bh, j0, T, D, one, t);
        tc_store<DM>(dk, ak, bh, j0, T, D, one, t);
    }
}

/* Entry points, one per head-size class (D <= DM). Block: TC_THREADS threads, static shared
 * memory only (at most 48 KiB). */
#define TC_VARIANT(DM, BC)                                                                         \
    extern "C" __global__ void __launch_bounds__(TC_THREADS)                                       \
        cuk_att_tc_fwd_d##DM(const float *q, const float *k, const float *v, float *o, i64 B,      \
                             i64 H, i64 T, i64 D, float scale, unsigned bthd)                      \
    {                                                                                              \
        tc_fwd<DM, BC, false>(q, k, v, o, nullptr, nullptr, B, H, T, D, scale, bthd);                    \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(TC_THREADS)                                       \
        cuk_att_tc_stats_d##DM(const float *q, const float *k, const float *o, const float *dout,  \
                               float *stats, i64 B, i64 H, i64 T, i64 D, float scale,              \
                               unsigned bthd)                                                      \
    {                                                                                              \
        tc_fwd<DM, BC, true>(q, k, nullptr, (float *)o, dout, stats, B, H, T, D, scale, bthd);        \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(TC_THREADS)                                       \
        cuk_att_tc_dq_d##DM(const float *q, const float *k, const float *v, const float *dout,     \
                            const float *stats, float *dq, i64 B, i64 H, i64 T, i64 D,             \
                            float scale, unsigned bthd)                                            \
    {                                                                                              \
        tc_dq<DM, BC>(q, k, v, dout, stats, dq, B, H, T, D, scale, bthd);                          \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(TC_THREADS)                                       \
        cuk_att_tc_dkv_d##DM(const float *q, const float *k, const float *v, const float *dout,    \
                             const float *stats, float *dk, float *dv, i64 B, i64 H, i64 T, i64 D, \
                             float scale, unsigned bthd)                                           \
    {                                                                                              \
        tc_dkv<DM, BC>(q, k, v, dout, stats, dk, dv, B, H, T, D, scale, bthd);                     \
    }

TC_VARIANT(64, 64)
TC_VARIANT(128, 32)
