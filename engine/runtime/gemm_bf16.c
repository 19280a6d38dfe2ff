/*
 * gemm_bf16.c — small bf16 GEMMs for the CPU's hand-written kernels (the attention tiles of
 * `precision.compute: bf16`): inputs rounded to bf16 (nearest even) while they are packed,
 * products accumulated in f32, f32 result (see runtime.h, jdt_rt_bf16_pack_*).
 *
 * Two pack formats, chosen once per process (jdt_rt_bf16_tiles_native):
 *   - AVX512-BF16 (VDPBF16PS): the pair layout the instruction reads. An A pack holds M rows of
 *     K2 = ceil(K / 2) 32-bit words, word p of row i = (A[i][2p], A[i][2p+1]) with element 2p in
 *     the low half; a B pack holds K2 rows of ldp = N rounded up to 32 words, word j of row p =
 *     (B[2p][j], B[2p+1][j]). An odd K is padded with zeros, columns past N are zero. The
 *     micro-kernel keeps an 8 x 32 tile of C in 16 registers and, per pair of K, loads two
 *     vectors of B and broadcasts one word of A per row.
 *     With AMX (Intel's tile unit: Sapphire Rapids and later, where the kernel grants the
 *     process its tile data; jdt_rt_bf16_tiles_amx) the same layout is padded to whole tiles:
 *     A rows are K2 rounded up to 16 words and the rows to a multiple of 16, B has as many rows
 *     as A has words, and the padding is zero. TDPBF16PS reads exactly these words (a tile row
 *     of A is 16 pairs of K, a tile row of B is one pair row of 16 columns), so the kernel
 *     keeps a 32 x 32 block of C in four tiles and steps K by 32 values, with no edge cases:
 *     past M, N or K it multiplies zeros, and only the valid part of C is written. The
 *     benchmark GPT's bf16 attention took 30 -> 22 ms forward and 60 -> 36 ms backward a step
 *     on 2 threads of a Sapphire Rapids box (docs/perf.md, Session 44). JDT_BF16_NO_AMX=1
 *     keeps the VDPBF16PS kernel.
 *   - everywhere else: the rounded values as f32, A row-major (M x K), B row-major (K x ldp),
 *     multiplied by OpenBLAS's SGEMM. A bf16 x bf16 product is exact in f32, so both paths
 *     compute the same sums up to the order of the f32 accumulation.
 * A B pack may be built once for the largest K and N and multiplied by a prefix of its rows and
 * columns (attention packs a head's keys once and multiplies every query block against the
 * keys before it): a prefix of even K reads whole pairs; an odd K reads one pair half, and the
 * A pack's zero in that pair cancels the other half (with AMX the A pack's zero words cancel
 * the B rows past the prefix up to the next whole tile the same way: finite values times
 * zero, so a prefix of K that is not a multiple of 32 would let an Inf or NaN in the rows
 * after it reach C; attention's prefixes are whole blocks of 64 keys, or the whole pack,
 * whose padding is zero).
 */
#include "runtime/runtime.h"
#include "runtime/runtime-impl.h"

#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 10
#define GEMM_BF16_X86 1
#include <immintrin.h>
#if __GNUC__ >= 11 && defined(__linux__)
#define GEMM_BF16_AMX 1
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static bool g_native, g_amx, g_amx_granted;

/* AMX-TILE and AMX-BF16 (CPUID 7.0 EDX bits 24 and 22), and the kernel's leave to use the tile
 * data (Linux 5.16+: arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, which fails where
 * the kernel or a hypervisor does not offer it). The leave is the process's; oneDNN asks for the
 * same. */
static bool amx_usable(void)
{
#ifdef GEMM_BF16_AMX
    enum { ARCH_GET_XCOMP_PERM = 0x1022, ARCH_REQ_XCOMP_PERM = 0x1023, XTILEDATA = 18 };
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d >> 24 & 1u) || !(d >> 22 & 1u))
        return false;
    unsigned long mask = 0;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XTILEDATA) != 0 ||
        syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &mask) != 0)
        return false;
    return (mask >> XTILEDATA & 1u) != 0;
#else
    return false;
#endif
}

static void detect_once(void)
{
#ifdef GEMM_BF16_X86
    g_amx_granted = __builtin_cpu_supports("avx512bf16") && amx_usable();
    g_native = __builtin_cpu_supports("avx512bf16") && !getenv("JDT_BF16_NO_DNNL");
    g_amx = g_native && g_amx_granted && !getenv("JDT_BF16_NO_AMX");
#endif
}

bool jdt_rt_bf16_tiles_native(void)
{
    pthread_once(&g_once, detect_once);
    return g_native;
}

bool jdt_rt_bf16_tiles_amx(void)
{
    pthread_once(&g_once, detect_once);
    return g_amx;
}

bool jdt_rt_cpu_amx(void)
{
    pthread_once(&g_once, detect_once);
    return g_amx_granted;
}

/* words in a pair row of a B pack for N columns: whole 32-word vectors, and not a multiple of
 * 4 KB (1024 words) in bytes, where all 16 rows an AMX tile load reads would share one L1 set
 * (the attention's k^T pack at T 1024: 5% on its products) */
static int64_t ld_of(int64_t N)
{
    const int64_t ld = (N + 31) / 32 * 32;
    return ld % 1024 == 0 ? ld + 16 : ld;
}

/* words in a row of an A pack (pair rows of a B pack) for K values: ceil(K / 2), whole AMX
 * tiles of 16 where AMX multiplies */
static int64_t k2_of(int64_t K)
{
    const int64_t K2 = (K + 1) / 2;
    return jdt_rt_bf16_tiles_amx() ? (K2 + 15) / 16 * 16 : K2;
}

/* rows of an A pack: whole AMX tiles of 16 where AMX multiplies */
static int64_t rows_of(int64_t M)
{
    return jdt_rt_bf16_tiles_amx() ? (M + 15) / 16 * 16 : M;
}

int64_t jdt_rt_bf16_pack_a_floats(int64_t M, int64_t K)
{
    /* native: M x ceil(K / 2) words (AMX: padded to tiles); portable: M x K floats */
    return jdt_rt_bf16_tiles_amx() ? rows_of(M) * k2_of(K) : M * (K + 1);
}

int64_t jdt_rt_bf16_pack_b_floats(int64_t K, int64_t N)
{
    /* native: ceil(K / 2) rows (AMX: padded to a tile); portable: K rows */
    return (jdt_rt_bf16_tiles_amx() ? k2_of(K) : K + 1) * ld_of(N);
}

/* The bf16 bits of x rounded to nearest even (runtime-impl.h), widened for the pair words. */
static inline __attribute__((always_inline)) uint32_t bits16(float x)
{
    return jdt_rt_bf16_bits_inline(x);
}

static inline __attribute__((always_inline)) float round16(float x)
{
    uint32_t u = bits16(x) << 16;
    memcpy(&x, &u, 4);
    return x;
}

#ifdef GEMM_BF16_X86
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#else
#define BF16_TARGET
#endif

#ifdef GEMM_BF16_X86
/* One 16 x 16 block of a transposed A pack: word p of pack row i = (a[2p][i], a[2p+1][i]) for
 * 16 pairs of source rows (a, row stride lda) and 16 columns, stored at w (row stride ld). Each
 * pair of rows becomes 16 words (one per column) along memory, bits16's rule vectorised; a 16 x 16
 * transpose of 32-bit words in registers (unpacks within 128-bit lanes, then lane shuffles)
 * turns them into the pack's rows. Storing a word at a time, 128 bytes apart, took 0.7 ns a
 * value, six times the untransposed pack and more than the GEMM it fed (the attention
 * backward's P^T and dS^T). */
BF16_TARGET static inline __attribute__((always_inline)) void
pack_at_block(const float *a, int64_t lda, uint32_t *w, int64_t ld)
{
    uint32_t wd[16][16] __attribute__((aligned(64))); /* wd[p][i]: the words along memory */
    for (int p = 0; p < 16; p++) {
        const float *r0 = a + 2 * p * lda, *r1 = r0 + lda;
#pragma omp simd
        for (int i = 0; i < 16; i++)
            wd[p][i] = bits16(r0[i]) | bits16(r1[i]) << 16;
    }
    __m512i r[16], t[16];
    for (int p = 0; p < 16; p++)
        r[p] = _mm512_load_si512(wd[p]);
    for (int k = 0; k < 16; k += 2) { /* lane L of t[k]: r[k], r[k+1] interleaved */
        t[k] = _mm512_unpacklo_epi32(r[k], r[k + 1]);
        t[k + 1] = _mm512_unpackhi_epi32(r[k], r[k + 1]);
    }
    for (int k = 0; k < 16; k += 4) { /* lane L of r[k + c]: rows k..k+3 of column 4L + c */
        r[k] = _mm512_unpacklo_epi64(t[k], t[k + 2]);
        r[k + 1] = _mm512_unpackhi_epi64(t[k], t[k + 2]);
        r[k + 2] = _mm512_unpacklo_epi64(t[k + 1], t[k + 3]);
        r[k + 3] = _mm512_unpackhi_epi64(t[k + 1], t[k + 3]);
    }
    for (int h = 0; h < 16; h += 8) /* t[h + c]: columns c and c + 8; t[h + 4 + c]: c + 4, c + 12 */
        for (int c = 0; c < 4; c++) {
            t[h + c] = _mm512_shuffle_i32x4(r[h + c], r[h + 4 + c], 0x88);
            t[h + 4 + c] = _mm512_shuffle_i32x4(r[h + c], r[h + 4 + c], 0xdd);
        }
    for (int c = 0; c < 8; c++) { /* columns c and c + 8 of all 16 rows: pack rows c, c + 8 */
        _mm512_storeu_si512(w + c * ld, _mm512_shuffle_i32x4(t[c], t[8 + c], 0x88));
        _mm512_storeu_si512(w + (c + 8) * ld, _mm512_shuffle_i32x4(t[c], t[8 + c], 0xdd));
    }
}
#endif

/* Packing. The inner loops run along memory (a row of the source) and vectorise (omp simd);
 * the native packs are compiled for AVX512 and only called where jdt_rt_bf16_tiles_native().
 * op(A) is M x K with A[i][k] = a[i * lda + k] (a[k * lda + i] when ta); op(B) is K x N with
 * B[k][j] = b[k * ldb + j] (b[j * ldb + k] when tb). */
BF16_TARGET static void pack_a_native(const float *a, int64_t lda, bool ta, int64_t M, int64_t K,
                                      uint32_t *w)
{
    const int64_t K2 = (K + 1) / 2, Ke = K / 2, ld = k2_of(K), Mp = rows_of(M);
    if (!ta) {
        for (int64_t i = 0; i < M; i++) {
            const float *r = a + i * lda;
#pragma omp simd
            for (int64_t p = 0; p < Ke; p++)
                w[i * ld + p] = bits16(r[2 * p]) | bits16(r[2 * p + 1]) << 16;
            if (K2 > Ke) w[i * ld + Ke] = bits16(r[K - 1]);
        }
    } else {
        /* whole 16 x 16 blocks of words through registers (x86), the rest a word at a time */
#ifdef GEMM_BF16_X86
        const int64_t M16 = M / 16 * 16, P16 = Ke / 16 * 16;
        for (int64_t i0 = 0; i0 < M16; i0 += 16)
            for (int64_t p0 = 0; p0 < P16; p0 += 16)
                pack_at_block(a + 2 * p0 * lda + i0, lda, w + i0 * ld + p0, ld);
#else
        const int64_t M16 = 0, P16 = 0;
#endif
        for (int64_t p = 0; p < K2; p++) {
            const float *r0 = a + 2 * p * lda, *r1 = r0 + lda;
            const int64_t i1 = p < P16 ? M16 : 0; /* columns the blocks did not cover */
            if (2 * p + 1 < K) {
#pragma omp simd
                for (int64_t i = i1; i < M; i++)
                    w[i * ld + p] = bits16(r0[i]) | bits16(r1[i]) << 16;
            } else {
#pragma omp simd
                for (int64_t i = i1; i < M; i++)
                    w[i * ld + p] = bits16(r0[i]);
            }
        }
    }
    if (ld > K2) /* AMX: the words past K, then the rows past M, are zero */
        for (int64_t i = 0; i < M; i++)
            memset(w + i * ld + K2, 0, (size_t)(ld - K2) * sizeof *w);
    if (Mp > M) memset(w + M * ld, 0, (size_t)((Mp - M) * ld) * sizeof *w);
}

/* pack_a_native of an untransposed A whose row i is multiplied by rs[i] first (in f32, then
 * rounded: the bits of scaling the rows in place and packing them) */
BF16_TARGET static void pack_a_scaled_native(const float *a, int64_t lda, int64_t M, int64_t K,
                                             const float *rs, uint32_t *w)
{
    const int64_t K2 = (K + 1) / 2, Ke = K / 2, ld = k2_of(K), Mp = rows_of(M);
    for (int64_t i = 0; i < M; i++) {
        const float *r = a + i * lda, f = rs[i];
#pragma omp simd
        for (int64_t p = 0; p < Ke; p++)
            w[i * ld + p] = bits16(r[2 * p] * f) | bits16(r[2 * p + 1] * f) << 16;
        if (K2 > Ke) w[i * ld + Ke] = bits16(r[K - 1] * f);
        if (ld > K2) memset(w + i * ld + K2, 0, (size_t)(ld - K2) * sizeof *w);
    }
    if (Mp > M) memset(w + M * ld, 0, (size_t)((Mp - M) * ld) * sizeof *w);
}

/* op(B) stored transposed (B[k][j] = b[j * ldb + k]): a row of b fills a column of the pack.
 * Blocks of BT_J rows are converted along memory (vectorised) into a small buffer of words,
 * which is then copied out a pack row at a time. Reading b column-wise and converting one word
 * at a time took ~20 instructions per word, the attention's packs of k^T and v^T about a fifth
 * of its forward. The same words either way. */
BF16_TARGET static void pack_bt_native(const float *b, int64_t ldb, int64_t K, int64_t N,
                                       int64_t ldp, uint32_t *w)
{
    enum { BT_J = 16, BT_P = 64 };
    const int64_t K2 = (K + 1) / 2, Ke = K / 2;
    uint32_t buf[BT_J][BT_P];
    for (int64_t j0 = 0; j0 < N; j0 += BT_J) {
        const int64_t nj = N - j0 < BT_J ? N - j0 : BT_J;
        for (int64_t p0 = 0; p0 < K2; p0 += BT_P) {
            const int64_t np = K2 - p0 < BT_P ? K2 - p0 : BT_P;
            const int64_t ne =
                Ke - p0 < np ? Ke - p0 : np; /* whole pairs; np - 1 at an odd K's end */
            for (int64_t jj = 0; jj < nj; jj++) {
                const float *r = b + (j0 + jj) * ldb + 2 * p0;
#pragma omp simd
                for (int64_t pp = 0; pp < ne; pp++)
                    buf[jj][pp] = bits16(r[2 * pp]) | bits16(r[2 * pp + 1]) << 16;
                if (ne < np) buf[jj][ne] = bits16(r[2 * ne]);
            }
            for (int64_t pp = 0; pp < np; pp++) {
                uint32_t *row = w + (p0 + pp) * ldp + j0;
                for (int64_t jj = 0; jj < nj; jj++)
                    row[jj] = buf[jj][pp];
            }
        }
    }
    for (int64_t p = 0; p < K2; p++)
        memset(w + p * ldp + N, 0, (size_t)(ldp - N) * sizeof *w);
}

BF16_TARGET static void pack_b_native(const float *b, int64_t ldb, bool tb, int64_t K, int64_t N,
                                      int64_t ldp, uint32_t *w)
{
    if (tb) {
        pack_bt_native(b, ldb, K, N, ldp, w);
        return;
    }
    for (int64_t p = 0; p < (K + 1) / 2; p++) {
        uint32_t *row = w + p * ldp;
        const float *r0 = b + 2 * p * ldb, *r1 = r0 + ldb;
        if (2 * p + 1 < K) {
#pragma omp simd
            for (int64_t j = 0; j < N; j++)
                row[j] = bits16(r0[j]) | bits16(r1[j]) << 16;
        } else {
#pragma omp simd
            for (int64_t j = 0; j < N; j++)
                row[j] = bits16(r0[j]);
        }
        memset(row + N, 0, (size_t)(ldp - N) * sizeof *row);
    }
}

/* A B pack in either form, then (AMX) its pair rows past K up to a whole tile, zero */
BF16_TARGET static void pack_b_any(const float *b, int64_t ldb, bool tb, int64_t K, int64_t N,
                                   int64_t ldp, uint32_t *w)
{
    pack_b_native(b, ldb, tb, K, N, ldp, w);
    const int64_t K2 = (K + 1) / 2, rows = k2_of(K);
    if (rows > K2) memset(w + K2 * ldp, 0, (size_t)((rows - K2) * ldp) * sizeof *w);
}

static void pack_a_portable(const float *a, int64_t lda, bool ta, int64_t M, int64_t K, float *y)
{
    if (!ta) {
        for (int64_t i = 0; i < M; i++) {
#pragma omp simd
            for (int64_t k = 0; k < K; k++)
                y[i * K + k] = round16(a[i * lda + k]);
        }
        return;
    }
    for (int64_t k = 0; k < K; k++) {
#pragma omp simd
        for (int64_t i = 0; i < M; i++)
            y[i * K + k] = round16(a[k * lda + i]);
    }
}

static void pack_b_portable(const float *b, int64_t ldb, bool tb, int64_t K, int64_t N, int64_t ldp,
                            float *y)
{
    for (int64_t k = 0; k < K; k++) {
        float *row = y + k * ldp;
        if (!tb) {
#pragma omp simd
            for (int64_t j = 0; j < N; j++)
                row[j] = round16(b[k * ldb + j]);
        } else {
            for (int64_t j = 0; j < N; j++)
                row[j] = round16(b[j * ldb + k]);
        }
        memset(row + N, 0, (size_t)(ldp - N) * sizeof *row);
    }
}

void jdt_rt_bf16_pack_a(const float *a, int64_t lda, bool ta, int64_t M, int64_t K, void *pack)
{
    if (jdt_rt_bf16_tiles_native())
        pack_a_native(a, lda, ta, M, K, pack);
    else
        pack_a_portable(a, lda, ta, M, K, pack);
}

void jdt_rt_bf16_pack_a_scaled(const float *a, int64_t lda, int64_t M, int64_t K,
                               const float *row_scale, void *pack)
{
    if (jdt_rt_bf16_tiles_native()) {
        pack_a_scaled_native(a, lda, M, K, row_scale, pack);
        return;
    }
    float *y = pack;
    for (int64_t i = 0; i < M; i++) {
        const float f = row_scale[i];
#pragma omp simd
        for (int64_t k = 0; k < K; k++)
            y[i * K + k] = round16(a[i * lda + k] * f);
    }
}

void jdt_rt_bf16_pack_b(const float *b, int64_t ldb, bool tb, int64_t K, int64_t N, void *pack)
{
    if (jdt_rt_bf16_tiles_native())
        pack_b_any(b, ldb, tb, K, N, ld_of(N), pack);
    else
        pack_b_portable(b, ldb, tb, K, N, ld_of(N), pack);
}

#ifdef GEMM_BF16_X86
/* One MR x 32 tile of C (MR <= 8, a compile-time constant after inlining): acc = sum over
 * the K2 pairs of A's rows times B's 32 columns, then c = alpha * acc + beta * c for the n
 * valid columns (n <= 32). */
BF16_TARGET static inline __attribute__((always_inline)) void
tile(int MR, const uint32_t *ap, int64_t K2, const uint32_t *bp, int64_t ldp, float alpha,
     float beta, float *c, int64_t ldc, int64_t n)
{
    __m512 acc[8][2];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t p = 0; p < K2; p++) {
        __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + p * ldp);
        __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + p * ldp + 16);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            __m512bh a = (__m512bh)_mm512_set1_epi32((int)ap[r * K2 + p]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
        }
    }
    const __mmask16 m0 = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
    const __mmask16 m1 =
        n >= 32 ? (__mmask16)0xFFFF : (n > 16 ? (__mmask16)((1u << (n - 16)) - 1) : (__mmask16)0);
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        float *cr = c + r * ldc;
        __m512 y0 = _mm512_mul_ps(acc[r][0], va), y1 = _mm512_mul_ps(acc[r][1], va);
        if (beta != 0.0f) {
            y0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m0, cr), vb, y0);
            y1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m1, cr + 16), vb, y1);
        }
        _mm512_mask_storeu_ps(cr, m0, y0);
        _mm512_mask_storeu_ps(cr + 16, m1, y1);
    }
}

BF16_TARGET static void gemm_native(const uint32_t *ap, const uint32_t *bp, int64_t ldp, int64_t M,
                                    int64_t N, int64_t K, float alpha, float beta, float *c,
                                    int64_t ldc)
{
    const int64_t K2 = (K + 1) / 2;
    for (int64_t i0 = 0; i0 < M; i0 += 8) {
        const int64_t mr = M - i0 < 8 ? M - i0 : 8;
        const uint32_t *a = ap + i0 * K2;
        for (int64_t j0 = 0; j0 < N; j0 += 32) {
            const int64_t n = N - j0 < 32 ? N - j0 : 32;
            float *cc = c + i0 * ldc + j0;
            const uint32_t *b = bp + j0;
            switch (mr) {
            case 8:
                tile(8, a, K2, b, ldp, alpha, beta, cc, ldc, n);
                break;
            case 7:
                tile(7, a, K2, b, ldp, alpha, beta, cc, ldc, n);
                break;
            case 6:
                tile(6, a, K2, b, ldp, alpha, beta, cc, ldc, n);
                break;
            case 5:
                tile(5, a, K2, b, ldp, alpha, beta, cc, ldc, n);
                break;
            case 4:
                tile(4, a, K2, b, ldp, alpha, beta, cc, ldc, n);
                break;
            case 3:
                tile(3, a, K2, b, ldp, alpha, beta, cc, ldc, n);
                break;
            case 2:
                tile(2, a, K2, b, ldp, alpha, beta, cc, ldc, n);
                break;
            default:
                tile(1, a, K2, b, ldp, alpha, beta, cc, ldc, n);
                break;
            }
        }
    }
}
#endif

#ifdef GEMM_BF16_AMX
#define AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))

/* LDTILECFG's 64-byte operand: palette 1, tiles 0-7 all 16 rows of 64 bytes */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

/* c rows r0.. (nr of them, nc columns) = alpha * acc (16 x 16, rows of 16) + beta * c */
AMX_TARGET static inline __attribute__((always_inline)) void
amx_out(const float *acc, int64_t nr, int64_t nc, float alpha, float beta, float *c, int64_t ldc)
{
    const __mmask16 m = nc >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << nc) - 1);
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    for (int64_t r = 0; r < nr; r++) {
        __m512 y = _mm512_mul_ps(_mm512_load_ps(acc + 16 * r), va);
        if (beta != 0.0f) y = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, c + r * ldc), vb, y);
        _mm512_mask_storeu_ps(c + r * ldc, m, y);
    }
}

/* C = alpha A B + beta C on the tile unit: per 32 x 32 block of C, four accumulator tiles
 * (0, 1: rows i0.., 2, 3: rows i0 + 16..; even, odd: columns j0.., j0 + 16..), two A tiles (4,
 * 5) and two B tiles (6, 7) per 32 values of K. A half block past M or N is not computed. The
 * packs are padded to whole tiles (k2_of, rows_of), so every tile load is in bounds. The tile
 * state is configured at entry and released at exit: the tile registers are per thread and
 * oneDNN's kernels configure their own between calls. */
AMX_TARGET static void gemm_amx(const uint32_t *ap, const uint32_t *bp, int64_t ldp, int64_t M,
                                int64_t N, int64_t K, float alpha, float beta, float *c,
                                int64_t ldc)
{
    const int64_t ld = k2_of(K);
    amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++)
        cfg.colsb[t] = 64, cfg.rows[t] = 16;
    /* GCC's _tile_loadconfig names only 8 bytes of cfg as read: keep the other stores */
    __asm__ volatile("" ::: "memory");
    _tile_loadconfig(&cfg);
    float acc[4][256] __attribute__((aligned(64)));
    const bool direct = alpha == 1.0f && beta == 0.0f;
/* Accumulator tile t (nr x nc valid) to C at cp. C = A B (alpha 1, beta 0) takes a whole tile
 * straight from the tile register (the same values: alpha * acc + 0 is acc); the rest go through
 * acc and amx_out (the attention's small-K products spent about as long there as multiplying). */
#define AMX_PUT(t, nr, nc, cp)                                                                     \
    do {                                                                                           \
        if (direct && (nr) == 16 && (nc) == 16)                                                    \
            _tile_stored(t, cp, ldc * 4);                                                          \
        else {                                                                                     \
            _tile_stored(t, acc[t], 64);                                                           \
            amx_out(acc[t], nr, nc, alpha, beta, cp, ldc);                                         \
        }                                                                                          \
    } while (0)
    for (int64_t i0 = 0; i0 < M; i0 += 32) {
        const bool m2 = M - i0 > 16;
        const uint32_t *a0 = ap + i0 * ld, *a1 = a0 + 16 * ld;
        for (int64_t j0 = 0; j0 < N; j0 += 32) {
            const bool n2 = N - j0 > 16;
            const uint32_t *b0 = bp + j0;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t p = 0; p < ld; p += 16) {
                _tile_loadd(4, a0 + p, ld * 4);
                _tile_loadd(6, b0 + p * ldp, ldp * 4);
                _tile_dpbf16ps(0, 4, 6);
                if (n2) {
                    _tile_loadd(7, b0 + p * ldp + 16, ldp * 4);
                    _tile_dpbf16ps(1, 4, 7);
                }
                if (m2) {
                    _tile_loadd(5, a1 + p, ld * 4);
                    _tile_dpbf16ps(2, 5, 6);
                    if (n2) _tile_dpbf16ps(3, 5, 7);
                }
            }
            const int64_t nr0 = M - i0 < 16 ? M - i0 : 16,
                          nr1 = M - i0 - 16 < 16 ? M - i0 - 16 : 16;
            const int64_t nc0 = N - j0 < 16 ? N - j0 : 16,
                          nc1 = N - j0 - 16 < 16 ? N - j0 - 16 : 16;
            float *c0 = c + i0 * ldc + j0;
            /* only the tiles this block computed */
            AMX_PUT(0, nr0, nc0, c0);
            if (n2) AMX_PUT(1, nr0, nc1, c0 + 16);
            if (m2) AMX_PUT(2, nr1, nc0, c0 + 16 * ldc);
            if (m2 && n2) AMX_PUT(3, nr1, nc1, c0 + 16 * ldc + 16);
        }
    }
    _tile_release();
#undef AMX_PUT
}
#endif

void jdt_rt_bf16_gemm_packed(const void *apack, const void *bpack, int64_t ldb_n, int64_t M,
                             int64_t N, int64_t K, float alpha, float beta, float *c, int64_t ldc)
{
    if (M <= 0 || N <= 0) return;
    const int64_t ldp = ld_of(ldb_n);
    if (K <= 0) { /* an empty sum */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++)
                c[i * ldc + j] = beta != 0.0f ? beta * c[i * ldc + j] : 0.0f;
        return;
    }
#ifdef GEMM_BF16_AMX
    if (jdt_rt_bf16_tiles_amx()) {
        gemm_amx(apack, bpack, ldp, M, N, K, alpha, beta, c, ldc);
        return;
    }
#endif
#ifdef GEMM_BF16_X86
    if (jdt_rt_bf16_tiles_native()) {
        gemm_native(apack, bpack, ldp, M, N, K, alpha, beta, c, ldc);
        return;
    }
#endif
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)N, (int)K, alpha, apack,
                (int)K, bpack, (int)ldp, beta, c, (int)ldc);
}
