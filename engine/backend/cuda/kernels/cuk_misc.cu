/*
 * cuk_misc.cu — data-movement kernels of the CUDA backend: embedding gather and its transpose
 * (scatter-add with atomics), rotary embedding, and the row fill used by a K = 0 GEMM. Same
 * semantics as the jdt_rt_* functions of engine/runtime/runtime.h.
 */
#include "cuk_common.cuh"

/* out (n, C) = table (V, C) rows idx (n); an index outside [0, V) gives a zero row. One block
 * per output row (grid-stride over rows), threads over C. */
extern "C" __global__ void CUK_ROW_BOUNDS cuk_gather(const float *table, const i32 *idx, float *out,
                                                     i64 n, i64 V, i64 C, int vec)
{
    for (i64 i = blockIdx.x; i < n; i += gridDim.x) {
        i64 r = idx[i];
        if (r >= 0 && r < V) {
            cuk_row_map(table + r * C, out + i * C, C, vec, [&](i64, float a) { return a; });
        } else {
            for (i64 c = threadIdx.x; c < C; c += blockDim.x)
                out[i * C + c] = 0.0f;
        }
    }
}

/* out[idx[i]] += src[i] (out zeroed by the launcher first); indices outside [0, V) skipped.
 * Duplicate indices meet in atomicAdd (float atomics: the summation order varies run to run). */
extern "C" __global__ void cuk_scatter_add(const float *src, const i32 *idx, float *out, i64 n,
                                           i64 V, i64 C)
{
    for (i64 i = blockIdx.x; i < n; i += gridDim.x) {
        i64 r = idx[i];
        if (r < 0 || r >= V) continue;
        const float *s = src + i * C;
        float *o = out + r * C;
        for (i64 c = threadIdx.x; c < C; c += blockDim.x)
            atomicAdd(o + c, s[c]);
    }
}

/* y (B, T, H, D) = rotation of pairs (2i, 2i+1) of x by t * theta^(-2i/D) (scaled as Llama 3's
 * rope_scaling when factor > 0: cuk_rope_freq; negated when inverse). One thread per pair, grid-stride; the angle in double like the CPU kernel. x16: x
 * holds bf16 bit patterns (widened exactly); y16: y is stored as bf16, rounded to nearest even
 * (the f32 result's CAST): the same numbers as f32 in and a rounding CAST after. */
extern "C" __global__ void cuk_rope(const void *xv, void *yv, i64 B, i64 T, i64 H, i64 D,
                                    double theta, int inverse, int x16, int y16, int x_bhtd,
                                    double factor, double lo, double hi, double orig)
{
    i64 half = D / 2, n_pairs = B * T * H * half;
    for (i64 p = (i64)blockIdx.x * blockDim.x + threadIdx.x; p < n_pairs;
         p += (i64)gridDim.x * blockDim.x) {
        i64 i = p % half, t = (p / (half * H)) % T;
        i64 o = 2 * p; /* pairs are contiguous: element index of the pair's first value */
        i64 xo = o;    /* x's: the same, or in (B, H, T, D) order */
        if (x_bhtd) xo = ((p / (half * H * T) * H + (p / half) % H) * T + t) * D + 2 * i;
        float x0, x1;
        if (x16) {
            x0 = cuk_ld((const unsigned short *)xv, xo),
            x1 = cuk_ld((const unsigned short *)xv, xo + 1);
        } else {
            x0 = ((const float *)xv)[xo], x1 = ((const float *)xv)[xo + 1];
        }
        float y0, y1;
        cuk_rope_pair_f(x0, x1, t, cuk_rope_freq(theta, i, D, factor, lo, hi, orig), inverse, &y0,
                        &y1);
        if (y16) {
            ((unsigned short *)yv)[o] = cuk_bf16_bits(y0);
            ((unsigned short *)yv)[o + 1] = cuk_bf16_bits(y1);
        } else {
            ((float *)yv)[o] = y0, ((float *)yv)[o + 1] = y1;
        }
    }
}

/* c (rows, N) = bias broadcast over rows, or 0 when bias is NULL. Grid-stride over elements. */
extern "C" __global__ void cuk_fill_rows(float *c, const float *bias, i64 rows, i64 N)
{
    i64 n_elems = rows * N;
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < n_elems;
         e += (i64)gridDim.x * blockDim.x)
        c[e] = bias ? bias[e % N] : 0.0f;
}

/* y (n, bf16 bits) = x (n, f32) rounded to bf16: the inputs of a bf16 GEMM (cuk_gemm.c).
 * Grid-stride; vec: x 16-byte and y 8-byte aligned and n % 4 == 0 (float4 in, 4 x u16 out). */
extern "C" __global__ void cuk_to_bf16(const float *x, unsigned short *y, i64 n, int vec)
{
    i64 stride = (i64)gridDim.x * blockDim.x, t0 = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (vec) {
        for (i64 i = t0; i < n / 4; i += stride) {
            float4 v = ((const float4 *)x)[i];
            ((ushort4 *)y)[i] = make_ushort4(cuk_bf16_bits(v.x), cuk_bf16_bits(v.y),
                                             cuk_bf16_bits(v.z), cuk_bf16_bits(v.w));
        }
        return;
    }
    for (i64 i = t0; i < n; i += stride)
        y[i] = cuk_bf16_bits(x[i]);
}

/* y (n, f32) = x (n, bf16 bits) widened: a bf16-stored GEMM input for the bf16 GEMM's TF32
 * fallback (exact). Grid-stride. */
extern "C" __global__ void cuk_bf16_widen(const unsigned short *x, float *y, i64 n)
{
    i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = __uint_as_float((unsigned int)x[i] << 16);
}

/* y (n, bf16 bits) = GELU (tanh form, as the compiler's kernels) of x (n, bf16 bits), rounded to
 * nearest even: the bf16 GEMM's GELU epilogue where cuBLASLt has none (jdt_cuk_matmul_bf16_gelu).
 * Grid-stride. */
extern "C" __global__ void cuk_gelu_bf16(const unsigned short *x, unsigned short *y, i64 n)
{
    i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = __uint_as_float((unsigned int)x[i] << 16);
        y[i] =
            cuk_bf16_bits(0.5f * v * (1.0f + tanhf(0.7978845608f * (v + 0.044715f * v * v * v))));
    }
}

/* g (n, bf16 bits) *= GELU'(u) (u: n bf16 bits, the tanh form's derivative), in place, rounded
 * to nearest even: the DGELU epilogue where cuBLASLt has none (jdt_cuk_matmul_bf16_dgelu).
 * Grid-stride. */
extern "C" __global__ void cuk_dgelu_bf16(const unsigned short *u, unsigned short *g, i64 n)
{
    i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float x = __uint_as_float((unsigned int)u[i] << 16);
        const float t = tanhf(0.7978845608f * (x + 0.044715f * x * x * x));
        const float d = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.7978845608f *
                                                (1.0f + 3.0f * 0.044715f * x * x);
        g[i] = cuk_bf16_bits(__uint_as_float((unsigned int)g[i] << 16) * d);
    }
}

/* The column sums of x (rows, N, bf16 bits) into y (N, f32): the bias gradient where cuBLASLt
 * has no DGELU_BGRAD epilogue (jdt_cuk_matmul_bf16_dgelu), in two passes that fill the GPU.
 * Block b sums the rows of chunk q = b / tiles (`chunk` rows from q chunk) in its 64 columns
 * (tile b % tiles; a warp reads 128 contiguous bytes of a row): warp w every 8th row from
 * w, then the 8 warps' sums in warp order, into part[q][col]; cuk_colsum_f32 then adds the
 * chunks in order. The launcher picks the chunks from the shape alone, so the sums are the
 * same bits on any GPU and schedule (check_cuk replays the order on the host). */
extern "C" __global__ void __launch_bounds__(256)
    cuk_colsum_bf16(const unsigned short *x, float *part, i64 rows, i64 N, i64 chunk)
{
    __shared__ float red[8][64];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const i64 tiles = (N + 63) / 64, tile = blockIdx.x % tiles, q = blockIdx.x / tiles;
    const i64 c0 = tile * 64 + lane, c1 = c0 + 32;
    const i64 r0 = q * chunk, r1 = min(rows, r0 + chunk);
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll 4
    for (i64 r = r0 + w; r < r1; r += 8) {
        const unsigned short *row = x + r * N;
        if (c0 < N) s0 += __uint_as_float((unsigned int)row[c0] << 16);
        if (c1 < N) s1 += __uint_as_float((unsigned int)row[c1] << 16);
    }
    red[w][lane] = s0;
    red[w][lane + 32] = s1;
    __syncthreads();
    const i64 c = tile * 64 + threadIdx.x;
    if (threadIdx.x < 64 && c < N) {
        float t = red[0][threadIdx.x];
        for (int v = 1; v < 8; v++)
            t += red[v][threadIdx.x];
        part[q * N + c] = t;
    }
}

/* y (N) = the sum over q < chunks of part (chunks, N), in order: cuk_colsum_bf16's second pass. */
extern "C" __global__ void cuk_colsum_f32(const float *part, float *y, i64 chunks, i64 N)
{
    const i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= N) return;
    float t = part[c];
    for (i64 q = 1; q < chunks; q++)
        t += part[q * N + c];
    y[c] = t;
}

/* y (n, f32) = x rounded to bf16, kept in f32 (the bf16 GEMM's fallback: TF32 tensor cores
 * multiply such values exactly). Grid-stride. */
extern "C" __global__ void cuk_bf16_round(const float *x, float *y, i64 n)
{
    i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = __uint_as_float((unsigned int)cuk_bf16_bits(x[i]) << 16);
}
