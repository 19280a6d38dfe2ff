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
 * BC rows, rounded to bf16 once as it is stored (row-major, rows padded by 16 bytes). Fragments
 * are read by ldmatrix.x4, transposing (.trans) where a product needs the tile as its k x n
 * operand. The warp's rows sit in registers as mma A fragments;
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
 * write disjoint outputs (deterministic; where dK/dV splits a key tile over blocks, their sums
 * meet in a fixed order, tc_dkv). Rows past T compute on zeros and write
 * nothing; a warp whose rows are all masked from a tile skips its products (warp-uniform, so
 * every lane still reaches every __syncthreads). Softmax in log2 units (tc_exp2). q, k, v are f32,
 * converted as tiles are stored (4 per thread and load where the head size and alignment allow:
 * tc_load), or bf16 (the _b kernels: the bits copied). Every tile loop is double-buffered: the
 * next tile is loaded while the block computes on this one, by cp.async for bf16 rows
 * (tc_load_async; f32 inputs are converted as they load, so theirs wait). dO is f32: the dQ
 * kernel writes the bf16 rows it stages to the scratch (g16), and dK/dV copies its tiles from
 * there. Grouped-query attention (cuk_att_group: G query heads per key/value head, bthd bits 8
 * and up): k, v, dk and dv have H / G heads; the forward, statistics and dQ kernels read key/value
 * head h / G for query head h, and a dK/dV block owns keys of one key/value head and streams the
 * queries of each head of its group in turn, so dk and dv sum over the group as they accumulate
 * (or a share of them, when the launcher splits the key tiles: a small B T with large groups).
 */
#include "cuk_common.cuh"

#define TC_BR 64 /* rows per block */
#define TC_THREADS 128
#define TC_LOG2E 1.4426950408889634f
#define TC_LN2 0.6931471805599453f
/* TC_HOT (scripts/bench/attention_sass.py only, never at run time): every block-uniform test of
 * "whole and aligned tile" taken as true, so that the main loops' SASS is their hot path alone,
 * whose instructions the script counts. */
#ifdef TC_HOT
#define TC_WHOLE(c) true
#else
#define TC_WHOLE(c) (c)
#endif

/* d (16 x 8, f32) += a (16 x 16, bf16) b (16 x 8, bf16): one warp, every lane. The host
 * emulation (check_cuk) defines JDT_CUK_EMU and its own cuk_mma_bf16 and cuk_ldsm_x4 with
 * these layouts. */
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

/* ldmatrix.x4: four 8 x 8 b16 matrices from shared memory; lane l gives the address of row l % 8
 * of matrix l / 8 (16 bytes, 16-byte aligned). Register i of lane l receives matrix i's row
 * l / 4, columns 2 (l % 4) and + 1; with TRANS the transposed matrix's (stored rows 2 (l % 4)
 * and + 1 of column l / 4). One warp, every lane. */
template <bool TRANS>
__device__ __forceinline__ void cuk_ldsm_x4(unsigned r[4], const unsigned short *row)
{
#if __CUDA_ARCH__ >= 800
    unsigned a = (unsigned)__cvta_generic_to_shared(row);
    if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(a));
#else
    __trap();
#endif
}

/* cp.async (sm_80): an N-byte copy (16 or 4) from global to shared memory that completes in
 * the background, without registers; `full` false writes N zero bytes instead (src-size 0: src
 * is not read, but stays a valid address). Copies issued since the last commit form a group;
 * cuk_cp_async_wait<N> waits until at most N of the thread's committed groups are in flight.
 * A wait covers the calling thread's copies only: a __syncthreads after it publishes them to
 * the block. The host emulation makes each copy at the wait that lets it through. */
template <int N> __device__ __forceinline__ void cuk_cp_async(void *dst, const void *src, bool full)
{
    static_assert(N == 16 || N == 4, "16-byte tiles' chunks or 4-byte statistics");
#if __CUDA_ARCH__ >= 800
    unsigned a = (unsigned)__cvta_generic_to_shared(dst);
    if (N == 16) /* .cg: L2 only, the tiles stream */
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(src),
                     "r"(full ? 16 : 0)
                     : "memory");
    else /* .ca: the only form of 4 bytes */
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(a), "l"(src),
                     "r"(full ? 4 : 0)
                     : "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void cuk_cp_async_commit()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void cuk_cp_async_wait()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
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

/* Two f32 rounded to bf16 (nearest, ties to even), lo in the low half: one 32-bit fragment
 * register. On the GPU one cvt.rn.bf16x2.f32 (PTX: its first source goes to the upper half),
 * where cuk_bf16_bits costs about five integer instructions a value; the same bits for every
 * non-NaN value (a NaN stays a NaN, its payload may differ). The host emulation uses
 * cuk_bf16_bits. */
__device__ __forceinline__ unsigned tc_pack(float lo, float hi)
{
#if defined(JDT_CUK_EMU) || !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 800
    return (unsigned)cuk_bf16_bits(lo) | (unsigned)cuk_bf16_bits(hi) << 16;
#else
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#endif
}

/* 2^x: on the GPU one ex2.approx.ftz.f32 (MUFU.EX2; 2^-inf = +0, results below 2^-126 flushed
 * to 0), where exp2f adds three instructions a value for subnormal results, which no product here
 * needs (a probability under 2^-126 is lost to the f32 sums anyway). The host emulation uses
 * exp2f. */
__device__ __forceinline__ float tc_exp2(float x)
{
#if defined(JDT_CUK_EMU) || !defined(__CUDA_ARCH__)
    return exp2f(x);
#else
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
#endif
}

/* Element offset of row t of slice (b, h) for input `bit` (as cuk_attention.cu's att_row). */
__device__ __forceinline__ i64 tc_row(unsigned bthd, int bit, i64 b, i64 h, i64 t, i64 H, i64 T,
                                      i64 D)
{
    return (bthd >> bit & 1u) ? ((b * T + t) * H + h) * D : ((b * H + h) * T + t) * D;
}

/* Rows t0..t0+R-1 of input `bit` of slice (b, h) as bf16 into X (R x DM, row stride lx); zeros
 * past T and past D. x is f32 (rounded, tc_pack) or bf16 bit patterns (copied: q, k, v a bf16
 * GEMM stored under precision.activations: bf16). When D is a multiple of 4 and x is aligned to
 * 4 elements (every row then is), a thread moves 4 consecutive elements of a row per load (a
 * float4 or 8 bytes) and stores them as one 8-byte word (lx and DM are multiples of 8). The
 * row's offset is one multiply from the tile's first row (tc_row once), the trip counts are
 * compile-time (TC_THREADS threads), and the bounds are tested only in a tile that reaches past
 * T or a head narrower than DM. Both branches are uniform over the block. */
__device__ __forceinline__ uint2 tc_quad(const float *p)
{
    float4 v = *(const float4 *)p;
    return make_uint2(tc_pack(v.x, v.y), tc_pack(v.z, v.w));
}
__device__ __forceinline__ uint2 tc_quad(const unsigned short *p)
{
    return *(const uint2 *)p;
}
__device__ __forceinline__ unsigned short tc_one(float v)
{
    return cuk_bf16_bits(v);
}
__device__ __forceinline__ unsigned short tc_one(unsigned short v)
{
    return v;
}

template <int R, int DM, class TX>
__device__ __forceinline__ void tc_load(unsigned short *X, int lx, const TX *x, unsigned bthd,
                                        int bit, i64 b, i64 h, i64 t0, i64 H, i64 T, i64 D)
{
    const i64 rs = (bthd >> bit & 1u) ? H * D : D; /* elements from one row to the next */
    const TX *x0 = x + tc_row(bthd, bit, b, h, t0, H, T, D);
    if (TC_WHOLE((D & 3) == 0 && ((unsigned long long)x & (4 * sizeof(TX) - 1)) == 0)) {
        /* a pass: TC_THREADS / Q rows, thread -> (row r, column d) fixed over the passes */
        constexpr int Q = DM / 4, RP = TC_THREADS / Q;
        static_assert(TC_THREADS % Q == 0 && R % RP == 0, "whole passes");
        const int r = threadIdx.x / Q, d = (threadIdx.x % Q) * 4;
        const bool full = TC_WHOLE(t0 + R <= T && D == DM);
        const TX *xp = x0 + r * rs + d;
        unsigned short *sp = X + r * lx + d;
#pragma unroll
        for (int k = 0; k < R / RP; k++) {
            uint2 w = make_uint2(0u, 0u);
            if (full || (t0 + r + k * RP < T && d < D)) w = tc_quad(xp + k * RP * rs);
            *(uint2 *)(sp + k * RP * lx) = w;
        }
        return;
    }
    for (int e = threadIdx.x; e < R * DM; e += TC_THREADS) {
        int r = e / DM, d = e - r * DM;
        X[r * lx + d] = t0 + r < T && d < D ? tc_one(x0[r * rs + d]) : (unsigned short)0;
    }
}

/* tc_load issued in the background: for bf16 x (the _b kernels) with D a multiple of 8 and x
 * 16-byte aligned, each thread copies 16-byte chunks (8 elements) of rows by cp.async, its
 * (row, chunk) fixed over unrolled passes, zero-filled past T and past D; the caller commits,
 * waits and synchronises the block before reading X. Otherwise (f32 x, or an odd head size or
 * alignment) tc_load, done when it returns. */
template <int R, int DM>
__device__ __forceinline__ void tc_load_async(unsigned short *X, int lx, const float *x,
                                              unsigned bthd, int bit, i64 b, i64 h, i64 t0, i64 H,
                                              i64 T, i64 D)
{
    tc_load<R, DM>(X, lx, x, bthd, bit, b, h, t0, H, T, D);
}
template <int R, int DM>
__device__ __forceinline__ void tc_load_async(unsigned short *X, int lx, const unsigned short *x,
                                              unsigned bthd, int bit, i64 b, i64 h, i64 t0, i64 H,
                                              i64 T, i64 D)
{
    if (!TC_WHOLE((D & 7) == 0 && ((unsigned long long)x & 15) == 0)) {
        tc_load<R, DM>(X, lx, x, bthd, bit, b, h, t0, H, T, D);
        return;
    }
    constexpr int Q = DM / 8, RP = TC_THREADS / Q; /* chunks per row, rows per pass */
    static_assert(TC_THREADS % Q == 0 && R % RP == 0, "whole passes");
    const i64 rs = (bthd >> bit & 1u) ? H * D : D;
    const unsigned short *x0 = x + tc_row(bthd, bit, b, h, t0, H, T, D);
    const int r = threadIdx.x / Q, d = (threadIdx.x % Q) * 8;
    const unsigned short *xr = x0 + r * rs + d;
    unsigned short *sr = X + r * lx + d;
    if (TC_WHOLE(t0 + R <= T && D == DM)) { /* a whole tile: no test per copy */
#pragma unroll
        for (int k = 0; k < R / RP; k++)
            cuk_cp_async<16>(sr + k * RP * lx, xr + k * RP * rs, true);
        return;
    }
#pragma unroll
    for (int k = 0; k < R / RP; k++) {
        const int row = r + k * RP;
        const bool in = t0 + row < T && d < D;
        cuk_cp_async<16>(sr + k * RP * lx, in ? xr + k * RP * rs : x0, in);
    }
}

/* The K tile (and, with V, the V tile after it) of keys j0.. into X, issued. */
template <int BC, int DM, bool V, class TQ>
__device__ __forceinline__ void tc_kv_issue(unsigned short *X, const TQ *k, const TQ *v,
                                            unsigned bthd, i64 b, i64 h, i64 j0, i64 H, i64 T,
                                            i64 D)
{
    tc_load_async<BC, DM>(X, DM + 8, k, bthd, 1, b, h, j0, H, T, D);
    if (V) tc_load_async<BC, DM>(X + BC * (DM + 8), DM + 8, v, bthd, 2, b, h, j0, H, T, D);
}

/* A double-buffered tile loop's turn, every thread: once every warp is done with the other
 * buffer, issue() fills it with the next tile when there is one (`more`); then this thread's
 * copies of the current tile are waited for. The caller synchronises the block after it. */
template <class F> __device__ __forceinline__ void tc_turn(bool more, F issue)
{
    __syncthreads();
    if (more) {
        issue();
        cuk_cp_async_commit();
        cuk_cp_async_wait<1>();
    } else {
        cuk_cp_async_wait<0>();
    }
}

/* A fragment (16 x 16) of row-major X at rows r0.., columns k0..: the matrices (r0, k0),
 * (r0 + 8, k0), (r0, k0 + 8), (r0 + 8, k0 + 8). */
__device__ __forceinline__ void tc_frag_a(unsigned a[4], const unsigned short *X, int lx, int r0,
                                          int k0, int lane)
{
    int m = lane >> 3;
    cuk_ldsm_x4<false>(a, X + (r0 + (lane & 7) + 8 * (m & 1)) * lx + k0 + 8 * (m >> 1));
}

/* B fragments (16 x 8, k x n) of columns n0.. (b[0], b[1]) and n0 + 8.. (b[2], b[3]), rows
 * k0.., of a matrix stored n-major, Y[n][k]: the matrices (n0, k0), (n0, k0 + 8), (n0 + 8, k0),
 * (n0 + 8, k0 + 8). */
__device__ __forceinline__ void tc_frag_b2(unsigned b[4], const unsigned short *Y, int ly, int n0,
                                           int k0, int lane)
{
    int m = lane >> 3;
    cuk_ldsm_x4<false>(b, Y + (n0 + (lane & 7) + 8 * (m >> 1)) * ly + k0 + 8 * (m & 1));
}

/* The same of a matrix stored k-major, Z[k][n], by transposing loads: the stored matrices
 * (k0, n0), (k0 + 8, n0), (k0, n0 + 8), (k0 + 8, n0 + 8). */
__device__ __forceinline__ void tc_frag_b2_t(unsigned b[4], const unsigned short *Z, int lz, int n0,
                                             int k0, int lane)
{
    int m = lane >> 3;
    cuk_ldsm_x4<true>(b, Z + (k0 + (lane & 7) + 8 * (m & 1)) * lz + n0 + 8 * (m >> 1));
}

/* The block's TC_BR rows from row r0 of input bx (x) and, unless y is null, of input by (y), as
 * the A fragments of each warp's 16 rows (xa, ya: DM / 16 each), staged through sm (TC_BR
 * (DM + 8) halves per input). Begins and ends with __syncthreads: every thread calls it. */
template <int DM, class TX, class TY>
__device__ __forceinline__ void tc_rows_a(unsigned (*xa)[4], unsigned (*ya)[4], unsigned short *sm,
                                          const TX *x, int bx, const TY *y, int by, unsigned bthd,
                                          i64 b, i64 h, i64 r0, i64 H, i64 T, i64 D)
{
    constexpr int L = DM + 8;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads(); /* the previous block's tiles have been consumed */
    tc_load<TC_BR, DM>(sm, L, x, bthd, bx, b, h, r0, H, T, D);
    if (y) tc_load<TC_BR, DM>(sm + TC_BR * L, L, y, bthd, by, b, h, r0, H, T, D);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < DM / 16; kk++) {
        tc_frag_a(xa[kk], sm, L, w * 16, kk * 16, lane);
        if (y) tc_frag_a(ya[kk], sm + TC_BR * L, L, w * 16, kk * 16, lane);
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
                                           const unsigned short *Y, int ly, int lane)
{
#pragma unroll
    for (int n2 = 0; n2 < N / 16; n2++) {
        float *c0 = c[2 * n2], *c1 = c[2 * n2 + 1];
        c0[0] = c0[1] = c0[2] = c0[3] = c1[0] = c1[1] = c1[2] = c1[3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < DM / 16; kk++) {
            unsigned bf[4];
            tc_frag_b2(bf, Y, ly, n2 * 16, kk * 16, lane);
            cuk_mma_bf16(c0, a[kk], bf);
            cuk_mma_bf16(c1, a[kk], bf + 2);
        }
    }
}

/* acc[DM/8] += P (the warp's 16 x N C fragments p) times Z (N x DM, row-major, row stride lz). */
template <int DM, int N>
__device__ __forceinline__ void tc_acc_by(float (*acc)[4], const float (*p)[4],
                                          const unsigned short *Z, int lz, int lane)
{
#pragma unroll
    for (int kk = 0; kk < N / 16; kk++) {
        unsigned pa[4];
        tc_c_to_a(pa, p, kk);
#pragma unroll
        for (int d2 = 0; d2 < DM / 16; d2++) {
            unsigned bf[4];
            tc_frag_b2_t(bf, Z, lz, d2 * 16, kk * 16, lane);
            cuk_mma_bf16(acc[2 * d2], pa, bf);
            cuk_mma_bf16(acc[2 * d2 + 1], pa, bf + 2);
        }
    }
}

/* The warp's 16 x DM accumulator (rows i0, i0 + 8 of the C layout) times mul[r] into out
 * (B, H, T, D) slice bh, and into the forward's (B, T, H, D) copy o2 when not NULL
 * (cuk_att_store2's layout; H heads); rows past T and columns past D are not written. A lane
 * holds columns 2t and 2t + 1 of each 8: with D even and out and o2 aligned to a pair
 * (block-uniform) it stores them as one pair (a float2, or two bf16 in 32 bits), the row
 * addresses found once; else one by one. */
template <int DM>
__device__ __forceinline__ void tc_store(float *out, const float (*acc)[4], i64 bh, i64 i0, i64 T,
                                         i64 D, const float mul[2], int t, void *o2 = nullptr,
                                         int o2b = 0, i64 H = 1)
{
    const i64 b = o2 ? bh / H : 0, h = o2 ? bh - b * H : 0;
    const bool pairs = (D & 1) == 0 && ((unsigned long long)out & 7) == 0 &&
                       ((unsigned long long)o2 & (o2b ? 3 : 7)) == 0;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        i64 i = i0 + 8 * r;
        if (i >= T) continue;
        float *row = out ? out + (bh * T + i) * D : nullptr; /* none: o2 only */
        const i64 at2 = ((b * T + i) * H + h) * D;           /* o2's row */
#pragma unroll
        for (int dn = 0; dn < DM / 8; dn++) {
            const int d = dn * 8 + 2 * t;
            const float v0 = acc[dn][2 * r] * mul[r], v1 = acc[dn][2 * r + 1] * mul[r];
            if (pairs) {
                if (d >= D) continue; /* D even: d + 1 < D too */
                if (row) *(float2 *)(row + d) = make_float2(v0, v1);
                if (o2 && o2b)
                    *(unsigned *)((unsigned short *)o2 + at2 + d) =
                        (unsigned)cuk_bf16_bits(v0) | (unsigned)cuk_bf16_bits(v1) << 16;
                else if (o2)
                    *(float2 *)((float *)o2 + at2 + d) = make_float2(v0, v1);
                continue;
            }
#pragma unroll
            for (int c = 0; c < 2; c++) {
                if (d + c >= D) continue;
                const float val = c ? v1 : v0;
                if (row) row[d + c] = val;
                if (o2) cuk_att_store2(o2, o2b, b, h, i, d + c, H, T, D, val);
            }
        }
    }
}

/* The warp's 16 x DM accumulator (rows w 16 + g and + 8 of the block, C layout) into stage
 * (TC_BR rows of stride DM + 4 f32: the tiles' shared memory, free once every warp is past
 * the first barrier) for cuk_att_grads_out. Every thread calls it: it begins and ends with
 * __syncthreads. */
template <int DM>
__device__ __forceinline__ void tc_stage(float *stage, const float (*acc)[4], int w, int g, int t,
                                         i64 D)
{
    __syncthreads();
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int dn = 0; dn < DM / 8; dn++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                int d = dn * 8 + 2 * t + c;
                if (d < D) stage[(w * 16 + g + 8 * r) * (DM + 4) + d] = acc[dn][2 * r + c];
            }
    __syncthreads();
}

/* delta = dO . O (f32; O and dO each f32 or bf16) of the warp's 16 rows r0.. of slice (b, h)
 * into stats[B*H*T + bh*T + i] and, unless dl is NULL, into dl[0] and dl[1] for the lane's rows
 * r0 + g and r0 + g + 8 (0 past T). Every lane of the warp calls it. When D / 4 is a power of
 * two up to 32 and o and dout are aligned to 4 elements (warp-uniform), G = D / 4 lanes share a
 * row, each summing 4 consecutive products from one 4-element load of each (cuk_ld4), then the
 * G partial sums by xor shuffles: 32 / G rows a pass, the row addresses found once a pass (it
 * was one row at a time, lanes along d, about 1.5 K instructions a warp in the dQ kernel's
 * prologue). Otherwise one row at a time. The stats and dQ kernels both call it, so they store
 * the same floats. */
template <class TO, class TG>
__device__ __forceinline__ void tc_delta(const TO *o, const TG *dout, float *stats, float *dl,
                                         unsigned bthd, i64 b, i64 h, i64 bh, i64 r0, int lane,
                                         int g, i64 B, i64 H, i64 T, i64 D)
{
    const int G = (int)D >> 2;
    if ((D & 3) == 0 && G <= 32 && (G & (G - 1)) == 0 &&
        ((unsigned long long)o & (4 * sizeof(TO) - 1)) == 0 &&
        ((unsigned long long)dout & (4 * sizeof(TG) - 1)) == 0) {
        const int rpp = 32 / G, c4 = lane & (G - 1); /* rows a pass; this lane's 4 columns */
        /* this lane's first row and the step to its row in the next pass, in elements */
        const TO *op = o + tc_row(bthd, 3, b, h, r0 + lane / G, H, T, D);
        const TG *gp = dout + tc_row(bthd, 4, b, h, r0 + lane / G, H, T, D);
        const i64 ostep = rpp * ((bthd >> 3 & 1u) ? H * D : D);
        const i64 gstep = rpp * ((bthd >> 4 & 1u) ? H * D : D);
        for (int p0 = 0; p0 < 16; p0 += rpp, op += ostep, gp += gstep) {
            const int rr = p0 + lane / G;
            const i64 i = r0 + rr;
            float dsum = 0.0f;
            if (rr < 16 && i < T) {
                const float4 a = cuk_ld4(op, c4), c = cuk_ld4(gp, c4);
                dsum = a.x * c.x;
                dsum = fmaf(a.y, c.y, dsum);
                dsum = fmaf(a.z, c.z, dsum);
                dsum = fmaf(a.w, c.w, dsum);
            }
            for (int m = G >> 1; m > 0; m >>= 1)
                dsum += __shfl_xor_sync(CUK_FULL, dsum, m);
            if (c4 == 0 && rr < 16 && i < T) stats[B * H * T + bh * T + i] = dsum;
            if (dl) { /* rows g and g + 8 from the lanes that hold them, when in this pass */
                const float v0 = __shfl_sync(CUK_FULL, dsum, ((g - p0) & (rpp - 1)) * G);
                const float v1 = __shfl_sync(CUK_FULL, dsum, ((g + 8 - p0) & (rpp - 1)) * G);
                if (g >= p0 && g < p0 + rpp) dl[0] = r0 + g < T ? v0 : 0.0f;
                if (g + 8 >= p0 && g + 8 < p0 + rpp) dl[1] = r0 + g + 8 < T ? v1 : 0.0f;
            }
        }
        return;
    }
    for (int r = 0; r < 16; r++) {
        i64 i = r0 + r;
        float dsum = 0.0f;
        if (i < T) {
            const TO *orow = o + tc_row(bthd, 3, b, h, i, H, T, D);
            const TG *grow = dout + tc_row(bthd, 4, b, h, i, H, T, D);
            for (i64 d = lane; d < D; d += 32)
                dsum += cuk_ld(orow, d) * cuk_ld(grow, d);
        }
        dsum = cuk_warp_sum(dsum);
        if (lane == 0 && i < T) stats[B * H * T + bh * T + i] = dsum;
        if (dl && r == g) dl[0] = dsum;
        if (dl && r == g + 8) dl[1] = dsum;
    }
}

/* Forward (STATS false: o unless o is NULL, its copy o2 unless NULL, and L_i into lse[bh*T + i]
 * unless lse is NULL) or the backward's row statistics (STATS true: stats[bh*T + i] = L_i,
 * stats[B*H*T + bh*T + i] = dO_i . O_i, o read as TO). L_i = logsumexp of the row's scaled
 * causal scores, the same float either way. */
template <int DM, int BC, bool STATS, class TQ, class TO, class TG>
__device__ void tc_fwd(const TQ *q, const TQ *k, const TQ *v, TO *o, void *o2, int o2b,
                       const TG *dout, float *stats, float *lse, i64 B, i64 H, i64 T, i64 D,
                       float scale, unsigned bthd)
{
    constexpr int L = DM + 8, NQ = TC_BR * L, NKV = 2 * BC * L; /* NKV: one K and one V tile */
    __shared__ float4 smv[(NQ > 2 * NKV ? NQ : 2 * NKV) / 8];   /* 16-byte aligned rows */
    unsigned short *sm = (unsigned short *)smv;
    const float sl2 = scale * TC_LOG2E; /* scores in log2 units: tc_exp2 */
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    i64 nqb = (T + TC_BR - 1) / TC_BR;
    for (i64 blk = blockIdx.x; blk < B * H * nqb; blk += gridDim.x) {
        i64 bh = blk / nqb, qb = nqb - 1 - blk % nqb, b = bh / H, h = bh % H;
        const i64 G = cuk_att_group(bthd), hk = h / G, Hk = H / G; /* k and v's head */
        i64 i0 = qb * TC_BR + w * 16 + g; /* this lane's rows: i0 and i0 + 8 */
        unsigned qa[DM / 16][4];
        tc_rows_a<DM>(qa, nullptr, sm, q, 0, (const TQ *)nullptr, 0, bthd, b, h, qb * TC_BR, H, T,
                      D);
        float acc[DM / 8][4];
#pragma unroll
        for (int dn = 0; dn < DM / 8; dn++)
            acc[dn][0] = acc[dn][1] = acc[dn][2] = acc[dn][3] = 0.0f;
        float m[2] = {CUK_NEG_INF, CUK_NEG_INF}, l[2] = {0.0f, 0.0f};
        i64 kend = min(T, (qb + 1) * TC_BR);
        /* double-buffered tiles: tile j0 + BC is copied into one buffer while the block
         * computes on j0 in the other (tc_load_async) */
        __syncthreads(); /* every warp has its q fragments: the staging area is free */
        tc_kv_issue<BC, DM, !STATS>(sm, k, v, bthd, b, hk, 0, Hk, T, D);
        cuk_cp_async_commit();
        for (i64 j0 = 0, u = 0; j0 < kend; j0 += BC, u ^= 1) { /* u: tile j0's buffer */
            unsigned short *Ks = sm + u * NKV, *Vs = Ks + BC * L;
            tc_turn(j0 + BC < kend, [&] {
                tc_kv_issue<BC, DM, !STATS>(sm + (u ^ 1) * NKV, k, v, bthd, b, hk, j0 + BC, Hk, T,
                                            D);
            });
            __syncthreads(); /* every thread's copies of tile j0 have landed */
            if (j0 > qb * TC_BR + w * 16 + 15) continue; /* the warp's rows see none of it */
            float s[BC / 8][4];
            tc_rows_by<DM, BC>(s, qa, Ks, L, lane);
            float mt[2] = {CUK_NEG_INF, CUK_NEG_INF};
            /* masks only on a tile where a key may follow a row (warp-uniform) */
            if (TC_WHOLE(j0 + BC - 1 <= qb * TC_BR + w * 16)) {
#pragma unroll
                for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        mt[e >> 1] = fmaxf(mt[e >> 1], s[nt][e]);
            } else {                             /* keys after their row: -inf */
                int dj = (int)(j0 - i0) + 2 * t; /* j - i at nt = 0, e = 0 */
#pragma unroll
                for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        if (dj + nt * 8 + (e & 1) - 8 * (e >> 1) > 0) s[nt][e] = CUK_NEG_INF;
                        mt[e >> 1] = fmaxf(mt[e >> 1], s[nt][e]);
                    }
            }
            float alpha[2], mu[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                /* the raw scores' max scaled: their scaled max (sl2 > 0, rounding is monotone) */
                float mn = fmaxf(m[r], tc_shfl_max(mt[r]) * sl2);
                mu[r] = mn == CUK_NEG_INF ? 0.0f : mn; /* nothing visible yet: p = 0 */
                alpha[r] = tc_exp2(m[r] - mu[r]);      /* m = -inf before the first key: 0 */
                m[r] = mn;
                l[r] *= alpha[r];
            }
#pragma unroll
            for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = tc_exp2(s[nt][e] * sl2 - mu[e >> 1]); /* scaled by the FFMA */
                    s[nt][e] = p;
                    l[e >> 1] += p; /* this lane's share; summed over the row's 4 lanes below */
                }
            if (!STATS) {
#pragma unroll
                for (int dn = 0; dn < DM / 8; dn++) {
                    acc[dn][0] *= alpha[0], acc[dn][1] *= alpha[0];
                    acc[dn][2] *= alpha[1], acc[dn][3] *= alpha[1];
                }
                tc_acc_by<DM, BC>(acc, s, Vs, L, lane);
            }
        }
        l[0] = tc_shfl_sum(l[0]);
        l[1] = tc_shfl_sum(l[1]);
        if constexpr (!STATS) {
            float inv[2] = {1.0f / l[0], 1.0f / l[1]};
            tc_store<DM>(o, acc, bh, i0, T, D, inv, t, o2, o2b, H);
            if (lse && t == 0)
                for (int r = 0; r < 2; r++)
                    if (i0 + 8 * r < T) lse[bh * T + i0 + 8 * r] = m[r] * TC_LN2 + logf(l[r]);
            continue;
        }
        if (t == 0)
            for (int r = 0; r < 2; r++)
                if (i0 + 8 * r < T) stats[bh * T + i0 + 8 * r] = m[r] * TC_LN2 + logf(l[r]);
        tc_delta(o, dout, stats, nullptr, bthd, b, h, bh, qb * TC_BR + w * 16, lane, 0, B, H, T, D);
    }
}

/* The dQ kernel's dS of one key tile, in place: s[nt][e] (q . k) becomes p (dp[nt][e] scale -
 * dl[r]), p = exp2(s sl2 - L2[r]), r = e >> 1 the lane's row (i0 or i0 + 8). MASK: p = 0 where
 * the key follows the row (dj: j - i at nt = 0, e = 0) or the row is past T; without it, no
 * test at all. */
template <int BC, bool MASK>
__device__ __forceinline__ void tc_dq_ds(float (*s)[4], const float (*dp)[4], const float L2[2],
                                         const float dl[2], int dj, i64 i0, i64 T, float sl2,
                                         float scale)
{
#pragma unroll
    for (int nt = 0; nt < BC / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = e >> 1;
            const bool in = !MASK || (dj + nt * 8 + (e & 1) - 8 * r <= 0 && i0 + 8 * r < T);
            const float p = in ? tc_exp2(s[nt][e] * sl2 - L2[r]) : 0.0f;
            s[nt][e] = p * fmaf(dp[nt][e], scale, -dl[r]); /* dS, rounded as the CPU's */
        }
}

/* dq (B, H, T, D) from the stats, or, when lse (the forward's log-sum-exp) is not NULL, from
 * lse and dO . O formed here as the statistics kernel would (which then does not run), both
 * also stored in stats for the dK/dV kernel. An f32 dO's rows, rounded to bf16 as staged, go to
 * g16 for the dK/dV kernel; a bf16 dO (the _bg kernels) is read there as it is. */
template <int DM, int BC, class TQ, class TO, class TG>
__device__ void tc_dq(const TQ *q, const TQ *k, const TQ *v, const TO *o, const TG *dout,
                      const float *lse, float *stats, unsigned short *g16, float *dq, void *g2,
                      int g2b, double g2rot, int g2inv, float *part, i64 B, i64 H, i64 T, i64 D,
                      float scale, unsigned bthd)
{
    constexpr int L = DM + 8, N1 = 2 * TC_BR * L, N2 = 2 * BC * L; /* N2: a K and a V tile */
    __shared__ float4 smv[(N1 > 2 * N2 ? N1 : 2 * N2) / 8];
    static_assert(TC_BR * (DM + 4) * sizeof(float) <= sizeof smv, "tc_stage fits");
    unsigned short *sm = (unsigned short *)smv;
    const float sl2 = scale * TC_LOG2E;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    i64 nqb = (T + TC_BR - 1) / TC_BR;
    for (i64 blk = blockIdx.x; blk < B * H * nqb; blk += gridDim.x) {
        i64 bh = blk / nqb, qb = nqb - 1 - blk % nqb, b = bh / H, h = bh % H;
        const i64 G = cuk_att_group(bthd), hk = h / G, Hk = H / G; /* k and v's head */
        i64 i0 = qb * TC_BR + w * 16 + g;
        unsigned qa[DM / 16][4], ga[DM / 16][4];
        tc_rows_a<DM>(qa, ga, sm, q, 0, dout, 4, bthd, b, h, qb * TC_BR, H, T, D);
        if constexpr (sizeof(TG) == sizeof(float)) {
            /* dO's rows as the bf16 tiles stage them (zeros past D), row stride DM, into g16
             * for the dK/dV kernel, which then copies its dO tiles as they are (cp.async) */
            constexpr int Q8 = DM / 8;
            for (int e = threadIdx.x; e < TC_BR * Q8; e += TC_THREADS) {
                int r = e / Q8, c = (e - r * Q8) * 8;
                i64 i = qb * TC_BR + r;
                if (i < T)
                    *(uint4 *)(g16 + (bh * T + i) * DM + c) =
                        *(const uint4 *)(sm + TC_BR * L + r * L + c);
            }
        }
        float L2[2], dl[2]; /* L in log2 units, delta */
        if (lse) {          /* the statistics here (uniform over the grid) */
            tc_delta(o, dout, stats, dl, bthd, b, h, bh, qb * TC_BR + w * 16, lane, g, B, H, T, D);
            for (int c = lane; c < 16; c += 32) {
                i64 i = qb * TC_BR + w * 16 + c;
                if (i < T) stats[bh * T + i] = lse[bh * T + i];
            }
        }
        for (int r = 0; r < 2; r++) {
            bool in = i0 + 8 * r < T;
            const float *ls = lse ? lse : stats;
            L2[r] = in ? ls[bh * T + i0 + 8 * r] * TC_LOG2E : 0.0f;
            dl[r] = !in ? 0.0f : lse ? dl[r] : stats[B * H * T + bh * T + i0 + 8 * r];
            dl[r] *= scale; /* dS = p (dp - delta) scale = p (dp scale - delta scale) */
        }
        float acc[DM / 8][4];
#pragma unroll
        for (int dn = 0; dn < DM / 8; dn++)
            acc[dn][0] = acc[dn][1] = acc[dn][2] = acc[dn][3] = 0.0f;
        i64 kend = min(T, (qb + 1) * TC_BR);
        __syncthreads(); /* double-buffered tiles, as in tc_fwd */
        tc_kv_issue<BC, DM, true>(sm, k, v, bthd, b, hk, 0, Hk, T, D);
        cuk_cp_async_commit();
        for (i64 j0 = 0, u = 0; j0 < kend; j0 += BC, u ^= 1) { /* u: tile j0's buffer */
            unsigned short *Ks = sm + u * N2, *Vs = Ks + BC * L;
            tc_turn(j0 + BC < kend, [&] {
                tc_kv_issue<BC, DM, true>(sm + (u ^ 1) * N2, k, v, bthd, b, hk, j0 + BC, Hk, T, D);
            });
            __syncthreads();
            if (j0 > qb * TC_BR + w * 16 + 15) continue;
            float s[BC / 8][4], dp[BC / 8][4];
            tc_rows_by<DM, BC>(s, qa, Ks, L, lane);
            tc_rows_by<DM, BC>(dp, ga, Vs, L, lane);
            /* masks only where a key may follow a row or a row may be past T (warp-uniform);
             * two copies of the loop, the unmasked one without tests (as in tc_dkv) */
            if (TC_WHOLE(j0 + BC - 1 <= qb * TC_BR + w * 16 && qb * TC_BR + w * 16 + 15 < T))
                tc_dq_ds<BC, false>(s, dp, L2, dl, 0, 0, 0, sl2, scale);
            else
                tc_dq_ds<BC, true>(s, dp, L2, dl, (int)(j0 - i0) + 2 * t, i0, T, sl2, scale);
            tc_acc_by<DM, BC>(acc, s, Ks, L, lane);
        }
        if (g2 || part) { /* the cotangent form (uniform over the grid) */
            tc_stage<DM>((float *)smv, acc, w, g, t, D);
            cuk_att_grads_out<TC_BR>((float *)smv, DM + 4, dq, g2, g2b, g2rot, g2inv, part, b, h,
                                     qb * TC_BR, H, T, D);
            continue;
        }
        float one[2] = {1.0f, 1.0f};
        tc_store<DM>(dq, acc, bh, i0, T, D, one, t);
    }
}

/* The dK/dV kernel's tiles for queries q0..q0+BQ-1 issued: Q (cp.async when bf16, else loaded
 * and rounded here), dO in bf16 from g16 (cp.async): the dQ kernel's copy (gbthd 0, row length
 * gD = DM) or dO itself stored as bf16 (its layout bit 4 in gbthd, gD = D), and L and delta
 * from the statistics by 4-byte cp.async (zeros past T), raw: their owner scales them once its
 * copies have landed. */
template <int DM, int BQ, class TQ>
__device__ __forceinline__ void tc_dkv_issue(unsigned short *Qs, float *Ls, float *Ds, const TQ *q,
                                             const unsigned short *g16, unsigned gbthd, i64 gD,
                                             const float *stats, unsigned bthd, i64 b, i64 h,
                                             i64 bh, i64 q0, i64 B, i64 H, i64 T, i64 D)
{
    constexpr int L = DM + 8;
    tc_load_async<BQ, DM>(Qs, L, q, bthd, 0, b, h, q0, H, T, D);
    tc_load_async<BQ, DM>(Qs + BQ * L, L, g16, gbthd, 4, b, h, q0, H, T, gD);
    static_assert(BQ <= TC_THREADS, "a thread per query of the tile");
    if (threadIdx.x < BQ) {
        int c = threadIdx.x;
        bool in = q0 + c < T;
        const float *ls = stats + bh * T + (in ? q0 + c : 0);
        cuk_cp_async<4>(&Ls[c], ls, in);
        cuk_cp_async<4>(&Ds[c], ls + B * H * T, in);
    }
}

/* The dK/dV kernel's probabilities and dS of one query tile, in place: s[nt][e] (k . q) becomes
 * p = exp2(s sl2 - Ls[c]) and dp[nt][e] (v . dO) becomes p (dp scale - Ds[c]), c the query's
 * column in the tile (nt 8 + 2 t + (e & 1)). MASK: p = 0 where the query precedes the key (di:
 * i - j at nt = 0, e = 0) or is past T (q0 + c >= T); without it, no test at all. */
template <int BQ, bool MASK>
__device__ __forceinline__ void tc_dkv_p(float (*s)[4], float (*dp)[4], const float *Ls,
                                         const float *Ds, int di, i64 q0, i64 T, int t, float sl2,
                                         float scale)
{
#pragma unroll
    for (int nt = 0; nt < BQ / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int c = nt * 8 + 2 * t + (e & 1);
            const bool in = !MASK || (di + nt * 8 + (e & 1) - 8 * (e >> 1) >= 0 && q0 + c < T);
            const float p = in ? tc_exp2(s[nt][e] * sl2 - Ls[c]) : 0.0f;
            s[nt][e] = p;
            dp[nt][e] = p * fmaf(dp[nt][e], scale, -Ds[c]);
        }
}

/* dk, dv (B, H / G, T, D) from the stats and g16 (dO as bf16, as tc_dkv_issue reads it): rows are
 * keys; a key tile's work is its items, the query tiles i >= its first key of each query head
 * of the key/value head's group in turn (head-major), each head's streamed double-buffered as
 * the forward's tiles. split S > 1 (the launcher's choice when the key tiles alone would leave
 * SMs idle: large groups at a small B T) gives each key tile S blocks, block c its items
 * [c n / S, (c + 1) n / S); each writes its f32 sums to frag (S slots per tile, this thread's
 * fragment elements strided by the block's threads) and the tile's last block to arrive (cnt,
 * zeroed before the launch) adds the S slots in order 0..S-1, whichever block it is, so the
 * result does not depend on the blocks' timing, and writes the outputs. */
template <int DM, int BQ, class TQ>
__device__ void tc_dkv(const TQ *q, const TQ *k, const TQ *v, const unsigned short *g16,
                       unsigned gbthd, i64 gD, const float *stats, float *dk, float *dv, void *k2,
                       void *v2, int kv2b, double k2rot, double v2rot, int kv2inv, float *kpart,
                       float *vpart, float *frag, unsigned *cnt, int split, i64 B, i64 H, i64 T,
                       i64 D, float scale, unsigned bthd)
{
    constexpr int L = DM + 8, N1 = 2 * TC_BR * L, N2 = 2 * BQ * L; /* N2: a Q and a dO tile */
    constexpr int NF = DM / 2; /* f32 elements of one accumulator's fragment per thread */
    __shared__ float4 smv[(N1 > 2 * N2 ? N1 : 2 * N2) / 8];
    static_assert(TC_BR * (DM + 4) * sizeof(float) <= sizeof smv, "tc_stage fits");
    __shared__ float Ls2[2][BQ], Ds2[2][BQ];
    __shared__ int last;
    unsigned short *sm = (unsigned short *)smv;
    const float sl2 = scale * TC_LOG2E;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    i64 nkb = (T + TC_BR - 1) / TC_BR;
    const i64 G = cuk_att_group(bthd), Hk = H / G, S = split;
    for (i64 blk = blockIdx.x; blk < B * Hk * nkb * S; blk += gridDim.x) {
        const i64 tile = blk / S, c = blk - tile * S;
        i64 bk = tile / nkb, kb = tile % nkb, b = bk / Hk, hk = bk % Hk;
        i64 j0 = kb * TC_BR + w * 16 + g; /* this lane's keys: j0 and j0 + 8 */
        unsigned ka[DM / 16][4], va[DM / 16][4];
        tc_rows_a<DM>(ka, va, sm, k, 1, v, 2, bthd, b, hk, kb * TC_BR, Hk, T, D);
        float ak[DM / 8][4], av[DM / 8][4];
#pragma unroll
        for (int dn = 0; dn < DM / 8; dn++)
            for (int e = 0; e < 4; e++)
                ak[dn][e] = av[dn][e] = 0.0f;
        const i64 qs = (kb * TC_BR) / BQ * BQ, nq = (T - qs + BQ - 1) / BQ;
        /* this block's items: i0 .. i1 - 1, head-major (item i: head hk G + i / nq, queries
         * from qs + (i % nq) BQ); all of them (G nq) unless split */
        const i64 i0 = c * G * nq / S, i1 = (c + 1) * G * nq / S;
        const i64 h0 = i0 / nq, h1 = i0 < i1 ? (i1 - 1) / nq : h0 - 1; /* its heads' range */
        for (i64 hi = h0; hi <= h1; hi++) {
            const i64 h = hk * G + hi, bh = b * H + h;
            const i64 qb = qs + (hi == h0 ? i0 % nq : 0) * BQ;
            const i64 qe = hi == h1 ? min(T, qs + ((i1 - 1) % nq + 1) * BQ) : T;
            __syncthreads(); /* every warp has its k, v fragments (or is done with the previous
                              * head's last tile): the staging area is free */
            tc_dkv_issue<DM, BQ>(sm, Ls2[0], Ds2[0], q, g16, gbthd, gD, stats, bthd, b, h, bh, qb,
                                 B, H, T, D);
            cuk_cp_async_commit();
            for (i64 q0 = qb, u = 0; q0 < qe; q0 += BQ, u ^= 1) { /* u: tile q0's buffer */
                unsigned short *Qs = sm + u * N2, *Gs = Qs + BQ * L;
                float *Ls = Ls2[u], *Ds = Ds2[u];
                tc_turn(q0 + BQ < qe, [&] {
                    tc_dkv_issue<DM, BQ>(sm + (u ^ 1) * N2, Ls2[u ^ 1], Ds2[u ^ 1], q, g16, gbthd,
                                         gD, stats, bthd, b, h, bh, q0 + BQ, B, H, T, D);
                });
                if (threadIdx.x < BQ) { /* this thread's L and delta have landed */
                    Ls[threadIdx.x] *= TC_LOG2E;
                    Ds[threadIdx.x] *= scale; /* as in dQ */
                }
                __syncthreads(); /* every thread's copies and scalings */
                if (q0 + BQ - 1 < kb * TC_BR + w * 16) continue; /* every query before the keys */
                float s[BQ / 8][4], dp[BQ / 8][4];
                tc_rows_by<DM, BQ>(s, ka, Qs, L, lane);  /* k . q */
                tc_rows_by<DM, BQ>(dp, va, Gs, L, lane); /* v . dO */
                /* masks only where a query may precede a key or be past T (warp-uniform); two
                 * copies of the loop, so that the unmasked tiles (all but a key tile's first) run
                 * without a test and a branch per element (Session 31: the one shared loop made
                 * the compiled tile loop twice as long as its unmasked path) */
                if (TC_WHOLE(q0 >= kb * TC_BR + w * 16 + 15 && q0 + BQ <= T))
                    tc_dkv_p<BQ, false>(s, dp, Ls, Ds, 0, 0, 0, t, sl2, scale);
                else
                    tc_dkv_p<BQ, true>(s, dp, Ls, Ds, (int)(q0 - j0) + 2 * t, q0, T, t, sl2, scale);
                tc_acc_by<DM, BQ>(av, s, Gs, L, lane);
                tc_acc_by<DM, BQ>(ak, dp, Qs, L, lane);
            }
        }
        if (S > 1) { /* the split's sums (uniform over the grid) */
            float *mine = frag + (tile * S + c) * 2 * NF * TC_THREADS + threadIdx.x;
#pragma unroll
            for (int dn = 0; dn < DM / 8; dn++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    mine[(dn * 4 + e) * TC_THREADS] = ak[dn][e];
                    mine[(NF + dn * 4 + e) * TC_THREADS] = av[dn][e];
                }
            __threadfence(); /* the sums visible to the grid before the count says so */
            __syncthreads();
            if (threadIdx.x == 0) last = atomicAdd(cnt + tile, 1u) == (unsigned)(S - 1);
            __syncthreads();
            if (!last) continue;
            __threadfence();
            /* every slot from memory, this block's too: the same order whichever block is last */
            const volatile float *all = frag + tile * S * 2 * NF * TC_THREADS + threadIdx.x;
#pragma unroll
            for (int dn = 0; dn < DM / 8; dn++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int ik = (dn * 4 + e) * TC_THREADS, iv = (NF + dn * 4 + e) * TC_THREADS;
                    float sk = all[ik], sv = all[iv];
                    for (i64 o = 1; o < S; o++) {
                        sk += all[o * 2 * NF * TC_THREADS + ik];
                        sv += all[o * 2 * NF * TC_THREADS + iv];
                    }
                    ak[dn][e] = sk, av[dn][e] = sv;
                }
        }
        if (k2 || v2 || kpart || vpart) { /* the cotangent form (uniform over the grid) */
            float *st = (float *)smv;
            tc_stage<DM>(st, av, w, g, t, D);
            cuk_att_grads_out<TC_BR>(st, DM + 4, dv, v2, kv2b >> 1 & 1, v2rot, kv2inv >> 1 & 1,
                                     vpart, b, hk, kb * TC_BR, Hk, T, D);
            tc_stage<DM>(st, ak, w, g, t, D);
            cuk_att_grads_out<TC_BR>(st, DM + 4, dk, k2, kv2b & 1, k2rot, kv2inv & 1, kpart, b, hk,
                                     kb * TC_BR, Hk, T, D);
            continue;
        }
        float one[2] = {1.0f, 1.0f};
        tc_store<DM>(dv, av, bk, j0, T, D, one, t);
        tc_store<DM>(dk, ak, bk, j0, T, D, one, t);
    }
}

/* Entry points, one per head-size class (D <= DM) and q/k/v type (f32, rounded to bf16 as the
 * tiles are stored, or bf16 bit patterns copied: the _b kernels, precision.activations: bf16):
 * BC key rows per tile for the forward and dQ, BQ query rows per tile for dK/dV; the statistics
 * and dQ kernels also per dO type TG and o type TO (f32, or bf16 with bf16 q/k/v: dO in the _bg
 * kernels, passes.c fold_attention_dout16, and o too in the _bgo ones, fold_attention_o16). Block:
 * TC_THREADS threads, static shared memory only (at most 48 KiB). */
#define TC_FWD(DM, BC, BQ, TQ, SFX)                                                                \
    extern "C" __global__ void __launch_bounds__(TC_THREADS, 3) cuk_att_tc_fwd##SFX##_d##DM(       \
        const TQ *q, const TQ *k, const TQ *v, float *o, void *o2, int o2b, float *lse, i64 B,     \
        i64 H, i64 T, i64 D, float scale, unsigned bthd)                                           \
    {                                                                                              \
        tc_fwd<DM, BC, false>(q, k, v, o, o2, o2b, (const float *)nullptr, nullptr, lse, B, H, T,  \
                              D, scale, bthd);                                                     \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(TC_THREADS) cuk_att_tc_dkv##SFX##_d##DM(          \
        const TQ *q, const TQ *k, const TQ *v, const unsigned short *g16, unsigned gbthd, i64 gD,  \
        const float *stats, float *dk, float *dv, void *k2, void *v2, int kv2b, double k2rot,      \
        double v2rot, int kv2inv, float *kpart, float *vpart, float *frag, unsigned *cnt,          \
        int split, i64 B, i64 H, i64 T, i64 D, float scale, unsigned bthd)                         \
    {                                                                                              \
        tc_dkv<DM, BQ>(q, k, v, g16, gbthd, gD, stats, dk, dv, k2, v2, kv2b, k2rot, v2rot, kv2inv, \
                       kpart, vpart, frag, cnt, split, B, H, T, D, scale, bthd);                   \
    }
#define TC_BWD(DM, BC, TQ, TO, TG, SFX)                                                            \
    extern "C" __global__ void __launch_bounds__(TC_THREADS) cuk_att_tc_stats##SFX##_d##DM(        \
        const TQ *q, const TQ *k, const TO *o, const TG *dout, float *stats, i64 B, i64 H, i64 T,  \
        i64 D, float scale, unsigned bthd)                                                         \
    {                                                                                              \
        tc_fwd<DM, BC, true>(q, k, (const TQ *)nullptr, (TO *)o, nullptr, 0, dout, stats, nullptr, \
                             B, H, T, D, scale, bthd);                                             \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(TC_THREADS, DM <= 64 ? 3 : 2)                     \
        cuk_att_tc_dq##SFX##_d##DM(                                                                \
            const TQ *q, const TQ *k, const TQ *v, const TO *o, const TG *dout, const float *lse,  \
            float *stats, unsigned short *g16, float *dq, void *g2, int g2b, double g2rot,         \
            int g2inv, float *part, i64 B, i64 H, i64 T, i64 D, float scale, unsigned bthd)        \
    {                                                                                              \
        tc_dq<DM, BC>(q, k, v, o, dout, lse, stats, g16, dq, g2, g2b, g2rot, g2inv, part, B, H, T, \
                      D, scale, bthd);                                                             \
    }

/* dK/dV: query tiles of 16 for D 128 keep its 64 + 64 accumulators unspilled */
TC_FWD(64, 64, 64, float, )
TC_FWD(128, 32, 16, float, )
TC_FWD(64, 64, 64, unsigned short, _b)
TC_FWD(128, 32, 16, unsigned short, _b)
TC_BWD(64, 64, float, float, float, )
TC_BWD(128, 32, float, float, float, )
TC_BWD(64, 64, unsigned short, float, float, _b)
TC_BWD(128, 32, unsigned short, float, float, _b)
TC_BWD(64, 64, unsigned short, float, unsigned short, _bg)
TC_BWD(128, 32, unsigned short, float, unsigned short, _bg)
TC_BWD(64, 64, unsigned short, unsigned short, unsigned short, _bgo)
TC_BWD(128, 32, unsigned short, unsigned short, unsigned short, _bgo)
