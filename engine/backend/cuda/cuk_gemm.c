/*
 * cuk_gemm.c — jdt_cuk_matmul: row-major batched GEMMs through cuBLASLt with TF32 tensor cores
 * and the bias in the epilogue (see cuk.h).
 *
 * cuBLASLt is column-major, so the row-major product c (M, N) = a @ b is computed as its
 * transpose c^T (N, M) = b^T a^T: a row-major (R, C) buffer read column-major is its transpose
 * with leading dimension C, so no data moves; cuBLAS's "A" is our b and its "B" our a. The
 * bias (N) becomes a per-row vector of c^T, which is exactly CUBLASLT_EPILOGUE_BIAS.
 * A shared b with an untransposed a folds the batch into M (one large GEMM); other batches use
 * strided batching (stride 0 for a shared b).
 *
 * Plans (descriptors, layouts and the heuristic's algorithm) are cached per shape, transpose
 * flags, bias presence and pointer alignment: the heuristic query costs tens of microseconds
 * and a training step repeats the same few shapes. Each plan times the heuristic's first 8
 * algorithms once and keeps the fastest, remembered in the kernel cache for later runs
 * (JDT_CUDA_AUTOTUNE, default auto: XLA's GEMM autotuning; cuk.h).
 * JDT_CUDA_TF32=0 multiplies f32 in full FP32. A bf16 GEMM may also store its output as bf16
 * (jdt_cuk_matmul_bf16_out): C/D bf16, the bias bf16 too (cuBLASLt's bias has D's type), the
 * epilogue adding it in f32 before the rounding.
 */
#include "backend/cuda/cuk-impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Largest power of two (<= 16) dividing the address: cuBLASLt's alignment classes. */
static int64_t align_of(const void *p)
{
    uintptr_t u = (uintptr_t)p;
    int64_t a = 16;
    while (a > 1 && u % (uintptr_t)a != 0)
        a /= 2;
    return a;
}

/* What a plan key's GEMM computes in, stores and adds, for messages. */
static const char *key_kind(const int64_t *key)
{
    return key[12] == 3   ? "bf16 out, GELU' and bias gradient epilogue"
           : key[12] == 2 ? "bf16 out, GELU' epilogue"
           : key[12]      ? "bf16 out, GELU epilogue"
           : key[11]      ? "bf16 out"
           : key[10]      ? "bf16"
                          : "tf32";
}

static jdt_status lt_err(jdt_err *e, cublasStatus_t st, const char *what, const int64_t *key)
{
    return jdt_err_set(e, JDT_ERR_INTERNAL,
                       "cuBLASLt %s (%s, batch %lld, M %lld, N %lld, K %lld, ta %lld, tb %lld): %s",
                       what, key_kind(key), (long long)key[0], (long long)key[1], (long long)key[2],
                       (long long)key[3], (long long)key[4], (long long)key[5],
                       cublasLtGetStatusString(st));
}

static void plan_release(jdt_cuk_plan *p)
{
    if (!p->used) return;
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->lc) cublasLtMatrixLayoutDestroy(p->lc);
    memset(p, 0, sizeof *p);
}

void jdt_cuk_gemm_free_plans(jdt_cuk *k)
{
    for (int i = 0; i < JDT_CUK_PLANS; i++)
        plan_release(&k->plans[i]);
}

/* The GEMM picks remembered on disk: an entry of the kernel cache (kind "gemmpick") per plan,
 * keyed by jdt_cuk_pick_key (the binary, the GPU, the driver and NVRTC), cuBLASLt's version,
 * TF32 on or off (f32 plans) and the plan's key; it holds "<i> <hash>": the timed pick's
 * index among the heuristic's candidates and a hash of its algorithm. A later run takes the
 * pick without timing where the heuristic offers the same algorithm at that index, so its
 * GEMMs run the first run's algorithms from its first step (runs and resumes repeat where
 * cuBLASLt's results do); else the plan is timed again. */
static uint64_t pick_key(const jdt_cuk *k, const jdt_cuk_plan *p)
{
    uint64_t h = jdt_hash_u64(jdt_cuk_pick_key(k, "gemmpick-v1"), (uint64_t)cublasLtGetVersion());
    h = jdt_hash_u64(h, (uint64_t)(k->no_tf32 && !p->key[10])); /* f32 in full FP32 */
    for (int i = 0; i < 16; i++)
        h = jdt_hash_u64(h, (uint64_t)p->key[i]);
    return h;
}

static uint64_t algo_hash(const cublasLtMatmulAlgo_t *a)
{
    return jdt_hash_bytes(JDT_HASH_INIT, a, sizeof *a);
}

/* The pick this context made or took already for a plan of key, NULL if none. */
static const cublasLtMatmulAlgo_t *pick_find(const jdt_cuk *k, const int64_t *key)
{
    for (int i = 0; i < k->n_picks; i++)
        if (memcmp(k->picks[i].key, key, sizeof k->picks[i].key) == 0) return &k->picks[i].algo;
    return NULL;
}

/* Keeps p's algorithm as the context's pick for its key (a full table keeps nothing). */
static void pick_keep(jdt_cuk *k, const jdt_cuk_plan *p)
{
    if (k->n_picks == JDT_CUK_PICKS || pick_find(k, p->key)) return;
    memcpy(k->picks[k->n_picks].key, p->key, sizeof p->key);
    k->picks[k->n_picks++].algo = p->algo;
}

/* Takes p's remembered pick, if any and still offered: p->algo, no timing (n_cand 0). */
static void pick_get(jdt_cuk *k, jdt_cuk_plan *p)
{
    char v[64];
    if (!jdt_cuk_pick_read(k, pick_key(k, p), "gemmpick", v, sizeof v)) return;
    char *end = v, *end2 = v;
    const long i = strtol(v, &end, 10);
    const unsigned long long h = end > v && *end == ' ' ? strtoull(end + 1, &end2, 16) : 0;
    if (end2 == v || i < 0 || i >= p->n_cand || algo_hash(&p->cand[i]) != (uint64_t)h)
        return; /* damaged, or the heuristic offers otherwise now: timed again */
    p->algo = p->cand[i];
    p->n_cand = 0;
    pick_keep(k, p);
    k->n_remembered++;
    if (!k->gemm_got_said) {
        k->gemm_got_said = true;
        JDT_INFO("cuda: GEMMs take the cuBLASLt algorithms timed before on this GPU and software "
                 "(the kernel cache's *.gemmpick entries; removing them, or JDT_CUDA_AUTOTUNE=1, "
                 "times them again)");
    }
}

/* Remembers p's timed pick, candidate i (best effort: a cache that cannot be written is said
 * once). */
static void pick_put(jdt_cuk *k, const jdt_cuk_plan *p, int i)
{
    char v[64];
    snprintf(v, sizeof v, "%d %llx\n", i, (unsigned long long)algo_hash(&p->cand[i]));
    jdt_cuk_pick_write(k, pick_key(k, p), "gemmpick", v, "a GEMM's algorithm pick",
                       &k->gemm_put_said);
}

/* A column-major layout of type dt, rows x cols with leading dimension ld, batched with
 * `stride` (elements). */
static cublasStatus_t make_layout(cublasLtMatrixLayout_t *l, cudaDataType dt, int64_t rows,
                                  int64_t cols, int64_t ld, int64_t batch, int64_t stride)
{
    cublasStatus_t st = cublasLtMatrixLayoutCreate(l, dt, (uint64_t)rows, (uint64_t)cols, ld);
    if (st != CUBLAS_STATUS_SUCCESS || batch == 1) return st;
    int32_t n = (int32_t)batch;
    st = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof n);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    return cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                            &stride, sizeof stride);
}

/* Builds plan p for key (batch, M, N, K, ta, tb, b_shared, bias, alignments, bf16, bf16 out,
 * GELU aux); with epilogue false the bias (if any) is left to the caller (p->bias_by_beta).
 * bf16: A and B are bf16, C/D and the bias f32 (bf16 with bf16 out), f32 accumulation; else all
 * f32 with TF32 tensor cores. GELU aux 1: D = GELU(x), the aux matrix (D's type and layout, its
 * pointer set per call) x, x the product plus the bias; 2: D = x GELU'(aux); 3: that, and the
 * "bias" pointer (f32 whatever D's type) the sums of D's rows in cuBLAS's terms (our columns). */
static jdt_status plan_build(jdt_cuk *k, jdt_cuk_plan *p, const int64_t *key, int64_t align_ab,
                             int64_t align_c, int64_t align_bias, bool epilogue, jdt_err *e)
{
    int64_t batch = key[0], M = key[1], N = key[2], K = key[3];
    bool ta = key[4], tb = key[5], shared = key[6], bias = key[7] && epilogue, bf16 = key[10];
    /* row strides: the stored rows' lengths unless padded (key[13..15]: a, b, c) */
    const int64_t lda = key[13] ? key[13]
                        : ta    ? M
                                : K,
                  ldb = key[14] ? key[14]
                        : tb    ? K
                                : N,
                  ldc = key[15] ? key[15] : N;
    cudaDataType dt_c = key[11] ? CUDA_R_16BF : CUDA_R_32F;
    cudaDataType dt_ab = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasStatus_t st;
    memcpy(p->key, key, sizeof p->key);
    p->used = true;
    p->bias_by_beta = key[7] && !epilogue;
    cublasComputeType_t compute =
        bf16 || k->no_tf32 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32;
    if ((st = cublasLtMatmulDescCreate(&p->op, compute, CUDA_R_32F)) != CUBLAS_STATUS_SUCCESS)
        return lt_err(e, st, "MatmulDescCreate", key);
    int32_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    if (st == CUBLAS_STATUS_SUCCESS && key[12]) { /* 1: GELU(x) out, x to aux; 2: x GELU'(aux) */
        int32_t epi = key[12] == 3   ? CUBLASLT_EPILOGUE_DGELU_BGRAD
                      : key[12] == 2 ? CUBLASLT_EPILOGUE_DGELU
                      : bias         ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                     : CUBLASLT_EPILOGUE_GELU_AUX;
        int64_t ld = N; /* c^T is (N, M) column-major */
        st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                                sizeof ld);
        if (st == CUBLAS_STATUS_SUCCESS && key[12] == 3) { /* the bias gradient in f32 */
            int32_t bt = CUDA_R_32F;
            st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                                sizeof bt);
        }
    } else if (st == CUBLAS_STATUS_SUCCESS && bias) {
        int32_t epi = CUBLASLT_EPILOGUE_BIAS;
        int64_t bstride = 0;
        st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
        if (st == CUBLAS_STATUS_SUCCESS && batch > 1)
            st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE,
                                                &bstride, sizeof bstride);
    }
    if (st != CUBLAS_STATUS_SUCCESS) return lt_err(e, st, "MatmulDescSetAttribute", key);
    /* cuBLAS A = our b: (N, K) col-major ld N, or stored (K, N) ld K and transposed */
    st = make_layout(&p->la, dt_ab, tb ? K : N, tb ? N : K, ldb, batch, shared ? 0 : K * N);
    /* cuBLAS B = our a: (K, M) col-major ld K, or stored (M, K) ld M and transposed */
    if (st == CUBLAS_STATUS_SUCCESS)
        st = make_layout(&p->lb, dt_ab, ta ? M : K, ta ? K : M, lda, batch, M * K);
    if (st == CUBLAS_STATUS_SUCCESS) st = make_layout(&p->lc, dt_c, N, M, ldc, batch, M * N);
    if (st != CUBLAS_STATUS_SUCCESS) return lt_err(e, st, "MatrixLayoutCreate", key);

    cublasLtMatmulPreference_t pref;
    if ((st = cublasLtMatmulPreferenceCreate(&pref)) != CUBLAS_STATUS_SUCCESS)
        return lt_err(e, st, "MatmulPreferenceCreate", key);
    uint64_t ws = JDT_CUK_WORKSPACE;
    uint32_t al_ab = (uint32_t)align_ab, al_c = (uint32_t)align_c;
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                              sizeof ws);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                  &al_ab, sizeof al_ab);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                  &al_ab, sizeof al_ab);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                  &al_c, sizeof al_c);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                  &al_c, sizeof al_c);
    /* a bf16 D: split-K partial sums only in f32 (the compute type). The in-place and
     * output-type schemes add the partials in bf16, and each adds a rounding: on an H200 a
     * 37 x 64 x 53 product into bf16 came out 16 bf16 steps off (check_cuk test_matmul_pitched,
     * 2026-12-04), where the 37 x 71 x 53 one was within one step. Where cuBLASLt has no such
     * algorithm, any rather than none (a bf16 D has no TF32 fallback). */
    (void)align_bias;
    const bool d16 = dt_c == CUDA_R_16BF;
    const uint32_t schemes[2] = {CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE,
                                 CUBLASLT_REDUCTION_SCHEME_MASK};
    /* a plan this context has picked for already (built again after the ring evicted it): that
     * pick, untimed; bias rows filled before the GEMM are never timed (gemm_one) */
    const cublasLtMatmulAlgo_t *known = k->autotune && !p->bias_by_beta ? pick_find(k, key) : NULL;
    const int want = k->autotune && !known && !p->bias_by_beta ? JDT_CUK_ALGOS : 1;
    cublasLtMatmulHeuristicResult_t res[JDT_CUK_ALGOS];
    int n_res = 0;
    for (int i = d16 ? 0 : 1; st == CUBLAS_STATUS_SUCCESS && n_res < 1 && i < 2; i++) {
        if (d16)
            st = cublasLtMatmulPreferenceSetAttribute(
                pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes[i], sizeof schemes[i]);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulAlgoGetHeuristic(k->lt, p->op, p->la, p->lb, p->lc, p->lc, pref,
                                                want, res, &n_res);
        if (d16 && i == 1 && st == CUBLAS_STATUS_SUCCESS && n_res > 0)
            JDT_INFO("cuda: GEMM (%s, batch %lld, M %lld, N %lld, K %lld): no cuBLASLt algorithm "
                     "sums split-K partials in f32; one that sums them in bf16 runs",
                     key_kind(key), (long long)batch, (long long)M, (long long)N, (long long)K);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS) return lt_err(e, st, "MatmulAlgoGetHeuristic", key);
    if (n_res < 1) return lt_err(e, CUBLAS_STATUS_NOT_SUPPORTED, "no algorithm for", key);
    p->algo = known ? *known : res[0].algo;
    p->n_cand = 0;
    for (int i = 0; want > 1 && i < n_res && i < JDT_CUK_ALGOS; i++)
        if (res[i].state == CUBLAS_STATUS_SUCCESS) p->cand[p->n_cand++] = res[i].algo;
    if (p->n_cand < 2) p->n_cand = 0; /* nothing to choose from */
    if (p->n_cand && !k->retune) pick_get(k, p);
    if (p->n_cand && k->n_picks == JDT_CUK_PICKS) { /* no room to keep a pick: none timed */
        p->n_cand = 0;
        if (!k->picks_full_said) {
            k->picks_full_said = true;
            JDT_INFO("cuda: over %d GEMM shapes: the next ones take cuBLASLt's heuristic's first "
                     "algorithm, untimed",
                     JDT_CUK_PICKS);
        }
    }
    return JDT_OK;
}

void jdt_cuk_gemm_tuning(const jdt_cuk *k, int *timed, int *changed)
{
    *timed = k->n_timed;
    *changed = k->n_changed;
}

#define TUNE_REPS 5 /* timed runs of each candidate, after an untimed one */

/* Autotuning (JDT_CUDA_AUTOTUNE): times each candidate of p on this call's operands (set in p->op
 * by the caller; D = c from C = cin, which the caller made sure is not c when beta is not 0, so
 * every run leaves the same result) and keeps the fastest in p->algo: the heuristic's first unless
 * another is over 3% faster, which is beyond the noise of TUNE_REPS back-to-back runs, and
 * remembers it (pick_put). A candidate that cuBLASLt refuses to run is skipped; if events fail,
 * the first stays, not remembered. Waits for the stream (the first step only: each plan is timed
 * once). */
static void tune(jdt_cuk *k, jdt_cuk_plan *p, const void *a, const void *b, const void *cin,
                 void *c, float alpha, float beta)
{
    cudaEvent_t ev[2] = {NULL, NULL};
    float ms[JDT_CUK_ALGOS];
    int best = -1;
    if (cudaEventCreate(&ev[0]) != cudaSuccess || cudaEventCreate(&ev[1]) != cudaSuccess) goto out;
    for (int i = 0; i < p->n_cand; i++) {
        ms[i] = -1.0f;
        bool ok = true;
        for (int r = 0; r <= TUNE_REPS && ok; r++) {
            if (r == 1 && cudaEventRecord(ev[0], k->stream) != cudaSuccess) goto out;
            ok = cublasLtMatmul(k->lt, p->op, &alpha, b, p->la, a, p->lb, &beta, cin, p->lc, c,
                                p->lc, &p->cand[i], k->workspace, JDT_CUK_WORKSPACE,
                                k->stream) == CUBLAS_STATUS_SUCCESS;
        }
        if (!ok) continue; /* refused: not a candidate after all */
        if (cudaEventRecord(ev[1], k->stream) != cudaSuccess ||
            cudaStreamSynchronize(k->stream) != cudaSuccess ||
            cudaEventElapsedTime(&ms[i], ev[0], ev[1]) != cudaSuccess)
            goto out;
        if (best < 0 || ms[i] < ms[best]) best = i;
    }
    if (best > 0 && ms[0] >= 0.0f && ms[best] >= 0.97f * ms[0]) best = 0;
    if (best >= 0) {
        p->algo = p->cand[best];
        pick_put(k, p, best);
    }
    k->n_timed++;
    if (best > 0) {
        k->n_changed++;
        const int64_t *key = p->key;
        char first[64] = "the heuristic's first refused to run";
        if (ms[0] >= 0.0f)
            snprintf(first, sizeof first, "%.3f ms the heuristic's first",
                     (double)ms[0] / TUNE_REPS);
        JDT_INFO("cuda: GEMM (%s, batch %lld, M %lld, N %lld, K %lld, ta %lld, tb %lld): "
                 "cuBLASLt algorithm %d of %d, %.3f ms a call; %s",
                 key_kind(key), (long long)key[0], (long long)key[1], (long long)key[2],
                 (long long)key[3], (long long)key[4], (long long)key[5], best + 1, p->n_cand,
                 (double)ms[best] / TUNE_REPS, first);
    }
out:
    p->n_cand = 0; /* timed once, whatever happened */
    pick_keep(k, p);
    if (ev[0]) cudaEventDestroy(ev[0]);
    if (ev[1]) cudaEventDestroy(ev[1]);
}

/* One cuBLASLt GEMM: gemm's arguments; dry: only find or build its plan (the checks a call
 * would make before it launches included), launching nothing. */
static jdt_status gemm_one(jdt_cuk *k, const void *a, const void *b, const void *bias,
                           const void *acc, void *c, const void *aux, int aux_kind, int64_t batch,
                           int64_t M, int64_t N, int64_t K, bool ta, bool tb, bool b_shared,
                           bool bf16, bool c_bf16, const int64_t *ld, bool dry, jdt_err *e)
{
    static const int64_t dense[3] = {0, 0, 0};
    if (!ld) ld = dense;
    const bool pitched = ld[0] || ld[1] || ld[2];
    if (pitched && batch != 1)
        return jdt_err_set(e, JDT_ERR_INTERNAL, "matmul: padded rows in a batch of %lld products",
                           (long long)batch);
    int64_t al_ab = align_of(a) < align_of(b) ? align_of(a) : align_of(b);
    int64_t al_c = align_of(c), al_bias = bias ? align_of(bias) : 16;
    if (acc && align_of(acc) < al_c) al_c = align_of(acc); /* C's alignment too */
    if (aux && align_of(aux) < al_c) al_c = align_of(aux);
    int64_t key[16] = {batch,
                       M,
                       N,
                       K,
                       ta,
                       tb,
                       b_shared,
                       bias != NULL,
                       al_ab,
                       al_c * 32 + al_bias,
                       bf16,
                       c_bf16,
                       aux ? aux_kind : 0,
                       ld[0],
                       ld[1],
                       ld[2]};
    jdt_cuk_plan *p = NULL;
    for (int i = 0; i < JDT_CUK_PLANS && !p; i++)
        if (k->plans[i].used && memcmp(k->plans[i].key, key, sizeof key) == 0) p = &k->plans[i];
    if (!p) {
        p = &k->plans[k->next_plan];
        k->next_plan = (k->next_plan + 1) % JDT_CUK_PLANS;
        plan_release(p);
        jdt_status s = plan_build(k, p, key, al_ab, al_c, al_bias, true, e);
        if (s != JDT_OK && bias && !c_bf16 && !aux &&
            !pitched) { /* no algorithm with the bias epilogue: bias rows + beta 1 */
            plan_release(p);
            s = plan_build(k, p, key, al_ab, al_c, al_bias, false, e);
        }
        if (s != JDT_OK) {
            plan_release(p);
            return s;
        }
    }
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    float alpha = 1.0f, beta = acc ? 1.0f : 0.0f;
    if (p->bias_by_beta && acc)
        return jdt_err_set(e, JDT_ERR_INTERNAL,
                           "cuBLASLt: no algorithm with the bias epilogue for an accumulating "
                           "GEMM (batch %lld, M %lld, N %lld, K %lld)",
                           (long long)batch, (long long)M, (long long)N, (long long)K);
    if (dry) return JDT_OK;
    if (p->bias_by_beta) {
        jdt_cuk_fill_rows(k, c, bias, batch * M, N);
        beta = 1.0f;
    } else if (bias) {
        st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                            sizeof bias);
    }
    if (st == CUBLAS_STATUS_SUCCESS && aux)
        st = cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                            sizeof aux);
    /* autotune at a call that may run again: no in-place accumulation, no DGELU over c */
    if (st == CUBLAS_STATUS_SUCCESS && p->n_cand && !p->bias_by_beta && !(acc && acc == c) &&
        !(aux && aux_kind >= 2 && aux == c))
        tune(k, p, a, b, acc ? acc : c, c, alpha, beta);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmul(k->lt, p->op, &alpha, b, p->la, a, p->lb, &beta, acc ? acc : c, p->lc,
                            c, p->lc, &p->algo, k->workspace, JDT_CUK_WORKSPACE, k->stream);
    if (st != CUBLAS_STATUS_SUCCESS) return lt_err(e, st, "Matmul", key);
    return JDT_OK;
}

/* A bf16 c split over K holds the remainder's terms rounded to bf16 before the bulk adds onto
 * them: split only where those are few of many (K past this), so that rounding stays far under
 * the output's own. */
#define SPLIT_K_BF16_MIN 1024

static bool split_k(int64_t K, int64_t al, bool c_bf16)
{
    return K > al && K % al != 0 && (!c_bf16 || K > SPLIT_K_BF16_MIN);
}

/* The aligned split (gemm): the product as GEMMs whose cuBLAS m, n and k (our N, M and K) are
 * multiples of al elements, and their remainders; row strides lda, ldb, ldc (never 0; acc has
 * c's), batch 1, no aux. A K remainder (split_k) runs first, with the bias and acc, the bulk then
 * adding onto c; an M remainder is the rows past the bulk, an N remainder the columns past it.
 * dry as gemm_one's. */
static jdt_status gemm_split(jdt_cuk *k, const void *a, const void *b, const void *bias,
                             const void *acc, void *c, int64_t M, int64_t N, int64_t K, bool ta,
                             bool tb, bool bf16, bool c_bf16, const int64_t *ld, int64_t al,
                             bool dry, jdt_err *e)
{
    const int64_t ea = bf16 ? 2 : 4, ec = c_bf16 ? 2 : 4;
    if (split_k(K, al, c_bf16)) {
        const int64_t K0 = K - K % al;
        const char *ar = (const char *)a + (ta ? K0 * ld[0] : K0) * ea,
                   *br = (const char *)b + (tb ? K0 : K0 * ld[1]) * ea;
        jdt_status st =
            gemm_split(k, ar, br, bias, acc, c, M, N, K - K0, ta, tb, bf16, c_bf16, ld, al, dry, e);
        if (st != JDT_OK) return st;
        return gemm_split(k, a, b, NULL, c, c, M, N, K0, ta, tb, bf16, c_bf16, ld, al, dry, e);
    }
    if (M > al && M % al != 0) {
        const int64_t M0 = M - M % al;
        jdt_status st =
            gemm_split(k, a, b, bias, acc, c, M0, N, K, ta, tb, bf16, c_bf16, ld, al, dry, e);
        if (st != JDT_OK) return st;
        const char *ar = (const char *)a + (ta ? M0 : M0 * ld[0]) * ea;
        return gemm_split(k, ar, b, bias, acc ? (const char *)acc + M0 * ld[2] * ec : NULL,
                          (char *)c + M0 * ld[2] * ec, M - M0, N, K, ta, tb, bf16, c_bf16, ld, al,
                          dry, e);
    }
    if (N > al && N % al != 0) {
        const int64_t N0 = N - N % al;
        jdt_status st = gemm_one(k, a, b, bias, acc, c, NULL, 0, 1, M, N0, K, ta, tb, false, bf16,
                                 c_bf16, ld, dry, e);
        if (st != JDT_OK) return st;
        const char *br = (const char *)b + (tb ? N0 * ld[1] : N0) * ea;
        return gemm_one(k, a, br, bias ? (const char *)bias + N0 * ec : NULL,
                        acc ? (const char *)acc + N0 * ec : NULL, (char *)c + N0 * ec, NULL, 0, 1,
                        M, N - N0, K, ta, tb, false, bf16, c_bf16, ld, dry, e);
    }
    return gemm_one(k, a, b, bias, acc, c, NULL, 0, 1, M, N, K, ta, tb, false, bf16, c_bf16, ld,
                    dry, e);
}

/* The GEMM of jdt_cuk_matmul on a and b of type f32 or (bf16) bf16, c and the bias f32 or
 * (c_bf16, with bf16) bf16, after the caller's checks: batch, M, N, K > 0 and within cuBLASLt's
 * int32 limits, the batch already folded.
 *
 * cuBLASLt runs a GEMM whose m (our N) or k (our K) is not a multiple of 16 bytes' elements far
 * slower than its neighbours: GPT-2's lm head (N, then K = 50257) took 25 and 19 ms on an H200
 * where its weight gradient (M = 50257, cuBLAS's n) took 4.9, against 3.5 for torch's at 50264
 * (run.profile and scripts/bench/gemm_peer_gpu.py, 2026-12-04); PyTorch's compiler pads such
 * shapes (pad_mm). Here, without padded copies, an unbatched GEMM with no GELU epilogue runs as
 * the aligned bulk and remainders of < 8 (bf16) or < 4 (f32) elements in K, M and N
 * (gemm_split), when cuBLASLt has plans for every part (else as one GEMM, remembered per shape);
 * JDT_GEMM_SPLIT=0 keeps one GEMM always. */
static jdt_status gemm(jdt_cuk *k, const void *a, const void *b, const void *bias, const void *acc,
                       void *c, const void *aux, int aux_kind, int64_t batch, int64_t M, int64_t N,
                       int64_t K, bool ta, bool tb, bool b_shared, bool bf16, bool c_bf16,
                       const int64_t *ld, jdt_err *e)
{
    const int64_t al = bf16 ? 8 : 4;
    if (k->gemm_split && batch == 1 && !aux &&
        (split_k(K, al, c_bf16) || (N > al && N % al) || (M > al && M % al))) {
        const int64_t lds[3] = {ld && ld[0] ? ld[0]
                                : ta        ? M
                                            : K,
                                ld && ld[1] ? ld[1]
                                : tb        ? K
                                            : N,
                                ld && ld[2] ? ld[2] : N};
        const int64_t shape[8] = {M, N, K, ta, tb, bf16, c_bf16, bias != NULL};
        bool refused = false;
        for (int i = 0; i < JDT_CUK_NO_SPLIT && !refused; i++)
            refused = memcmp(k->no_split[i], shape, sizeof shape) == 0;
        jdt_err le;
        jdt_err_clear(&le);
        if (!refused) {
            if (gemm_split(k, a, b, bias, acc, c, M, N, K, ta, tb, bf16, c_bf16, lds, al, true,
                           &le) == JDT_OK) {
                k->n_split++;
                return gemm_split(k, a, b, bias, acc, c, M, N, K, ta, tb, bf16, c_bf16, lds, al,
                                  false, e);
            }
            memcpy(k->no_split[k->next_no_split], shape, sizeof shape);
            k->next_no_split = (k->next_no_split + 1) % JDT_CUK_NO_SPLIT;
        }
    }
    return gemm_one(k, a, b, bias, acc, c, aux, aux_kind, batch, M, N, K, ta, tb, b_shared, bf16,
                    c_bf16, ld, false, e);
}

/* Shared checks of both entry points: empty products, K = 0 (c = bias rows), folding a batch
 * over a shared b into M, cuBLASLt's int32 dimensions. *done when nothing is left to do. */
static jdt_status gemm_shape(jdt_cuk *k, const float *bias, const float *acc, float *c,
                             int64_t *batch, int64_t *M, int64_t N, int64_t K, bool ta,
                             bool b_shared, bool *done, jdt_err *e)
{
    *done = true;
    if (*batch <= 0 || *M <= 0 || N <= 0) return JDT_OK;
    if (K <= 0 && acc)
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "matmul: an accumulating empty (K = 0) product");
    if (K <= 0) {
        jdt_cuk_fill_rows(k, c, bias, *batch * *M, N);
        return JDT_OK;
    }
    if (b_shared && !ta) { /* one (batch*M, K) @ (K, N) product */
        *M *= *batch;
        *batch = 1;
    }
    if (*M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || *batch > INT32_MAX)
        return jdt_err_set(e, JDT_ERR_INVALID,
                           "matmul: dimension too large for cuBLASLt (batch %lld, M %lld, N "
                           "%lld, K %lld)",
                           (long long)*batch, (long long)*M, (long long)N, (long long)K);
    *done = false;
    return JDT_OK;
}

void jdt_cuk_gemm_pitch(jdt_cuk *k, int64_t lda, int64_t ldb, int64_t ldc)
{
    k->ld_next[0] = lda;
    k->ld_next[1] = ldb;
    k->ld_next[2] = ldc;
}

/* The pending row strides (jdt_cuk_gemm_pitch), taken: ld receives them, k forgets them.
 * ERR_INTERNAL when any is set and `takes` is false (an entry point without them), or K is 0
 * (the bias rows' fill writes rows back to back). */
static jdt_status take_ld(jdt_cuk *k, int64_t *ld, bool takes, int64_t K, jdt_err *e)
{
    memcpy(ld, k->ld_next, sizeof k->ld_next);
    memset(k->ld_next, 0, sizeof k->ld_next);
    if (!(ld[0] || ld[1] || ld[2]) || (takes && K > 0)) return JDT_OK;
    return jdt_err_set(e, JDT_ERR_INTERNAL, "matmul: padded rows (%lld, %lld, %lld) for a GEMM %s",
                       (long long)ld[0], (long long)ld[1], (long long)ld[2],
                       takes ? "with K = 0" : "that takes none");
}

jdt_status jdt_cuk_matmul(jdt_cuk *k, const float *a, const float *b, const float *bias,
                          const float *acc, float *c, int64_t batch, int64_t M, int64_t N,
                          int64_t K, bool ta, bool tb, bool b_shared, jdt_err *e)
{
    int64_t ld[3];
    jdt_status st = take_ld(k, ld, true, K, e);
    if (st != JDT_OK) return st;
    bool done;
    st = gemm_shape(k, bias, acc, c, &batch, &M, N, K, ta, b_shared, &done, e);
    if (st != JDT_OK || done) return st;
    return gemm(k, a, b, bias, acc, c, NULL, 0, batch, M, N, K, ta, tb, b_shared, false, false, ld,
                e);
}

/* Where b's bf16 copy starts in the scratch: after a's, 16-byte aligned when that fits. */
static int64_t bf16_b_offset(int64_t na, int64_t nb, int64_t scratch_bytes)
{
    int64_t off = (2 * na + 15) / 16 * 16;
    return off + 2 * nb <= scratch_bytes ? off : 2 * na;
}

int64_t jdt_cuk_matmul_bf16_scratch_bytes(int64_t batch, int64_t M, int64_t N, int64_t K,
                                          bool b_shared)
{ /* f32 room: the TF32 fallback's rounded copies; the bf16 copies take half of it */
    return 4 * (batch * M * K + (b_shared ? 1 : batch) * K * N) + 16;
}

int64_t jdt_cuk_matmul_bf16_need_bytes(int64_t batch, int64_t M, int64_t N, int64_t K,
                                       bool b_shared, bool a_bf16, bool b_bf16)
{
    const int64_t na = batch * M * K, nb = (b_shared ? 1 : batch) * K * N;
    const int64_t copies = 2 * ((a_bf16 ? 0 : na) + (b_bf16 ? 0 : nb));
    return copies ? copies + 16 : 0;
}

jdt_status jdt_cuk_matmul_bf16(jdt_cuk *k, const float *a, const float *b, const float *bias,
                               float *c, int64_t batch, int64_t M, int64_t N, int64_t K, bool ta,
                               bool tb, bool b_shared, void *scratch, int64_t scratch_bytes,
                               jdt_err *e)
{
    return jdt_cuk_matmul_bf16_ex(k, a, b, bias, NULL, c, batch, M, N, K, ta, tb, b_shared, false,
                                  false, scratch, scratch_bytes, e);
}

/* jdt_cuk_matmul_bf16_ex and jdt_cuk_matmul_bf16_out: c and the bias f32, or both bf16
 * (c_bf16, which has no TF32 fallback); ld the row strides (NULL: none), a padded operand read
 * in place only */
static jdt_status matmul_bf16(jdt_cuk *k, const void *a, const void *b, const void *bias,
                              const float *acc, void *c, const void *aux, int aux_kind,
                              int64_t batch, int64_t M, int64_t N, int64_t K, bool ta, bool tb,
                              bool b_shared, bool a_bf16, bool b_bf16, bool c_bf16, void *scratch,
                              int64_t scratch_bytes, const int64_t *ld, jdt_err *e)
{
    const bool pitched = ld && (ld[0] || ld[1] || ld[2]);
    if (pitched && ((ld[0] && !a_bf16) || (ld[1] && !b_bf16)))
        return jdt_err_set(e, JDT_ERR_INTERNAL,
                           "matmul bf16: a padded f32 operand (the conversion reads rows back "
                           "to back)");
    const int64_t na = batch * M * K, nb = (b_shared ? 1 : batch) * K * N;
    if (c_bf16 && K <= 0 && batch > 0 && M > 0 && N > 0)
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED,
                           "matmul: a bf16 output of an empty (K = 0) product");
    bool done;
    jdt_status st = gemm_shape(k, bias, acc, c, &batch, &M, N, K, ta, b_shared, &done, e);
    if (st != JDT_OK || done) return st;
    /* the bf16 copies of the f32 operands (none when both are stored as bf16) */
    const int64_t need = 2 * ((a_bf16 ? 0 : na) + (b_bf16 ? 0 : nb));
    if (need > 0 && (!scratch || scratch_bytes < need))
        return jdt_err_set(e, JDT_ERR_INTERNAL,
                           "matmul bf16: scratch of %lld bytes, %lld needed (the memory plan "
                           "and the CUDA backend disagree)",
                           (long long)scratch_bytes, (long long)need);
    const uint16_t *a16 = a, *b16 = b;
    if (!a_bf16) {
        jdt_cuk_to_bf16(k, a, scratch, na);
        a16 = scratch;
    }
    if (!b_bf16) {
        uint16_t *bs =
            (uint16_t *)((char *)scratch + (a_bf16 ? 0 : bf16_b_offset(na, nb, scratch_bytes)));
        jdt_cuk_to_bf16(k, b, bs, nb);
        b16 = bs;
    }
    st = gemm(k, a16, b16, bias, acc, c, aux, aux_kind, batch, M, N, K, ta, tb, b_shared, true,
              c_bf16, ld, e);
    /* (an in-place add, acc == c, has no second try: a split that failed part way has added
     * some of its parts to c already) */
    if (st == JDT_OK || c_bf16 || pitched || (acc && (const void *)acc == c)) return st;
    /* no bf16 algorithm for this shape or alignment: the rounded values in f32 through TF32
     * tensor cores (exact for bf16 values: 8 significant bits fit TF32's 11), in the caller's
     * scratch when it has room, else in memory allocated for this call, stream-ordered: the
     * compiler's plan does not reserve it (it is meant to be rare), and its first use says so */
    void *tmp = NULL;
    bool tmp_async = false;
    const size_t fb = (size_t)(4 * (na + nb));
    if (!scratch || scratch_bytes < (int64_t)fb) {
        cudaError_t ce;
        if (!(tmp = jdt_cuk_tmp_alloc(k, fb, &tmp_async, &ce)))
            return jdt_err_set(e, JDT_ERR_NOMEM,
                               "matmul bf16 (M %lld, N %lld, K %lld): cuBLASLt has no bf16 "
                               "algorithm, and the TF32 fallback's %.1f MiB of f32 copies, "
                               "which the memory plan does not hold, could not be allocated: %s",
                               (long long)M, (long long)N, (long long)K, (double)fb / 1048576.0,
                               cudaGetErrorString(ce));
    }
    if (!k->tf32_fallbacks++)
        JDT_INFO("cuda: cuBLASLt has no bf16 algorithm for a GEMM (batch %lld, M %lld, N %lld, "
                 "K %lld): TF32 on its bf16-rounded values (%s)",
                 (long long)batch, (long long)M, (long long)N, (long long)K,
                 tmp ? "copies allocated for the call" : "copies in the planned scratch");
    float *ar = tmp ? tmp : scratch, *br = ar + na;
    if (a_bf16)
        jdt_cuk_bf16_widen(k, a, ar, na);
    else
        jdt_cuk_bf16_round(k, a, ar, na);
    if (b_bf16)
        jdt_cuk_bf16_widen(k, b, br, nb);
    else
        jdt_cuk_bf16_round(k, b, br, nb);
    st = gemm(k, ar, br, bias, acc, c, NULL, 0, batch, M, N, K, ta, tb, b_shared, false, false,
              NULL, e);
    if (tmp) jdt_cuk_tmp_free(k, tmp, tmp_async);
    return st;
}

jdt_status jdt_cuk_matmul_bf16_ex(jdt_cuk *k, const void *a, const void *b, const float *bias,
                                  const float *acc, float *c, int64_t batch, int64_t M, int64_t N,
                                  int64_t K, bool ta, bool tb, bool b_shared, bool a_bf16,
                                  bool b_bf16, void *scratch, int64_t scratch_bytes, jdt_err *e)
{
    int64_t ld[3];
    jdt_status st = take_ld(k, ld, true, K, e);
    if (st != JDT_OK) return st;
    return matmul_bf16(k, a, b, bias, acc, c, NULL, 0, batch, M, N, K, ta, tb, b_shared, a_bf16,
                       b_bf16, false, scratch, scratch_bytes, ld, e);
}

jdt_status jdt_cuk_matmul_bf16_out(jdt_cuk *k, const void *a, const void *b, const uint16_t *bias,
                                   uint16_t *c, int64_t batch, int64_t M, int64_t N, int64_t K,
                                   bool ta, bool tb, bool b_shared, bool a_bf16, bool b_bf16,
                                   void *scratch, int64_t scratch_bytes, jdt_err *e)
{
    int64_t ld[3];
    jdt_status st = take_ld(k, ld, true, K, e);
    if (st != JDT_OK) return st;
    return matmul_bf16(k, a, b, bias, NULL, c, NULL, 0, batch, M, N, K, ta, tb, b_shared, a_bf16,
                       b_bf16, true, scratch, scratch_bytes, ld, e);
}

/* The bf16-output GEMM with a GELU epilogue (aux_kind 1: GELU_AUX(_BIAS), 2: DGELU, 3:
 * DGELU_BGRAD, `bias` then the f32 gradient it writes; aux the GELU input), when the shape fits
 * cuBLASLt's one aux matrix (the batch folds into M only over a shared b; ld N a multiple of 8)
 * and the context has not been refused it before (*off). False: the caller's fallback runs; a
 * refusal sets *off and says so once. */
static bool gelu_epilogue(jdt_cuk *k, bool *off, const char *what, const void *a, const void *b,
                          const void *bias, uint16_t *c, const uint16_t *aux, int aux_kind,
                          int64_t batch, int64_t M, int64_t N, int64_t K, bool ta, bool tb,
                          bool b_shared, bool a_bf16, bool b_bf16, void *scratch,
                          int64_t scratch_bytes)
{
    if (*off || !(batch == 1 || (b_shared && !ta)) || N % 8 != 0 || K <= 0) return false;
    jdt_err le;
    jdt_err_clear(&le);
    if (matmul_bf16(k, a, b, bias, NULL, c, aux, aux_kind, batch, M, N, K, ta, tb, b_shared, a_bf16,
                    b_bf16, true, scratch, scratch_bytes, NULL, &le) == JDT_OK)
        return true;
    *off = true;
    JDT_INFO("cuda: no cuBLASLt %s epilogue here (%s): %s", what, le.msg,
             aux_kind == 3   ? "DGELU, then a column-sum kernel"
             : aux_kind == 2 ? "the GEMM, then a GELU' kernel"
                             : "the GEMM, then a GELU kernel");
    return false;
}

jdt_status jdt_cuk_matmul_bf16_gelu(jdt_cuk *k, const void *a, const void *b, const uint16_t *bias,
                                    uint16_t *y, uint16_t *pre, int64_t batch, int64_t M, int64_t N,
                                    int64_t K, bool ta, bool tb, bool b_shared, bool a_bf16,
                                    bool b_bf16, void *scratch, int64_t scratch_bytes, jdt_err *e)
{
    int64_t ld[3];
    jdt_status lst = take_ld(k, ld, false, K, e);
    if (lst != JDT_OK) return lst;
    if (gelu_epilogue(k, &k->gelu_epilogue_off, "GELU", a, b, bias, y, pre, 1, batch, M, N, K, ta,
                      tb, b_shared, a_bf16, b_bf16, scratch, scratch_bytes))
        return JDT_OK;
    jdt_status st = matmul_bf16(k, a, b, bias, NULL, pre, NULL, 0, batch, M, N, K, ta, tb, b_shared,
                                a_bf16, b_bf16, true, scratch, scratch_bytes, NULL, e);
    if (st == JDT_OK) jdt_cuk_gelu_bf16(k, pre, y, batch * M * N);
    return st;
}

jdt_status jdt_cuk_matmul_bf16_dgelu(jdt_cuk *k, const void *a, const void *b, const uint16_t *pre,
                                     uint16_t *dx, float *dbias, int64_t batch, int64_t M,
                                     int64_t N, int64_t K, bool ta, bool tb, bool b_shared,
                                     bool a_bf16, bool b_bf16, void *scratch, int64_t scratch_bytes,
                                     jdt_err *e)
{
    int64_t ld[3];
    jdt_status st = take_ld(k, ld, false, K, e);
    if (st != JDT_OK) return st;
    if (dbias &&
        gelu_epilogue(k, &k->dgelu_bgrad_off, "DGELU_BGRAD", a, b, dbias, dx, pre, 3, batch, M, N,
                      K, ta, tb, b_shared, a_bf16, b_bf16, scratch, scratch_bytes))
        return JDT_OK;
    if (!gelu_epilogue(k, &k->dgelu_epilogue_off, "DGELU", a, b, NULL, dx, pre, 2, batch, M, N, K,
                       ta, tb, b_shared, a_bf16, b_bf16, scratch, scratch_bytes)) {
        st = matmul_bf16(k, a, b, NULL, NULL, dx, NULL, 0, batch, M, N, K, ta, tb, b_shared, a_bf16,
                         b_bf16, true, scratch, scratch_bytes, NULL, e);
        if (st == JDT_OK) jdt_cuk_dgelu_bf16(k, pre, dx, batch * M * N);
    }
    if (st == JDT_OK && dbias) jdt_cuk_colsum_bf16(k, dx, dbias, batch * M, N);
    return st;
}
