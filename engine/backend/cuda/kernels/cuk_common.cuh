/*
 * cuk_common.cuh — shared device helpers for the builtin CUDA kernels (compiled at run time by
 * NVRTC, which has no system headers: everything here is self-contained). Block/warp
 * reductions, float4 row access and the index types. Included by every kernels/*.cu file.
 */
#pragma once

typedef long long i64;
typedef int i32;

#define CUK_WARP 32
/* The bound of the kernels cuk.c launches a block per row with row_threads (up to 1024 threads):
 * ptxas then keeps them within 64 registers a thread, so a block of 1024 fits an SM's 65536.
 * Without a bound a kernel may take up to 255 and a launch past 256 threads would work only as
 * long as it happened to take fewer (the host emulator refuses such a launch). */
#define CUK_ROW_BOUNDS __launch_bounds__(1024)
#define CUK_FULL 0xffffffffu
#define CUK_NEG_INF __int_as_float(0xff800000)
#define CUK_NAN __int_as_float(0x7fc00000)

/* The block's dynamic shared memory as `T name[]` (check_cuk's host emulation, which defines
 * JDT_CUK_EMU, supplies its own). */
#ifndef JDT_CUK_EMU
#define CUK_DYN_SMEM(T, name) extern __shared__ T name[]
#endif

__device__ __forceinline__ float cuk_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(CUK_FULL, v, o);
    return v;
}

__device__ __forceinline__ float cuk_warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(CUK_FULL, v, o));
    return v;
}

/* Sum of v over the block, returned to every thread. sh: 32 floats of shared memory. The block
 * size must be a multiple of 32 (every launcher uses 128..1024). Contains __syncthreads: every
 * thread of the block must call it. */
__device__ __forceinline__ float cuk_block_sum(float v, float *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = cuk_warp_sum(v);
    __syncthreads(); /* sh may still be read by a previous reduction */
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return cuk_warp_sum(v);
}

__device__ __forceinline__ float cuk_block_max(float v, float *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = cuk_warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : CUK_NEG_INF;
    return cuk_warp_max(v);
}

/* x (f32) rounded to the nearest bf16, ties to even (jdt_rt_bf16_round's rule): the bit
 * pattern. A NaN stays a (quiet) NaN; values past the largest bf16 round to Inf. */
__device__ __forceinline__ unsigned short cuk_bf16_bits(float x)
{
    unsigned int u = __float_as_uint(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* The attention forward's optional second output (the compiler's fold_attention_copies): the
 * value v of o at (b, h, i, d) into o2, a (B, T, H, D) copy (the layout of the transpose the
 * projection's GEMM reads), bf16 bit patterns with o2_bf16, else f32. */
__device__ __forceinline__ void cuk_att_store2(void *o2, int o2_bf16, i64 b, i64 h, i64 i, i64 d,
                                               i64 H, i64 T, i64 D, float v)
{
    const i64 at = ((b * T + i) * H + h) * D + d;
    if (o2_bf16)
        ((unsigned short *)o2)[at] = cuk_bf16_bits(v);
    else
        ((float *)o2)[at] = v;
}

/* RoPE's frequency of pair i of a head of size D: theta^(-2i/D), scaled as Llama 3's
 * rope_scaling when factor > 0 (low/high frequency factors lo, hi, original context orig):
 * the device copy of jdt_rope_freq (engine/core/util.c), the same double arithmetic. */
__device__ __forceinline__ double cuk_rope_freq(double theta, i64 i, i64 D, double factor,
                                                double lo, double hi, double orig)
{
    const double f = pow(theta, -2.0 * (double)i / (double)D);
    if (!(factor > 0)) return f;
    const double wavelen = 2.0 * 3.14159265358979323846 / f;
    if (wavelen < orig / hi) return f;
    if (wavelen > orig / lo) return f / factor;
    const double smooth = (orig / wavelen - lo) / (hi - lo);
    return (1.0 - smooth) * f / factor + smooth * f;
}

/* RoPE's rotation of the pair (x0, x1) at sequence position t by the angle t freq (minus it
 * when inverse), found in double. */
__device__ __forceinline__ void cuk_rope_pair_f(float x0, float x1, i64 t, double freq,
                                                int inverse, float *y0, float *y1)
{
    double ang = (inverse ? -1.0 : 1.0) * (double)t * freq;
    float cs = (float)cos(ang), sn = (float)sin(ang);
    /* rounded products and sum, never a fused multiply-add: NVRTC may contract a * b - c * d
     * either way, and two kernels inlining this would then differ in the last bit (a suspect
     * for the attention backward's rotated copies, which did not match cuk_rope's on an H200) */
    *y0 = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
    *y1 = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cs));
}

/* cuk_rope_pair_f for pair i of a head of size D at theta^(-2i/D), unscaled: cuk_rope's
 * arithmetic, shared with the attention backward's cotangent form (which the compiler gives
 * only unscaled RoPEs). */
__device__ __forceinline__ void cuk_rope_pair(float x0, float x1, i64 t, i64 i, i64 D, double theta,
                                              int inverse, float *y0, float *y1)
{
    cuk_rope_pair_f(x0, x1, t, pow(theta, -2.0 * (double)i / (double)D), inverse, y0, y1);
}

/* Grouped-query attention (cuk.h JDT_CUK_ATT_GROUP): bits 8 and up of the attention kernels'
 * layout word bthd hold G, the query heads that share one key/value head (0: 1). k and v then
 * have H / G heads, query head h reading key/value head h / G; dk and dv are (B, H / G, T, D),
 * each the sum over its group's query heads. */
__device__ __forceinline__ i64 cuk_att_group(unsigned bthd)
{
    const unsigned g = bthd >> 8;
    return g ? (i64)g : 1;
}

/* Rows per partial column sum of the attention backward's cotangent form (cuk.h
 * JDT_CUK_ATT_PART): a multiple of both kernels' blocks start every chunk. */
#define CUK_ATT_PART 32

/* The attention backward's cotangent form (the compiler's fold_attention_cotangents): rows
 * r0..r0+R-1 of slice (b, h) of dq, dk or dv, staged as f32 in shared memory (row stride ls)
 * by the caller, stored coalesced: into out (B, H, T, D) f32 unless NULL, into g2, the
 * (B, T, H, D) copy the projection's GEMMs read (cuk_att_store2; none when NULL; rotated as
 * RoPE's backward would, cuk_rope_pair, when rot is not 0: rot is theta, inverse rot_inv), and,
 * unless part is NULL, summed per column over each CUK_ATT_PART rows into row b ceil(T /
 * CUK_ATT_PART) + i / CUK_ATT_PART, columns h D.., of part (P, H D): the bias gradient's
 * partial rows, of the copy's f32 values (rotated when it is: Qwen2's q and k biases, before
 * the RoPE; the rotated rows then replace the staged ones). r0 is a multiple of CUK_ATT_PART;
 * rows past T are neither stored nor summed. Every thread of the block calls it, between the
 * __syncthreads ending the staging and one before stage is written again.
 *
 * It runs once per block after the tile loop, and once cost half as much as that loop: one
 * element per thread and pass, each with a 64-bit division (about 25 instructions on its 32-bit
 * path) and a 2-byte store, made the dK/dV kernel's epilogue about 4.9 K instructions a warp
 * against its tile loops' 8.8 K (Session 31, docs/perf.md). So each thread owns 8 columns of a row at a time: two float4 reads of the
 * stage, float4 stores to out, one 16-byte store of 8 bf16 to g2; 32-bit index arithmetic; the
 * thread -> (row, columns) map found once. That needs D % 8 == 0, D / 8 <= blockDim.x, ls % 4
 * == 0 and 16-byte aligned stage, out and g2 (block-uniform); otherwise one element at a time,
 * as before. */
template <int R>
__device__ __forceinline__ void cuk_att_grads_out(float *stage, int ls, float *out, void *g2,
                                                  int g2b, double rot, int rot_inv, float *part,
                                                  i64 b, i64 h, i64 r0, i64 H, i64 T, i64 D)
{
    const bool rotate = g2 && rot != 0.0;
    const int nr = (int)(T - r0 < R ? T - r0 : R); /* rows of this block before T */
    const int Di = (int)D;
    const bool vec = (Di & 7) == 0 && Di / 8 <= (int)blockDim.x && (ls & 3) == 0 &&
                     ((unsigned long long)stage & 15) == 0 &&
                     ((unsigned long long)out & 15) == 0 && ((unsigned long long)g2 & 15) == 0;
    if (vec && (out || g2)) {
        const int G = Di >> 3, rp = (int)blockDim.x / G; /* 8-column groups a row, rows a pass */
        const int c8 = ((int)threadIdx.x % G) * 8;
        for (int rr = (int)threadIdx.x / G; rr < nr && (int)threadIdx.x < rp * G; rr += rp) {
            const i64 i = r0 + rr;
            float4 *s4 = (float4 *)(stage + rr * ls + c8);
            const float4 lo = s4[0], hi = s4[1];
            if (out) {
                float4 *o4 = (float4 *)(out + ((b * H + h) * T + i) * D + c8);
                o4[0] = lo;
                o4[1] = hi;
            }
            if (!g2) continue;
            float y[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
            if (rotate) {
                for (int p = 0; p < 4; p++)
                    cuk_rope_pair(y[2 * p], y[2 * p + 1], i, c8 / 2 + p, D, rot, rot_inv,
                                  &y[2 * p], &y[2 * p + 1]);
                if (part) { /* this thread's 8 columns of the row: no other reads them here */
                    s4[0] = make_float4(y[0], y[1], y[2], y[3]);
                    s4[1] = make_float4(y[4], y[5], y[6], y[7]);
                }
            }
            const i64 at = ((b * T + i) * H + h) * D + c8;
            if (g2b) {
                unsigned u[4];
                for (int p = 0; p < 4; p++)
                    u[p] = (unsigned)cuk_bf16_bits(y[2 * p]) |
                           (unsigned)cuk_bf16_bits(y[2 * p + 1]) << 16;
                *(uint4 *)((unsigned short *)g2 + at) = make_uint4(u[0], u[1], u[2], u[3]);
            } else {
                float4 *g4 = (float4 *)((float *)g2 + at);
                g4[0] = make_float4(y[0], y[1], y[2], y[3]);
                g4[1] = make_float4(y[4], y[5], y[6], y[7]);
            }
        }
    } else {
        for (int e = threadIdx.x; e < nr * Di && (out || (g2 && !rotate)); e += blockDim.x) {
            const int rr = e / Di, d = e - rr * Di;
            const i64 i = r0 + rr;
            float v = stage[rr * ls + d];
            if (out) out[((b * H + h) * T + i) * D + d] = v;
            if (g2 && !rotate) cuk_att_store2(g2, g2b, b, h, i, d, H, T, D, v);
        }
        const int half = Di / 2;
        if (rotate && part) __syncthreads(); /* (block-uniform) out read the rows unrotated */
        for (int e = threadIdx.x; rotate && e < nr * half; e += blockDim.x) {
            const int rr = e / half, p = e - rr * half;
            const i64 i = r0 + rr;
            float y0, y1;
            cuk_rope_pair(stage[rr * ls + 2 * p], stage[rr * ls + 2 * p + 1], i, p, D, rot,
                          rot_inv, &y0, &y1);
            cuk_att_store2(g2, g2b, b, h, i, 2 * p, H, T, D, y0);
            cuk_att_store2(g2, g2b, b, h, i, 2 * p + 1, H, T, D, y1);
            if (part) stage[rr * ls + 2 * p] = y0, stage[rr * ls + 2 * p + 1] = y1; /* its pair */
        }
    }
    if (!part) return;
    if (rotate) __syncthreads(); /* (block-uniform) the rotated rows, every thread's */
    const i64 nc = (T + CUK_ATT_PART - 1) / CUK_ATT_PART;
    for (int e = threadIdx.x; e < (R / CUK_ATT_PART) * Di; e += blockDim.x) {
        const int c = e / Di, d = e - c * Di, rr0 = c * CUK_ATT_PART;
        if (rr0 >= nr) continue;
        float s = 0.0f;
        for (int rr = rr0; rr < rr0 + CUK_ATT_PART && rr < nr; rr++)
            s += stage[rr * ls + d];
        part[(b * nc + (r0 + rr0) / CUK_ATT_PART) * H * D + h * D + d] = s;
    }
}

/* Loads of f32 rows and of bf16 rows (bit patterns, widened exactly): element c, and the 4
 * elements of group i (a float4, or 8 bytes of bf16; the row 16- or 8-byte aligned). */
__device__ __forceinline__ float cuk_ld(const float *x, i64 c) { return x[c]; }
__device__ __forceinline__ float cuk_ld(const unsigned short *x, i64 c)
{
    return __uint_as_float((unsigned int)x[c] << 16);
}
__device__ __forceinline__ float4 cuk_ld4(const float *x, i64 i) { return ((const float4 *)x)[i]; }
__device__ __forceinline__ float4 cuk_ld4(const unsigned short *x, i64 i)
{
    uint2 u = ((const uint2 *)x)[i];
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                       __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
}

/* Calls f(c, x[c]) for every c < C of a row, each thread a strided share. With vec (C % 4 == 0
 * and x 16-byte aligned, checked by the launcher) the loads are float4. */
template <class F>
__device__ __forceinline__ void cuk_row_visit(const float *x, i64 C, bool vec, F f)
{
    if (vec) {
        const float4 *x4 = (const float4 *)x;
        for (i64 i = threadIdx.x; i < C / 4; i += blockDim.x) {
            float4 a = x4[i];
            f(4 * i, a.x);
            f(4 * i + 1, a.y);
            f(4 * i + 2, a.z);
            f(4 * i + 3, a.w);
        }
    } else {
        for (i64 c = threadIdx.x; c < C; c += blockDim.x)
            f(c, x[c]);
    }
}

/* Two rows visited together: f(c, x[c], y[c]); vec as above for both. */
template <class F>
__device__ __forceinline__ void cuk_row_visit2(const float *x, const float *y, i64 C, bool vec,
                                               F f)
{
    if (vec) {
        const float4 *x4 = (const float4 *)x, *y4 = (const float4 *)y;
        for (i64 i = threadIdx.x; i < C / 4; i += blockDim.x) {
            float4 a = x4[i], b = y4[i];
            f(4 * i, a.x, b.x);
            f(4 * i + 1, a.y, b.y);
            f(4 * i + 2, a.z, b.z);
            f(4 * i + 3, a.w, b.w);
        }
    } else {
        for (i64 c = threadIdx.x; c < C; c += blockDim.x)
            f(c, x[c], y[c]);
    }
}

/* y[c] = f(c, x[c]) for every c < C; float4 loads and stores with vec (y aligned too). */
template <class F>
__device__ __forceinline__ void cuk_row_map(const float *x, float *y, i64 C, bool vec, F f)
{
    if (vec) {
        const float4 *x4 = (const float4 *)x;
        float4 *y4 = (float4 *)y;
        for (i64 i = threadIdx.x; i < C / 4; i += blockDim.x) {
            float4 a = x4[i];
            y4[i] = make_float4(f(4 * i, a.x), f(4 * i + 1, a.y), f(4 * i + 2, a.z),
                                f(4 * i + 3, a.w));
        }
    } else {
        for (i64 c = threadIdx.x; c < C; c += blockDim.x)
            y[c] = f(c, x[c]);
    }
}

/* y[c] = f(c, x[c], g[c]); vec as above for all three rows. */
template <class F>
__device__ __forceinline__ void cuk_row_map2(const float *x, const float *g, float *y, i64 C,
                                             bool vec, F f)
{
    if (vec) {
        const float4 *x4 = (const float4 *)x, *g4 = (const float4 *)g;
        float4 *y4 = (float4 *)y;
        for (i64 i = threadIdx.x; i < C / 4; i += blockDim.x) {
            float4 a = x4[i], b = g4[i];
            y4[i] = make_float4(f(4 * i, a.x, b.x), f(4 * i + 1, a.y, b.y),
                                f(4 * i + 2, a.z, b.z), f(4 * i + 3, a.w, b.w));
        }
    } else {
        for (i64 c = threadIdx.x; c < C; c += blockDim.x)
            y[c] = f(c, x[c], g[c]);
    }
}
