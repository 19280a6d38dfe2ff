/*
 * builder.c — the checked builder API (builder.h): every op goes through jdt_graph_op, which
 * validates inputs with the op's shape rule (ops.c), records the first error in the graph
 * (sticky), appends the node and propagates logical axis names.
 */
#include "graph/builder.h"

#include "graph/ops-impl.h"

#include <stdio.h>
#include <string.h>

bool jdt_dtype_is_float(jdt_dtype dt)
{
    return dt == JDT_DTYPE_F32 || dt == JDT_DTYPE_F64 || dt == JDT_DTYPE_BF16;
}

jdt_dtype jdt_dtype_cotangent(jdt_dtype dt)
{
    return dt == JDT_DTYPE_BF16 ? JDT_DTYPE_F32 : dt;
}

static void describe_inputs(int n, jdt_tensor *const *in, char *buf, size_t cap)
{
    size_t off = 0;
    buf[0] = 0;
    for (int i = 0; i < n && off < cap; i++) {
        char s[128];
        off += (size_t)snprintf(buf + off, cap - off, "%s%s %s", i ? ", " : "",
                                jdt_shape_str(&in[i]->shape, s, sizeof s),
                                jdt_dtype_name(in[i]->dtype));
    }
}

static bool belongs(const jdt_graph *g, const jdt_tensor *t)
{
    return t->id >= 0 && t->id < jdt_graph_n_nodes(g) && jdt_graph_node(g, t->id) == t;
}

/* ---- logical axis names ------------------------------------------------------------------- */

static void propagate_axes(jdt_tensor *t)
{
    jdt_tensor *const *in = t->inputs;
    const jdt_attrs *a = &t->attrs;
    int nd = t->shape.ndim;
    switch (t->op) {
    case JDT_OP_BROADCAST: {
        int lead = nd - in[0]->shape.ndim;
        for (int i = lead; i < nd; i++)
            if (in[0]->shape.dims[i - lead] == t->shape.dims[i]) t->axes[i] = in[0]->axes[i - lead];
        break;
    }
    case JDT_OP_REDUCE_SUM:
    case JDT_OP_REDUCE_MAX:
    case JDT_OP_REDUCE_MEAN:
        for (int i = 0, k = 0; i < in[0]->shape.ndim; i++) {
            if (!(a->i[0] & (1 << i)))
                t->axes[k++] = in[0]->axes[i];
            else if (a->i[1])
                t->axes[k++] = NULL;
        }
        break;
    case JDT_OP_TRANSPOSE:
        for (int k = 0; k < nd; k++)
            t->axes[k] = in[0]->axes[a->i[k]];
        break;
    case JDT_OP_RESHAPE: {
        const jdt_shape *s = &in[0]->shape;
        int p = 0;
        while (p < nd && p < s->ndim && s->dims[p] == t->shape.dims[p]) {
            t->axes[p] = in[0]->axes[p];
            p++;
        }
        for (int q = 1; nd - q >= p && s->ndim - q >= p; q++) {
            if (s->dims[s->ndim - q] != t->shape.dims[nd - q]) break;
            t->axes[nd - q] = in[0]->axes[s->ndim - q];
        }
        break;
    }
    case JDT_OP_MATMUL: {
        const jdt_tensor *x = in[0], *y = in[1];
        int na = x->shape.ndim, nb = y->shape.ndim;
        for (int i = 0; i < nd - 2; i++)
            t->axes[i] = x->axes[i];
        t->axes[nd - 2] = x->axes[na - (a->i[0] ? 1 : 2)];
        t->axes[nd - 1] = y->axes[nb - (a->i[1] ? 2 : 1)];
        break;
    }
    case JDT_OP_GATHER:
        for (int i = 0; i < in[1]->shape.ndim; i++)
            t->axes[i] = in[1]->axes[i];
        t->axes[nd - 1] = in[0]->axes[1];
        break;
    case JDT_OP_SCATTER_ADD:
        t->axes[1] = in[0]->axes[in[0]->shape.ndim - 1];
        break;
    case JDT_OP_SOFTMAX_XENT:
        for (int d = 0; d < t->shape.ndim; d++)
            t->axes[d] = in[0]->axes[d] ? in[0]->axes[d] : in[1]->axes[d];
        break;
    case JDT_OP_ATTENTION_BWD:
        for (int i = 0; i < 4; i++)
            t->axes[i + 1] = in[0]->axes[i];
        break;
    case JDT_OP_PARAM:
    case JDT_OP_INPUT:
    case JDT_OP_CONSTANT:
    case JDT_OP_NEG:
    case JDT_OP_EXP:
    case JDT_OP_LOG:
    case JDT_OP_TANH:
    case JDT_OP_SQRT:
    case JDT_OP_RSQRT:
    case JDT_OP_RELU:
    case JDT_OP_GELU:
    case JDT_OP_SILU:
    case JDT_OP_SIGMOID:
    case JDT_OP_ABS:
    case JDT_OP_ADD:
    case JDT_OP_SUB:
    case JDT_OP_MUL:
    case JDT_OP_DIV:
    case JDT_OP_MAX:
    case JDT_OP_MIN:
    case JDT_OP_GT:
    case JDT_OP_GE:
    case JDT_OP_ADD_SCALAR:
    case JDT_OP_MUL_SCALAR:
    case JDT_OP_POW_SCALAR:
    case JDT_OP_GELU_GRAD:
    case JDT_OP_SILU_GRAD:
    case JDT_OP_SELECT:
    case JDT_OP_CAST:
    case JDT_OP_STOP_GRADIENT:
    case JDT_OP_DROPOUT:
    case JDT_OP_SLICE:
    case JDT_OP_CONCAT:
    case JDT_OP_IOTA:
    case JDT_OP_CAUSAL_MASK:
    case JDT_OP_SOFTMAX:
    case JDT_OP_SOFTMAX_BWD:
    case JDT_OP_LOG_SOFTMAX:
    case JDT_OP_LOG_SOFTMAX_BWD:
    case JDT_OP_SOFTMAX_XENT_BWD:
    case JDT_OP_NORMALIZE:
    case JDT_OP_NORMALIZE_BWD:
    case JDT_OP_RMS_NORMALIZE:
    case JDT_OP_RMS_NORMALIZE_BWD:
    case JDT_OP_ROPE:
    case JDT_OP_ATTENTION:
    case JDT_OP_ALL_REDUCE:
    case JDT_OP_ALL_GATHER:
    case JDT_OP_REDUCE_SCATTER:
        /* Same-shape ops (elementwise, row ops, slice/concat, cast ...): per dim, the first
         * input of the same rank that names it. */
        for (int k = 0; k < t->n_inputs; k++) {
            if (in[k]->shape.ndim != nd) continue;
            for (int i = 0; i < nd; i++)
                if (!t->axes[i]) t->axes[i] = in[k]->axes[i];
        }
        break;
    }
}

/* ---- the generic constructor -------------------------------------------------------------- */

/* Type promotion (as JAX's for bf16 against f32): an elementwise op (CAST aside) whose float
 * inputs mix bf16 with f32 or f64 gets its bf16 inputs cast to the widest of them, so the node
 * itself has one float dtype. VJP rules rely on it (an f32 cotangent times a bf16 value).
 * Returns true and fills out[] when it cast something. */
static bool promote_inputs(jdt_graph *g, jdt_op op, int n, jdt_tensor *const *in, jdt_tensor **out)
{
    if (jdt_op_class_of(op) != JDT_OPC_ELEMENTWISE || op == JDT_OP_CAST) return false;
    bool any_bf16 = false;
    jdt_dtype wide = JDT_DTYPE_BF16;
    const int first = op == JDT_OP_SELECT ? 1 : 0; /* SELECT's condition keeps its dtype */
    for (int i = first; i < n; i++) {
        if (in[i]->dtype == JDT_DTYPE_BF16) any_bf16 = true;
        if (in[i]->dtype == JDT_DTYPE_F64) wide = JDT_DTYPE_F64;
        if (in[i]->dtype == JDT_DTYPE_F32 && wide != JDT_DTYPE_F64) wide = JDT_DTYPE_F32;
    }
    if (!any_bf16 || wide == JDT_DTYPE_BF16) return false;
    for (int i = 0; i < n; i++)
        out[i] =
            i >= first && in[i]->dtype == JDT_DTYPE_BF16 ? jdt_graph_cast(g, in[i], wide) : in[i];
    return true;
}

jdt_tensor *jdt_graph_op(jdt_graph *g, jdt_op op, int n_inputs, jdt_tensor *const *inputs,
                         const jdt_attrs *attrs, jdt_dtype dt, const jdt_shape *shape)
{
    if (!g || jdt_graph_error_msg(g)) return NULL;
    if ((int)op < 0 || (int)op >= JDT_OP_COUNT) {
        jdt_graph_fail(g, JDT_ERR_INVALID, "unknown op %d", (int)op);
        return NULL;
    }
    const jdt_op_info *info = jdt_op_info_get(op);
    if (info->arity >= 0 ? n_inputs != info->arity : (n_inputs < 1 || n_inputs > JDT_MAX_INPUTS)) {
        jdt_graph_fail(g, JDT_ERR_INVALID, "op '%s': got %d inputs, expects %d", info->name,
                       n_inputs, info->arity);
        return NULL;
    }
    if (n_inputs > 0 && !inputs) {
        jdt_graph_fail(g, JDT_ERR_INVALID, "op '%s': inputs array is NULL", info->name);
        return NULL;
    }
    for (int i = 0; i < n_inputs; i++) {
        if (!inputs[i]) {
            jdt_graph_fail(g, JDT_ERR_INVALID, "op '%s': input %d is NULL", info->name, i);
            return NULL;
        }
        if (!belongs(g, inputs[i])) {
            jdt_graph_fail(g, JDT_ERR_INVALID, "op '%s': input %d belongs to another graph",
                           info->name, i);
            return NULL;
        }
    }
    jdt_tensor *promoted[JDT_MAX_INPUTS];
    if (n_inputs > 0 && promote_inputs(g, op, n_inputs, inputs, promoted)) {
        if (jdt_graph_error_msg(g)) return NULL;
        inputs = promoted;
    }
    jdt_attrs at;
    memset(&at, 0, sizeof at);
    if (attrs) at = *attrs;
    jdt_shape out;
    memset(&out, 0, sizeof out);
    if (shape) out = *shape;
    jdt_dtype odt = dt;
    char why[256];
    if (!info->shape(inputs, n_inputs, &at, &odt, &out, why, sizeof why)) {
        char ins[512];
        describe_inputs(n_inputs, inputs, ins, sizeof ins);
        jdt_graph_fail(g, JDT_ERR_SHAPE, "op '%s': %s (inputs: %s)", info->name, why,
                       n_inputs ? ins : "none");
        return NULL;
    }
    jdt_tensor *t = jdt_graph_new_node(g, op, odt, &out, n_inputs, inputs, &at);
    if (!t) {
        jdt_graph_fail(g, JDT_ERR_NOMEM, "op '%s': out of memory appending node %d", info->name,
                       jdt_graph_n_nodes(g));
        return NULL;
    }
    if (n_inputs) propagate_axes(t);
    return t;
}

/* ---- leaves and constants ----------------------------------------------------------------- */

static jdt_tensor *leaf(jdt_graph *g, jdt_op op, const char *name, jdt_dtype dt, int ndim,
                        const int64_t *dims, const char *const *axis_names)
{
    if (!g || jdt_graph_error_msg(g)) return NULL;
    const char *what = jdt_op_name(op);
    if (op != JDT_OP_CONSTANT) {
        if (!name || !*name) {
            jdt_graph_fail(g, JDT_ERR_INVALID, "%s: a name is required", what);
            return NULL;
        }
        if (jdt_graph_find(g, name)) {
            jdt_graph_fail(g, JDT_ERR_INVALID, "%s '%s': name already used in this graph", what,
                           name);
            return NULL;
        }
    }
    if (ndim < 0 || ndim > JDT_MAX_DIMS || (ndim > 0 && !dims)) {
        jdt_graph_fail(g, JDT_ERR_SHAPE, "%s '%s': rank %d out of range 0..%d", what,
                       name ? name : "", ndim, JDT_MAX_DIMS);
        return NULL;
    }
    for (int i = 0; i < ndim; i++)
        if (dims[i] <= 0) {
            jdt_graph_fail(g, JDT_ERR_SHAPE, "%s '%s': dim %d is %lld (must be > 0)", what,
                           name ? name : "", i, (long long)dims[i]);
            return NULL;
        }
    if ((int)dt < 0 || dt >= JDT_DTYPE_COUNT) {
        jdt_graph_fail(g, JDT_ERR_INVALID, "%s '%s': unknown dtype %d", what, name ? name : "",
                       (int)dt);
        return NULL;
    }
    jdt_shape s = jdt_shape_make(ndim, dims);
    jdt_tensor *t = jdt_graph_op(g, op, 0, NULL, NULL, dt, &s);
    if (!t) return NULL;
    if (name && !(t->name = jdt_graph_strdup(g, name))) goto fail_nomem;
    for (int i = 0; axis_names && i < ndim; i++)
        if (axis_names[i] && !(t->axes[i] = jdt_graph_strdup(g, axis_names[i]))) goto fail_nomem;
    return t;
fail_nomem:
    jdt_graph_fail(g, JDT_ERR_NOMEM, "%s '%s': out of memory", what, name ? name : "");
    return NULL;
}

jdt_tensor *jdt_graph_param(jdt_graph *g, const char *name, jdt_dtype dt, int ndim,
                            const int64_t *dims, const char *const *axis_names)
{
    return leaf(g, JDT_OP_PARAM, name, dt, ndim, dims, axis_names);
}

jdt_tensor *jdt_graph_input(jdt_graph *g, const char *name, jdt_dtype dt, int ndim,
                            const int64_t *dims, const char *const *axis_names)
{
    return leaf(g, JDT_OP_INPUT, name, dt, ndim, dims, axis_names);
}

jdt_tensor *jdt_graph_state(jdt_graph *g, const char *name, jdt_dtype dt, int ndim,
                            const int64_t *dims, const char *const *axis_names)
{
    jdt_tensor *t = leaf(g, JDT_OP_INPUT, name, dt, ndim, dims, axis_names);
    if (t) t->flags = (t->flags & ~(uint32_t)JDT_TENSOR_INPUT) | JDT_TENSOR_STATE;
    return t;
}

jdt_tensor *jdt_graph_constant(jdt_graph *g, jdt_dtype dt, int ndim, const int64_t *dims,
                               const void *data)
{
    jdt_tensor *t = leaf(g, JDT_OP_CONSTANT, NULL, dt, ndim, dims, NULL);
    if (!t) return NULL;
    if (!data) {
        jdt_graph_fail(g, JDT_ERR_INVALID, "constant: data is NULL (use jdt_graph_full)");
        return NULL;
    }
    size_t n_bytes = (size_t)jdt_shape_numel(&t->shape) * jdt_dtype_size(dt);
    if (!(t->data = jdt_graph_alloc(g, n_bytes))) {
        jdt_graph_fail(g, JDT_ERR_NOMEM, "constant: out of memory for %zu bytes", n_bytes);
        return NULL;
    }
    memcpy(t->data, data, n_bytes);
    return t;
}

jdt_tensor *jdt_graph_full(jdt_graph *g, jdt_dtype dt, int ndim, const int64_t *dims, double value)
{
    jdt_tensor *t = leaf(g, JDT_OP_CONSTANT, NULL, dt, ndim, dims, NULL);
    if (t) t->attrs.f[0] = value;
    return t;
}

jdt_tensor *jdt_graph_scalar(jdt_graph *g, jdt_dtype dt, double value)
{
    return jdt_graph_full(g, dt, 0, NULL, value);
}

jdt_tensor *jdt_graph_iota(jdt_graph *g, jdt_dtype dt, int ndim, const int64_t *dims, int axis)
{
    if (ndim < 0 || ndim > JDT_MAX_DIMS || (ndim && !dims)) {
        if (g) jdt_graph_fail(g, JDT_ERR_SHAPE, "op 'iota': rank %d out of range", ndim);
        return NULL;
    }
    jdt_shape s = jdt_shape_make(ndim, dims);
    jdt_attrs a = {.i = {axis}};
    return jdt_graph_op(g, JDT_OP_IOTA, 0, NULL, &a, dt, &s);
}

jdt_tensor *jdt_graph_causal_mask(jdt_graph *g, jdt_dtype dt, int64_t seq_len)
{
    int64_t d[2] = {seq_len, seq_len};
    jdt_shape s = jdt_shape_make(2, d);
    return jdt_graph_op(g, JDT_OP_CAUSAL_MASK, 0, NULL, NULL, dt, &s);
}

/* ---- one function per op ------------------------------------------------------------------ */

static jdt_tensor *op1(jdt_graph *g, jdt_op op, jdt_tensor *x, const jdt_attrs *a)
{
    jdt_tensor *in[1] = {x};
    return jdt_graph_op(g, op, 1, in, a, JDT_DTYPE_F32, NULL);
}

static jdt_tensor *op2(jdt_graph *g, jdt_op op, jdt_tensor *x, jdt_tensor *y, const jdt_attrs *a)
{
    jdt_tensor *in[2] = {x, y};
    return jdt_graph_op(g, op, 2, in, a, JDT_DTYPE_F32, NULL);
}

#define UNARY_(fn, OP)                                                                             \
    jdt_tensor *jdt_graph_##fn(jdt_graph *g, jdt_tensor *x)                                        \
    {                                                                                              \
        return op1(g, JDT_OP_##OP, x, NULL);                                                       \
    }
UNARY_(neg, NEG)
UNARY_(exp, EXP)
UNARY_(log, LOG)
UNARY_(tanh, TANH)
UNARY_(sqrt, SQRT)
UNARY_(rsqrt, RSQRT)
UNARY_(relu, RELU)
UNARY_(gelu, GELU)
UNARY_(silu, SILU)
UNARY_(sigmoid, SIGMOID)
UNARY_(abs, ABS)
UNARY_(stop_gradient, STOP_GRADIENT)
UNARY_(softmax, SOFTMAX)
UNARY_(log_softmax, LOG_SOFTMAX)
#undef UNARY_

#define BINARY_(fn, OP)                                                                            \
    jdt_tensor *jdt_graph_##fn(jdt_graph *g, jdt_tensor *a, jdt_tensor *b)                         \
    {                                                                                              \
        return op2(g, JDT_OP_##OP, a, b, NULL);                                                    \
    }
BINARY_(add, ADD)
BINARY_(sub, SUB)
BINARY_(mul, MUL)
BINARY_(div, DIV)
BINARY_(max, MAX)
BINARY_(min, MIN)
BINARY_(gt, GT)
BINARY_(ge, GE)
BINARY_(gelu_grad, GELU_GRAD)
BINARY_(silu_grad, SILU_GRAD)
BINARY_(softmax_bwd, SOFTMAX_BWD)
BINARY_(log_softmax_bwd, LOG_SOFTMAX_BWD)
BINARY_(softmax_xent, SOFTMAX_XENT)
#undef BINARY_

bool jdt_shape_broadcast(const jdt_shape *a, const jdt_shape *b, jdt_shape *out)
{
    jdt_shape r;
    memset(&r, 0, sizeof r);
    r.ndim = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int i = 0; i < r.ndim; i++) {
        int ia = a->ndim - r.ndim + i, ib = b->ndim - r.ndim + i;
        int64_t da = ia >= 0 ? a->dims[ia] : 1, db = ib >= 0 ? b->dims[ib] : 1;
        if (da != db && da != 1 && db != 1) return false;
        r.dims[i] = da == 1 ? db : da;
    }
    *out = r;
    return true;
}

static jdt_tensor *bcast_to(jdt_graph *g, jdt_tensor *x, const jdt_shape *s)
{
    if (jdt_shape_eq(&x->shape, s)) return x;
    return jdt_graph_broadcast(g, x, s->ndim, s->dims);
}

static jdt_tensor *binary_bcast(jdt_graph *g, jdt_op op, jdt_tensor *a, jdt_tensor *b)
{
    if (!g || jdt_graph_error_msg(g)) return NULL;
    if (!a || !b) return op2(g, op, a, b, NULL); /* records the NULL-input error */
    jdt_shape s;
    if (!jdt_shape_broadcast(&a->shape, &b->shape, &s)) {
        char sa[128], sb[128];
        jdt_graph_fail(g, JDT_ERR_SHAPE, "op '%s': shapes %s and %s cannot be broadcast together",
                       jdt_op_name(op), jdt_shape_str(&a->shape, sa, sizeof sa),
                       jdt_shape_str(&b->shape, sb, sizeof sb));
        return NULL;
    }
    return op2(g, op, bcast_to(g, a, &s), bcast_to(g, b, &s), NULL);
}

#define BCAST_(fn, OP)                                                                             \
    jdt_tensor *jdt_graph_##fn##_bcast(jdt_graph *g, jdt_tensor *a, jdt_tensor *b)                 \
    {                                                                                              \
        return binary_bcast(g, JDT_OP_##OP, a, b);                                                 \
    }
BCAST_(add, ADD)
BCAST_(sub, SUB)
BCAST_(mul, MUL)
BCAST_(div, DIV)
BCAST_(max, MAX)
BCAST_(min, MIN)
#undef BCAST_

jdt_tensor *jdt_graph_add_scalar(jdt_graph *g, jdt_tensor *x, double c)
{
    jdt_attrs a = {.f = {c}};
    return op1(g, JDT_OP_ADD_SCALAR, x, &a);
}

jdt_tensor *jdt_graph_mul_scalar(jdt_graph *g, jdt_tensor *x, double c)
{
    jdt_attrs a = {.f = {c}};
    return op1(g, JDT_OP_MUL_SCALAR, x, &a);
}

jdt_tensor *jdt_graph_pow_scalar(jdt_graph *g, jdt_tensor *x, double p)
{
    jdt_attrs a = {.f = {p}};
    return op1(g, JDT_OP_POW_SCALAR, x, &a);
}

jdt_tensor *jdt_graph_select(jdt_graph *g, jdt_tensor *cond, jdt_tensor *a, jdt_tensor *b)
{
    jdt_tensor *in[3] = {cond, a, b};
    return jdt_graph_op(g, JDT_OP_SELECT, 3, in, NULL, JDT_DTYPE_F32, NULL);
}

jdt_tensor *jdt_graph_cast(jdt_graph *g, jdt_tensor *x, jdt_dtype dt)
{
    jdt_tensor *in[1] = {x};
    return jdt_graph_op(g, JDT_OP_CAST, 1, in, NULL, dt, NULL);
}

jdt_tensor *jdt_graph_dropout(jdt_graph *g, jdt_tensor *x, jdt_tensor *step, double rate,
                              uint64_t key)
{
    jdt_attrs a = {.i = {(int64_t)key}, .f = {rate}};
    return op2(g, JDT_OP_DROPOUT, x, step, &a);
}

jdt_tensor *jdt_graph_dropout_rows(jdt_graph *g, jdt_tensor *x, jdt_tensor *step, jdt_tensor *row0,
                                   double rate, uint64_t key)
{
    if (!x || !step || !row0) return NULL;
    jdt_attrs a = {.i = {(int64_t)key}, .f = {rate}};
    if (x->shape.ndim > 6) {
        jdt_graph_fail(g, JDT_ERR_SHAPE, "dropout: at most 6 dims with a row offset");
        return NULL;
    }
    int64_t stride = 1;
    for (int d = x->shape.ndim - 1; d >= 0; d--) {
        a.i[2 + d] = stride;
        stride *= x->shape.dims[d];
    }
    jdt_tensor *in[3] = {x, step, row0};
    return jdt_graph_op(g, JDT_OP_DROPOUT, 3, in, &a, x->dtype, NULL);
}

jdt_tensor *jdt_graph_broadcast(jdt_graph *g, jdt_tensor *x, int ndim, const int64_t *dims)
{
    if (ndim < 0 || ndim > JDT_MAX_DIMS || (ndim > 0 && !dims)) {
        if (g)
            jdt_graph_fail(g, JDT_ERR_SHAPE, "op 'broadcast': rank %d out of range (or dims NULL)",
                           ndim);
        return NULL;
    }
    jdt_shape s = jdt_shape_make(ndim, dims);
    jdt_tensor *in[1] = {x};
    return jdt_graph_op(g, JDT_OP_BROADCAST, 1, in, NULL, JDT_DTYPE_F32, &s);
}

static jdt_tensor *reduce(jdt_graph *g, jdt_op op, jdt_tensor *x, uint32_t mask, bool keepdims)
{
    jdt_attrs a = {.i = {(int64_t)mask, keepdims ? 1 : 0}};
    return op1(g, op, x, &a);
}

jdt_tensor *jdt_graph_reduce_sum(jdt_graph *g, jdt_tensor *x, uint32_t axes_mask, bool keepdims)
{
    return reduce(g, JDT_OP_REDUCE_SUM, x, axes_mask, keepdims);
}

jdt_tensor *jdt_graph_reduce_max(jdt_graph *g, jdt_tensor *x, uint32_t axes_mask, bool keepdims)
{
    return reduce(g, JDT_OP_REDUCE_MAX, x, axes_mask, keepdims);
}

jdt_tensor *jdt_graph_reduce_mean(jdt_graph *g, jdt_tensor *x, uint32_t axes_mask, bool keepdims)
{
    return reduce(g, JDT_OP_REDUCE_MEAN, x, axes_mask, keepdims);
}

jdt_tensor *jdt_graph_reshape(jdt_graph *g, jdt_tensor *x, int ndim, const int64_t *dims)
{
    if (ndim < 0 || ndim > JDT_MAX_DIMS || (ndim > 0 && !dims)) {
        if (g)
            jdt_graph_fail(g, JDT_ERR_SHAPE, "op 'reshape': rank %d out of range (or dims NULL)",
                           ndim);
        return NULL;
    }
    jdt_shape s = jdt_shape_make(ndim, dims);
    jdt_tensor *in[1] = {x};
    return jdt_graph_op(g, JDT_OP_RESHAPE, 1, in, NULL, JDT_DTYPE_F32, &s);
}

jdt_tensor *jdt_graph_transpose(jdt_graph *g, jdt_tensor *x, const int *perm)
{
    jdt_attrs a;
    memset(&a, 0, sizeof a);
    if (x && !perm) {
        if (g) jdt_graph_fail(g, JDT_ERR_INVALID, "op 'transpose': perm is NULL");
        return NULL;
    }
    for (int k = 0; x && k < x->shape.ndim; k++)
        a.i[k] = perm[k];
    return op1(g, JDT_OP_TRANSPOSE, x, &a);
}

jdt_tensor *jdt_graph_slice(jdt_graph *g, jdt_tensor *x, int axis, int64_t start, int64_t stop)
{
    jdt_attrs a = {.i = {axis, start, stop}};
    return op1(g, JDT_OP_SLICE, x, &a);
}

jdt_tensor *jdt_graph_concat(jdt_graph *g, int n, jdt_tensor *const *xs, int axis)
{
    jdt_attrs a = {.i = {axis}};
    return jdt_graph_op(g, JDT_OP_CONCAT, n, xs, &a, JDT_DTYPE_F32, NULL);
}

jdt_tensor *jdt_graph_matmul(jdt_graph *g, jdt_tensor *a, jdt_tensor *b, bool ta, bool tb)
{
    /* a bf16 operand means bf16 compute (graph.h, MATMUL) */
    bool bf16 = jdt_graph_matmul_bf16(g) || (a && a->dtype == JDT_DTYPE_BF16) ||
                (b && b->dtype == JDT_DTYPE_BF16);
    jdt_attrs at = {.i = {ta ? 1 : 0, tb ? 1 : 0, bf16 ? 1 : 0}};
    return op2(g, JDT_OP_MATMUL, a, b, &at);
}

jdt_tensor *jdt_graph_gather(jdt_graph *g, jdt_tensor *table, jdt_tensor *idx)
{
    return op2(g, JDT_OP_GATHER, table, idx, NULL);
}

jdt_tensor *jdt_graph_scatter_add(jdt_graph *g, jdt_tensor *src, jdt_tensor *idx, int64_t n_rows)
{
    jdt_attrs a = {.i = {n_rows}};
    return op2(g, JDT_OP_SCATTER_ADD, src, idx, &a);
}

jdt_tensor *jdt_graph_softmax_xent_bwd(jdt_graph *g, jdt_tensor *logits, jdt_tensor *targets,
                                       jdt_tensor *dloss, jdt_tensor *loss)
{
    if (!loss && !(loss = jdt_graph_softmax_xent(g, logits, targets))) return NULL;
    jdt_tensor *in[4] = {logits, targets, dloss, loss};
    return jdt_graph_op(g, JDT_OP_SOFTMAX_XENT_BWD, 4, in, NULL, JDT_DTYPE_F32, NULL);
}

jdt_tensor *jdt_graph_normalize(jdt_graph *g, jdt_tensor *x, double eps)
{
    jdt_attrs a = {.f = {eps}};
    return op1(g, JDT_OP_NORMALIZE, x, &a);
}

jdt_tensor *jdt_graph_normalize_bwd(jdt_graph *g, jdt_tensor *x, jdt_tensor *dxhat, double eps)
{
    jdt_attrs a = {.f = {eps}};
    return op2(g, JDT_OP_NORMALIZE_BWD, x, dxhat, &a);
}

jdt_tensor *jdt_graph_rms_normalize(jdt_graph *g, jdt_tensor *x, double eps)
{
    jdt_attrs a = {.f = {eps}};
    return op1(g, JDT_OP_RMS_NORMALIZE, x, &a);
}

jdt_tensor *jdt_graph_rms_normalize_bwd(jdt_graph *g, jdt_tensor *x, jdt_tensor *dxhat, double eps)
{
    jdt_attrs a = {.f = {eps}};
    return op2(g, JDT_OP_RMS_NORMALIZE_BWD, x, dxhat, &a);
}

jdt_tensor *jdt_graph_rope(jdt_graph *g, jdt_tensor *x, double theta, bool inverse)
{
    return jdt_graph_rope_scaled(g, x, theta, inverse, NULL);
}

jdt_tensor *jdt_graph_rope_scaled(jdt_graph *g, jdt_tensor *x, double theta, bool inverse,
                                  const double *sc)
{
    jdt_attrs a = {.i = {inverse ? 1 : 0}, .f = {theta}};
    if (sc && sc[0] > 0) {
        a.f[1] = sc[0];
        a.f[2] = sc[1];
        a.f[3] = sc[2];
        a.i[3] = (int64_t)sc[3];
    }
    return op1(g, JDT_OP_ROPE, x, &a);
}

jdt_tensor *jdt_graph_attention(jdt_graph *g, jdt_tensor *q, jdt_tensor *k, jdt_tensor *v,
                                double scale)
{
    jdt_tensor *in[3] = {q, k, v};
    jdt_attrs a = {.i = {jdt_graph_matmul_bf16(g) ? 1 : 0}, .f = {scale}};
    return jdt_graph_op(g, JDT_OP_ATTENTION, 3, in, &a, JDT_DTYPE_F32, NULL);
}

jdt_tensor *jdt_graph_attention_bwd(jdt_graph *g, jdt_tensor *q, jdt_tensor *k, jdt_tensor *v,
                                    jdt_tensor *o, jdt_tensor *dout, double scale)
{
    jdt_tensor *in[5] = {q, k, v, o, dout};
    jdt_attrs a = {.i = {jdt_graph_matmul_bf16(g) ? 1 : 0}, .f = {scale}};
    return jdt_graph_op(g, JDT_OP_ATTENTION_BWD, 5, in, &a, JDT_DTYPE_F32, NULL);
}

jdt_tensor *jdt_graph_unbroadcast(jdt_graph *g, jdt_tensor *dx, const jdt_shape *shape)
{
    if (!dx || jdt_shape_eq(&dx->shape, shape)) return dx;
    int lead = dx->shape.ndim - shape->ndim;
    uint32_t mask = 0;
    for (int i = 0; i < dx->shape.ndim; i++)
        if (i < lead || (shape->dims[i - lead] == 1 && dx->shape.dims[i] != 1)) mask |= 1u << i;
    jdt_tensor *r = mask ? jdt_graph_reduce_sum(g, dx, mask, false) : dx;
    return jdt_graph_reshape(g, r, shape->ndim, shape->dims);
}

void jdt_graph_fprint(const jdt_graph *g, FILE *f)
{
    for (int i = 0; i < jdt_graph_n_nodes(g); i++) {
        const jdt_tensor *t = jdt_graph_node(g, i);
        char sh[128];
        fprintf(f, "  %%%d = %s(", t->id, jdt_op_name(t->op));
        for (int k = 0; k < t->n_inputs; k++)
            fprintf(f, "%s%%%d", k ? ", " : "", t->inputs[k]->id);
        fprintf(f, ")");
        const jdt_attrs *a = &t->attrs;
        bool any_i = false, any_f = false;
        for (size_t k = 0; k < JDT_ARRAY_LEN(a->i); k++)
            any_i |= a->i[k] != 0;
        for (size_t k = 0; k < JDT_ARRAY_LEN(a->f); k++)
            any_f |= a->f[k] != 0;
        if (any_i)
            fprintf(f, " i=[%lld %lld %lld %lld]", (long long)a->i[0], (long long)a->i[1],
                    (long long)a->i[2], (long long)a->i[3]);
        if (any_f) fprintf(f, " f=[%g %g]", a->f[0], a->f[1]);
        fprintf(f, " : %s %s", jdt_shape_str(&t->shape, sh, sizeof sh), jdt_dtype_name(t->dtype));
        bool named = false;
        for (int d = 0; d < t->shape.ndim; d++)
            named |= t->axes[d] != NULL;
        if (named) {
            fprintf(f, " [");
            for (int d = 0; d < t->shape.ndim; d++)
                fprintf(f, "%s%s", d ? ", " : "", t->axes[d] ? t->axes[d] : "_");
            fprintf(f, "]");
        }
        if (t->name) fprintf(f, " '%s'", t->name);
        if (t->flags & JDT_TENSOR_STATE) fprintf(f, " state");
        fprintf(f, "\n");
    }
    for (int i = 0; i < jdt_graph_n_outputs(g); i++)
        fprintf(f, "  output %d: %%%d\n", i, jdt_graph_output(g, i)->id);
    for (int i = 0; i < jdt_graph_n_updates(g); i++) {
        jdt_tensor *target, *value;
        jdt_graph_update(g, i, &target, &value);
        fprintf(f, "  update '%s' <- %%%d\n", target->name ? target->name : "?", value->id);
    }
}

jdt_status jdt_graph_verify(const jdt_graph *g, jdt_err *e)
{
    if (!g) return jdt_err_set(e, JDT_ERR_INVALID, "verify: graph is NULL");
    for (int i = 0; i < jdt_graph_n_nodes(g); i++) {
        jdt_tensor *t = jdt_graph_node(g, i);
        if ((int)t->op < 0 || (int)t->op >= JDT_OP_COUNT)
            return jdt_err_set(e, JDT_ERR_INVALID, "verify: node %d has unknown op %d", i,
                               (int)t->op);
        const jdt_op_info *info = jdt_op_info_get(t->op);
        if (t->id != i)
            return jdt_err_set(e, JDT_ERR_INVALID, "verify: node %d (%s) has id %d", i, info->name,
                               t->id);
        if (info->arity >= 0 ? t->n_inputs != info->arity
                             : (t->n_inputs < 1 || t->n_inputs > JDT_MAX_INPUTS))
            return jdt_err_set(e, JDT_ERR_INVALID, "verify: node %d (%s) has %d inputs, expects %d",
                               i, info->name, t->n_inputs, info->arity);
        for (int k = 0; k < t->n_inputs; k++) {
            const jdt_tensor *in = t->inputs[k];
            if (!in || !belongs(g, in) || in->id >= i)
                return jdt_err_set(
                    e, JDT_ERR_INVALID,
                    "verify: node %d (%s): input %d is not an earlier node of this graph", i,
                    info->name, k);
        }
        jdt_dtype dt = t->dtype;
        jdt_shape s = t->shape;
        char why[256], a[128], b[128];
        if (!info->shape(t->inputs, t->n_inputs, &t->attrs, &dt, &s, why, sizeof why))
            return jdt_err_set(e, JDT_ERR_SHAPE, "verify: node %d (%s): %s", i, info->name, why);
        if (dt != t->dtype || !jdt_shape_eq(&s, &t->shape))
            return jdt_err_set(
                e, JDT_ERR_SHAPE, "verify: node %d (%s) stores %s %s but its inputs give %s %s", i,
                info->name, jdt_shape_str(&t->shape, a, sizeof a), jdt_dtype_name(t->dtype),
                jdt_shape_str(&s, b, sizeof b), jdt_dtype_name(dt));
    }
    return JDT_OK;
}

jdt_tensor *jdt_graph_all_reduce(jdt_graph *g, jdt_tensor *x, int group, int reduce_op,
                                 double scale)
{
    jdt_attrs a;
    memset(&a, 0, sizeof a);
    a.i[0] = group;
    a.i[1] = reduce_op;
    a.f[0] = scale;
    jdt_tensor *in[1] = {x};
    return jdt_graph_op(g, JDT_OP_ALL_REDUCE, 1, in, &a, x ? x->dtype : JDT_DTYPE_F32, NULL);
}

jdt_tensor *jdt_graph_all_gather(jdt_graph *g, jdt_tensor *x, int group, int k, int axis)
{
    jdt_attrs a;
    memset(&a, 0, sizeof a);
    a.i[0] = group;
    a.i[1] = axis;
    a.i[2] = k;
    a.f[0] = 1.0;
    jdt_tensor *in[1] = {x};
    return jdt_graph_op(g, JDT_OP_ALL_GATHER, 1, in, &a, x ? x->dtype : JDT_DTYPE_F32, NULL);
}

jdt_tensor *jdt_graph_reduce_scatter(jdt_graph *g, jdt_tensor *x, int group, int k, int axis,
                                     double scale)
{
    jdt_attrs a;
    memset(&a, 0, sizeof a);
    a.i[0] = group;
    a.i[1] = axis;
    a.i[2] = k;
    a.f[0] = scale;
    jdt_tensor *in[1] = {x};
    return jdt_graph_op(g, JDT_OP_REDUCE_SCATTER, 1, in, &a, x ? x->dtype : JDT_DTYPE_F32, NULL);
}
