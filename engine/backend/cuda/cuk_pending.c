/*
 * cuk_pending.c — TEMPORARY stand-in for the builtin kernels of branch `cudak` (cuk.h) until
 * that branch is merged: jdt_cuk_init really selects the device and creates the stream (so the
 * generated kernels run), and every builtin records an ERR_UNSUPPORTED naming itself, returned
 * by the next jdt_cuk_check. Deleted by the merge of `cudak`.
 */
#include "backend/cuda/cuk.h"

#include <cuda_runtime.h>
#include <stdio.h>

struct jdt_cuk {
    int device, arch;
    cudaStream_t stream;
    const char *missing; /* first builtin called */
};

jdt_status jdt_cuk_init(int device, const char *cache_dir, jdt_cuk **out, jdt_err *e)
{
    *out = NULL;
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess)
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "cuda: cudaSetDevice(%d): %s", device,
                           cudaGetErrorString(ce));
    jdt_cuk *k = jdt_calloc(1, sizeof *k);
    if (!k) return jdt_err_set(e, JDT_ERR_NOMEM, "cuda: context");
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    k->arch = major * 10 + minor;
    k->device = device;
    if ((ce = cudaStreamCreateWithFlags(&k->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        jdt_free(k);
        return jdt_err_set(e, JDT_ERR_INTERNAL, "cuda: cudaStreamCreate: %s",
                           cudaGetErrorString(ce));
    }
    *out = k;
    return JDT_OK;
}

void jdt_cuk_free(jdt_cuk *k)
{
    if (!k) return;
    cudaStreamSynchronize(k->stream);
    cudaStreamDestroy(k->stream);
    jdt_free(k);
}

void *jdt_cuk_stream(jdt_cuk *k)
{
    return k->stream;
}

int jdt_cuk_arch(const jdt_cuk *k)
{
    return k->arch;
}

jdt_status jdt_cuk_check(jdt_cuk *k, const char *what, bool sync, jdt_err *e)
{
    if (k->missing) {
        const char *m = k->missing;
        k->missing = NULL;
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s: no CUDA kernel for %s yet (branch cudak "
                           "not merged)", what, m);
    }
    cudaError_t ce = sync ? cudaStreamSynchronize(k->stream) : cudaSuccess;
    if (ce == cudaSuccess) ce = cudaGetLastError();
    if (ce != cudaSuccess)
        return jdt_err_set(e, JDT_ERR_INTERNAL, "%s: %s", what, cudaGetErrorString(ce));
    return JDT_OK;
}

jdt_status jdt_cuk_compile_all(int arch, jdt_err *e)
{
    return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "cuda builtin kernels: branch cudak not merged");
}

#define MISSING(name)                                                                            \
    do {                                                                                         \
        if (!k->missing) k->missing = name;                                                      \
    } while (0)

jdt_status jdt_cuk_matmul(jdt_cuk *k, const float *a, const float *b, const float *bias, float *c,
                          int64_t batch, int64_t M, int64_t N, int64_t K, bool ta, bool tb,
                          bool b_shared, jdt_err *e)
{
    return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "no CUDA kernel for matmul yet (cudak)");
}
void jdt_cuk_gather(jdt_cuk *k, const float *table, const int32_t *idx, float *out, int64_t n,
                    int64_t V, int64_t C) { MISSING("gather"); }
void jdt_cuk_scatter_add(jdt_cuk *k, const float *src, const int32_t *idx, float *out, int64_t n,
                         int64_t V, int64_t C) { MISSING("scatter_add"); }
void jdt_cuk_softmax(jdt_cuk *k, const float *x, float *y, int64_t N, int64_t C) { MISSING("softmax"); }
void jdt_cuk_softmax_bwd(jdt_cuk *k, const float *y, const float *dy, float *dx, int64_t N,
                         int64_t C) { MISSING("softmax_bwd"); }
void jdt_cuk_log_softmax(jdt_cuk *k, const float *x, float *y, int64_t N, int64_t C) { MISSING("log_softmax"); }
void jdt_cuk_log_softmax_bwd(jdt_cuk *k, const float *y, const float *dy, float *dx, int64_t N,
                             int64_t C) { MISSING("log_softmax_bwd"); }
void jdt_cuk_softmax_xent(jdt_cuk *k, const float *logits, const int32_t *tgt, float *loss,
                          int64_t N, int64_t V) { MISSING("softmax_xent"); }
void jdt_cuk_softmax_xent_bwd(jdt_cuk *k, const float *logits, const int32_t *tgt,
                              const float *dloss, float *dlogits, int64_t N, int64_t V) { MISSING("softmax_xent_bwd"); }
void jdt_cuk_normalize(jdt_cuk *k, const float *x, float *y, int64_t N, int64_t C, float eps) { MISSING("normalize"); }
void jdt_cuk_normalize_bwd(jdt_cuk *k, const float *x, const float *dxhat, float *dx, int64_t N,
                           int64_t C, float eps) { MISSING("normalize_bwd"); }
void jdt_cuk_rms_normalize(jdt_cuk *k, const float *x, float *y, int64_t N, int64_t C, float eps) { MISSING("rms_normalize"); }
void jdt_cuk_rms_normalize_bwd(jdt_cuk *k, const float *x, const float *dxhat, float *dx,
                               int64_t N, int64_t C, float eps) { MISSING("rms_normalize_bwd"); }
void jdt_cuk_rope(jdt_cuk *k, const float *x, float *y, int64_t B, int64_t T, int64_t H,
                  int64_t D, double theta, bool inverse) { MISSING("rope"); }
void jdt_cuk_concat(jdt_cuk *k, const float *const *in, const int64_t *len, int n_in, float *out,
                    int64_t outer, int64_t inner, size_t elem_bytes) { MISSING("concat"); }
int64_t jdt_cuk_attention_scratch_bytes(int64_t B, int64_t H, int64_t T, int64_t D) { return 0; }
void jdt_cuk_attention(jdt_cuk *k, const float *q, const float *kk, const float *v, float *o,
                       int64_t B, int64_t H, int64_t T, int64_t D, float scale, unsigned bthd,
                       void *scratch) { MISSING("attention"); }
void jdt_cuk_attention_bwd(jdt_cuk *k, const float *q, const float *kk, const float *v,
                           const float *o, const float *dout, float *dqkv, int64_t B, int64_t H,
                           int64_t T, int64_t D, float scale, unsigned bthd, void *scratch) { MISSING("attention_bwd"); }
jdt_status jdt_cuk_comm_init(jdt_cuk *k, struct jdt_dist *d, const int *ranks, int n_ranks,
                             const char *key, jdt_cuk_comm **out, jdt_err *e)
{
    *out = NULL;
    return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "NCCL collectives: branch cudak not merged");
}
void jdt_cuk_comm_free(jdt_cuk_comm *c) {}
jdt_status jdt_cuk_allreduce(jdt_cuk_comm *c, float *buf, int64_t n, bool average, jdt_err *e)
{
    return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "NCCL collectives: branch cudak not merged");
}
