/*
 * cuk_rows.cu — row kernels of the CUDA backend: softmax, log-softmax, softmax cross-entropy,
 * layer and RMS normalisation, forward and backward. Same semantics as the jdt_rt_* functions
 * of engine/runtime/runtime.h (see engine/backend/cuda/cuk.h).
 *
 * Layout: one block per row (a grid-stride loop over rows when N exceeds the grid), threads
 * stride over the row, block reductions by warp shuffles. A logsumexp is one pass (online max
 * and sum); rows are re-read per pass otherwise (softmax: max, sum, write). The cross-entropy
 * backward takes the forward's per-row loss and reads its row once. `vec` (chosen by the
 * launcher) switches to float4 accesses.
 */
#include "cuk_common.cuh"

extern "C" __global__ void CUK_ROW_BOUNDS cuk_softmax(const float *x, float *y, i64 N, i64 C,
                                                      int vec)
{
    __shared__ float sh[32];
    for (i64 n = blockIdx.x; n < N; n += gridDim.x) {
        const float *xr = x + n * C;
        float *yr = y + n * C;
        float m = CUK_NEG_INF;
        cuk_row_visit(xr, C, vec, [&](i64, float a) { m = fmaxf(m, a); });
        m = cuk_block_max(m, sh);
        float s = 0.0f;
        cuk_row_visit(xr, C, vec, [&](i64, float a) { s += expf(a - m); });
        float inv = 1.0f / cuk_block_sum(s, sh);
        cuk_row_map(xr, yr, C, vec, [&](i64, float a) { return expf(a - m) * inv; });
    }
}

extern "C" __global__ void CUK_ROW_BOUNDS cuk_softmax_bwd(const float *y, const float *dy,
                                                          float *dx, i64 N, i64 C, int vec)
{
    __shared__ float sh[32];
    for (i64 n = blockIdx.x; n < N; n += gridDim.x) {
        const float *yr = y + n * C, *gr = dy + n * C;
        float s = 0.0f;
        cuk_row_visit2(yr, gr, C, vec, [&](i64, float a, float g) { s += a * g; });
        s = cuk_block_sum(s, sh);
        cuk_row_map2(yr, gr, dx + n * C, C, vec,
                     [&](i64, float a, float g) { return a * (g - s); });
    }
}

/* Folds a, b, c, d into a thread's running logsumexp state: m the largest value so far (-inf
 * before any), s the sum of exp(x - m). One exp per value and one for the rescale; -inf values
 * add nothing, a NaN makes s NaN (fmaxf skips it, its exp does not). */
__device__ __forceinline__ void cuk_lse_fold4(float &m, float &s, float a, float b, float c,
                                              float d)
{
    float mn = fmaxf(m, fmaxf(fmaxf(a, b), fmaxf(c, d)));
    float base = mn == CUK_NEG_INF ? 0.0f : mn;
    s = s * expf(m - base) +
        ((expf(a - base) + expf(b - base)) + (expf(c - base) + expf(d - base)));
    m = mn;
}

/* logsumexp of a row (f32 or bf16), to every thread of the block, in one pass over the row
 * (online: each thread keeps its own max and rescales its sum when the max grows; the block
 * combines them). A row of -inf gives -inf, a row with a NaN NaN. Every thread must call it
 * (barriers). vec: 4 values per load from a row aligned to them, the last C % 4 one by one. */
template <class T> __device__ float cuk_row_lse(const T *xr, i64 C, bool vec, float *sh)
{
    float m = CUK_NEG_INF, s = 0.0f;
    if (vec) {
        for (i64 i = threadIdx.x; i < C / 4; i += blockDim.x) {
            float4 a = cuk_ld4(xr, i);
            cuk_lse_fold4(m, s, a.x, a.y, a.z, a.w);
        }
        for (i64 c = C / 4 * 4 + threadIdx.x; c < C; c += blockDim.x)
            cuk_lse_fold4(m, s, cuk_ld(xr, c), CUK_NEG_INF, CUK_NEG_INF, CUK_NEG_INF);
    } else {
        const i64 bd = blockDim.x;
        for (i64 c = threadIdx.x; c < C; c += 4 * bd) {
            float v[4];
#pragma unroll
            for (int j = 0; j < 4; j++)
                v[j] = c + j * bd < C ? cuk_ld(xr, c + j * bd) : CUK_NEG_INF;
            cuk_lse_fold4(m, s, v[0], v[1], v[2], v[3]);
        }
    }
    float M = cuk_block_max(m, sh), base = M == CUK_NEG_INF ? 0.0f : M;
    return base + logf(cuk_block_sum(s * expf(m - base), sh));
}

extern "C" __global__ void CUK_ROW_BOUNDS cuk_log_softmax(const float *x, float *y, i64 N, i64 C,
                                                          int vec)
{
    __shared__ float sh[32];
    for (i64 n = blockIdx.x; n < N; n += gridDim.x) {
        const float *xr = x + n * C;
        float l = cuk_row_lse(xr, C, vec, sh);
        cuk_row_map(xr, y + n * C, C, vec, [&](i64, float a) { return a - l; });
    }
}

extern "C" __global__ void CUK_ROW_BOUNDS cuk_log_softmax_bwd(const float *y, const float *dy,
                                                              float *dx, i64 N, i64 C, int vec)
{
    __shared__ float sh[32];
    for (i64 n = blockIdx.x; n < N; n += gridDim.x) {
        const float *yr = y + n * C, *gr = dy + n * C;
        float s = 0.0f;
        cuk_row_visit(gr, C, vec, [&](i64, float g) { s += g; });
        s = cuk_block_sum(s, sh);
        cuk_row_map2(yr, gr, dx + n * C, C, vec,
                     [&](i64, float a, float g) { return g - expf(a) * s; });
    }
}

/* The cross-entropy kernels read f32 logits or (precision.activations: bf16, the compiler's
 * fold_bf16_casts) bf16 ones: templates over the logits' element type, one extern "C" entry
 * per type (the _b suffix: bf16 logits). Rows are ldx elements apart in the logits and ldd in
 * dlogits (>= V: padded rows, the compiler's fuse.c mark_pitched_rows; the padding is neither
 * read nor written). */

/* loss[n] = lse(row) - row[t]; t < 0 -> 0; t >= V -> NaN. */
template <class T>
__device__ __forceinline__ void xent_fwd(const T *logits, const i32 *tgt, float *loss, i64 N, i64 V,
                                         i64 ldx, i64 ldd, int vec)
{
    __shared__ float sh[32];
    for (i64 n = blockIdx.x; n < N; n += gridDim.x) {
        i64 t = tgt[n];
        if (t < 0 || t >= V) { /* uniform over the block */
            if (threadIdx.x == 0) loss[n] = t < 0 ? 0.0f : CUK_NAN;
            continue;
        }
        const T *xr = logits + n * ldx;
        float l = cuk_row_lse(xr, V, vec, sh);
        if (threadIdx.x == 0) loss[n] = l - cuk_ld(xr, t);
    }
}

extern "C" __global__ void CUK_ROW_BOUNDS cuk_softmax_xent(const float *logits, const i32 *tgt,
                                                           float *loss, i64 N, i64 V, i64 ldx,
                                                           i64 ldd, int vec)
{
    xent_fwd(logits, tgt, loss, N, V, ldx, ldd, vec);
}

extern "C" __global__ void CUK_ROW_BOUNDS cuk_softmax_xent_b(const unsigned short *logits,
                                                             const i32 *tgt, float *loss, i64 N,
                                                             i64 V, i64 ldx, i64 ldd, int vec)
{
    xent_fwd(logits, tgt, loss, N, V, ldx, ldd, vec);
}

/* The logsumexp of row n for the backward: from the forward's loss when there is one
 * (loss = lse - row[t], so lse = loss + row[t]: no pass over the row), else computed; xt is
 * row[t]. Uniform over the block (loss == NULL is). Ends with a barrier (the block reductions'
 * or its own): every read of the row but the backward's own element's is done, so dlogits may
 * be written over the logits (the device's xent_inplace). */
template <class T>
__device__ __forceinline__ float cuk_xent_lse(const T *xr, const float *loss, i64 n, float xt,
                                              i64 V, bool vec, float *sh)
{
    if (!loss) return cuk_row_lse(xr, V, vec, sh);
    __syncthreads();
    return loss[n] + xt;
}

/* The fused classifier's forward half (the compiler's fold_xent_backwards): with loss_out,
 * row n's loss from its logsumexp l and xt = row[t] (read before the row is written), or for a
 * target out of range 0 (t < 0) or NaN. By thread 0. */
__device__ __forceinline__ void cuk_xent_store_loss(float *loss_out, i64 n, i64 t, i64 V, float l,
                                                    float xt)
{
    if (loss_out && threadIdx.x == 0) loss_out[n] = t < 0 ? 0.0f : t >= V ? CUK_NAN : l - xt;
}

/* dlogits = dloss * (softmax(row) - onehot(t)); rows with t out of [0, V) are 0. dloss: the
 * per-row cotangents, or NULL for the same g for every row. loss: the forward's per-row loss
 * of these logits and targets (SOFTMAX_XENT's output), or NULL (the logsumexp is computed;
 * loss_out, when not NULL, receives the loss too). */
template <class T>
__device__ __forceinline__ void xent_bwd(const T *logits, const i32 *tgt, const float *dloss,
                                         float g, const float *loss, float *loss_out,
                                         float *dlogits, i64 N, i64 V, i64 ldx, i64 ldd, int vec)
{
    __shared__ float sh[32];
    for (i64 n = blockIdx.x; n < N; n += gridDim.x) {
        i64 t = tgt[n];
        const T *xr = logits + n * ldx;
        float *d = dlogits + n * ldd;
        if (t < 0 || t >= V) {
            cuk_xent_store_loss(loss_out, n, t, V, 0.0f, 0.0f);
            for (i64 c = threadIdx.x; c < V; c += blockDim.x)
                d[c] = 0.0f;
            continue;
        }
        const float xt = cuk_ld(xr, t); /* before the barrier below: dlogits may be the row */
        float l = cuk_xent_lse(xr, loss, n, xt, V, vec, sh);
        if (dloss) g = dloss[n];
        cuk_xent_store_loss(loss_out, n, t, V, l, xt);
        auto f = [&](i64 c, float a) {
            float p = g * expf(a - l);
            return c == t ? p - g : p;
        };
        if (vec) {
            float4 *d4 = (float4 *)d;
            for (i64 i = threadIdx.x; i < V / 4; i += blockDim.x) {
                float4 a = cuk_ld4(xr, i);
                d4[i] = make_float4(f(4 * i, a.x), f(4 * i + 1, a.y), f(4 * i + 2, a.z),
                                    f(4 * i + 3, a.w));
            }
            for (i64 c = V / 4 * 4 + threadIdx.x; c < V; c += blockDim.x) /* a padded row's tail */
                d[c] = f(c, cuk_ld(xr, c));
        } else {
            for (i64 c = threadIdx.x; c < V; c += blockDim.x)
                d[c] = f(c, cuk_ld(xr, c));
        }
    }
}

extern "C" __global__ void CUK_ROW_BOUNDS cuk_softmax_xent_bwd(const float *logits, const i32 *tgt,
                                                               const float *dloss,
                                                               const float *loss, float *dlogits,
                                                               i64 N, i64 V, i64 ldx, i64 ldd,
                                                               int vec)
{
    xent_bwd(logits, tgt, dloss, 0.0f, loss, (float *)0, dlogits, N, V, ldx, ldd, vec);
}

extern "C" __global__ void CUK_ROW_BOUNDS cuk_softmax_xent_bwd_b(const unsigned short *logits,
                                                                 const i32 *tgt, const float *dloss,
                                                                 const float *loss, float *dlogits,
                                                                 i64 N, i64 V, i64 ldx, i64 ldd,
                                                                 int vec)
{
    xent_bwd(logits, tgt, dloss, 0.0f, loss, (float *)0, dlogits, N, V, ldx, ldd, vec);
}

/* The fused classifier: loss and dlogits = g * (softmax - onehot) in one pass over a row. */
extern "C" __global__ void CUK_ROW_BOUNDS cuk_softmax_xent_fused(const float *logits,
                                                                 const i32 *tgt, float g,
                                                                 float *loss, float *dlogits, i64 N,
                                                                 i64 V, i64 ldx, i64 ldd, int vec)
{
    xent_bwd(logits, tgt, (const float *)0, g, (const float *)0, loss, dlogits, N, V, ldx, ldd,
             vec);
}

extern "C" __global__ void CUK_ROW_BOUNDS cuk_softmax_xent_fused_b(const unsigned short *logits,
                                                                   const i32 *tgt, float g,
                                                                   float *loss, float *dlogits,
                                                                   i64 N, i64 V, i64 ldx, i64 ldd,
                                                                   int vec)
{
    xent_bwd(logits, tgt, (const float *)0, g, (const float *)0, loss, dlogits, N, V, ldx, ldd,
             vec);
}

/* The backward storing bf16 (bit patterns, rounded to nearest even): dlogits read only by bf16
 * GEMMs (the compiler's bf16 storage, precision.compute: bf16). With vec the row is read 4
 * values at a time and written 4 values (8 bytes) at a time (dlogits 8-byte aligned: the
 * launcher checks). */
template <class T>
__device__ __forceinline__ void
xent_bwd_bf16(const T *logits, const i32 *tgt, const float *dloss, float g, const float *loss,
              float *loss_out, unsigned short *dlogits, i64 N, i64 V, i64 ldx, i64 ldd, int vec)
{
    __shared__ float sh[32];
    for (i64 n = blockIdx.x; n < N; n += gridDim.x) {
        i64 t = tgt[n];
        const T *xr = logits + n * ldx;
        unsigned short *d = dlogits + n * ldd;
        if (t < 0 || t >= V) {
            cuk_xent_store_loss(loss_out, n, t, V, 0.0f, 0.0f);
            for (i64 c = threadIdx.x; c < V; c += blockDim.x)
                d[c] = 0;
            continue;
        }
        const float xt = cuk_ld(xr, t); /* before the barrier below: dlogits may be the row */
        float l = cuk_xent_lse(xr, loss, n, xt, V, vec, sh);
        if (dloss) g = dloss[n];
        cuk_xent_store_loss(loss_out, n, t, V, l, xt);
        auto bits = [&](i64 c, float a) -> unsigned int {
            float p = g * expf(a - l);
            return cuk_bf16_bits(c == t ? p - g : p);
        };
        if (vec) {
            uint2 *d4 = (uint2 *)d;
            for (i64 i = threadIdx.x; i < V / 4; i += blockDim.x) {
                float4 a = cuk_ld4(xr, i);
                d4[i] = make_uint2(bits(4 * i, a.x) | bits(4 * i + 1, a.y) << 16,
                                   bits(4 * i + 2, a.z) | bits(4 * i + 3, a.w) << 16);
            }
            for (i64 c = V / 4 * 4 + threadIdx.x; c < V; c += blockDim.x) /* a padded row's tail */
                d[c] = (unsigned short)bits(c, cuk_ld(xr, c));
        } else {
            for (i64 c = threadIdx.x; c < V; c += blockDim.x)
                d[c] = (unsigned short)bits(c, cuk_ld(xr, c));
        }
    }
}

extern "C" __global__ void CUK_ROW_BOUNDS cuk_softmax_xent_bwd_bf16(
    const float *logits, const i32 *tgt, const float *dloss, const float *loss,
    unsigned short *dlogits, i64 N, i64 V, i64 ldx, i64 ldd, int vec)
{
    xent_bwd_bf16(logits, tgt, dloss, 0.0f, loss, (float *)0, dlogits, N, V, ldx, ldd, vec);
}

extern "C" __global__ void CUK_ROW_BOUNDS cuk_softmax_xent_bwd_bf16_b(
    const unsigned short *logits, const i32 *tgt, const float *dloss, const float *loss,
    unsigned short *dlogits, i64 N, i64 V, i64 ldx, i64 ldd, int vec)
{
    xent_bwd_bf16(logits, tgt, dloss, 0.0f, loss, (float *)0, dlogits, N, V, ldx, ldd, vec);
}

extern "C" __global__ void CUK_ROW_BOUNDS
cuk_softmax_xent_fused_bf16(const float *logits, const i32 *tgt, float g, float *loss,
                            unsigned short *dlogits, i64 N, i64 V, i64 ldx, i64 ldd, int vec)
{
    xent_bwd_bf16(logits, tgt, (const float *)0, g, (const float *)0, loss, dlogits, N, V, ldx, ldd,
                  vec);
}

extern "C" __global__ void CUK_ROW_BOUNDS
cuk_softmax_xent_fused_bf16_b(const unsigned short *logits, const i32 *tgt, float g, float *loss,
                              unsigned short *dlogits, i64 N, i64 V, i64 ldx, i64 ldd, int vec)
{
    xent_bwd_bf16(logits, tgt, (const float *)0, g, (const float *)0, loss, dlogits, N, V, ldx, ldd,
                  vec);
}

/* 8 bf16 values (a uint4 of bit patterns) widened to f32. */
__device__ __forceinline__ void cuk_bf16x8(uint4 u, float v[8])
{
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; j++) {
        v[2 * j] = __uint_as_float(w[j] << 16);
        v[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
}

/* The fused classifier for bf16 logits and bf16 dlogits (GPT-2's under precision.activations:
 * bf16) with each row staged in shared memory: the logits are read from memory once, 16 bytes
 * a load, where xent_bwd_bf16 reads a row twice (its second pass from L2 at best: a row is
 * 100 KB at GPT-2's vocabulary), and dlogits are stored 16 bytes at a time. The same values as
 * xent_bwd_bf16 up to the sums' order (the log-sum-exp's last bits). Dynamic shared memory:
 * ceil(V / 8) * 16 bytes (the launcher raises the kernel's limit); ldx, ldd multiples of 8 and
 * both rows 16-byte aligned (the launcher checks). */
extern "C" __global__ void __launch_bounds__(512)
    cuk_softmax_xent_fused_bf16_bs(const unsigned short *logits, const i32 *tgt, float g,
                                   float *loss, unsigned short *dlogits, i64 N, i64 V, i64 ldx,
                                   i64 ldd)
{
    CUK_DYN_SMEM(uint4, cuk_xent_row);
    __shared__ float sh[32];
    unsigned short *row16 = (unsigned short *)cuk_xent_row;
    const i64 V8 = V / 8;
    for (i64 n = blockIdx.x; n < N; n += gridDim.x) {
        const i64 t = tgt[n];
        const unsigned short *xr = logits + n * ldx;
        unsigned short *d = dlogits + n * ldd;
        if (t < 0 || t >= V) { /* uniform over the block */
            cuk_xent_store_loss(loss, n, t, V, 0.0f, 0.0f);
            for (i64 c = threadIdx.x; c < V; c += blockDim.x)
                d[c] = 0;
            continue;
        }
        /* pass 1: the row into shared memory, each thread's running max and sum */
        float m = CUK_NEG_INF, s = 0.0f;
#pragma unroll 4
        for (i64 i = threadIdx.x; i < V8; i += blockDim.x) {
            const uint4 u = ((const uint4 *)xr)[i];
            cuk_xent_row[i] = u;
            float v[8];
            cuk_bf16x8(u, v);
            cuk_lse_fold4(m, s, v[0], v[1], v[2], v[3]);
            cuk_lse_fold4(m, s, v[4], v[5], v[6], v[7]);
        }
        for (i64 c = V8 * 8 + threadIdx.x; c < V; c += blockDim.x) { /* the last V % 8 */
            row16[c] = xr[c];
            cuk_lse_fold4(m, s, cuk_ld(xr, c), CUK_NEG_INF, CUK_NEG_INF, CUK_NEG_INF);
        }
        /* the block's log-sum-exp (its barriers also publish the row in shared memory) */
        const float M = cuk_block_max(m, sh), base = M == CUK_NEG_INF ? 0.0f : M;
        const float l = base + logf(cuk_block_sum(s * expf(m - base), sh));
        cuk_xent_store_loss(loss, n, t, V, l, cuk_ld(row16, t));
        /* pass 2: dlogits = g (softmax - onehot(t)) from shared memory */
        auto bits = [&](i64 c, float a) -> unsigned int {
            float p = g * expf(a - l);
            return cuk_bf16_bits(c == t ? p - g : p);
        };
        for (i64 i = threadIdx.x; i < V8; i += blockDim.x) {
            float v[8];
            cuk_bf16x8(cuk_xent_row[i], v);
            const i64 c = 8 * i;
            ((uint4 *)d)[i] = make_uint4(bits(c, v[0]) | bits(c + 1, v[1]) << 16,
                                         bits(c + 2, v[2]) | bits(c + 3, v[3]) << 16,
                                         bits(c + 4, v[4]) | bits(c + 5, v[5]) << 16,
                                         bits(c + 6, v[6]) | bits(c + 7, v[7]) << 16);
        }
        for (i64 c = V8 * 8 + threadIdx.x; c < V; c += blockDim.x)
            d[c] = (unsigned short)bits(c, cuk_ld(row16, c));
        __syncthreads(); /* the next row overwrites the staged one */
    }
}

/* Mean and 1/sqrt(var + eps) of a row (two passes: the centred second pass keeps the variance
 * accurate when |mean| >> std), to every thread. */
__device__ void cuk_row_moments(const float *xr, i64 C, bool vec, float eps, float *sh, float *mean,
                                float *rstd)
{
    float s = 0.0f;
    cuk_row_visit(xr, C, vec, [&](i64, float a) { s += a; });
    float mu = cuk_block_sum(s, sh) / (float)C, v = 0.0f;
    cuk_row_visit(xr, C, vec, [&](i64, float a) { v += (a - mu) * (a - mu); });
    v = cuk_block_sum(v, sh);
    *mean = mu;
    *rstd = 1.0f / sqrtf(v / (float)C + eps);
}

extern "C" __global__ void CUK_ROW_BOUNDS cuk_normalize(const float *x, float *y, i64 N, i64 C,
                                                        float eps, int vec)
{
    __shared__ float sh[32];
    for (i64 n = blockIdx.x; n < N; n += gridDim.x) {
        const float *xr = x + n * C;
        float mu, r;
        cuk_row_moments(xr, C, vec, eps, sh, &mu, &r);
        cuk_row_map(xr, y + n * C, C, vec, [&](i64, float a) { return (a - mu) * r; });
    }
}

/* The norms with their affine (passes.c fold_norm_affines): y = xhat * w (+ b) per column, b
 * NULL for none, stored as f32 or as bf16 bits rounded to nearest even (a value only bf16
 * GEMMs read, fuse.c mark_bf16_storage). xhat = (x - mean) * rstd, or x * rstd (rms): the
 * values the plain kernels store, so xhat is never written. */
__device__ __forceinline__ void cuk_st(float *y, i64 i, float v)
{
    y[i] = v;
}
__device__ __forceinline__ void cuk_st(unsigned short *y, i64 i, float v)
{
    y[i] = cuk_bf16_bits(v);
}

template <bool RMS, class T>
__device__ __forceinline__ void norm_affine(const float *x, const float *w, const float *b, T *y,
                                            i64 N, i64 C, float eps, int vec)
{
    __shared__ float sh[32];
    for (i64 n = blockIdx.x; n < N; n += gridDim.x) {
        const float *xr = x + n * C;
        float mu = 0.0f, r;
        if (RMS) {
            float s = 0.0f;
            cuk_row_visit(xr, C, vec, [&](i64, float a) { s += a * a; });
            r = 1.0f / sqrtf(cuk_block_sum(s, sh) / (float)C + eps);
        } else {
            cuk_row_moments(xr, C, vec, eps, sh, &mu, &r);
        }
        for (i64 c = threadIdx.x; c < C; c += blockDim.x) {
            const float v = (xr[c] - mu) * r * w[c];
            cuk_st(y, n * C + c, b ? v + b[c] : v);
        }
    }
}

/* norm_affine by warps (cuk.c picks it when C is a multiple of 128 up to 1024, x, w, b and an f32
 * y are 16-byte aligned and a bf16 y 8-byte, and blockDim.x is 128): a warp takes a row, a lane
 * the 4 consecutive columns 4 (lane + 32 j) of each group j of 128 (K = C / 128 groups), held
 * in registers from one float4 load each; the moments are warp shuffles, no barrier, and a
 * lane stores its 4 outputs at once (a float4, or 4 bf16 in 8 bytes). The block-per-row kernel
 * reads the row three times and spends two block-wide sums a row (Session 31, docs/perf.md).
 * The moments' sums run in another order; each output is the same expression of them. */
#define CUK_PARTW_K 8 /* groups of 128 columns a warp's row holds: C <= 1024 */
__device__ __forceinline__ void cuk_st4(float *y, i64 q, const float o[4])
{
    ((float4 *)y)[q] = make_float4(o[0], o[1], o[2], o[3]);
}
__device__ __forceinline__ void cuk_st4(unsigned short *y, i64 q, const float o[4])
{
    ((uint2 *)y)[q] =
        make_uint2((unsigned)cuk_bf16_bits(o[0]) | (unsigned)cuk_bf16_bits(o[1]) << 16,
                   (unsigned)cuk_bf16_bits(o[2]) | (unsigned)cuk_bf16_bits(o[3]) << 16);
}
/* The moments of a warp's row, held as K float4 a lane (xa[j]: columns 4 (lane + 32 j)): mean
 * (0 for RMS) and rstd = 1 / sqrt(mean square about it + eps), by warp shuffles. Every lane
 * calls it and gets both. */
template <bool RMS>
__device__ __forceinline__ void cuk_warp_moments(const float4 *xa, int K, float fc, float eps,
                                                 float *mean, float *rstd)
{
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < CUK_PARTW_K; j++) {
        if (j >= K) break;
        const float4 a = xa[j];
        s += RMS ? a.x * a.x : a.x;
        s += RMS ? a.y * a.y : a.y;
        s += RMS ? a.z * a.z : a.z;
        s += RMS ? a.w * a.w : a.w;
    }
    if (RMS) {
        *mean = 0.0f;
        *rstd = 1.0f / sqrtf(cuk_warp_sum(s) / fc + eps);
        return;
    }
    const float mu = cuk_warp_sum(s) / fc;
    float v = 0.0f;
#pragma unroll
    for (int j = 0; j < CUK_PARTW_K; j++) {
        if (j >= K) break;
        const float4 a = xa[j];
        v += (a.x - mu) * (a.x - mu);
        v += (a.y - mu) * (a.y - mu);
        v += (a.z - mu) * (a.z - mu);
        v += (a.w - mu) * (a.w - mu);
    }
    *mean = mu;
    *rstd = 1.0f / sqrtf(cuk_warp_sum(v) / fc + eps);
}
template <bool RMS, class T>
__device__ __forceinline__ void norm_affine_w(const float *x, const float *w, const float *b, T *y,
                                              i64 N, i64 C, float eps)
{
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, K = (int)(C >> 7);
    const float fc = (float)C;
    for (i64 n = (i64)blockIdx.x * 4 + wp; n < N; n += (i64)gridDim.x * 4) {
        const float4 *xr = (const float4 *)(x + n * C);
        float4 xa[CUK_PARTW_K];
#pragma unroll
        for (int j = 0; j < CUK_PARTW_K; j++) {
            if (j >= K) break;
            xa[j] = xr[lane + 32 * j];
        }
        float mu, r;
        cuk_warp_moments<RMS>(xa, K, fc, eps, &mu, &r);
#pragma unroll
        for (int j = 0; j < CUK_PARTW_K; j++) {
            if (j >= K) break;
            const int q = lane + 32 * j;
            const float4 wv = ((const float4 *)w)[q];
            const float4 bv = b ? ((const float4 *)b)[q] : make_float4(0.f, 0.f, 0.f, 0.f);
            float o[4] = {(xa[j].x - mu) * r * wv.x, (xa[j].y - mu) * r * wv.y,
                          (xa[j].z - mu) * r * wv.z, (xa[j].w - mu) * r * wv.w};
            if (b) o[0] += bv.x, o[1] += bv.y, o[2] += bv.z, o[3] += bv.w;
            cuk_st4(y + n * C, q, o);
        }
    }
}

extern "C" __global__ void CUK_ROW_BOUNDS cuk_normalize_affine(const float *x, const float *w,
                                                               const float *b, float *y, i64 N,
                                                               i64 C, float eps, int vec)
{
    norm_affine<false>(x, w, b, y, N, C, eps, vec);
}

extern "C" __global__ void __launch_bounds__(128)
    cuk_normalize_affine_w(const float *x, const float *w, const float *b, float *y, i64 N, i64 C,
                           float eps)
{
    norm_affine_w<false>(x, w, b, y, N, C, eps);
}

extern "C" __global__ void CUK_ROW_BOUNDS cuk_normalize_affine_bf16(const float *x, const float *w,
                                                                    const float *b,
                                                                    unsigned short *y, i64 N, i64 C,
                                                                    float eps, int vec)
{
    norm_affine<false>(x, w, b, y, N, C, eps, vec);
}

extern "C" __global__ void __launch_bounds__(128)
    cuk_normalize_affine_bf16_w(const float *x, const float *w, const float *b, unsigned short *y,
                                i64 N, i64 C, float eps)
{
    norm_affine_w<false>(x, w, b, y, N, C, eps);
}

extern "C" __global__ void CUK_ROW_BOUNDS cuk_rms_normalize_affine(const float *x, const float *w,
                                                                   const float *b, float *y, i64 N,
                                                                   i64 C, float eps, int vec)
{
    norm_affine<true>(x, w, b, y, N, C, eps, vec);
}

extern "C" __global__ void __launch_bounds__(128)
    cuk_rms_normalize_affine_w(const float *x, const float *w, const float *b, float *y, i64 N,
                               i64 C, float eps)
{
    norm_affine_w<true>(x, w, b, y, N, C, eps);
}

extern "C" __global__ void CUK_ROW_BOUNDS cuk_rms_normalize_affine_bf16(const float *x,
                                                                        const float *w,
                                                                        const float *b,
                                                                        unsigned short *y, i64 N,
                                                                        i64 C, float eps, int vec)
{
    norm_affine<true>(x, w, b, y, N, C, eps, vec);
}

extern "C" __global__ void __launch_bounds__(128)
    cuk_rms_normalize_affine_bf16_w(const float *x, const float *w, const float *b,
                                    unsigned short *y, i64 N, i64 C, float eps)
{
    norm_affine_w<true>(x, w, b, y, N, C, eps);
}

/* The norm backwards take the normalised value's cotangent as dy * w when w is not NULL (w: C
 * values, the norm's scale: the compiler folds the affine's product into the builtin, passes.c
 * fold_norm_scales), else as dy itself. */
__device__ __forceinline__ float cuk_scaled(const float *w, i64 c, float g)
{
    return w ? g * w[c] : g;
}

extern "C" __global__ void CUK_ROW_BOUNDS cuk_normalize_bwd(const float *x, const float *dy,
                                                            const float *w, float *dx, i64 N, i64 C,
                                                            float eps, int vec)
{
    __shared__ float sh[32];
    for (i64 n = blockIdx.x; n < N; n += gridDim.x) {
        const float *xr = x + n * C, *gr = dy + n * C;
        float mu, r, sg = 0.0f, sgx = 0.0f;
        cuk_row_moments(xr, C, vec, eps, sh, &mu, &r);
        cuk_row_visit2(xr, gr, C, vec, [&](i64 c, float a, float g) {
            g = cuk_scaled(w, c, g);
            sg += g;
            sgx += g * (a - mu) * r;
        });
        sg = cuk_block_sum(sg, sh) / (float)C;
        sgx = cuk_block_sum(sgx, sh) / (float)C;
        cuk_row_map2(xr, gr, dx + n * C, C, vec, [&](i64 c, float a, float g) {
            return r * (cuk_scaled(w, c, g) - sg - (a - mu) * r * sgx);
        });
    }
}

extern "C" __global__ void CUK_ROW_BOUNDS cuk_rms_normalize(const float *x, float *y, i64 N, i64 C,
                                                            float eps, int vec)
{
    __shared__ float sh[32];
    for (i64 n = blockIdx.x; n < N; n += gridDim.x) {
        const float *xr = x + n * C;
        float s = 0.0f;
        cuk_row_visit(xr, C, vec, [&](i64, float a) { s += a * a; });
        float r = 1.0f / sqrtf(cuk_block_sum(s, sh) / (float)C + eps);
        cuk_row_map(xr, y + n * C, C, vec, [&](i64, float a) { return a * r; });
    }
}

extern "C" __global__ void CUK_ROW_BOUNDS cuk_rms_normalize_bwd(const float *x, const float *dy,
                                                                const float *w, float *dx, i64 N,
                                                                i64 C, float eps, int vec)
{
    __shared__ float sh[32];
    for (i64 n = blockIdx.x; n < N; n += gridDim.x) {
        const float *xr = x + n * C, *gr = dy + n * C;
        float s = 0.0f, sgx = 0.0f;
        cuk_row_visit2(xr, gr, C, vec, [&](i64 c, float a, float g) {
            s += a * a;
            sgx += cuk_scaled(w, c, g) * a;
        });
        s = cuk_block_sum(s, sh);
        sgx = cuk_block_sum(sgx, sh);
        float r = 1.0f / sqrtf(s / (float)C + eps);
        float k = r * r * r * sgx / (float)C;
        cuk_row_map2(xr, gr, dx + n * C, C, vec,
                     [&](i64 c, float a, float g) { return r * cuk_scaled(w, c, g) - a * k; });
    }
}

/* The norm backwards that also sum their affine's gradients (passes.c fold_norm_partials): dx
 * as cuk_normalize_bwd / cuk_rms_normalize_bwd with the scale w, plus acc when not NULL (the
 * residual stream's cotangent the norm's input adds to: a tensor of dx's shape, read as the row
 * is), and per column c the sums of
 * dy * xhat (into pw[p C + c]) and of dy (pb[p C + c]) over the rows [p R, min(N, (p + 1) R))
 * of partial p, R = ceil(N / P): block p of the P takes those rows (a partial without rows is
 * zeros). A small reduction over the P partial rows then gives w's and b's gradients, so
 * neither xhat nor a second read of dy for them is needed. With pg the sums of the output
 * (dx + acc) too (pg[p C + c]: the bias gradient of the linear layer whose input cotangent the
 * output is), with dx16 its bf16 copy (that layer's GEMMs' operand): passes.c
 * fold_norm_cotangents; no reduction or cast then reads the f32 output again. xhat = (x - mean)
 * * rstd, or x * rstd (rms). Thread t owns the columns t + i bd (i < CUK_PART_MAX; the launcher
 * checks that C fits): a row's x and dy are read once into registers, the next row's while this
 * one's block sums run, and the column sums stay in registers across the rows. */
#define CUK_PART_MAX 8

/* Sums of a and b over the block, to every thread, in one exchange (two barriers, not four).
 * sh: 64 floats. Every thread must call it. */
__device__ __forceinline__ float2 cuk_block_sum2(float a, float b, float *sh)
{
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    a = cuk_warp_sum(a);
    b = cuk_warp_sum(b);
    __syncthreads(); /* sh may still be read by a previous reduction */
    if (lane == 0) sh[w] = a, sh[32 + w] = b;
    __syncthreads();
    a = lane < nw ? sh[lane] : 0.0f;
    b = lane < nw ? sh[32 + lane] : 0.0f;
    return make_float2(cuk_warp_sum(a), cuk_warp_sum(b));
}
/* dy's value at element i: dy[i], plus dy2[i] and then dy3[i] where they are not NULL (the
 * terms of a sum, passes.c fold_norm_dy_terms), added in f32. */
template <class TG>
__device__ __forceinline__ float cuk_ld_terms(const TG *dy, const TG *dy2, const TG *dy3, i64 i)
{
    float v = cuk_ld(dy, i);
    if (dy2) v += cuk_ld(dy2, i);
    if (dy3) v += cuk_ld(dy3, i);
    return v;
}

/* The same for the 4 values of group q of the row at element off (cuk_ld4). */
template <class TG>
__device__ __forceinline__ float4 cuk_ld4_terms(const TG *dy, const TG *dy2, const TG *dy3, i64 off,
                                                int q)
{
    float4 v = cuk_ld4(dy + off, q);
    if (dy2) {
        const float4 u = cuk_ld4(dy2 + off, q);
        v.x += u.x, v.y += u.y, v.z += u.z, v.w += u.w;
    }
    if (dy3) {
        const float4 u = cuk_ld4(dy3 + off, q);
        v.x += u.x, v.y += u.y, v.z += u.z, v.w += u.w;
    }
    return v;
}

template <bool RMS, class TG>
__device__ __forceinline__ void norm_bwd_part(const float *x, const TG *dy, const TG *dy2,
                                              const TG *dy3, const float *w, const float *acc,
                                              float *dx, float *pw, float *pb, float *pg,
                                              unsigned short *dx16, i64 N, i64 C, float eps, i64 P)
{
    __shared__ float sh[64];
    const i64 R = (N + P - 1) / P, bd = blockDim.x;
    for (i64 p = blockIdx.x; p < P; p += gridDim.x) {
        float aw[CUK_PART_MAX], ab[CUK_PART_MAX], ag[CUK_PART_MAX], xa[CUK_PART_MAX],
            ga[CUK_PART_MAX], xb[CUK_PART_MAX], gb[CUK_PART_MAX], ac[CUK_PART_MAX];
        const i64 r0 = p * R, r1 = (p + 1) * R < N ? (p + 1) * R : N;
#pragma unroll
        for (int i = 0; i < CUK_PART_MAX; i++) {
            const i64 c = threadIdx.x + i * bd;
            const bool in = c < C && r0 < r1;
            aw[i] = ab[i] = ag[i] = 0.0f;
            xb[i] = in ? x[r0 * C + c] : 0.0f;
            gb[i] = in ? cuk_ld_terms(dy, dy2, dy3, r0 * C + c) : 0.0f;
        }
        for (i64 n = r0; n < r1; n++) {
            float s = 0.0f, mu = 0.0f, v = 0.0f, sg = 0.0f, sgx = 0.0f;
#pragma unroll
            for (int i = 0; i < CUK_PART_MAX; i++) {
                const i64 c = threadIdx.x + i * bd;
                const bool in = c < C && n + 1 < r1;
                xa[i] = xb[i], ga[i] = gb[i];
                ac[i] = acc && c < C ? acc[n * C + c] : 0.0f; /* in flight during the sums */
                xb[i] = in ? x[(n + 1) * C + c] : 0.0f; /* the next row, in flight meanwhile */
                gb[i] = in ? cuk_ld_terms(dy, dy2, dy3, (n + 1) * C + c) : 0.0f;
                s += RMS ? xa[i] * xa[i] : xa[i];
            }
            float r;
            if (RMS) {
                r = 1.0f / sqrtf(cuk_block_sum(s, sh) / (float)C + eps);
            } else {
                mu = cuk_block_sum(s, sh) / (float)C;
#pragma unroll
                for (int i = 0; i < CUK_PART_MAX; i++)
                    if (threadIdx.x + i * bd < C) v += (xa[i] - mu) * (xa[i] - mu);
                r = 1.0f / sqrtf(cuk_block_sum(v, sh) / (float)C + eps);
            }
#pragma unroll
            for (int i = 0; i < CUK_PART_MAX; i++) {
                const i64 c = threadIdx.x + i * bd;
                if (c >= C) continue;
                const float gs = cuk_scaled(w, c, ga[i]);
                sg += gs;
                sgx += gs * (xa[i] - mu) * r;
            }
            const float2 t = cuk_block_sum2(sg, sgx, sh);
            sg = t.x / (float)C;
            sgx = t.y / (float)C;
#pragma unroll
            for (int i = 0; i < CUK_PART_MAX; i++) {
                const i64 c = threadIdx.x + i * bd;
                if (c >= C) continue;
                const float xh = (xa[i] - mu) * r, gs = cuk_scaled(w, c, ga[i]);
                const float d = r * (gs - (RMS ? 0.0f : sg) - xh * sgx), o = acc ? d + ac[i] : d;
                dx[n * C + c] = o;
                if (dx16) dx16[n * C + c] = cuk_bf16_bits(o);
                aw[i] += ga[i] * xh;
                ab[i] += ga[i];
                ag[i] += o;
            }
        }
#pragma unroll
        for (int i = 0; i < CUK_PART_MAX; i++) {
            const i64 c = threadIdx.x + i * bd;
            if (c >= C) continue;
            pw[p * C + c] = aw[i];
            pb[p * C + c] = ab[i];
            if (pg) pg[p * C + c] = ag[i];
        }
    }
}

/* norm_bwd_part by warps, the same outputs (cuk.c picks it when C is a multiple of 128 up to
 * CUK_PARTW_K * 128, the rows of x, acc, dx, pw, pb and pg are 16-byte aligned, dy's 16-byte
 * (f32) or 8-byte (bf16) and dx16's 8-byte, and blockDim.x is 128): a warp takes the rows
 * r0 + w, r0 + w + 4, ... of its block's range, a lane the 4 consecutive columns 4 (lane + 32 j)
 * of each group j of 128 (K = C / 128 groups), so a row's sums are warp shuffles without a
 * barrier. Its column sums stay in the lane's registers over its rows; at the end the block adds
 * its 4 warps' sums in warp order (shared memory). The block-per-row kernel spends three
 * block-wide sums (six barriers) and 8 predicated column slots of 64-bit index arithmetic a
 * row: about 800 instructions a warp and row, 4 warps a row (Session 31, docs/perf.md). The
 * sums' order differs from it (per lane, then the warp), each term the same f32 product. */
template <bool RMS, class TG>
__device__ __forceinline__ void
norm_bwd_part_w(const float *x, const TG *dy, const TG *dy2, const TG *dy3, const float *w,
                const float *acc, float *dx, float *pw, float *pb, float *pg, unsigned short *dx16,
                i64 N, i64 C, float eps, i64 P)
{
    __shared__ float4 red[4 * CUK_PARTW_K * 32]; /* 4 warps' column sums: C <= 1024 floats each */
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, K = (int)(C >> 7);
    const i64 R = (N + P - 1) / P;
    const float fc = (float)C;
    for (i64 p = blockIdx.x; p < P; p += gridDim.x) {
        float4 aw[CUK_PARTW_K], ab[CUK_PARTW_K], ag[CUK_PARTW_K];
#pragma unroll
        for (int j = 0; j < CUK_PARTW_K; j++)
            aw[j] = ab[j] = ag[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const i64 r0 = p * R, r1 = (p + 1) * R < N ? (p + 1) * R : N;
        for (i64 n = r0 + wp; n < r1; n += 4) {
            const float4 *xr = (const float4 *)(x + n * C);
            float4 xa[CUK_PARTW_K], ga[CUK_PARTW_K], ac[CUK_PARTW_K];
#pragma unroll
            for (int j = 0; j < CUK_PARTW_K; j++) {
                if (j >= K) break;
                const int q = lane + 32 * j; /* this lane's float4 of group j */
                xa[j] = xr[q];
                ga[j] = cuk_ld4_terms(dy, dy2, dy3, n * C, q);
                ac[j] = acc ? ((const float4 *)(acc + n * C))[q] : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            float mu, r;
            cuk_warp_moments<RMS>(xa, K, fc, eps, &mu, &r);
            float sg = 0.0f, sgx = 0.0f;
#pragma unroll
            for (int j = 0; j < CUK_PARTW_K; j++) {
                if (j >= K) break;
                const i64 c = 4 * (i64)(lane + 32 * j);
                const float xv[4] = {xa[j].x, xa[j].y, xa[j].z, xa[j].w};
                const float gv[4] = {ga[j].x, ga[j].y, ga[j].z, ga[j].w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float gs = cuk_scaled(w, c + e, gv[e]);
                    sg += gs;
                    sgx += gs * (xv[e] - mu) * r;
                }
            }
            sg = cuk_warp_sum(sg) / fc;
            sgx = cuk_warp_sum(sgx) / fc;
#pragma unroll
            for (int j = 0; j < CUK_PARTW_K; j++) {
                if (j >= K) break;
                const int q = lane + 32 * j;
                const i64 c = 4 * (i64)q;
                const float xv[4] = {xa[j].x, xa[j].y, xa[j].z, xa[j].w};
                const float gv[4] = {ga[j].x, ga[j].y, ga[j].z, ga[j].w};
                const float av[4] = {ac[j].x, ac[j].y, ac[j].z, ac[j].w};
                float o[4], xh[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    xh[e] = (xv[e] - mu) * r;
                    const float gs = cuk_scaled(w, c + e, gv[e]);
                    const float d = r * (gs - (RMS ? 0.0f : sg) - xh[e] * sgx);
                    o[e] = acc ? d + av[e] : d;
                }
                ((float4 *)(dx + n * C))[q] = make_float4(o[0], o[1], o[2], o[3]);
                if (dx16)
                    ((uint2 *)(dx16 + n * C))[q] = make_uint2(
                        (unsigned)cuk_bf16_bits(o[0]) | (unsigned)cuk_bf16_bits(o[1]) << 16,
                        (unsigned)cuk_bf16_bits(o[2]) | (unsigned)cuk_bf16_bits(o[3]) << 16);
                aw[j].x += gv[0] * xh[0], aw[j].y += gv[1] * xh[1];
                aw[j].z += gv[2] * xh[2], aw[j].w += gv[3] * xh[3];
                ab[j].x += gv[0], ab[j].y += gv[1], ab[j].z += gv[2], ab[j].w += gv[3];
                ag[j].x += o[0], ag[j].y += o[1], ag[j].z += o[2], ag[j].w += o[3];
            }
        }
        /* the block's sums: warp 0's + warp 1's + warp 2's + warp 3's, per column */
        for (int a = 0; a < 3; a++) {
            float *out = a == 0 ? pw : a == 1 ? pb : pg;
            if (!out) break; /* pg last, and only when asked for */
            __syncthreads(); /* red is free (the previous sum, or the previous partial's) */
#pragma unroll
            for (int j = 0; j < CUK_PARTW_K; j++)
                if (j < K) red[(wp * K + j) * 32 + lane] = a == 0 ? aw[j] : a == 1 ? ab[j] : ag[j];
            __syncthreads();
            for (int q = threadIdx.x; q < K * 32; q += blockDim.x) {
                const int j = q >> 5, l = q & 31;
                float4 t = red[j * 32 + l];
                for (int u = 1; u < 4; u++) {
                    const float4 v = red[(u * K + j) * 32 + l];
                    t.x += v.x, t.y += v.y, t.z += v.z, t.w += v.w;
                }
                ((float4 *)(out + p * C))[l + 32 * j] = t;
            }
        }
    }
}

/* Entry points per norm and dy type: f32, or bf16 bit patterns (the _bg kernels: a GEMM
 * stored dy as bf16, passes.c fold_norm_dy16), widened exactly as they load. A block per row
 * takes about 110 registers a thread: up to 512 threads (C <= 4096) NAME, and past that NAME_k,
 * the same code held to 64 registers so that 1024 threads fit an SM's 65536 (it spills about
 * 500 bytes a thread to local memory; ptxas for sm_90). Then NAME_w, a warp per row. */
#define NORM_BWD_PART_ENTRY(NAME, BOUND, FN, RMS, TG)                                              \
    extern "C" __global__ void __launch_bounds__(BOUND)                                            \
        NAME(const float *x, const TG *dy, const TG *dy2, const TG *dy3, const float *w,           \
             const float *acc, float *dx, float *pw, float *pb, float *pg, unsigned short *dx16,   \
             i64 N, i64 C, float eps, i64 P)                                                       \
    {                                                                                              \
        FN<RMS>(x, dy, dy2, dy3, w, acc, dx, pw, pb, pg, dx16, N, C, eps, P);                      \
    }
#define NORM_BWD_PART(NAME, RMS, TG)                                                               \
    NORM_BWD_PART_ENTRY(NAME, 512, norm_bwd_part, RMS, TG)                                         \
    NORM_BWD_PART_ENTRY(NAME##_k, 1024, norm_bwd_part, RMS, TG)                                    \
    NORM_BWD_PART_ENTRY(NAME##_w, 128, norm_bwd_part_w, RMS, TG)
NORM_BWD_PART(cuk_normalize_bwd_part, false, float)
NORM_BWD_PART(cuk_rms_normalize_bwd_part, true, float)
NORM_BWD_PART(cuk_normalize_bwd_part_bg, false, unsigned short)
NORM_BWD_PART(cuk_rms_normalize_bwd_part_bg, true, unsigned short)
