/*
 * cudnnemu.c — a host stand-in for cuDNN 9's graph API (the calls engine/backend/cuda/
 * cuk_cudnn.c makes) for the host CUDA emulator (cudaemu.c), so that jdt-train's cuDNN attention
 * path runs end to end without a GPU: the graph it builds, the plan cache, the variant pack
 * (which pointer goes with which tensor), the workspace, the scratch and what runs after
 * cuDNN. The emulator's runtime points JDT_CUDNN_LIBRARY at this library, which cuk_cudnn.c
 * dlopens in place of libcudnn.so.9. A test fixture, not a product.
 *
 * It does not know attention. It records the descriptors as cuDNN's backend API describes
 * them, checks the operation graph when it is finalized (4-d tensors, each virtual tensor
 * written by exactly one operation, matmul, reduction and reshape shapes that agree, the
 * pointwise modes it knows), offers one engine, and at execution interprets the graph on the
 * host, operation by operation in dependency order, by the documented meaning of each
 * operation:
 *   matmul     C = A B over the last two axes, batched over the first two (an extent of 1
 *              broadcasts; one that divides C's, g times smaller, is grouped: C's index i reads
 *              i / g, as grouped-query attention's k and v with fewer heads than q), products
 *              summed in double, C rounded to its type; C += A B where
 *              C is in memory and the graph reads it again (an accumulator, such as the
 *              backward's f32 dQ: the fused engine adds into it with atomics, so the caller
 *              must have zeroed it)
 *   pointwise  y = mode(alpha1 x, alpha2 b[, t]) element by element, inputs broadcast where
 *              their extent is 1: ADD SUB MUL DIV EXP LOG IDENTITY CMP_GE, BINARY_SELECT
 *              (y = t ? x : b) and GEN_INDEX (y = the element's index along AXIS)
 *   reduction  y = MAX or ADD of x over the axes where y's extent is 1, and over each group
 *              of g consecutive indices where y's extent is x's divided by g (grouped-query
 *              attention's dk and dv: the sum over each key/value head's query heads)
 *   reshape    y = x's memory read with y's dimensions and strides (a transpose), in y's type
 * A tensor that is not virtual lives at its variant-pack pointer, read and written through its
 * strides in its type (float, bf16, int32, bool); a by-value tensor's float is copied from the
 * host when the plan is executed, as cuDNN does. Virtual tensors are host arrays in their own
 * strides, rounded to their type. Execute checks every pointer the graph needs: present, 16-byte
 * aligned (the tensors say so), and inside one device allocation (cudaemu.c
 * jdt_cudaemu_dev_range) for the tensor's whole extent; the workspace likewise. The work is
 * queued on the handle's stream (cudaemu.c jdt_cudaemu_defer), as a GPU would run it.
 *
 * Env: JDT_CUDNNEMU_VERSION (cudnnGetVersion, default 91900: 9.19), JDT_CUDNNEMU_WORKSPACE
 * (the plan's workspace in bytes, default 1 MiB; the interpreter fills it with 0xff bytes),
 * JDT_CUDNNEMU_PERTURB (a planted error for the tests: every value written to a tensor in
 * memory is multiplied by 1 + this, read when the plan is executed).
 * What it cannot check: the real engines' patterns (cuk_cudnn.c's offline check builds the
 * graphs against the real library), their rounding and speed.
 */
#define _GNU_SOURCE
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes"
#include <cudnn_graph.h>
#pragma GCC diagnostic pop

#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

/* ---- errors ------------------------------------------------------------------------------- */

static __thread char last_err[512];

static cudnnStatus_t fail(cudnnStatus_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static cudnnStatus_t fail(cudnnStatus_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_err, sizeof last_err, fmt, ap);
    va_end(ap);
    return st;
}

const char *cudnnGetErrorString(cudnnStatus_t st)
{
    switch (st) {
    case CUDNN_STATUS_SUCCESS:
        return "CUDNN_STATUS_SUCCESS";
    case CUDNN_STATUS_BAD_PARAM:
        return "CUDNN_STATUS_BAD_PARAM";
    case CUDNN_STATUS_BAD_PARAM_NULL_POINTER:
        return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
    case CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER:
        return "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER";
    case CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED:
        return "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED";
    case CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND:
        return "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND";
    case CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH:
        return "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH";
    case CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE:
        return "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE";
    case CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE:
        return "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE";
    case CUDNN_STATUS_NOT_SUPPORTED:
        return "CUDNN_STATUS_NOT_SUPPORTED";
    case CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN:
        return "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN";
    case CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE:
        return "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE";
    case CUDNN_STATUS_INTERNAL_ERROR:
        return "CUDNN_STATUS_INTERNAL_ERROR";
    case CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED:
        return "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED";
    default:
        return "CUDNN_STATUS (another)";
    }
}

void cudnnGetLastErrorString(char *message, size_t max_size)
{
    if (!max_size) return;
    snprintf(message, max_size, "%s", last_err);
    last_err[0] = 0;
}

size_t cudnnGetVersion(void)
{
    const char *v = getenv("JDT_CUDNNEMU_VERSION");
    return v && *v ? (size_t)strtoull(v, NULL, 10) : 91900;
}

/* ---- the handle ----------------------------------------------------------------------------- */

struct cudnnContext {
    cudaStream_t stream;
};

cudnnStatus_t cudnnCreate(cudnnHandle_t *handle)
{
    if (!handle) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnCreate: no handle");
    *handle = calloc(1, sizeof **handle);
    return *handle ? CUDNN_STATUS_SUCCESS
                   : fail(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, "cudnnCreate");
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle)
{
    free(handle);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream)
{
    if (!handle) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "cudnnSetStream: no handle");
    handle->stream = stream;
    return CUDNN_STATUS_SUCCESS;
}

/* ---- descriptors: attributes as set, finalized or not ------------------------------------- */

#define MAX_ATTRS 24
#define MAX_OPS 64
#define DESC_MAGIC 0x6a647464u /* "jdtd" */

typedef struct {
    cudnnBackendAttributeName_t name;
    cudnnBackendAttributeType_t type;
    int64_t n;
    void *v;
} attr;

typedef struct desc desc;
struct desc {
    unsigned magic; /* DESC_MAGIC while alive; 0 after destroy (kept until exit: a plan that
                       outlives its graph is caught, not a use after free) */
    cudnnBackendDescriptorType_t type;
    bool final;
    attr a[MAX_ATTRS];
    int n_a;
    desc *graph; /* engine configurations, plans: the operation graph they run */
    desc *next;  /* every descriptor, for the exit's free */
};

static desc *all_descs;

__attribute__((destructor)) static void free_all(void)
{
    for (desc *d = all_descs, *nx; d; d = nx) {
        nx = d->next;
        for (int i = 0; i < d->n_a; i++)
            free(d->a[i].v);
        free(d);
    }
    all_descs = NULL;
}

static size_t type_size(cudnnBackendAttributeType_t t)
{
    switch (t) {
    case CUDNN_TYPE_HANDLE:
    case CUDNN_TYPE_VOID_PTR:
    case CUDNN_TYPE_BACKEND_DESCRIPTOR:
        return sizeof(void *);
    case CUDNN_TYPE_BOOLEAN:
        return sizeof(bool);
    case CUDNN_TYPE_INT64:
    case CUDNN_TYPE_DOUBLE:
        return 8;
    case CUDNN_TYPE_CHAR:
        return 1;
    default:
        return 4; /* FLOAT, INT32 and the enumerations */
    }
}

static bool alive(const desc *d)
{
    return d && d->magic == DESC_MAGIC;
}

static attr *find(const desc *d, cudnnBackendAttributeName_t name)
{
    for (int i = 0; i < d->n_a; i++)
        if (d->a[i].name == name) return (attr *)&d->a[i];
    return NULL;
}

/* The descriptor attribute name of d, or NULL when unset. */
static desc *ref(const desc *d, cudnnBackendAttributeName_t name)
{
    const attr *a = find(d, name);
    return a && a->type == CUDNN_TYPE_BACKEND_DESCRIPTOR && a->n >= 1 ? *(desc **)a->v : NULL;
}

static bool get_i64(const desc *d, cudnnBackendAttributeName_t name, int64_t *out, int64_t n)
{
    const attr *a = find(d, name);
    if (!a || a->type != CUDNN_TYPE_INT64 || a->n != n) return false;
    memcpy(out, a->v, (size_t)n * 8);
    return true;
}

static bool get_enum(const desc *d, cudnnBackendAttributeName_t name, int *out)
{
    const attr *a = find(d, name);
    if (!a || a->n != 1 || type_size(a->type) != 4) return false;
    memcpy(out, a->v, 4);
    return true;
}

static bool get_bool(const desc *d, cudnnBackendAttributeName_t name)
{
    const attr *a = find(d, name);
    return a && a->type == CUDNN_TYPE_BOOLEAN && a->n == 1 && *(bool *)a->v;
}

static float get_float(const desc *d, cudnnBackendAttributeName_t name, float dflt)
{
    const attr *a = find(d, name);
    return a && a->type == CUDNN_TYPE_FLOAT && a->n == 1 ? *(float *)a->v : dflt;
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type,
                                           cudnnBackendDescriptor_t *out)
{
    if (!out) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "create: no descriptor pointer");
    desc *d = calloc(1, sizeof *d);
    if (!d) return fail(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, "create");
    d->magic = DESC_MAGIC;
    d->type = type;
    d->next = all_descs;
    all_descs = d;
    *out = d;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t p)
{
    desc *d = p;
    if (!alive(d)) return fail(CUDNN_STATUS_BAD_PARAM, "destroy: not a live descriptor");
    d->magic = 0;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t p, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t n,
                                       const void *values)
{
    desc *d = p;
    if (!alive(d))
        return fail(CUDNN_STATUS_BAD_PARAM, "set attribute %d: not a live descriptor", (int)name);
    if (d->final)
        return fail(CUDNN_STATUS_BAD_PARAM, "set attribute %d: the descriptor is finalized",
                    (int)name);
    if (n < 0 || (n > 0 && !values))
        return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "set attribute %d: no values", (int)name);
    attr *a = find(d, name);
    if (!a) {
        if (d->n_a == MAX_ATTRS)
            return fail(CUDNN_STATUS_INTERNAL_ERROR, "set attribute %d: too many attributes",
                        (int)name);
        a = &d->a[d->n_a++];
        a->name = name;
        a->v = NULL;
    }
    const size_t nb = (size_t)n * type_size(type);
    void *v = malloc(nb ? nb : 1);
    if (!v) return fail(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, "set attribute");
    if (nb) memcpy(v, values, nb);
    if (type == CUDNN_TYPE_BACKEND_DESCRIPTOR)
        for (int64_t i = 0; i < n; i++)
            if (!alive(((desc **)v)[i]) || !((desc **)v)[i]->final) {
                free(v);
                return fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED,
                            "set attribute %d: element %lld is not a finalized descriptor",
                            (int)name, (long long)i);
            }
    free(a->v);
    a->type = type;
    a->n = n;
    a->v = v;
    return CUDNN_STATUS_SUCCESS;
}

/* ---- the operation graph: checked when finalized ------------------------------------------ */

typedef enum { OP_MATMUL, OP_POINTWISE, OP_REDUCTION, OP_RESHAPE } op_kind;

/* An operation's tensors: in[0..2] (x, b, t; a, b for matmul), out. */
typedef struct {
    op_kind kind;
    desc *in[3], *out;
    int mode; /* pointwise mode / reduction operator */
    int64_t axis;
    float alpha1, alpha2;
} op_view;

typedef struct {
    int64_t dim[4], str[4], uid;
    int dt;
    bool virt, by_value;
} tensor_view;

static bool tensor_of(const desc *t, tensor_view *v)
{
    if (!alive(t) || t->type != CUDNN_BACKEND_TENSOR_DESCRIPTOR) return false;
    v->virt = get_bool(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL);
    v->by_value = get_bool(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE);
    return get_i64(t, CUDNN_ATTR_TENSOR_DIMENSIONS, v->dim, 4) &&
           get_i64(t, CUDNN_ATTR_TENSOR_STRIDES, v->str, 4) &&
           get_i64(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, &v->uid, 1) &&
           get_enum(t, CUDNN_ATTR_TENSOR_DATA_TYPE, &v->dt);
}

static size_t dt_size(int dt)
{
    switch (dt) {
    case CUDNN_DATA_FLOAT:
    case CUDNN_DATA_INT32:
        return 4;
    case CUDNN_DATA_BFLOAT16:
    case CUDNN_DATA_HALF:
        return 2;
    case CUDNN_DATA_BOOLEAN:
        return 1;
    default:
        return 0;
    }
}

static int64_t n_elems(const tensor_view *v)
{
    return v->dim[0] * v->dim[1] * v->dim[2] * v->dim[3];
}

/* Elements the tensor's strides span: the largest offset + 1. */
static int64_t extent(const tensor_view *v)
{
    int64_t e = 1;
    for (int i = 0; i < 4; i++)
        e += (v->dim[i] - 1) * v->str[i];
    return e;
}

static cudnnStatus_t op_of(const desc *o, op_view *v)
{
    memset(v, 0, sizeof *v);
    v->alpha1 = v->alpha2 = 1.0f;
    v->axis = -1;
    switch (o->type) {
    case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
        v->kind = OP_MATMUL;
        v->in[0] = ref(o, CUDNN_ATTR_OPERATION_MATMUL_ADESC);
        v->in[1] = ref(o, CUDNN_ATTR_OPERATION_MATMUL_BDESC);
        v->out = ref(o, CUDNN_ATTR_OPERATION_MATMUL_CDESC);
        if (!ref(o, CUDNN_ATTR_OPERATION_MATMUL_DESC))
            return fail(CUDNN_STATUS_BAD_PARAM, "a matmul without its matmul descriptor");
        break;
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: {
        v->kind = OP_POINTWISE;
        const desc *pw = ref(o, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
        if (!pw || !get_enum(pw, CUDNN_ATTR_POINTWISE_MODE, &v->mode))
            return fail(CUDNN_STATUS_BAD_PARAM, "a pointwise operation without its mode");
        get_i64(pw, CUDNN_ATTR_POINTWISE_AXIS, &v->axis, 1);
        v->in[0] = ref(o, CUDNN_ATTR_OPERATION_POINTWISE_XDESC);
        v->in[1] = ref(o, CUDNN_ATTR_OPERATION_POINTWISE_BDESC);
        v->in[2] = ref(o, CUDNN_ATTR_OPERATION_POINTWISE_TDESC);
        v->out = ref(o, CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
        v->alpha1 = get_float(o, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, 1.0f);
        v->alpha2 = get_float(o, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, 1.0f);
        const int m = v->mode;
        const int n_in = m == CUDNN_POINTWISE_BINARY_SELECT ? 3
                         : m == CUDNN_POINTWISE_ADD || m == CUDNN_POINTWISE_SUB ||
                                 m == CUDNN_POINTWISE_MUL || m == CUDNN_POINTWISE_DIV ||
                                 m == CUDNN_POINTWISE_CMP_GE
                             ? 2
                         : m == CUDNN_POINTWISE_EXP || m == CUDNN_POINTWISE_LOG ||
                                 m == CUDNN_POINTWISE_IDENTITY || m == CUDNN_POINTWISE_GEN_INDEX
                             ? 1
                             : 0;
        if (!n_in) return fail(CUDNN_STATUS_NOT_SUPPORTED, "pointwise mode %d is not emulated", m);
        for (int i = 0; i < 3; i++)
            if ((i < n_in) != (v->in[i] != NULL))
                return fail(CUDNN_STATUS_BAD_PARAM,
                            "pointwise mode %d takes %d input%s; input %d is %s", m, n_in,
                            n_in == 1 ? "" : "s", i, v->in[i] ? "set" : "missing");
        if (m == CUDNN_POINTWISE_GEN_INDEX && (v->axis < 0 || v->axis > 3))
            return fail(CUDNN_STATUS_BAD_PARAM, "GEN_INDEX without an axis in 0..3");
        break;
    }
    case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: {
        v->kind = OP_REDUCTION;
        const desc *r = ref(o, CUDNN_ATTR_OPERATION_REDUCTION_DESC);
        if (!r || !get_enum(r, CUDNN_ATTR_REDUCTION_OPERATOR, &v->mode))
            return fail(CUDNN_STATUS_BAD_PARAM, "a reduction without its operator");
        if (v->mode != CUDNN_REDUCE_TENSOR_ADD && v->mode != CUDNN_REDUCE_TENSOR_MAX)
            return fail(CUDNN_STATUS_NOT_SUPPORTED, "reduction operator %d is not emulated",
                        v->mode);
        v->in[0] = ref(o, CUDNN_ATTR_OPERATION_REDUCTION_XDESC);
        v->out = ref(o, CUDNN_ATTR_OPERATION_REDUCTION_YDESC);
        break;
    }
    case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR:
        v->kind = OP_RESHAPE;
        v->in[0] = ref(o, CUDNN_ATTR_OPERATION_RESHAPE_XDESC);
        v->out = ref(o, CUDNN_ATTR_OPERATION_RESHAPE_YDESC);
        break;
    default:
        return fail(CUDNN_STATUS_NOT_SUPPORTED, "operation descriptor type %d is not emulated",
                    (int)o->type);
    }
    if (!v->in[0] || !v->out)
        return fail(CUDNN_STATUS_BAD_PARAM, "an operation without its input or output tensor");
    return CUDNN_STATUS_SUCCESS;
}

/* Whether an input of dims a broadcasts to output dims y (each extent equal or 1). */
static bool broadcasts(const int64_t a[4], const int64_t y[4])
{
    for (int i = 0; i < 4; i++)
        if (a[i] != y[i] && a[i] != 1) return false;
    return true;
}

/* Whether extent a is b's, 1, or a divisor of b (the grouped matmul and reduction). */
static bool groups(int64_t a, int64_t b)
{
    return a == b || a == 1 || (a > 0 && b % a == 0);
}

/* The index into an extent a of index i into extent b (groups(a, b)). */
static int64_t group_index(int64_t i, int64_t a, int64_t b)
{
    return a == b ? i : a == 1 ? 0 : i / (b / a);
}

static cudnnStatus_t check_op(const op_view *o)
{
    tensor_view t[3], y;
    for (int i = 0; i < 3; i++)
        if (o->in[i] && !tensor_of(o->in[i], &t[i]))
            return fail(CUDNN_STATUS_BAD_PARAM, "an operation's input %d is not a 4-d tensor", i);
    if (!tensor_of(o->out, &y))
        return fail(CUDNN_STATUS_BAD_PARAM, "an operation's output is not a 4-d tensor");
    if (y.by_value) return fail(CUDNN_STATUS_BAD_PARAM, "a by-value tensor as an output");
    for (int i = 0; i < 3; i++)
        if (o->in[i] && !dt_size(t[i].dt))
            return fail(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, "tensor %lld: data type %d",
                        (long long)t[i].uid, t[i].dt);
    if (!dt_size(y.dt))
        return fail(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, "tensor %lld: data type %d",
                    (long long)y.uid, y.dt);
    switch (o->kind) {
    case OP_MATMUL: {
        const tensor_view *a = &t[0], *b = &t[1];
        bool ok = a->dim[3] == b->dim[2] && y.dim[2] == a->dim[2] && y.dim[3] == b->dim[3];
        for (int i = 0; i < 2; i++)
            ok = ok && groups(a->dim[i], y.dim[i]) && groups(b->dim[i], y.dim[i]);
        if (!ok)
            return fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                        "matmul of tensors %lld and %lld into %lld: shapes do not agree",
                        (long long)a->uid, (long long)b->uid, (long long)y.uid);
        break;
    }
    case OP_POINTWISE:
        for (int i = 0; i < 3; i++)
            if (o->in[i] && o->mode != CUDNN_POINTWISE_GEN_INDEX && !broadcasts(t[i].dim, y.dim))
                return fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                            "pointwise mode %d: input tensor %lld does not broadcast to %lld",
                            o->mode, (long long)t[i].uid, (long long)y.uid);
        if (o->mode == CUDNN_POINTWISE_GEN_INDEX && memcmp(t[0].dim, y.dim, sizeof y.dim) != 0)
            return fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                        "GEN_INDEX: x and y differ in shape");
        break;
    case OP_REDUCTION:
        for (int i = 0; i < 4; i++)
            if (!groups(y.dim[i], t[0].dim[i]))
                return fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                            "reduction of tensor %lld into %lld: y's extents must be x's, 1 or "
                            "divide x's",
                            (long long)t[0].uid, (long long)y.uid);
        break;
    case OP_RESHAPE:
        if (n_elems(&t[0]) != n_elems(&y) || extent(&t[0]) != extent(&y) ||
            (t[0].virt && extent(&t[0]) != n_elems(&t[0])))
            return fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                        "reshape of tensor %lld into %lld: not the same memory",
                        (long long)t[0].uid, (long long)y.uid);
        break;
    }
    return CUDNN_STATUS_SUCCESS;
}

/* The graph's checks: each operation readable and its shapes agreeing, each tensor written at
 * most once, each virtual tensor written exactly once, by-value tensors only read. */
static cudnnStatus_t check_graph(const desc *g)
{
    const attr *ops = find(g, CUDNN_ATTR_OPERATIONGRAPH_OPS);
    if (!ops || ops->type != CUDNN_TYPE_BACKEND_DESCRIPTOR || ops->n < 1 || ops->n > MAX_OPS)
        return fail(CUDNN_STATUS_BAD_PARAM, "an operation graph needs 1 to %d operations", MAX_OPS);
    desc **od = ops->v;
    op_view v[MAX_OPS];
    for (int64_t i = 0; i < ops->n; i++) {
        cudnnStatus_t st = op_of(od[i], &v[i]);
        if (st == CUDNN_STATUS_SUCCESS) st = check_op(&v[i]);
        if (st != CUDNN_STATUS_SUCCESS) return st;
        for (int64_t j = 0; j < i; j++)
            if (v[j].out == v[i].out)
                return fail(CUDNN_STATUS_BAD_PARAM, "operations %lld and %lld write one tensor",
                            (long long)j, (long long)i);
    }
    for (int64_t i = 0; i < ops->n; i++)
        for (int k = 0; k < 3; k++) {
            tensor_view t;
            if (!v[i].in[k] || !tensor_of(v[i].in[k], &t) || !t.virt) continue;
            bool made = false;
            for (int64_t j = 0; j < ops->n && !made; j++)
                made = v[j].out == v[i].in[k];
            if (!made)
                return fail(CUDNN_STATUS_BAD_PARAM,
                            "virtual tensor %lld is read by operation %lld but never written",
                            (long long)t.uid, (long long)i);
        }
    return CUDNN_STATUS_SUCCESS;
}

/* ---- engines, heuristics, plans ------------------------------------------------------------- */

static int64_t workspace_bytes(void)
{
    const char *w = getenv("JDT_CUDNNEMU_WORKSPACE");
    return w && *w ? strtoll(w, NULL, 10) : (int64_t)1 << 20;
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t p)
{
    desc *d = p;
    if (!alive(d)) return fail(CUDNN_STATUS_BAD_PARAM, "finalize: not a live descriptor");
    if (d->final) return fail(CUDNN_STATUS_BAD_PARAM, "finalize: already finalized");
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    switch (d->type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: {
        tensor_view t;
        if (!tensor_of(d, &t))
            return fail(CUDNN_STATUS_BAD_PARAM,
                        "a tensor needs a type, 4 dimensions, 4 strides and a unique id");
        for (int i = 0; i < 4; i++)
            if (t.dim[i] < 1 || t.str[i] < 0)
                return fail(CUDNN_STATUS_BAD_PARAM,
                            "tensor %lld: a dimension or stride out of range", (long long)t.uid);
        break;
    }
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR:
        st = check_graph(d);
        break;
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: {
        desc *g = ref(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
        if (!g || g->type != CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)
            return fail(CUDNN_STATUS_BAD_PARAM, "heuristics without an operation graph");
        d->graph = g;
        break;
    }
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
        desc *cfg = ref(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
        if (!cfg || !cfg->graph)
            return fail(CUDNN_STATUS_BAD_PARAM, "a plan without an engine configuration");
        const attr *h = find(d, CUDNN_ATTR_EXECUTION_PLAN_HANDLE);
        if (!h || !*(void **)h->v) return fail(CUDNN_STATUS_BAD_PARAM, "a plan without a handle");
        d->graph = cfg->graph;
        break;
    }
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: {
        const attr *u = find(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS),
                   *q = find(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
        if (!u || !q || u->type != CUDNN_TYPE_INT64 || q->type != CUDNN_TYPE_VOID_PTR ||
            u->n != q->n)
            return fail(CUDNN_STATUS_BAD_PARAM,
                        "a variant pack needs as many unique ids as data pointers");
        for (int64_t i = 0; i < u->n; i++)
            for (int64_t j = 0; j < i; j++)
                if (((int64_t *)u->v)[i] == ((int64_t *)u->v)[j])
                    return fail(CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES,
                                "the variant pack names unique id %lld twice",
                                (long long)((int64_t *)u->v)[i]);
        break;
    }
    default:
        break; /* the descriptors of operations: read when their graph is finalized */
    }
    if (st == CUDNN_STATUS_SUCCESS) d->final = true;
    return st;
}

/* Copies src's attributes and graph into the caller's descriptor dst (a heuristics result, an
 * engine configuration's engine), which is then finalized. */
static cudnnStatus_t fill(desc *dst, const desc *src)
{
    if (!alive(dst) || dst->type != src->type)
        return fail(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE,
                    "get attribute: a %d descriptor is needed", (int)src->type);
    for (int i = 0; i < dst->n_a; i++)
        free(dst->a[i].v);
    dst->n_a = 0;
    for (int i = 0; i < src->n_a; i++) {
        const size_t nb = (size_t)src->a[i].n * type_size(src->a[i].type);
        dst->a[i] = src->a[i];
        if (!(dst->a[i].v = malloc(nb ? nb : 1)))
            return fail(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, "get attribute");
        memcpy(dst->a[i].v, src->a[i].v, nb);
        dst->n_a = i + 1;
    }
    dst->graph = src->graph;
    dst->final = true;
    return CUDNN_STATUS_SUCCESS;
}

/* The one engine: global index 0, no numerical notes. */
static desc *the_engine(void)
{
    static desc *e;
    if (!e) {
        cudnnBackendDescriptor_t p;
        if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_ENGINE_DESCRIPTOR, &p)) return NULL;
        e = p;
        const int64_t idx = 0;
        cudnnBackendSetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &idx);
        e->final = true;
    }
    return e;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const p,
                                       cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t want,
                                       int64_t *count, void *values)
{
    desc *d = p;
    if (!alive(d))
        return fail(CUDNN_STATUS_BAD_PARAM, "get attribute %d: not a live descriptor", (int)name);
    if (!d->final)
        return fail(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, "get attribute %d: not finalized",
                    (int)name);
    int64_t dummy;
    if (!count) count = &dummy;
    if (d->type == CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR && name == CUDNN_ATTR_ENGINEHEUR_RESULTS) {
        *count = 1;
        if (want < 1) return CUDNN_STATUS_SUCCESS;
        desc cfg = {
            .magic = DESC_MAGIC, .type = CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, .graph = d->graph};
        desc *eng = the_engine();
        if (!eng) return fail(CUDNN_STATUS_INTERNAL_ERROR, "no engine");
        cfg.a[0] = (attr){CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &eng};
        cfg.n_a = 1;
        return fill(((desc **)values)[0], &cfg);
    }
    if (d->type == CUDNN_BACKEND_ENGINECFG_DESCRIPTOR && name == CUDNN_ATTR_ENGINECFG_ENGINE) {
        *count = 1;
        return want < 1 ? CUDNN_STATUS_SUCCESS : fill(((desc **)values)[0], the_engine());
    }
    if (d->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR &&
        name == CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE) {
        *count = 1;
        if (want >= 1) *(int64_t *)values = workspace_bytes();
        return CUDNN_STATUS_SUCCESS;
    }
    if (d->type == CUDNN_BACKEND_ENGINE_DESCRIPTOR && name == CUDNN_ATTR_ENGINE_NUMERICAL_NOTE) {
        *count = 0;
        return CUDNN_STATUS_SUCCESS;
    }
    const attr *a = find(d, name);
    if (!a) return fail(CUDNN_STATUS_BAD_PARAM, "get attribute %d: not set", (int)name);
    if (a->type != type)
        return fail(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE, "get attribute %d: type %d, not %d",
                    (int)name, (int)a->type, (int)type);
    *count = a->n;
    if (want > 0 && values)
        memcpy(values, a->v, (size_t)(want < a->n ? want : a->n) * type_size(type));
    return CUDNN_STATUS_SUCCESS;
}

/* ---- execution: the graph interpreted on the host ----------------------------------------- */

typedef struct {
    desc *d;
    tensor_view v;
    char *mem;     /* not virtual: the variant pack's pointer */
    float scalar;  /* by value: copied at execute */
    float perturb; /* JDT_CUDNNEMU_PERTURB at execute: a tensor in memory is written times 1 + it */
    float *buf;    /* virtual: extent(v) floats, in the tensor's own strides */
    bool ready;
    bool accumulate; /* in memory, written and then read by the graph: an accumulator */
} rt_tensor;

typedef struct {
    int n_t, n_ops;
    rt_tensor t[3 * MAX_OPS + MAX_OPS];
    op_view ops[MAX_OPS];
    int in[MAX_OPS][3], out[MAX_OPS]; /* indices into t */
    char *ws;
    int64_t ws_bytes;
} job;

static float bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) { /* inf, nan */
        if (u & 0x7fffffu) u |= 0x400000u;
        u &= 0xffff0000u;
    } else
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

static float to_type(int dt, float x)
{
    switch (dt) {
    case CUDNN_DATA_BFLOAT16:
        return bf16_round(x);
    case CUDNN_DATA_INT32:
        return (float)(int32_t)x;
    case CUDNN_DATA_BOOLEAN:
        return x != 0.0f ? 1.0f : 0.0f;
    default:
        return x;
    }
}

static int64_t offset(const tensor_view *v, const int64_t i[4])
{
    return i[0] * v->str[0] + i[1] * v->str[1] + i[2] * v->str[2] + i[3] * v->str[3];
}

/* Element i of t (t's own dimensions; broadcast extents read index 0). */
static float load(const rt_tensor *t, const int64_t idx[4])
{
    int64_t i[4];
    for (int k = 0; k < 4; k++)
        i[k] = t->v.dim[k] == 1 ? 0 : idx[k];
    if (t->v.by_value) return t->scalar;
    const int64_t o = offset(&t->v, i);
    if (t->buf) return t->buf[o];
    const char *p = t->mem + o * (int64_t)dt_size(t->v.dt);
    switch (t->v.dt) {
    case CUDNN_DATA_FLOAT: {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    case CUDNN_DATA_BFLOAT16: {
        uint16_t h;
        memcpy(&h, p, 2);
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case CUDNN_DATA_INT32: {
        int32_t x;
        memcpy(&x, p, 4);
        return (float)x;
    }
    default:
        return *p ? 1.0f : 0.0f;
    }
}

static void store(rt_tensor *t, const int64_t idx[4], float x)
{
    if (!t->buf && t->perturb != 0.0f) x *= 1.0f + t->perturb; /* a planted error */
    x = to_type(t->v.dt, x);
    const int64_t o = offset(&t->v, idx);
    if (t->buf) {
        t->buf[o] = x;
        return;
    }
    char *p = t->mem + o * (int64_t)dt_size(t->v.dt);
    switch (t->v.dt) {
    case CUDNN_DATA_FLOAT:
        memcpy(p, &x, 4);
        break;
    case CUDNN_DATA_BFLOAT16: {
        uint32_t u;
        memcpy(&u, &x, 4);
        uint16_t h = (uint16_t)(u >> 16);
        memcpy(p, &h, 2);
        break;
    }
    case CUDNN_DATA_INT32: {
        int32_t v = (int32_t)x;
        memcpy(p, &v, 4);
        break;
    }
    default:
        *p = x != 0.0f;
        break;
    }
}

#define FOR4(y, i)                                                                                 \
    for (i[0] = 0; i[0] < (y)->dim[0]; i[0]++)                                                     \
        for (i[1] = 0; i[1] < (y)->dim[1]; i[1]++)                                                 \
            for (i[2] = 0; i[2] < (y)->dim[2]; i[2]++)                                             \
                for (i[3] = 0; i[3] < (y)->dim[3]; i[3]++)

static float pointwise(const op_view *o, float x, float b, float t, const int64_t i[4])
{
    x *= o->alpha1;
    b *= o->alpha2;
    switch (o->mode) {
    case CUDNN_POINTWISE_ADD:
        return x + b;
    case CUDNN_POINTWISE_SUB:
        return x - b;
    case CUDNN_POINTWISE_MUL:
        return x * b;
    case CUDNN_POINTWISE_DIV:
        return x / b;
    case CUDNN_POINTWISE_EXP:
        return expf(x);
    case CUDNN_POINTWISE_LOG:
        return logf(x);
    case CUDNN_POINTWISE_IDENTITY:
        return x;
    case CUDNN_POINTWISE_CMP_GE:
        return x >= b ? 1.0f : 0.0f;
    case CUDNN_POINTWISE_BINARY_SELECT:
        return t != 0.0f ? x : b;
    case CUDNN_POINTWISE_GEN_INDEX:
        return (float)i[o->axis];
    default:
        return NAN;
    }
}

static void run_op(const op_view *o, rt_tensor *const in[3], rt_tensor *y)
{
    int64_t i[4];
    const tensor_view *yv = &y->v;
    switch (o->kind) {
    case OP_MATMUL: {
        const int64_t K = in[0]->v.dim[3];
        const tensor_view *av = &in[0]->v, *bv = &in[1]->v;
        FOR4(yv, i)
        {
            double acc = 0.0;
            int64_t ai[4] = {group_index(i[0], av->dim[0], yv->dim[0]),
                             group_index(i[1], av->dim[1], yv->dim[1]), i[2], 0},
                    bi[4] = {group_index(i[0], bv->dim[0], yv->dim[0]),
                             group_index(i[1], bv->dim[1], yv->dim[1]), 0, i[3]};
            for (int64_t k = 0; k < K; k++) {
                ai[3] = bi[2] = k;
                acc += (double)load(in[0], ai) * (double)load(in[1], bi);
            }
            store(y, i, y->accumulate ? load(y, i) + (float)acc : (float)acc);
        }
        break;
    }
    case OP_POINTWISE:
        FOR4(yv, i)
        {
            const float x = load(in[0], i), b = in[1] ? load(in[1], i) : 0.0f,
                        t = in[2] ? load(in[2], i) : 0.0f;
            store(y, i, pointwise(o, x, b, t, i));
        }
        break;
    case OP_REDUCTION: {
        /* y's elements start at the operator's identity; x's are folded in, in order */
        const bool mx = o->mode == CUDNN_REDUCE_TENSOR_MAX;
        double *acc = malloc((size_t)n_elems(yv) * sizeof *acc);
        if (!acc) abort();
        for (int64_t k = 0; k < n_elems(yv); k++)
            acc[k] = mx ? -INFINITY : 0.0;
        const tensor_view *xv = &in[0]->v;
        FOR4(xv, i)
        {
            int64_t k = 0;
            for (int a = 0; a < 4; a++)
                k = k * yv->dim[a] + group_index(i[a], yv->dim[a], xv->dim[a]);
            const double x = load(in[0], i);
            acc[k] = mx ? (x > acc[k] ? x : acc[k]) : acc[k] + x;
        }
        FOR4(yv, i)
        {
            const int64_t k = ((i[0] * yv->dim[1] + i[1]) * yv->dim[2] + i[2]) * yv->dim[3] + i[3];
            store(y, i, (float)acc[k]);
        }
        free(acc);
        break;
    }
    case OP_RESHAPE: {
        /* y reads x's memory through y's strides: view x's memory as y's tensor */
        rt_tensor view = *in[0];
        view.v.dim[0] = view.v.dim[1] = view.v.dim[2] = 1, view.v.dim[3] = extent(&in[0]->v);
        view.v.str[0] = view.v.str[1] = view.v.str[2] = 0, view.v.str[3] = 1;
        FOR4(yv, i)
        {
            const int64_t at[4] = {0, 0, 0, offset(yv, i)};
            store(y, i, load(&view, at));
        }
        break;
    }
    }
}

static void run_job(void *ctx)
{
    job *j = ctx;
    if (j->ws && j->ws_bytes > 0) memset(j->ws, 0xff, (size_t)j->ws_bytes);
    for (int left = j->n_ops; left > 0;) {
        int ran = 0;
        for (int k = 0; k < j->n_ops; k++) {
            if (j->t[j->out[k]].ready) continue;
            bool go = true;
            for (int m = 0; m < 3; m++)
                go = go && (j->in[k][m] < 0 || j->t[j->in[k][m]].ready);
            if (!go) continue;
            rt_tensor *in[3];
            for (int m = 0; m < 3; m++)
                in[m] = j->in[k][m] < 0 ? NULL : &j->t[j->in[k][m]];
            run_op(&j->ops[k], in, &j->t[j->out[k]]);
            j->t[j->out[k]].ready = true;
            ran++, left--;
        }
        if (!ran) {
            fprintf(stderr, "cudnnemu: the graph's operations wait on each other (a cycle)\n");
            abort();
        }
    }
    for (int k = 0; k < j->n_t; k++)
        free(j->t[k].buf);
    free(j);
}

/* The index of d in j's tensors, added (not ready) when new. */
static int tensor_slot(job *j, desc *d)
{
    for (int k = 0; k < j->n_t; k++)
        if (j->t[k].d == d) return k;
    rt_tensor *t = &j->t[j->n_t];
    memset(t, 0, sizeof *t);
    t->d = d;
    tensor_of(d, &t->v);
    return j->n_t++;
}

static void *pack_ptr(const desc *vp, int64_t uid, bool *found)
{
    const attr *u = find(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS),
               *q = find(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
    for (int64_t i = 0; i < u->n; i++)
        if (((int64_t *)u->v)[i] == uid) {
            *found = true;
            return ((void **)q->v)[i];
        }
    *found = false;
    return NULL;
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan_p,
                                  cudnnBackendDescriptor_t vp_p)
{
    desc *plan = plan_p, *vp = vp_p;
    if (!handle) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "execute: no handle");
    if (!alive(plan) || !plan->final || plan->type != CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)
        return fail(CUDNN_STATUS_BAD_PARAM, "execute: not a finalized execution plan");
    if (!alive(vp) || !vp->final || vp->type != CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)
        return fail(CUDNN_STATUS_BAD_PARAM, "execute: not a finalized variant pack");
    const desc *g = plan->graph;
    if (!alive(g))
        return fail(CUDNN_STATUS_BAD_PARAM,
                    "execute: the plan's operation graph was destroyed before the plan");
    static int (*dev_range)(const void *, size_t, const char *);
    static int (*defer)(cudaStream_t, void (*)(void *), void *);
    static bool looked;
    if (!looked) { /* the emulated runtime, when this process has it */
        *(void **)&dev_range = dlsym(RTLD_DEFAULT, "jdt_cudaemu_dev_range");
        *(void **)&defer = dlsym(RTLD_DEFAULT, "jdt_cudaemu_defer");
        looked = true;
    }
    job *j = calloc(1, sizeof *j);
    if (!j) return fail(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, "execute");
    const attr *ops = find(g, CUDNN_ATTR_OPERATIONGRAPH_OPS);
    j->n_ops = (int)ops->n;
    cudnnStatus_t st = CUDNN_STATUS_SUCCESS;
    for (int k = 0; k < j->n_ops && st == CUDNN_STATUS_SUCCESS; k++) {
        desc *od = ((desc **)ops->v)[k];
        if (!alive(od)) {
            st = fail(CUDNN_STATUS_BAD_PARAM, "execute: operation %d was destroyed", k);
            break;
        }
        op_of(od, &j->ops[k]);
        for (int m = 0; m < 3; m++)
            j->in[k][m] = j->ops[k].in[m] ? tensor_slot(j, j->ops[k].in[m]) : -1;
        j->out[k] = tensor_slot(j, j->ops[k].out);
    }
    /* every tensor's storage: the pack's pointers (checked), by-value copies, host arrays */
    for (int k = 0; k < j->n_t && st == CUDNN_STATUS_SUCCESS; k++) {
        rt_tensor *t = &j->t[k];
        if (!alive(t->d)) {
            st = fail(CUDNN_STATUS_BAD_PARAM, "execute: a tensor of the graph was destroyed");
            break;
        }
        if (t->v.virt) {
            if (!(t->buf = malloc((size_t)extent(&t->v) * sizeof(float))))
                st = fail(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED, "execute");
            continue;
        }
        bool found;
        void *p = pack_ptr(vp, t->v.uid, &found);
        if (!found || !p) {
            st = fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER,
                      "execute: the variant pack has no pointer for tensor %lld",
                      (long long)t->v.uid);
            break;
        }
        if (t->v.by_value) {
            t->scalar = *(const float *)p;
            t->ready = true;
            continue;
        }
        const size_t nb = (size_t)extent(&t->v) * dt_size(t->v.dt);
        if ((uintptr_t)p % 16 != 0)
            st = fail(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
                      "execute: tensor %lld at %p is not 16-byte aligned", (long long)t->v.uid, p);
        else if (dev_range && !dev_range(p, nb, "cudnnemu: a variant pack tensor"))
            st = fail(CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND,
                      "execute: tensor %lld's %zu bytes at %p are not inside one device "
                      "allocation",
                      (long long)t->v.uid, nb, p);
        t->mem = p;
        const char *pe = getenv("JDT_CUDNNEMU_PERTURB");
        t->perturb = pe && *pe ? strtof(pe, NULL) : 0.0f;
        t->ready = true;
        for (int m = 0; m < j->n_ops; m++)
            if (j->out[m] == k) t->ready = false; /* written by the graph */
        for (int m = 0; m < j->n_ops && !t->ready; m++)
            for (int q = 0; q < 3; q++)
                t->accumulate |= j->in[m][q] == k; /* ... and read by it */
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        const attr *w = find(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE);
        j->ws = w && w->n == 1 ? *(char **)w->v : NULL;
        j->ws_bytes = workspace_bytes();
        if (j->ws_bytes > 0 && !j->ws)
            st = fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER,
                      "execute: the plan needs %lld bytes of workspace and the pack has none",
                      (long long)j->ws_bytes);
        else if (j->ws_bytes > 0 && dev_range &&
                 !dev_range(j->ws, (size_t)j->ws_bytes, "cudnnemu: the workspace"))
            st = fail(CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND,
                      "execute: the workspace (%lld bytes at %p) is not inside one device "
                      "allocation",
                      (long long)j->ws_bytes, (void *)j->ws);
    }
    if (st != CUDNN_STATUS_SUCCESS) {
        for (int k = 0; k < j->n_t; k++)
            free(j->t[k].buf);
        free(j);
        return st;
    }
    if (!defer || !defer(handle->stream, run_job, j)) run_job(j);
    return CUDNN_STATUS_SUCCESS;
}
