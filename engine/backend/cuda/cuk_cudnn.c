/*
 * cuk_cudnn.c — causal attention through cuDNN's fused attention engines (the "flash" fprop and
 * bprop engines of cuDNN 9), for the CUDA backend's bf16 path (cuk.h jdt_cuk_attention and
 * jdt_cuk_attention_bwd call in here first and fall back to jdt-train's kernels when this
 * declines). libcudnn.so.9 is opened with dlopen on first use, like NCCL (cuk_comm.c): the
 * binary never needs cuDNN; only cudnn_graph.h's types and constants are used at build time.
 *
 * The graph is cuDNN's C backend API, the "composite" form of scaled dot-product attention:
 * matmul, scale, the causal mask as index generators + a compare + a select, the softmax with
 * its statistics (max, exp, sum, log), matmul; the backward recomputes the probabilities from
 * the forward's statistics (jdt-train's log-sum-exp is exactly cuDNN's Stats: max + log sum of
 * the scaled, masked scores) and forms dV, dP, dS = P (dP - rowsum(dO . O)), dK and dQ. The
 * backward takes the deterministic form (dQ written by its matmul, no f32 accumulator for
 * atomics); the engine's numerical notes are logged. The fused-attention engine recognizes the
 * pattern; cudnn-frontend's SDPA nodes document it (read, not copied).
 *
 * Plans are built once per shape (B, H, T, D, layouts) with the context's handle and cached,
 * each with the descriptors it was built from (kept alive as cudnn-frontend keeps them); a
 * shape no engine takes, or one that cudnn-frontend refuses on this cuDNN version
 * (jdt_cuk_dnn_refusal), is remembered as declined (one info line) and runs our kernels, and
 * so is a plan cuDNN refuses to execute (one warning). The plan's workspace is the context's
 * cuBLASLt workspace (the stream orders them), or device memory of its own up to half of what
 * the GPU has free; an engine that wants more is skipped. The backward's row sums of dO . O go
 * to the attention's scratch.
 *
 * Who serves a call (cuk.c asks here first): JDT_CUDNN_ATTENTION=auto, the default, tries each
 * call shape and direction once against jdt-train's kernels (jdt_cuk_dnn_attention_auto: both
 * run, are timed and compared) and keeps cuDNN for it only where its outputs agree and it is
 * faster, as XLA's autotuner checks a candidate's results before timing counts; =1 (or fast)
 * trusts cuDNN wherever it takes the shape.
 *
 * Without a GPU, jdt_cuk_dnn_check_offline builds the same graphs against a described H200
 * (cuDNN 9.8's device-property descriptor: heuristics and plan finalization need no handle), so
 * CI proves that an engine takes each graph and that its kernels compile.
 */
#include "backend/cuda/cuk-impl.h"

#include <dlfcn.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__has_include)
#if __has_include(<cudnn_graph.h>)
#define JDT_HAVE_CUDNN 1
#endif
#endif

/* Why cuDNN of this version must not run an attention (bwd: the backward) over T positions, or
 * NULL: cases cudnn-frontend refuses, or works around with a padding mask this graph does not
 * build. */
const char *jdt_cuk_dnn_refusal(size_t version, bool bwd, int64_t T)
{
    if (version >= 91000 && version <= 91001)
        return "cuDNN 9.10.0 and 9.10.1 have known bugs in bf16 fused attention (cudnn-frontend "
               "refuses them)";
    if (bwd && T < 2) return "a backward over one position (cudnn-frontend refuses it)";
    if (bwd && T % 128 != 0 && version <= 91500)
        return "a backward whose sequence is not a multiple of 128 before cuDNN 9.15.1 (cudnn-"
               "frontend adds a padding mask there)";
    return NULL;
}

#ifndef JDT_HAVE_CUDNN

bool jdt_cuk_dnn_attention(jdt_cuk *k, const void *q, const void *kk, const void *v, void *o2,
                           float *lse, int64_t B, int64_t H, int64_t T, int64_t D, float scale,
                           unsigned bthd)
{
    (void)k, (void)q, (void)kk, (void)v, (void)o2, (void)lse, (void)B, (void)H, (void)T, (void)D;
    (void)scale, (void)bthd;
    return false;
}
bool jdt_cuk_dnn_attention_bwd(jdt_cuk *k, const void *q, const void *kk, const void *v,
                               const void *o, const void *dout, const float *lse,
                               const jdt_cuk_att_grads *g, int64_t B, int64_t H, int64_t T,
                               int64_t D, float scale, unsigned bthd, void *scratch)
{
    (void)k, (void)q, (void)kk, (void)v, (void)o, (void)dout, (void)lse, (void)g, (void)B;
    (void)H, (void)T, (void)D, (void)scale, (void)bthd, (void)scratch;
    return false;
}
void jdt_cuk_dnn_free(jdt_cuk *k)
{
    (void)k;
}
void jdt_cuk_dnn_trim(jdt_cuk *k)
{
    (void)k;
}
bool jdt_cuk_dnn_attention_auto(jdt_cuk *k, const void *q, const void *kk, const void *v, void *o2,
                                float *lse, int64_t B, int64_t H, int64_t T, int64_t D, float scale,
                                unsigned bthd, void *scratch)
{
    (void)k, (void)q, (void)kk, (void)v, (void)o2, (void)lse, (void)B, (void)H, (void)T, (void)D;
    (void)scale, (void)bthd, (void)scratch;
    return false;
}
bool jdt_cuk_dnn_attention_bwd_auto(jdt_cuk *k, const void *q, const void *kk, const void *v,
                                    const void *o, const void *dout, const float *lse,
                                    const jdt_cuk_att_grads *g, int64_t B, int64_t H, int64_t T,
                                    int64_t D, float scale, unsigned bthd, void *scratch)
{
    (void)k, (void)q, (void)kk, (void)v, (void)o, (void)dout, (void)lse, (void)g, (void)B;
    (void)H, (void)T, (void)D, (void)scale, (void)bthd, (void)scratch;
    return false;
}
jdt_status jdt_cuk_dnn_check_offline(bool bwd, bool stats, bool accum, int64_t B, int64_t H,
                                     int64_t T, int64_t D, unsigned bthd, char *info, size_t n,
                                     jdt_err *e)
{
    (void)bwd, (void)stats, (void)accum, (void)B, (void)H, (void)T, (void)D, (void)bthd;
    if (n) info[0] = 0;
    return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "built without cuDNN's headers (cudnn_graph.h)");
}

#else

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cudnn_graph.h> /* types and constants only: the functions are resolved with dlsym */
#pragma GCC diagnostic pop

/* The cuDNN entry points this file uses, resolved with dlsym. */
typedef struct {
    void *lib;
    __typeof__(cudnnGetVersion) *get_version;
    __typeof__(cudnnCreate) *create;
    __typeof__(cudnnDestroy) *destroy;
    __typeof__(cudnnSetStream) *set_stream;
    __typeof__(cudnnGetErrorString) *error_string;
    __typeof__(cudnnGetLastErrorString) *last_error;
    __typeof__(cudnnBackendCreateDescriptor) *bcreate;
    __typeof__(cudnnBackendDestroyDescriptor) *bdestroy;
    __typeof__(cudnnBackendSetAttribute) *bset;
    __typeof__(cudnnBackendGetAttribute) *bget;
    __typeof__(cudnnBackendFinalize) *bfinalize;
    __typeof__(cudnnBackendExecute) *bexecute;
} dnn_api;

/* The device-property descriptor (cuDNN 9.8) needs cuDNN 9.8 for offline builds. */
#define DNN_MIN_VERSION 90000
#define DNN_OFFLINE_MIN_VERSION 90800

/* Opens libcudnn.so.9 (JDT_CUDNN_LIBRARY: a path or soname, e.g. PyTorch's wheel's copy;
 * else the loader's search, then $CUDA_HOME/lib and /usr/local/cuda/lib{,64}). */
static jdt_status dnn_load(dnn_api *a, jdt_err *e)
{
    memset(a, 0, sizeof *a);
    const char *env = getenv("JDT_CUDNN_LIBRARY");
    const char *home = getenv("CUDA_HOME");
    char tries[5][512];
    int n = 0;
    if (env && *env)
        snprintf(tries[n++], sizeof tries[0], "%s", env);
    else {
        snprintf(tries[n++], sizeof tries[0], "libcudnn.so.9");
        if (home && *home) snprintf(tries[n++], sizeof tries[0], "%s/lib/libcudnn.so.9", home);
        snprintf(tries[n++], sizeof tries[0], "/usr/local/cuda/lib/libcudnn.so.9");
        snprintf(tries[n++], sizeof tries[0], "/usr/local/cuda/lib64/libcudnn.so.9");
    }
    /* the message: the first place's error, or a later one that found a file and failed to
     * load it (a missing dependency says more than "no such file") */
    char err[300] = "";
    for (int i = 0; i < n && !a->lib; i++)
        if (!(a->lib = dlopen(tries[i], RTLD_NOW | RTLD_LOCAL))) {
            const char *d = dlerror();
            if (d && (!err[0] || !strstr(d, "No such file"))) snprintf(err, sizeof err, "%s", d);
        }
    if (!a->lib)
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "cuDNN cannot be loaded (%d place%s tried): %s",
                           n, n == 1 ? "" : "s", err);
#define SYM(field, name)                                                                           \
    if (!(*(void **)&a->field = dlsym(a->lib, name))) {                                            \
        dlclose(a->lib);                                                                           \
        a->lib = NULL;                                                                             \
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "cuDNN lacks %s (cuDNN 9 is needed)", name);    \
    }
    SYM(get_version, "cudnnGetVersion");
    SYM(create, "cudnnCreate");
    SYM(destroy, "cudnnDestroy");
    SYM(set_stream, "cudnnSetStream");
    SYM(error_string, "cudnnGetErrorString");
    SYM(last_error, "cudnnGetLastErrorString");
    SYM(bcreate, "cudnnBackendCreateDescriptor");
    SYM(bdestroy, "cudnnBackendDestroyDescriptor");
    SYM(bset, "cudnnBackendSetAttribute");
    SYM(bget, "cudnnBackendGetAttribute");
    SYM(bfinalize, "cudnnBackendFinalize");
    SYM(bexecute, "cudnnBackendExecute");
#undef SYM
    if (a->get_version() < DNN_MIN_VERSION) {
        size_t v = a->get_version();
        dlclose(a->lib);
        a->lib = NULL;
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "cuDNN %zu is too old (9.0 or newer is needed)",
                           v);
    }
    return JDT_OK;
}

/* ---- a graph under construction ----------------------------------------------------------- */

/* The most workspace a plan may ask for (an engine that wants more is skipped). */
#define DNN_MAX_WORKSPACE (4ll << 30)

#define DNN_MAX_DESC 128
#define DNN_MAX_OPS 48

/* Every descriptor made while building (freed together), the operations in order, and the
 * first failure as one message. */
typedef struct {
    const dnn_api *a;
    cudnnBackendDescriptor_t d[DNN_MAX_DESC];
    int n_d;
    cudnnBackendDescriptor_t ops[DNN_MAX_OPS];
    int n_ops;
    int64_t next_uid; /* the virtual tensors' */
    bool failed;
    char msg[400];
} dnn_g;

static void g_fail(dnn_g *g, cudnnStatus_t st, const char *fmt, ...) JDT_PRINTF(3, 4);
static void g_fail(dnn_g *g, cudnnStatus_t st, const char *fmt, ...)
{
    if (g->failed) return;
    g->failed = true;
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(g->msg, sizeof g->msg, fmt, ap);
    va_end(ap);
    if (len < 0 || (size_t)len >= sizeof g->msg) return;
    char last[256] = "";
    if (st != CUDNN_STATUS_SUCCESS) g->a->last_error(last, sizeof last);
    snprintf(g->msg + len, sizeof g->msg - (size_t)len, ": %s%s%s",
             st != CUDNN_STATUS_SUCCESS ? g->a->error_string(st) : "unsupported",
             last[0] ? " - " : "", last);
}

static cudnnBackendDescriptor_t g_new(dnn_g *g, cudnnBackendDescriptorType_t type)
{
    if (g->failed) return NULL;
    if (g->n_d == DNN_MAX_DESC) {
        g_fail(g, CUDNN_STATUS_SUCCESS, "cuDNN graph: more than %d descriptors", DNN_MAX_DESC);
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    cudnnStatus_t st = g->a->bcreate(type, &d);
    if (st != CUDNN_STATUS_SUCCESS) {
        g_fail(g, st, "cudnnBackendCreateDescriptor(%d)", (int)type);
        return NULL;
    }
    g->d[g->n_d++] = d;
    return d;
}

static void g_set(dnn_g *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t attr,
                  cudnnBackendAttributeType_t type, int64_t count, const void *value)
{
    if (g->failed || !d) return;
    cudnnStatus_t st = g->a->bset(d, attr, type, count, value);
    if (st != CUDNN_STATUS_SUCCESS) g_fail(g, st, "cudnnBackendSetAttribute(%d)", (int)attr);
}

/* Sets d's attribute attr to the descriptor v. */
static void g_ref(dnn_g *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t attr,
                  cudnnBackendDescriptor_t v)
{
    g_set(g, d, attr, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

static void g_finalize(dnn_g *g, cudnnBackendDescriptor_t d, const char *what)
{
    if (g->failed || !d) return;
    cudnnStatus_t st = g->a->bfinalize(d);
    if (st != CUDNN_STATUS_SUCCESS) g_fail(g, st, "finalizing %s", what);
}

static void g_free(dnn_g *g)
{
    for (int i = g->n_d - 1; i >= 0; i--)
        g->a->bdestroy(g->d[i]);
    g->n_d = 0;
}

/* Descriptors a cached plan keeps alive (dnn_plan's owned). */
typedef struct {
    cudnnBackendDescriptor_t *d;
    int n;
} dnn_owned;

/* Tensor flags. */
#define T_VIRTUAL 1
#define T_BY_VALUE 2

/* A 4-d tensor: uid 0 takes the next virtual uid. */
static cudnnBackendDescriptor_t g_tensor(dnn_g *g, int64_t uid, cudnnDataType_t dt,
                                         const int64_t dim[4], const int64_t str[4], int flags)
{
    cudnnBackendDescriptor_t t = g_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    if (!uid) uid = g->next_uid++;
    int64_t align = 16;
    bool virt = flags & T_VIRTUAL, by_value = flags & T_BY_VALUE;
    g_set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    g_set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim);
    g_set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str);
    g_set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    g_set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    g_set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt);
    if (by_value) g_set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    g_finalize(g, t, "a tensor");
    return t;
}

/* A virtual tensor shaped like dim with row-major strides. */
static cudnnBackendDescriptor_t g_virtual(dnn_g *g, cudnnDataType_t dt, const int64_t dim[4])
{
    int64_t str[4] = {dim[1] * dim[2] * dim[3], dim[2] * dim[3], dim[3], 1};
    return g_tensor(g, 0, dt, dim, str, T_VIRTUAL);
}

/* A by-value scalar (host memory in the variant pack). */
static cudnnBackendDescriptor_t g_scalar(dnn_g *g, int64_t uid)
{
    static const int64_t one[4] = {1, 1, 1, 1};
    return g_tensor(g, uid, CUDNN_DATA_FLOAT, one, one, T_BY_VALUE);
}

static void g_op(dnn_g *g, cudnnBackendDescriptor_t op, const char *what)
{
    g_finalize(g, op, what);
    if (g->failed) return;
    if (g->n_ops == DNN_MAX_OPS) {
        g_fail(g, CUDNN_STATUS_SUCCESS, "cuDNN graph: more than %d operations", DNN_MAX_OPS);
        return;
    }
    g->ops[g->n_ops++] = op;
}

/* y = mode(x, b, t): a pointwise operation at math precision prec; b, t NULL where the mode
 * takes fewer inputs; axis >= 0 for GEN_INDEX. Returns y. */
static cudnnBackendDescriptor_t g_pw(dnn_g *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec,
                                     cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                                     cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
                                     int64_t axis)
{
    cudnnBackendDescriptor_t pw = g_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    g_set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    g_set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) g_set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    g_finalize(g, pw, "a pointwise descriptor");
    cudnnBackendDescriptor_t op = g_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    const float one = 1.0f;
    g_ref(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    g_ref(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b) g_ref(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b);
    if (t) g_ref(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t);
    g_ref(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    g_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    g_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    g_op(g, op, "a pointwise operation");
    return y;
}

/* Sets d's compute type (attribute attr) to f32 and finalizes d. */
static void g_f32(dnn_g *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t attr,
                  const char *what)
{
    cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    g_set(g, d, attr, CUDNN_TYPE_DATA_TYPE, 1, &f32);
    g_finalize(g, d, what);
}

/* y = reduction of x over the axes where y's extent is 1, f32. */
static cudnnBackendDescriptor_t g_reduce(dnn_g *g, cudnnReduceTensorOp_t mode,
                                         cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t r = g_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    g_set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    g_f32(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, "a reduction descriptor");
    cudnnBackendDescriptor_t op = g_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    g_ref(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    g_ref(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    g_ref(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, r);
    g_op(g, op, "a reduction operation");
    return y;
}

/* c = a b over the last two axes (batched over the first two), f32 accumulation. */
static cudnnBackendDescriptor_t g_matmul(dnn_g *g, cudnnBackendDescriptor_t a,
                                         cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c)
{
    cudnnBackendDescriptor_t m = g_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    g_f32(g, m, CUDNN_ATTR_MATMUL_COMP_TYPE, "a matmul descriptor");
    cudnnBackendDescriptor_t op = g_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    g_ref(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    g_ref(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    g_ref(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    g_ref(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, m);
    g_op(g, op, "a matmul operation");
    return c;
}

/* y = x viewed with y's dimensions and strides (a transpose, and the operand's type). */
static cudnnBackendDescriptor_t g_reshape(dnn_g *g, cudnnBackendDescriptor_t x,
                                          cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t op = g_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    g_ref(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    g_ref(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    g_op(g, op, "a reshape operation");
    return y;
}

/* ---- the attention graphs ----------------------------------------------------------------- */

/* The variant pack's uids. */
enum {
    U_Q = 1,
    U_K,
    U_V,
    U_O,
    U_STATS,
    U_SCALE,
    U_DO,
    U_DQ,
    U_DK,
    U_DV,
    U_SOFTSUM, /* the backward's row sums of dO . O (scratch) */
    U_DQ_ACC,  /* the accumulator form's f32 dQ */
    U_NEG_INF,
    U_ONE,
    U_VIRTUAL = 100
};

/* One plan's shape. bthd as in jdt_cuk_attention (bit i: input i stored (B, T, H, D); the
 * backward's o bit 3, dout bit 4; its group bits cleared: G holds them); outputs (o, dq, dk, dv)
 * are always (B, T, h, D), h their head count. Grouped-query attention (G > 1): k, v, dk and dv
 * have Hk = H / G heads; the matmuls reading k or v take them with Hk heads, which cuDNN reads
 * as query head h using key/value head h / G, and dk and dv are each the ADD reduction of a
 * full-head product over the group (cudnn-frontend's SDPA backward builds the same, the product
 * a virtual tensor of the inputs' type: each head's share rounded to bf16 before the sum, where
 * jdt-train's kernels sum in f32 and round once). */
typedef struct {
    bool bwd, stats; /* stats: the forward stores the log-sum-exp */
    bool accum;      /* the backward's dQ summed in an f32 accumulator (the engine may use
                        atomics: JDT_CUDNN_ATTENTION=fast), else written by its matmul */
    int64_t B, H, T, D, G;
    unsigned bthd;
} dnn_key;

/* (B, h, T, D) dimensions' strides of a tensor of h heads stored (B, T, h, D) or (B, h, T, D). */
static void bhtd_strides(const dnn_key *s, int64_t h, bool bthd, int64_t str[4])
{
    const int64_t H = h, T = s->T, D = s->D;
    if (bthd)
        str[0] = T * H * D, str[1] = D, str[2] = H * D, str[3] = 1;
    else
        str[0] = H * T * D, str[1] = T * D, str[2] = D, str[3] = 1;
}

/* The (B, Hk, D, T) view of k or v, (B, Hk, T, D) (K^T, V^T). */
static cudnnBackendDescriptor_t g_transposed_input(dnn_g *g, const dnn_key *s, int64_t uid,
                                                   bool bthd)
{
    int64_t str[4], dim[4] = {s->B, s->H / s->G, s->D, s->T};
    bhtd_strides(s, dim[1], bthd, str);
    int64_t t = str[2];
    str[2] = str[3], str[3] = t;
    return g_tensor(g, uid, CUDNN_DATA_BFLOAT16, dim, str, 0);
}

/* A (B, h, T, D) tensor: h = s->H, or the key/value heads for k, v, dk and dv. */
static cudnnBackendDescriptor_t g_input(dnn_g *g, const dnn_key *s, int64_t uid, bool bthd)
{
    const bool kv = uid == U_K || uid == U_V || uid == U_DK || uid == U_DV;
    int64_t str[4], dim[4] = {s->B, kv ? s->H / s->G : s->H, s->T, s->D};
    bhtd_strides(s, dim[1], bthd, str);
    return g_tensor(g, uid, CUDNN_DATA_BFLOAT16, dim, str, 0);
}

/* The causal mask of scores (B, H, T, T): where row < column, -inf (the top-left diagonal). */
static cudnnBackendDescriptor_t g_causal(dnn_g *g, const dnn_key *s, cudnnBackendDescriptor_t x,
                                         cudnnBackendDescriptor_t neg_inf)
{
    const int64_t tt[4] = {s->B, s->H, s->T, s->T};
    cudnnBackendDescriptor_t row = g_virtual(g, CUDNN_DATA_INT32, tt),
                             col = g_virtual(g, CUDNN_DATA_INT32, tt),
                             keep = g_virtual(g, CUDNN_DATA_BOOLEAN, tt);
    g_pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, NULL, NULL, row, 2);
    g_pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, x, NULL, NULL, col, 3);
    g_pw(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, NULL, keep, -1);
    return g_pw(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, x, neg_inf, keep,
                g_virtual(g, CUDNN_DATA_FLOAT, tt), -1);
}

static void build_fwd(dnn_g *g, const dnn_key *s)
{
    const int64_t tt[4] = {s->B, s->H, s->T, s->T}, t1[4] = {s->B, s->H, s->T, 1};
    const int64_t t1_str[4] = {s->H * s->T, s->T, 1, 1};
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t q = g_input(g, s, U_Q, s->bthd & 1),
                             kt = g_transposed_input(g, s, U_K, s->bthd & 2),
                             v = g_input(g, s, U_V, s->bthd & 4), o = g_input(g, s, U_O, true),
                             scale = g_scalar(g, U_SCALE), neg_inf = g_scalar(g, U_NEG_INF);
    cudnnBackendDescriptor_t sc = g_matmul(g, q, kt, g_virtual(g, f32, tt));
    sc = g_pw(g, CUDNN_POINTWISE_MUL, f32, sc, scale, NULL, g_virtual(g, f32, tt), -1);
    sc = g_causal(g, s, sc, neg_inf);
    cudnnBackendDescriptor_t mx = g_reduce(g, CUDNN_REDUCE_TENSOR_MAX, sc, g_virtual(g, f32, t1));
    cudnnBackendDescriptor_t ex =
        g_pw(g, CUDNN_POINTWISE_SUB, f32, sc, mx, NULL, g_virtual(g, f32, tt), -1);
    ex = g_pw(g, CUDNN_POINTWISE_EXP, f32, ex, NULL, NULL, g_virtual(g, f32, tt), -1);
    cudnnBackendDescriptor_t sum = g_reduce(g, CUDNN_REDUCE_TENSOR_ADD, ex, g_virtual(g, f32, t1));
    /* the statistics, stored or virtual: the engine's pattern has them either way */
    cudnnBackendDescriptor_t lg =
        g_pw(g, CUDNN_POINTWISE_LOG, f32, sum, NULL, NULL, g_virtual(g, f32, t1), -1);
    g_pw(g, CUDNN_POINTWISE_ADD, f32, mx, lg, NULL,
         s->stats ? g_tensor(g, U_STATS, f32, t1, t1_str, 0) : g_virtual(g, f32, t1), -1);
    /* the probabilities in the products' type (bf16), as the engine expects */
    cudnnBackendDescriptor_t p =
        g_pw(g, CUDNN_POINTWISE_DIV, f32, ex, sum, NULL, g_virtual(g, CUDNN_DATA_BFLOAT16, tt), -1);
    g_matmul(g, p, v, o);
}

static void build_bwd(dnn_g *g, const dnn_key *s)
{
    const int64_t tt[4] = {s->B, s->H, s->T, s->T}, t1[4] = {s->B, s->H, s->T, 1},
                  td[4] = {s->B, s->H, s->T, s->D};
    const int64_t t1_str[4] = {s->H * s->T, s->T, 1, 1};
    /* (B, H, T, T) stored transposed: the probabilities' and dS's view as P^T, dS^T */
    const int64_t tt_t_str[4] = {s->H * s->T * s->T, s->T * s->T, 1, s->T};
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT, b16 = CUDNN_DATA_BFLOAT16;
    cudnnBackendDescriptor_t q = g_input(g, s, U_Q, s->bthd & 1),
                             kt = g_transposed_input(g, s, U_K, s->bthd & 2),
                             vt = g_transposed_input(g, s, U_V, s->bthd & 4),
                             o = g_input(g, s, U_O, s->bthd & 8),
                             dout = g_input(g, s, U_DO, s->bthd & 16),
                             dq = g_input(g, s, U_DQ, true), dk = g_input(g, s, U_DK, true),
                             dv = g_input(g, s, U_DV, true),
                             stats = g_tensor(g, U_STATS, f32, t1, t1_str, 0),
                             scale = g_scalar(g, U_SCALE), neg_inf = g_scalar(g, U_NEG_INF),
                             one = g_scalar(g, U_ONE);
    /* the row sums of dO . O */
    cudnnBackendDescriptor_t dd =
        g_pw(g, CUDNN_POINTWISE_MUL, f32, dout, o, NULL, g_virtual(g, f32, td), -1);
    dd = g_reduce(g, CUDNN_REDUCE_TENSOR_ADD, dd, g_virtual(g, f32, t1));
    cudnnBackendDescriptor_t softsum = g_pw(g, CUDNN_POINTWISE_MUL, f32, dd, one, NULL,
                                            g_tensor(g, U_SOFTSUM, f32, t1, t1_str, 0), -1);
    /* P = exp(scale Q K^T - L), masked */
    cudnnBackendDescriptor_t sc = g_matmul(g, q, kt, g_virtual(g, f32, tt));
    sc = g_pw(g, CUDNN_POINTWISE_MUL, f32, sc, scale, NULL, g_virtual(g, f32, tt), -1);
    sc = g_pw(g, CUDNN_POINTWISE_SUB, f32, sc, stats, NULL, g_virtual(g, f32, tt), -1);
    sc = g_causal(g, s, sc, neg_inf);
    cudnnBackendDescriptor_t p =
        g_pw(g, CUDNN_POINTWISE_EXP, f32, sc, NULL, NULL, g_virtual(g, f32, tt), -1);
    /* dV = P^T dO; grouped-query: the full-head product summed over each group (its type the
     * inputs', as cudnn-frontend declares it) */
    cudnnBackendDescriptor_t pt = g_reshape(g, p, g_tensor(g, 0, b16, tt, tt_t_str, T_VIRTUAL));
    if (s->G > 1)
        g_reduce(g, CUDNN_REDUCE_TENSOR_ADD, g_matmul(g, pt, dout, g_virtual(g, b16, td)), dv);
    else
        g_matmul(g, pt, dout, dv);
    /* dS = scale P (dO V^T - rowsum(dO . O)) */
    cudnnBackendDescriptor_t ds = g_matmul(g, dout, vt, g_virtual(g, f32, tt));
    ds = g_pw(g, CUDNN_POINTWISE_SUB, f32, ds, softsum, NULL, g_virtual(g, f32, tt), -1);
    ds = g_pw(g, CUDNN_POINTWISE_MUL, f32, ds, p, NULL, g_virtual(g, f32, tt), -1);
    ds = g_pw(g, CUDNN_POINTWISE_MUL, f32, ds, scale, NULL, g_virtual(g, f32, tt), -1);
    /* dK = dS^T Q (grouped-query: summed over each group, as dV) */
    cudnnBackendDescriptor_t dst = g_reshape(g, ds, g_tensor(g, 0, b16, tt, tt_t_str, T_VIRTUAL));
    if (s->G > 1)
        g_reduce(g, CUDNN_REDUCE_TENSOR_ADD, g_matmul(g, dst, q, g_virtual(g, b16, td)), dk);
    else
        g_matmul(g, dst, q, dk);
    /* dQ = dS K (K from K^T's view): by the matmul (the deterministic form), or into an f32
     * accumulator the engine may add to atomically, then rounded into dq */
    int64_t k_str[4], acc_str[4];
    const int64_t tk[4] = {s->B, s->H / s->G, s->T, s->D};
    bhtd_strides(s, tk[1], s->bthd & 2, k_str);
    cudnnBackendDescriptor_t kk = g_reshape(g, kt, g_tensor(g, 0, b16, tk, k_str, T_VIRTUAL));
    if (s->accum) {
        bhtd_strides(s, s->H, false, acc_str);
        cudnnBackendDescriptor_t acc = g_tensor(g, U_DQ_ACC, f32, td, acc_str, 0);
        g_matmul(g, ds, kk, acc);
        g_pw(g, CUDNN_POINTWISE_IDENTITY, f32, acc, NULL, NULL, dq, -1);
    } else
        g_matmul(g, ds, kk, dq);
}

/* The operation graph of s, heuristics, and the first engine configuration whose plan
 * finalizes with a workspace of at most max_ws bytes: *plan (owned by the caller, destroy with
 * a->bdestroy), *ws. handle or devprop (offline) identifies the device. info: the engine's
 * global index and whether cuDNN calls it nondeterministic. On failure, a message in e.
 * owned (may be NULL: freed here): on success, the graph's descriptors (the operation graph,
 * the engine configurations) pass to the caller, to be destroyed after the plan, in reverse
 * order; cudnn-frontend keeps a plan's configuration alive as long as the plan. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static jdt_status dnn_plan(const dnn_api *a, cudnnHandle_t handle, cudnnBackendDescriptor_t devprop,
                           const dnn_key *s, int64_t max_ws, cudnnBackendDescriptor_t *plan,
                           int64_t *ws, dnn_owned *owned, char *info, size_t n_info, jdt_err *e)
{
    dnn_g g = {.a = a, .next_uid = U_VIRTUAL};
    *plan = NULL;
    *ws = 0;
    if (n_info) info[0] = 0;
    if (s->bwd)
        build_bwd(&g, s);
    else
        build_fwd(&g, s);
    cudnnBackendDescriptor_t og = g_new(&g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    g_set(&g, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g.n_ops, g.ops);
    if (handle) g_set(&g, og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    g_finalize(&g, og, "the operation graph");
    int64_t n_cfg = 0;
    cudnnBackendDescriptor_t cfg[16];
    cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    char tried[200] = "";
    for (int m = 0; m < 2 && !g.failed && !*plan; m++) {
        cudnnBackendDescriptor_t heur = g_new(&g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
        g_ref(&g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, og);
        g_set(&g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m]);
        if (devprop) g_ref(&g, heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, devprop);
        g_finalize(&g, heur, "the engine heuristics");
        if (g.failed) break;
        n_cfg = 0;
        cudnnStatus_t st = a->bget(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                   CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n_cfg, NULL);
        if (st != CUDNN_STATUS_SUCCESS) {
            g_fail(&g, st, "counting the heuristics' results");
            break;
        }
        if (n_cfg > 16) n_cfg = 16;
        for (int64_t i = 0; i < n_cfg; i++)
            cfg[i] = g_new(&g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        if (g.failed) break;
        int64_t got = 0;
        st = a->bget(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n_cfg,
                     &got, cfg);
        if (st != CUDNN_STATUS_SUCCESS) {
            g_fail(&g, st, "reading the heuristics' results");
            break;
        }
        for (int64_t i = 0; i < got && !*plan; i++) {
            cudnnBackendDescriptor_t p = NULL;
            if (a->bcreate(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p) != CUDNN_STATUS_SUCCESS)
                continue;
            cudnnStatus_t ps = a->bset(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg[i]);
            if (ps == CUDNN_STATUS_SUCCESS && handle)
                ps = a->bset(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
            if (ps == CUDNN_STATUS_SUCCESS && devprop)
                ps = a->bset(p, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                             1, &devprop);
            if (ps == CUDNN_STATUS_SUCCESS) ps = a->bfinalize(p);
            /* offline (the driver's stub library): the engine took the graph and NVRTC compiled
             * its kernel; only loading the module needs a GPU */
            const bool compiled = devprop && ps == CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER;
            int64_t w = 0, cnt = 0;
            if (ps == CUDNN_STATUS_SUCCESS)
                ps = a->bget(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &cnt,
                             &w);
            /* which engine: its global index and numerical notes */
            cudnnBackendDescriptor_t eng = NULL;
            int64_t idx = -1, n_notes = 0;
            cudnnBackendNumericalNote_t notes[16];
            if (a->bcreate(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &eng) == CUDNN_STATUS_SUCCESS) {
                if (a->bget(cfg[i], CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                            &cnt, &eng) == CUDNN_STATUS_SUCCESS) {
                    a->bget(eng, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &cnt, &idx);
                    if (a->bget(eng, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                                16, &n_notes, notes) != CUDNN_STATUS_SUCCESS)
                        n_notes = 0;
                }
                a->bdestroy(eng);
            }
            size_t len = strlen(tried);
            snprintf(tried + len, sizeof tried - len, "%s%lld%s", len ? ", " : "", (long long)idx,
                     compiled                     ? ""
                     : ps != CUDNN_STATUS_SUCCESS ? " (no plan)"
                     : w > max_ws                 ? " (workspace)"
                                                  : "");
            if (!compiled && (ps != CUDNN_STATUS_SUCCESS || w > max_ws)) {
                a->bdestroy(p);
                continue;
            }
            bool nondet = false;
            for (int64_t j = 0; j < n_notes && j < 16; j++)
                nondet |= notes[j] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC;
            *plan = p;
            *ws = w;
            if (n_info && compiled)
                snprintf(info, n_info,
                         "engine %lld for %d operations, kernel compiled (loading it needs a "
                         "GPU), %s",
                         (long long)idx, g.n_ops, nondet ? "nondeterministic" : "deterministic");
            else if (n_info)
                snprintf(info, n_info, "engine %lld for %d operations, workspace %lld bytes, %s",
                         (long long)idx, g.n_ops, (long long)w,
                         nondet ? "nondeterministic" : "deterministic");
        }
    }
    jdt_status rc = JDT_OK;
    if (g.failed)
        rc = jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s", g.msg);
    else if (!*plan)
        rc = jdt_err_set(e, JDT_ERR_UNSUPPORTED,
                         "no cuDNN engine takes the graph (%s: %s; workspace at most %lld bytes)",
                         tried[0] ? "engines tried" : "heuristics", tried[0] ? tried : "none",
                         (long long)max_ws);
    if (rc == JDT_OK && owned && g.n_d > 0) {
        if ((owned->d = jdt_malloc((size_t)g.n_d * sizeof *owned->d))) {
            memcpy(owned->d, g.d, (size_t)g.n_d * sizeof *owned->d);
            owned->n = g.n_d;
            g.n_d = 0;
        } else {
            a->bdestroy(*plan);
            *plan = NULL;
            rc = jdt_err_set(e, JDT_ERR_NOMEM, "cuDNN graph: no memory to keep its descriptors");
        }
    }
    g_free(&g);
    return rc;
}
#pragma GCC diagnostic pop

/* ---- the context's state: the library, a handle, plans by shape -------------------------- */

#define DNN_PLANS 8

typedef struct {
    dnn_key key;
    cudnnBackendDescriptor_t plan; /* NULL: declined */
    dnn_owned owned;               /* the plan's graph and engine configurations */
    int64_t ws;
} dnn_entry;

struct jdt_cuk_dnn {
    dnn_api api;
    cudnnHandle_t handle;
    /* device memory of our own for plans that want more workspace than the cuBLASLt
     * workspace's 32 MiB, and the accumulator form's f32 dQ; grown as plans need (cudaMalloc
     * outside the planned arena, like cuBLASLt's workspace), said at info level */
    void *ws, *acc;
    int64_t ws_bytes, acc_bytes;
    bool unavailable; /* the library or the handle failed: never asked again */
    dnn_entry e[DNN_PLANS];
    int n, next;
};

/* Destroys en's plan, then the descriptors it was built from; en is then declined. */
static void entry_clear(const dnn_api *a, dnn_entry *en)
{
    if (en->plan) a->bdestroy(en->plan);
    en->plan = NULL;
    for (int i = en->owned.n - 1; i >= 0; i--)
        a->bdestroy(en->owned.d[i]);
    jdt_free(en->owned.d);
    en->owned.d = NULL;
    en->owned.n = 0;
}

/* The key of a call: the layout bits its direction reads (the forward's 0-2, the backward's
 * 0-4), the group (JDT_CUK_ATT_GROUP) apart; a backward always reads the statistics. */
static dnn_key key_of(bool bwd, bool stats, bool accum, int64_t B, int64_t H, int64_t T, int64_t D,
                      unsigned bthd)
{
    return (dnn_key){.bwd = bwd,
                     .stats = bwd || stats,
                     .accum = bwd && accum,
                     .B = B,
                     .H = H,
                     .T = T,
                     .D = D,
                     .G = JDT_CUK_ATT_GROUP(bthd),
                     .bthd = bthd & (bwd ? 31u : 7u)};
}

static bool key_eq(const dnn_key *a, const dnn_key *b)
{
    return a->bwd == b->bwd && a->stats == b->stats && a->accum == b->accum && a->B == b->B &&
           a->H == b->H && a->T == b->T && a->D == b->D && a->G == b->G && a->bthd == b->bthd;
}

/* *buf holds at least n bytes (grown with cudaMalloc); false, with a message, when the GPU
 * has no room. */
static bool dnn_grow(void **buf, int64_t *have, int64_t n, const char *what, jdt_err *e)
{
    if (*have >= n) return true;
    if (*buf) cudaFree(*buf);
    *buf = NULL;
    *have = 0;
    cudaError_t rc = cudaMalloc(buf, (size_t)n);
    if (rc != cudaSuccess) {
        *buf = NULL; /* cudaMalloc's pointer after a failure is not ours to free */
        cudaGetLastError();
        jdt_err_set(e, JDT_ERR_NOMEM, "no room for cuDNN's %s of %.1f MiB: %s", what,
                    (double)n / (1 << 20), cudaGetErrorString(rc));
        return false;
    }
    *have = n;
    JDT_INFO("cuDNN attention: %.1f MiB of device memory for its %s", (double)n / (1 << 20), what);
    return true;
}

/* The most workspace a plan may have: device memory outside the planned arena, at most half of
 * what the GPU has free (never under the cuBLASLt workspace, nor over DNN_MAX_WORKSPACE). */
static int64_t max_workspace(void)
{
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        cudaGetLastError();
        return DNN_MAX_WORKSPACE;
    }
    const int64_t half = (int64_t)(free_b / 2);
    return half < JDT_CUK_WORKSPACE_BYTES ? JDT_CUK_WORKSPACE_BYTES
           : half > DNN_MAX_WORKSPACE     ? DNN_MAX_WORKSPACE
                                          : half;
}

/* Loads cuDNN and makes the context's handle at the first call (one info line either way);
 * whether cuDNN is usable. */
static bool dnn_open(jdt_cuk *k)
{
    jdt_err e;
    jdt_err_clear(&e);
    if (!k->dnn) {
        if (!(k->dnn = jdt_calloc(1, sizeof *k->dnn))) return false;
        struct jdt_cuk_dnn *d = k->dnn;
        cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
        /* the handle belongs to the current device: the context's (a caller on another
         * thread may not have selected it) */
        cudaError_t crc = cudaSetDevice(k->device);
        if (crc != cudaSuccess) {
            jdt_cuk_cuda_err(&e, crc, "cudaSetDevice for cuDNN");
            d->unavailable = true;
        } else if (dnn_load(&d->api, &e) != JDT_OK)
            d->unavailable = true;
        else if ((st = d->api.create(&d->handle)) != CUDNN_STATUS_SUCCESS ||
                 (st = d->api.set_stream(d->handle, k->stream)) != CUDNN_STATUS_SUCCESS) {
            jdt_err_set(&e, JDT_ERR_UNSUPPORTED, "cudnnCreate: %s", d->api.error_string(st));
            d->unavailable = true;
        }
        if (d->unavailable) {
            snprintf(k->dnn_why, sizeof k->dnn_why, "%.399s", e.msg);
            JDT_INFO("cuDNN attention unavailable, using jdt-train's kernels: %s", e.msg);
        } else
            JDT_INFO("cuDNN attention: cuDNN %zu", d->api.get_version());
    }
    return !k->dnn->unavailable;
}

/* The plan of s, built at its first use; NULL when cuDNN declines (logged once). */
static dnn_entry *dnn_get(jdt_cuk *k, const dnn_key *s)
{
    jdt_err e;
    jdt_err_clear(&e);
    if (!dnn_open(k)) return NULL;
    struct jdt_cuk_dnn *d = k->dnn;
    for (int i = 0; i < d->n; i++)
        if (key_eq(&d->e[i].key, s)) {
            if (d->e[i].plan) return &d->e[i];
            snprintf(k->dnn_why, sizeof k->dnn_why, "declined before");
            return NULL;
        }
    dnn_entry *en;
    if (d->n < DNN_PLANS)
        en = &d->e[d->n++];
    else {
        en = &d->e[d->next];
        d->next = (d->next + 1) % DNN_PLANS;
        /* its kernels may still be queued: the stream finishes them first (rare: a 9th shape) */
        if (en->plan) cudaStreamSynchronize(k->stream);
        entry_clear(&d->api, en);
    }
    memset(en, 0, sizeof *en);
    en->key = *s;
    char info[160];
    double t0 = jdt_now_s();
    const char *why = jdt_cuk_dnn_refusal(d->api.get_version(), s->bwd, s->T);
    jdt_status rc = why ? jdt_err_set(&e, JDT_ERR_UNSUPPORTED, "%s", why)
                        : dnn_plan(&d->api, d->handle, NULL, s, max_workspace(), &en->plan, &en->ws,
                                   &en->owned, info, sizeof info, &e);
    /* memory beyond the cuBLASLt workspace: the plan's workspace, the accumulator */
    if (rc == JDT_OK && en->ws > JDT_CUK_WORKSPACE_BYTES &&
        !dnn_grow(&d->ws, &d->ws_bytes, en->ws, "workspace", &e))
        rc = e.code;
    if (rc == JDT_OK && s->accum &&
        !dnn_grow(&d->acc, &d->acc_bytes, s->B * s->H * s->T * s->D * 4, "f32 dQ accumulator", &e))
        rc = e.code;
    if (rc != JDT_OK) {
        entry_clear(&d->api, en);
        JDT_INFO("cuDNN attention %s B=%lld H=%lld T=%lld D=%lld declined, using jdt-train's "
                 "kernels: %s",
                 s->bwd ? "backward" : "forward", (long long)s->B, (long long)s->H, (long long)s->T,
                 (long long)s->D, e.msg);
        snprintf(k->dnn_why, sizeof k->dnn_why, "%.399s", e.msg);
        return NULL;
    }
    JDT_INFO("cuDNN attention %s B=%lld H=%lld T=%lld D=%lld: %s (plan built in %.2f s)",
             s->bwd ? "backward" : "forward", (long long)s->B, (long long)s->H, (long long)s->T,
             (long long)s->D, info, jdt_now_s() - t0);
    return en;
}

/* Queues the plan on the stream with the pack's tensors. false when cuDNN refuses at once
 * (the variant pack, or an engine whose kernel does not load on this driver): the plan is
 * dropped, the shape declined from then on with one warning, and the caller runs jdt-train's
 * kernels, which write every output cuDNN would have. An error the kernels raise later is the
 * stream's, found by jdt_cuk_check like any kernel's. */
static bool dnn_run(jdt_cuk *k, dnn_entry *en, const int64_t *uids, void **ptrs, int n)
{
    const dnn_api *a = &k->dnn->api;
    cudnnBackendDescriptor_t vp = NULL;
    void *ws = en->ws > JDT_CUK_WORKSPACE_BYTES ? k->dnn->ws : k->workspace;
    cudnnStatus_t st = a->bcreate(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    if (st == CUDNN_STATUS_SUCCESS)
        st = a->bset(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = a->bset(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = a->bset(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    if (st == CUDNN_STATUS_SUCCESS) st = a->bfinalize(vp);
    if (st == CUDNN_STATUS_SUCCESS) st = a->bexecute(k->dnn->handle, en->plan, vp);
    if (vp) a->bdestroy(vp);
    if (st != CUDNN_STATUS_SUCCESS) {
        char last[256] = "";
        a->last_error(last, sizeof last);
        snprintf(k->dnn_why, sizeof k->dnn_why, "cuDNN attention %s failed to run: %s%s%.200s",
                 en->key.bwd ? "backward" : "forward", a->error_string(st), last[0] ? " - " : "",
                 last);
        JDT_WARN("%s; B=%lld H=%lld T=%lld D=%lld runs jdt-train's kernels from now on", k->dnn_why,
                 (long long)en->key.B, (long long)en->key.H, (long long)en->key.T,
                 (long long)en->key.D);
        cudaGetLastError(); /* a launch error cuDNN left behind is not the next kernel's */
        entry_clear(a, en);
        return false;
    }
    k->n_dnn++;
    return true;
}

/* The masked scores' value: -inf, or the lowest float before cuDNN 9.1 (cudnn-frontend's
 * choice there: its softmax preferred a finite mask). */
static float mask_fill(const jdt_cuk *k)
{
    return k->dnn->api.get_version() < 90100 ? -FLT_MAX : -__builtin_inff();
}

bool jdt_cuk_dnn_attention(jdt_cuk *k, const void *q, const void *kk, const void *v, void *o2,
                           float *lse, int64_t B, int64_t H, int64_t T, int64_t D, float scale,
                           unsigned bthd)
{
    dnn_key s = key_of(false, lse != NULL, false, B, H, T, D, bthd);
    dnn_entry *en = dnn_get(k, &s);
    if (!en) return false;
    float neg_inf = mask_fill(k);
    int64_t uids[] = {U_Q, U_K, U_V, U_O, U_SCALE, U_NEG_INF, U_STATS};
    void *ptrs[] = {(void *)q, (void *)kk, (void *)v, o2, &scale, &neg_inf, lse};
    return dnn_run(k, en, uids, ptrs, lse ? 7 : 6);
}

bool jdt_cuk_dnn_attention_bwd(jdt_cuk *k, const void *q, const void *kk, const void *v,
                               const void *o, const void *dout, const float *lse,
                               const jdt_cuk_att_grads *g, int64_t B, int64_t H, int64_t T,
                               int64_t D, float scale, unsigned bthd, void *scratch)
{
    dnn_key s = key_of(true, true, k->dnn_on == 2, B, H, T, D, bthd);
    dnn_entry *en = dnn_get(k, &s);
    if (!en) return false;
    float neg_inf = mask_fill(k), one = 1.0f;
    int64_t uids[] = {U_Q,  U_K,  U_V,       U_O,     U_DO,      U_STATS, U_DQ,
                      U_DK, U_DV, U_SOFTSUM, U_SCALE, U_NEG_INF, U_ONE,   U_DQ_ACC};
    void *ptrs[] = {(void *)q,   (void *)kk, (void *)v,  (void *)o,  (void *)dout,
                    (void *)lse, g->copy[0], g->copy[1], g->copy[2], scratch,
                    &scale,      &neg_inf,   &one,       k->dnn->acc};
    if (s.accum) { /* the accumulator starts at zero */
        cudaError_t rc = cudaMemsetAsync(k->dnn->acc, 0, (size_t)(B * H * T * D * 4), k->stream);
        if (rc != cudaSuccess)
            jdt_cuk_defer(k, JDT_ERR_INTERNAL, "cuDNN attention backward: zeroing dQ: %s",
                          cudaGetErrorString(rc));
    }
    if (!dnn_run(k, en, uids, ptrs, s.accum ? 14 : 13)) return false;
    for (int i = 0; i < 3; i++) /* RoPE's backward on a copy (Llama's dq, dk): in place */
        if (g->rope_theta[i] != 0.0)
            jdt_cuk_rope(k, g->copy[i], g->copy[i], true, true, false, B, T, i ? H / s.G : H, D,
                         g->rope_theta[i], NULL, g->rope_inverse[i]);
    if (g->part) { /* the bias gradients' partial column sums of the bf16 copies, rotated where
                      they are (Qwen2's q, k), as jdt-train's kernels form them: (P, H D) for
                      dq, then (P, Hk D) each for dk and dv */
        const int64_t P = B * (T / JDT_CUK_ATT_PART);
        float *part = g->part;
        for (int i = 0; i < 3; i++) {
            const int64_t N = (i ? H / s.G : H) * D;
            jdt_cuk_colsum_part_bf16(k, g->copy[i], part, B * T, N, JDT_CUK_ATT_PART);
            part += P * N;
        }
    }
    return true;
}

void jdt_cuk_dnn_free(jdt_cuk *k)
{
    struct jdt_cuk_dnn *d = k->dnn;
    if (!d) return;
    for (int i = 0; i < d->n; i++)
        entry_clear(&d->api, &d->e[i]);
    if (d->handle) d->api.destroy(d->handle);
    if (d->ws) cudaFree(d->ws);
    if (d->acc) cudaFree(d->acc);
    /* the library stays open: cuDNN's own threads and atexit handlers may refer to it */
    jdt_free(d);
    k->dnn = NULL;
}

void jdt_cuk_dnn_trim(jdt_cuk *k)
{
    if (k->dnn && !k->dnn->unavailable) jdt_cuk_dnn_free(k);
}

/* ---- JDT_CUDNN_ATTENTION=auto: cuDNN or ours, tried once per call shape ------------------- */

#define TRIAL_REPS 3       /* timed runs of each, alternating, after one untimed */
#define TRIAL_REL 2e-2     /* an output's largest difference, of its largest magnitude */
#define TRIAL_LSE_ABS 1e-4 /* the log-sum-exp's: 1e-4 + 0.2% of each value */
#define TRIAL_LSE_REL 2e-3
#define TRIAL_FASTER 0.97     /* cuDNN kept at most this share of ours' time (beyond noise) */
#define TRIAL_CHUNK (1 << 20) /* values compared per copy to the host */

/* One call of either direction, as the trial replays it (bf16 q, k, v, o, dO: the only calls
 * cuDNN is asked to serve). */
typedef struct {
    bool bwd;
    const void *q, *kk, *v, *o, *dout;
    const float *lse_in; /* the backward's: the forward's log-sum-exp */
    void *o2;            /* the forward's outputs */
    float *lse;
    jdt_cuk_att_grads g; /* the backward's */
    int64_t B, H, T, D;
    float scale;
    unsigned bthd;
    void *scratch;
} att_call;

/* The memory a call writes: at most 4 buffers (the forward's o and log-sum-exp; the backward's
 * three copies and its partial sums), their bases in base and sizes in bytes; returns their
 * count. The trial gives cuDNN buffers of these sizes. */
static int call_bufs(const att_call *c, void *base[4], size_t bytes[4])
{
    const int64_t n = c->B * c->H * c->T * c->D, G = JDT_CUK_ATT_GROUP(c->bthd);
    int m = 0;
    if (!c->bwd) {
        base[m] = c->o2, bytes[m++] = (size_t)n * 2;
        if (c->lse) base[m] = c->lse, bytes[m++] = (size_t)(c->B * c->H * c->T) * 4;
        return m;
    }
    for (int j = 0; j < 3; j++)
        base[m] = c->g.copy[j], bytes[m++] = (size_t)(j ? n / G : n) * 2;
    if (c->g.part) /* (P, H D) for dq, then (P, H / G D) each for dk and dv */
        base[m] = c->g.part,
        bytes[m++] = (size_t)(c->B * (c->T / JDT_CUK_ATT_PART) * (c->H + 2 * c->H / G) * c->D) * 4;
    return m;
}

/* An output compared by the trial: n values at byte `at` of buffer `buf` (call_bufs), bf16 or
 * f32, the log-sum-exp or not, and its name. */
typedef struct {
    int buf;
    size_t at;
    int64_t n;
    bool bf16, lse;
    const char *name;
} att_out;

/* The outputs of c, each compared on its own (the partial sums of dq, dk and dv apart: each by
 * its own largest value); returns their count (at most 6). */
static int call_outs(const att_call *c, att_out out[6])
{
    const int64_t n = c->B * c->H * c->T * c->D, G = JDT_CUK_ATT_GROUP(c->bthd);
    int m = 0;
    if (!c->bwd) {
        out[m++] = (att_out){0, 0, n, true, false, "o"};
        if (c->lse) out[m++] = (att_out){1, 0, c->B * c->H * c->T, false, true, "log-sum-exp"};
        return m;
    }
    static const char *const names[3] = {"dq", "dk", "dv"}, *const parts[3] = {
                                                                "dq's bias partial sums",
                                                                "dk's bias partial sums",
                                                                "dv's bias partial sums"};
    for (int j = 0; j < 3; j++)
        out[m++] = (att_out){j, 0, j ? n / G : n, true, false, names[j]};
    const int64_t P = c->B * (c->T / JDT_CUK_ATT_PART);
    size_t at = 0;
    for (int j = 0; j < 3 && c->g.part; j++) {
        const int64_t np = P * (j ? c->H / G : c->H) * c->D;
        out[m++] = (att_out){3, at, np, false, false, parts[j]};
        at += (size_t)np * 4;
    }
    return m;
}

/* Queues c on cuDNN (dnn) or on jdt-train's kernels; false when cuDNN declines it. */
static bool call_run(jdt_cuk *k, const att_call *c, bool dnn)
{
    if (dnn)
        return c->bwd ? jdt_cuk_dnn_attention_bwd(k, c->q, c->kk, c->v, c->o, c->dout, c->lse_in,
                                                  &c->g, c->B, c->H, c->T, c->D, c->scale, c->bthd,
                                                  c->scratch)
                      : jdt_cuk_dnn_attention(k, c->q, c->kk, c->v, c->o2, c->lse, c->B, c->H, c->T,
                                              c->D, c->scale, c->bthd);
    if (c->bwd)
        jdt_cuk_att_bwd_ours(k, c->q, c->kk, c->v, true, c->o, true, c->dout, true, c->lse_in, NULL,
                             &c->g, c->B, c->H, c->T, c->D, c->scale, c->bthd, true, c->scratch);
    else
        jdt_cuk_att_fwd_ours(k, c->q, c->kk, c->v, true, NULL, c->o2, true, c->lse, c->B, c->H,
                             c->T, c->D, c->scale, c->bthd, true, c->scratch);
    return true;
}

/* How far b's values are from a's (both on the device, n values of a's type): returns the
 * largest difference (the log-sum-exp: over 1e-4 + 0.2% of each value, so 1 is its bound) and
 * *big a's largest magnitude; INFINITY for a NaN in either, -1 when a copy to the host fails. */
static double compare(jdt_cuk *k, const att_out *a, const void *pa, const void *b, float *ha,
                      float *hb, double *big)
{
    const size_t es = a->bf16 ? 2 : 4;
    double diff = 0.0;
    *big = 0.0;
    for (int64_t at = 0; at < a->n; at += TRIAL_CHUNK) {
        const int64_t m = a->n - at < TRIAL_CHUNK ? a->n - at : TRIAL_CHUNK;
        if (cudaMemcpyAsync(ha, (const char *)pa + at * es, (size_t)m * es, cudaMemcpyDeviceToHost,
                            k->stream) != cudaSuccess ||
            cudaMemcpyAsync(hb, (const char *)b + at * es, (size_t)m * es, cudaMemcpyDeviceToHost,
                            k->stream) != cudaSuccess ||
            cudaStreamSynchronize(k->stream) != cudaSuccess)
            return -1.0;
        for (int64_t i = 0; i < m; i++) {
            float x, y;
            if (a->bf16) {
                uint32_t ux = (uint32_t)((const uint16_t *)ha)[i] << 16,
                         uy = (uint32_t)((const uint16_t *)hb)[i] << 16;
                memcpy(&x, &ux, 4);
                memcpy(&y, &uy, 4);
            } else
                x = ha[i], y = hb[i];
            if (isnan(x) || isnan(y)) return INFINITY;
            double d = fabs((double)y - (double)x);
            if (a->lse) d /= TRIAL_LSE_ABS + TRIAL_LSE_REL * fabs((double)x);
            if (fabs((double)x) > *big) *big = fabs((double)x);
            if (d > diff) diff = d;
        }
    }
    return diff;
}

/* Times the trial's runs: ms[0] ours (writing c's outputs), ms[1] cuDNN (alt's), the best of
 * TRIAL_REPS each, alternating. false when events fail or cuDNN stops serving. */
static bool trial_time(jdt_cuk *k, const att_call *c, const att_call *alt, float ms[2])
{
    cudaEvent_t ev[2 * TRIAL_REPS + 1] = {0};
    bool ok = true;
    for (int i = 0; i < 2 * TRIAL_REPS + 1 && ok; i++)
        ok = cudaEventCreate(&ev[i]) == cudaSuccess;
    ok = ok && cudaEventRecord(ev[0], k->stream) == cudaSuccess;
    for (int r = 0; r < TRIAL_REPS && ok; r++) {
        call_run(k, c, false);
        ok = cudaEventRecord(ev[2 * r + 1], k->stream) == cudaSuccess && call_run(k, alt, true) &&
             cudaEventRecord(ev[2 * r + 2], k->stream) == cudaSuccess;
    }
    ok = ok && cudaStreamSynchronize(k->stream) == cudaSuccess;
    ms[0] = ms[1] = INFINITY;
    for (int r = 0; r < TRIAL_REPS && ok; r++) {
        float a, b;
        ok = cudaEventElapsedTime(&a, ev[2 * r], ev[2 * r + 1]) == cudaSuccess &&
             cudaEventElapsedTime(&b, ev[2 * r + 1], ev[2 * r + 2]) == cudaSuccess;
        if (ok && a < ms[0]) ms[0] = a;
        if (ok && b < ms[1]) ms[1] = b;
    }
    for (int i = 0; i < 2 * TRIAL_REPS + 1; i++)
        if (ev[i]) cudaEventDestroy(ev[i]);
    return ok;
}

/* After a failed runtime call of the trial: a fault on the device (the stream's error) becomes
 * the step's error, naming the trial; anything else is cleared (not the next call's error) and
 * the trial ends for ours. */
static void trial_failed(jdt_cuk *k, const char *dir, const char *shape, const char *what)
{
    cudaError_t rc = cudaStreamSynchronize(k->stream);
    if (rc != cudaSuccess)
        jdt_cuk_defer(k, JDT_ERR_INTERNAL,
                      "attention %s %s: the device failed while trying cuDNN's attention against "
                      "jdt-train's kernels (JDT_CUDNN_ATTENTION=0 skips cuDNN): %s",
                      dir, shape, cudaGetErrorString(rc));
    else {
        (void)cudaGetLastError();
        JDT_INFO("cuda: attention %s %s: %s; jdt-train's kernels", dir, shape, what);
    }
}

/* The trial of c (jdt_cuk_dnn_attention_auto's contract); pick: the shape's slot in k. True
 * when the verdict is settled, so worth remembering: both ran and their outputs agreed (then
 * the times decided). False when it fell back to ours for want of memory, a timing or cuDNN, or
 * because the outputs disagreed: a disagreement, or a NaN of a diverging first step, is tried
 * again by the next run, not remembered against cuDNN for good. */
static bool trial(jdt_cuk *k, const att_call *c, int *pick)
{
    const char *dir = c->bwd ? "backward" : "forward";
    char shape[96];
    snprintf(shape, sizeof shape, "B=%lld H=%lld T=%lld D=%lld", (long long)c->B, (long long)c->H,
             (long long)c->T, (long long)c->D);
    k->n_att_trials++;
    void *base[4], *alt_base[4];
    size_t bytes[4], off[4], total = 0;
    const int nb = call_bufs(c, base, bytes);
    for (int i = 0; i < nb; i++) {
        off[i] = total;
        total += (bytes[i] + 255) & ~(size_t)255;
    }
    att_out out[6];
    const int m = call_outs(c, out);
    bool async = false;
    cudaError_t rc;
    char *tmp = jdt_cuk_tmp_alloc(k, total, &async, &rc);
    call_run(k, c, false); /* ours: the call's outputs, whatever the verdict */
    if (!tmp) {
        JDT_INFO("cuda: attention %s %s: no device memory to try cuDNN's (%.1f MiB: %s); "
                 "jdt-train's kernels",
                 dir, shape, (double)total / 1048576.0, cudaGetErrorString(rc));
        return false;
    }
    att_call alt = *c; /* cuDNN's outputs: the trial's memory */
    for (int i = 0; i < nb; i++)
        alt_base[i] = tmp + off[i];
    if (c->bwd) {
        for (int j = 0; j < 3; j++)
            alt.g.copy[j] = alt_base[j];
        if (c->g.part) alt.g.part = alt_base[3];
    } else {
        alt.o2 = alt_base[0];
        if (c->lse) alt.lse = alt_base[1];
    }
    float ms[2] = {INFINITY, INFINITY};
    float *ha = NULL, *hb = NULL;
    int worst = -1;       /* the output furthest from ours, by its bound */
    double worst_r = 0.0; /* its distance over its bound (1: at the bound) */
    /* untimed: cuDNN builds its plan here (a decline is said by dnn_get or dnn_run) */
    bool served = call_run(k, &alt, true);
    if (served && !trial_time(k, c, &alt, ms)) {
        trial_failed(k, dir, shape, "cuDNN's could not be timed");
        served = false;
    }
    if (served && (!(ha = jdt_malloc((size_t)TRIAL_CHUNK * 4)) ||
                   !(hb = jdt_malloc((size_t)TRIAL_CHUNK * 4)))) {
        JDT_INFO("cuda: attention %s %s: no host memory to compare cuDNN's outputs; jdt-train's "
                 "kernels",
                 dir, shape);
        served = false;
    }
    double big[6]; /* each output's largest magnitude (ours) */
    for (int i = 0; i < m && served; i++) {
        const att_out *o = &out[i];
        const double d = compare(k, o, (char *)base[o->buf] + o->at,
                                 (char *)alt_base[o->buf] + o->at, ha, hb, &big[i]);
        /* its scale: its own largest value; a partial sum's (outputs 3-5, after the copies they
         * sum), sqrt(JDT_CUK_ATT_PART) times its copy's largest value, the size of a sum of
         * that many terms of mixed signs: dk's sums over a whole sequence cancel to rounding
         * noise (the softmax does not see a bias of the keys), so their own largest value is
         * no scale */
        const double scale = o->lse        ? 1.0
                             : o->buf == 3 ? sqrt((double)JDT_CUK_ATT_PART) * big[i - 3]
                                           : big[i];
        const double r = o->lse        ? d
                         : scale > 0.0 ? d / scale / TRIAL_REL
                         : d > 0.0     ? INFINITY
                                       : 0.0;
        if (d < 0.0) {
            trial_failed(k, dir, shape, "cuDNN's outputs could not be read back");
            served = false;
        } else if (worst < 0 || r > worst_r)
            worst = i, worst_r = r;
    }
    jdt_free(ha);
    jdt_free(hb);
    const bool agree = served && worst >= 0 && worst_r <= 1.0;
    const bool faster =
        k->att_trial_force ? k->att_trial_force == 2 : ms[1] <= TRIAL_FASTER * ms[0];
    char how[160] = "";
    if (served && worst >= 0) {
        const double pct = 100.0 * TRIAL_REL * worst_r; /* of the output's scale */
        if (out[worst].lse)
            snprintf(how, sizeof how, "the log-sum-exp at %.3g of its bound, 1e-4 + 0.2%%",
                     worst_r);
        else if (out[worst].buf == 3)
            snprintf(how, sizeof how,
                     "%s by %.3g%% of sqrt(%d) times their copy's largest value, 2%% allowed",
                     out[worst].name, pct, JDT_CUK_ATT_PART);
        else
            snprintf(how, sizeof how, "%s by %.3g%% of its largest value, 2%% allowed",
                     out[worst].name, pct);
    }
    if (served && !agree) {
        k->n_att_disagree++;
        JDT_WARN("cuda: attention %s %s: cuDNN's outputs differ from jdt-train's kernels (%s): "
                 "jdt-train's kernels kept (cuDNN %.3f ms, ours %.3f ms)",
                 dir, shape, how, (double)ms[1], (double)ms[0]);
    } else if (served) {
        *pick = faster;
        JDT_INFO("cuda: attention %s %s: cuDNN %.3f ms, jdt-train's kernels %.3f ms, outputs "
                 "agree (largest difference: %s): %s kept%s (JDT_CUDNN_ATTENTION=0 or 1 fixes the "
                 "choice)",
                 dir, shape, (double)ms[1], (double)ms[0], how,
                 faster ? "cuDNN's" : "jdt-train's kernels",
                 k->att_trial_force ? ", the verdict forced by a test" : "");
    }
    if (*pick) { /* this call's outputs become cuDNN's, as the shape's later calls will be */
        for (int i = 0; i < nb; i++) {
            rc = cudaMemcpyAsync(base[i], alt_base[i], bytes[i], cudaMemcpyDeviceToDevice,
                                 k->stream);
            if (rc != cudaSuccess)
                jdt_cuk_defer(k, JDT_ERR_INTERNAL, "attention %s: copying cuDNN's outputs: %s", dir,
                              cudaGetErrorString(rc));
        }
    }
    jdt_cuk_tmp_free(k, tmp, async);
    return agree;
}

/* The verdicts remembered on disk: an entry of the kernel cache (kind "attpick") per call shape,
 * keyed by the binary (its build ID: the cuDNN graphs it builds and the kernels it runs), the
 * GPU (name, architecture, multiprocessors), the driver's, NVRTC's and cuDNN's versions and
 * NVRTC's target, holding "1" (cuDNN's) or "0" (ours). A later run on the same GPU and software
 * takes the verdict without trying again, so its attention is the first run's from its first
 * step: runs, and a run resumed from a checkpoint, use the same kernels. Verdicts forced by a
 * test, or left unsettled, are not remembered. */
static uint64_t verdict_key(const jdt_cuk *k, const int64_t key[8])
{
    uint64_t h =
        jdt_hash_u64(jdt_cuk_pick_key(k, "attpick-v1"), (uint64_t)k->dnn->api.get_version());
    for (int i = 0; i < 8; i++)
        h = jdt_hash_u64(h, (uint64_t)key[i]);
    return h;
}

/* The remembered verdict of key into *pick; false when there is none (or no cache). */
static bool verdict_get(const jdt_cuk *k, const int64_t key[8], int *pick)
{
    char v[8];
    if (k->att_trial_force || !jdt_cuk_pick_read(k, verdict_key(k, key), "attpick", v, sizeof v) ||
        (v[0] != '0' && v[0] != '1'))
        return false;
    *pick = v[0] == '1';
    return true;
}

/* Remembers a settled verdict (best effort: a cache that cannot be written is said once). */
static void verdict_put(jdt_cuk *k, const int64_t key[8], int pick)
{
    if (k->att_trial_force) return;
    jdt_cuk_pick_write(k, verdict_key(k, key), "attpick",
                       pick ? "1 cuDNN's\n" : "0 jdt-train's kernels\n", "the attention's verdict",
                       &k->att_put_said);
}

/* The verdict for c: true when its outputs were written here (cuDNN's kept, or the trial). */
static bool auto_run(jdt_cuk *k, const att_call *c)
{
    int64_t key[8] = {c->bwd, c->B, c->H, c->T, c->D, c->bthd, 0, 0};
    if (c->bwd)
        key[6] = (c->g.part != NULL) | (c->g.rope_theta[0] != 0.0) << 1 |
                 (c->g.rope_theta[1] != 0.0) << 2 | (c->g.rope_theta[2] != 0.0) << 3;
    else
        key[6] = c->lse != NULL;
    for (int i = 0; i < k->n_att_picks; i++)
        if (memcmp(k->att_picks[i].key, key, sizeof key) == 0)
            return k->att_picks[i].pick && call_run(k, c, true);
    if (k->n_att_picks == JDT_CUK_ATT_PICKS) { /* no room: ours, untried */
        if (!k->att_picks_full) {
            k->att_picks_full = true;
            JDT_INFO("cuda: attention: %d call shapes tried already; the next ones run "
                     "jdt-train's kernels untried",
                     JDT_CUK_ATT_PICKS);
        }
        return false;
    }
    if (!dnn_open(k)) return false; /* said once */
    int *pick = &k->att_picks[k->n_att_picks].pick;
    memcpy(k->att_picks[k->n_att_picks++].key, key, sizeof key);
    *pick = 0;
    bool done = true; /* the outputs written here */
    if (verdict_get(k, key, pick)) {
        k->n_att_remembered++;
        JDT_INFO("cuda: attention %s B=%lld H=%lld T=%lld D=%lld: %s kept, as tried before on "
                 "this GPU and cuDNN (the kernel cache's verdict; removing its *.attpick entries "
                 "tries again)",
                 c->bwd ? "backward" : "forward", (long long)c->B, (long long)c->H, (long long)c->T,
                 (long long)c->D, *pick ? "cuDNN's" : "jdt-train's kernels");
        done = *pick && call_run(k, c, true);
        if (!done) *pick = 0; /* cuDNN declined it now: ours from here on */
    } else if (trial(k, c, pick))
        verdict_put(k, key, *pick);
    if (*pick) k->n_att_dnn++;
    /* after a backward's verdict (a forward's comes first) with no shape keeping cuDNN so far:
     * its handle, plans and memory go (the stream is idle: the trial waited for it) */
    if (c->bwd && !k->n_att_dnn) jdt_cuk_dnn_trim(k);
    return done;
}

bool jdt_cuk_dnn_attention_auto(jdt_cuk *k, const void *q, const void *kk, const void *v, void *o2,
                                float *lse, int64_t B, int64_t H, int64_t T, int64_t D, float scale,
                                unsigned bthd, void *scratch)
{
    const att_call c = {.q = q,
                        .kk = kk,
                        .v = v,
                        .o2 = o2,
                        .lse = lse,
                        .B = B,
                        .H = H,
                        .T = T,
                        .D = D,
                        .scale = scale,
                        .bthd = bthd,
                        .scratch = scratch};
    return auto_run(k, &c);
}

bool jdt_cuk_dnn_attention_bwd_auto(jdt_cuk *k, const void *q, const void *kk, const void *v,
                                    const void *o, const void *dout, const float *lse,
                                    const jdt_cuk_att_grads *g, int64_t B, int64_t H, int64_t T,
                                    int64_t D, float scale, unsigned bthd, void *scratch)
{
    const att_call c = {.bwd = true,
                        .q = q,
                        .kk = kk,
                        .v = v,
                        .o = o,
                        .dout = dout,
                        .lse_in = lse,
                        .g = *g,
                        .B = B,
                        .H = H,
                        .T = T,
                        .D = D,
                        .scale = scale,
                        .bthd = bthd,
                        .scratch = scratch};
    return auto_run(k, &c);
}

/* An H200's properties as cuDNN's device-property descriptor reads them (its JSON form, the
 * fields of cudaDeviceProp that cuDNN 9.19 asks for), for building plans without a GPU. */
static const char H200_JSON[] =
    "{\"deviceName\":\"NVIDIA H200\",\"deviceVer\":900,\"driverVer\":13000,\"cudaDeviceId\":0,"
    "\"maxGridSize\":[2147483647,65535,65535],\"maxBlockSize\":[1024,1024,64],"
    "\"regsPerBlock\":65536,\"multiProcessorCount\":132,\"warpSize\":32,"
    "\"maxSharedMemoryPerBlock\":49152,\"maxSharedMemoryPerBlockOptin\":232448,"
    "\"reservedSharedMemoryPerBlock\":1024,\"maxRegistersPerSM\":65536,\"maxCtasPerSM\":32,"
    "\"maxThreadsPerBlock\":1024,\"maxThreadsPerSM\":2048,\"pciDeviceId\":9013,"
    "\"isTccDriver\":0,\"supportCoopLaunch\":1,\"smClockRateKHz\":1980000,"
    "\"memClockRateKHz\":3201000,\"l2CacheSize\":52428800,\"totalGlobalMem\":150754820096}";

jdt_status jdt_cuk_dnn_check_offline(bool bwd, bool stats, bool accum, int64_t B, int64_t H,
                                     int64_t T, int64_t D, unsigned bthd, char *info, size_t n,
                                     jdt_err *e)
{
    if (n) info[0] = 0;
    /* cuDNN's runtime-compiled engines load their kernels through the driver: without one,
     * the toolkit's stub libcuda (every call fails) lets them get as far as NVRTC's compile */
    if (!dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL)) {
        const char *home = getenv("CUDA_HOME");
        char stub[512];
        snprintf(stub, sizeof stub, "%s/lib/stubs/libcuda.so",
                 home && *home ? home : "/usr/local/cuda");
        if (!dlopen(stub, RTLD_NOW | RTLD_GLOBAL) &&
            !dlopen("/usr/local/cuda/lib64/stubs/libcuda.so", RTLD_NOW | RTLD_GLOBAL))
            return jdt_err_set(e, JDT_ERR_UNSUPPORTED,
                               "cuDNN's runtime-compiled engines need libcuda: neither the "
                               "driver's nor the toolkit's stub (%s) can be loaded",
                               stub);
    }
    dnn_api a;
    jdt_status rc = dnn_load(&a, e);
    if (rc != JDT_OK) return rc;
    if (a.get_version() < DNN_OFFLINE_MIN_VERSION)
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED,
                           "cuDNN %zu cannot build plans without a GPU (9.8 or newer can)",
                           a.get_version());
    cudnnBackendDescriptor_t dp = NULL;
    cudnnStatus_t st = a.bcreate(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, &dp);
    if (st == CUDNN_STATUS_SUCCESS)
        st = a.bset(dp, CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                    (int64_t)sizeof H200_JSON, H200_JSON);
    if (st == CUDNN_STATUS_SUCCESS) st = a.bfinalize(dp);
    if (st != CUDNN_STATUS_SUCCESS) {
        char last[256] = "";
        a.last_error(last, sizeof last);
        if (dp) a.bdestroy(dp);
        return jdt_err_set(e, JDT_ERR_INTERNAL, "cuDNN's device properties of an H200: %s - %s",
                           a.error_string(st), last);
    }
    dnn_key s = key_of(bwd, stats, accum, B, H, T, D, bthd);
    /* as dnn_get keeps it: the plan, then the descriptors it was built from */
    dnn_entry en = {.key = s};
    rc = dnn_plan(&a, NULL, dp, &s, DNN_MAX_WORKSPACE, &en.plan, &en.ws, &en.owned, info, n, e);
    entry_clear(&a, &en);
    a.bdestroy(dp);
    return rc;
}

#endif /* JDT_HAVE_CUDNN */
