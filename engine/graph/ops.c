/*
 * ops.c — the op registry: for every op of JDT_OP_LIST its shape rule (checked by the builder on
 * every node), next to it its VJP rule (used by engine/autodiff) and its partition kind (how
 * engine/shard splits it over a mesh). The table is generated from JDT_OP_LIST with functions
 * named shape_<OP> and vjp_<OP> and kinds named part_<OP>, so an op added to the list without
 * all three does not compile; non-differentiable ops define vjp_<OP> as NULL and ops the
 * partitioner never sees define part_<OP> as JDT_PART_NONE, explicitly.
 *
 * Beside them, each op's flags_<OP>: the JDT_OPF_* yes/no properties passes and backends ask of
 * it (graph.h), 0 where it has none, also written out for every op.
 *
 * VJP rules only build nodes with the public builder API (builder.h); they never compute.
 */
#include "graph/ops-impl.h"

#include "graph/builder.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define WHY(...) (snprintf(why, n_why, __VA_ARGS__), false)

/* ---- shape-rule helpers -------------------------------------------------------------------- */

/* f32 and f64: the dtypes every float op accepts (reductions, row ops, index ops, collectives) */
static bool is_float(jdt_dtype dt)
{
    return dt == JDT_DTYPE_F32 || dt == JDT_DTYPE_F64;
}
static bool is_num(jdt_dtype dt)
{
    return is_float(dt) || dt == JDT_DTYPE_I32;
}
/* is_float or bf16: elementwise ops, shape ops and MATMUL operands also take bf16 (computed in
 * f32, the result rounded to bf16 where it is a bf16 node) */
static bool is_real(jdt_dtype dt)
{
    return is_float(dt) || dt == JDT_DTYPE_BF16;
}

static bool valid_shape(const jdt_shape *s, char *why, size_t n_why)
{
    if (s->ndim < 0 || s->ndim > JDT_MAX_DIMS)
        return WHY("rank %d out of range 0..%d", s->ndim, JDT_MAX_DIMS);
    for (int i = 0; i < s->ndim; i++)
        if (s->dims[i] <= 0) return WHY("dim %d is %lld (must be > 0)", i, (long long)s->dims[i]);
    return true;
}

/* All inputs float (bf16 too when allow_bf16), same dtype and same shape; result = input 0. */
static bool same_float_ex(jdt_tensor *const *in, int n_in, bool allow_bf16, jdt_dtype *dt,
                          jdt_shape *out, char *why, size_t n_why)
{
    for (int i = 0; i < n_in; i++) {
        if (!(allow_bf16 ? is_real(in[i]->dtype) : is_float(in[i]->dtype)))
            return WHY("input %d has dtype %s, expected f32 or f64%s", i,
                       jdt_dtype_name(in[i]->dtype),
                       in[i]->dtype == JDT_DTYPE_BF16 ? " (cast bf16 to f32 first)" : "");
        if (in[i]->dtype != in[0]->dtype) return WHY("inputs have different dtypes");
        if (!jdt_shape_eq(&in[i]->shape, &in[0]->shape))
            return WHY("input %d's shape differs from input 0's (use the _bcast helpers)", i);
    }
    *dt = in[0]->dtype;
    *out = in[0]->shape;
    return true;
}

static bool same_float(jdt_tensor *const *in, int n_in, jdt_dtype *dt, jdt_shape *out, char *why,
                       size_t n_why)
{
    return same_float_ex(in, n_in, false, dt, out, why, n_why);
}

/* Elementwise ops: f32, f64 or bf16 (all inputs one dtype; the builder promotes a bf16 input
 * mixed with f32/f64 ones by a CAST, builder.c promote_inputs). */
static bool shape_elementwise(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                              jdt_shape *out, char *why, size_t n_why)
{
    return same_float_ex(in, n_in, true, dt, out, why, n_why);
}

/* Row ops work on the last axis: rank >= 1. */
static bool shape_rows(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                       jdt_shape *out, char *why, size_t n_why)
{
    if (!same_float(in, n_in, dt, out, why, n_why)) return false;
    if (out->ndim < 1) return WHY("needs rank >= 1 (works on the last axis)");
    return true;
}

static bool shape_leaf(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                       jdt_shape *out, char *why, size_t n_why)
{
    if ((int)*dt < 0 || *dt >= JDT_DTYPE_COUNT) return WHY("unknown dtype %d", (int)*dt);
    return valid_shape(out, why, n_why);
}

#define shape_PARAM shape_leaf
#define shape_INPUT shape_leaf
#define shape_CONSTANT shape_leaf
#define shape_NEG shape_elementwise
#define shape_EXP shape_elementwise
#define shape_LOG shape_elementwise
#define shape_TANH shape_elementwise
#define shape_SQRT shape_elementwise
#define shape_RSQRT shape_elementwise
#define shape_RELU shape_elementwise
#define shape_GELU shape_elementwise
#define shape_SILU shape_elementwise
#define shape_SIGMOID shape_elementwise
#define shape_ABS shape_elementwise
#define shape_ADD shape_elementwise
#define shape_SUB shape_elementwise
#define shape_MUL shape_elementwise
#define shape_DIV shape_elementwise
#define shape_MAX shape_elementwise
#define shape_MIN shape_elementwise
#define shape_GT shape_elementwise
#define shape_GE shape_elementwise
#define shape_ADD_SCALAR shape_elementwise
#define shape_MUL_SCALAR shape_elementwise
#define shape_POW_SCALAR shape_elementwise
#define shape_GELU_GRAD shape_elementwise
#define shape_SILU_GRAD shape_elementwise
#define shape_SOFTMAX shape_rows
#define shape_SOFTMAX_BWD shape_rows
#define shape_LOG_SOFTMAX shape_rows
#define shape_LOG_SOFTMAX_BWD shape_rows
#define shape_NORMALIZE shape_rows
#define shape_NORMALIZE_BWD shape_rows
#define shape_RMS_NORMALIZE shape_rows
#define shape_RMS_NORMALIZE_BWD shape_rows

static bool shape_SELECT(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                         jdt_shape *out, char *why, size_t n_why)
{
    if (!is_num(in[0]->dtype) && in[0]->dtype != JDT_DTYPE_BF16)
        return WHY("condition dtype %s unsupported", jdt_dtype_name(in[0]->dtype));
    if (!jdt_shape_eq(&in[0]->shape, &in[1]->shape)) return WHY("condition shape differs from a's");
    return same_float_ex(in + 1, 2, true, dt, out, why, n_why);
}

static bool shape_CAST(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                       jdt_shape *out, char *why, size_t n_why)
{
    jdt_dtype from = in[0]->dtype, to = *dt;
    bool bf16 = from == JDT_DTYPE_BF16 || to == JDT_DTYPE_BF16;
    if (bf16 ? !(is_real(from) && is_real(to)) : !(is_num(from) && is_num(to)))
        return WHY("cast %s -> %s unsupported (f32, f64, i32; bf16 <-> f32, f64)",
                   jdt_dtype_name(from), jdt_dtype_name(to));
    *out = in[0]->shape;
    return true;
}

static bool shape_STOP_GRADIENT(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                                jdt_shape *out, char *why, size_t n_why)
{
    *dt = in[0]->dtype;
    *out = in[0]->shape;
    return true;
}

static bool shape_DROPOUT(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                          jdt_shape *out, char *why, size_t n_why)
{
    if (!same_float_ex(in, 1, true, dt, out, why, n_why)) return false;
    if (in[1]->dtype != JDT_DTYPE_I32 || in[1]->shape.ndim != 0)
        return WHY("step must be an i32 scalar (rank 0)");
    if (n_in > 4) return WHY("at most 4 inputs (x, step, row0, base)");
    for (int k = 2; k < n_in; k++)
        if (in[k]->dtype != JDT_DTYPE_F64 || in[k]->shape.ndim != 0)
            return WHY("%s must be an f64 scalar (rank 0)", k == 2 ? "row0" : "base");
    if (n_in > 2 && in[0]->shape.ndim > 6) return WHY("a row-numbered dropout takes at most 6 dims");
    if (!(a->f[0] >= 0.0 && a->f[0] < 1.0)) return WHY("rate %g not in [0, 1)", a->f[0]);
    return true;
}

static bool shape_BROADCAST(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                            jdt_shape *out, char *why, size_t n_why)
{
    const jdt_shape *s = &in[0]->shape;
    if (!valid_shape(out, why, n_why)) return false;
    if (out->ndim < s->ndim) return WHY("target rank %d < input rank %d", out->ndim, s->ndim);
    for (int i = 0; i < s->ndim; i++) {
        int64_t d = s->dims[s->ndim - 1 - i], o = out->dims[out->ndim - 1 - i];
        if (d != 1 && d != o)
            return WHY("dim %d of size %lld cannot expand to %lld", s->ndim - 1 - i, (long long)d,
                       (long long)o);
    }
    *dt = in[0]->dtype;
    return true;
}

static bool shape_reduce(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                         jdt_shape *out, char *why, size_t n_why)
{
    const jdt_shape *s = &in[0]->shape;
    if (!is_float(in[0]->dtype))
        return WHY("dtype %s, expected f32 or f64", jdt_dtype_name(in[0]->dtype));
    if (a->i[0] < 0 || a->i[0] >= (1 << s->ndim))
        return WHY("axes mask 0x%llx names axes beyond rank %d", (long long)a->i[0], s->ndim);
    if (a->i[1] != 0 && a->i[1] != 1) return WHY("keepdims must be 0 or 1");
    out->ndim = 0;
    for (int i = 0; i < s->ndim; i++) {
        if (a->i[0] & (1 << i)) {
            if (a->i[1]) out->dims[out->ndim++] = 1;
        } else {
            out->dims[out->ndim++] = s->dims[i];
        }
    }
    *dt = in[0]->dtype;
    return true;
}
#define shape_REDUCE_SUM shape_reduce
#define shape_REDUCE_MAX shape_reduce
#define shape_REDUCE_MEAN shape_reduce

static bool shape_RESHAPE(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                          jdt_shape *out, char *why, size_t n_why)
{
    if (!valid_shape(out, why, n_why)) return false;
    if (jdt_shape_numel(out) != jdt_shape_numel(&in[0]->shape))
        return WHY("element count %lld != %lld", (long long)jdt_shape_numel(&in[0]->shape),
                   (long long)jdt_shape_numel(out));
    *dt = in[0]->dtype;
    return true;
}

static bool shape_TRANSPOSE(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                            jdt_shape *out, char *why, size_t n_why)
{
    const jdt_shape *s = &in[0]->shape;
    int seen = 0;
    out->ndim = s->ndim;
    for (int k = 0; k < s->ndim; k++) {
        int64_t p = a->i[k];
        if (p < 0 || p >= s->ndim || (seen & (1 << p)))
            return WHY("perm is not a permutation of 0..%d", s->ndim - 1);
        seen |= 1 << p;
        out->dims[k] = s->dims[p];
    }
    *dt = in[0]->dtype;
    return true;
}

static bool shape_SLICE(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                        jdt_shape *out, char *why, size_t n_why)
{
    const jdt_shape *s = &in[0]->shape;
    int64_t ax = a->i[0], lo = a->i[1], hi = a->i[2];
    if (ax < 0 || ax >= s->ndim)
        return WHY("axis %lld out of range for rank %d", (long long)ax, s->ndim);
    if (lo < 0 || hi > s->dims[ax] || lo >= hi)
        return WHY("range [%lld, %lld) invalid for dim of size %lld", (long long)lo, (long long)hi,
                   (long long)s->dims[ax]);
    *out = *s;
    out->dims[ax] = hi - lo;
    *dt = in[0]->dtype;
    return true;
}

static bool shape_CONCAT(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                         jdt_shape *out, char *why, size_t n_why)
{
    int64_t ax = a->i[0];
    const jdt_shape *s = &in[0]->shape;
    if (ax < 0 || ax >= s->ndim)
        return WHY("axis %lld out of range for rank %d", (long long)ax, s->ndim);
    if (in[0]->dtype == JDT_DTYPE_BF16) return WHY("bf16 inputs unsupported (cast to f32)");
    *out = *s;
    for (int k = 1; k < n_in; k++) {
        const jdt_shape *t = &in[k]->shape;
        if (in[k]->dtype != in[0]->dtype) return WHY("input %d has a different dtype", k);
        if (in[k]->dtype == JDT_DTYPE_BF16) return WHY("bf16 inputs unsupported (cast to f32)");
        if (t->ndim != s->ndim)
            return WHY("input %d has rank %d, input 0 rank %d", k, t->ndim, s->ndim);
        for (int i = 0; i < s->ndim; i++)
            if (i != ax && t->dims[i] != s->dims[i])
                return WHY("input %d differs from input 0 in dim %d (not the concat axis)", k, i);
        out->dims[ax] += t->dims[ax];
    }
    *dt = in[0]->dtype;
    return true;
}

static bool shape_MATMUL(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                         jdt_shape *out, char *why, size_t n_why)
{
    const jdt_shape *sa = &in[0]->shape, *sb = &in[1]->shape;
    jdt_dtype da = in[0]->dtype, db = in[1]->dtype;
    bool bf16 = da == JDT_DTYPE_BF16 || db == JDT_DTYPE_BF16;
    if (bf16) { /* a bf16 operand: bf16 compute, the other operand f32 or bf16, output f32 */
        if (!(da == JDT_DTYPE_BF16 || da == JDT_DTYPE_F32) ||
            !(db == JDT_DTYPE_BF16 || db == JDT_DTYPE_F32))
            return WHY("a bf16 operand needs a bf16 or f32 other operand");
        if (!a->i[2]) return WHY("bf16 operands need bf16 compute (attrs i[2] = 1)");
    } else if (!is_float(da) || da != db) {
        return WHY("operands must share a float dtype");
    }
    if (sa->ndim < 2 || sb->ndim < 2) return WHY("operands need rank >= 2");
    if (sb->ndim != 2) {
        if (sa->ndim != sb->ndim)
            return WHY("batch ranks differ (b must be 2-D or match a's batch)");
        for (int i = 0; i < sa->ndim - 2; i++)
            if (sa->dims[i] != sb->dims[i]) return WHY("batch dim %d differs", i);
    }
    int64_t m = sa->dims[sa->ndim - (a->i[0] ? 1 : 2)], ka = sa->dims[sa->ndim - (a->i[0] ? 2 : 1)];
    int64_t kb = sb->dims[sb->ndim - (a->i[1] ? 1 : 2)], n = sb->dims[sb->ndim - (a->i[1] ? 2 : 1)];
    if (ka != kb) return WHY("contraction dims differ: %lld vs %lld", (long long)ka, (long long)kb);
    *out = *sa;
    out->dims[sa->ndim - 2] = m;
    out->dims[sa->ndim - 1] = n;
    *dt = bf16 ? JDT_DTYPE_F32 : in[0]->dtype;
    return true;
}

static bool shape_GATHER(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                         jdt_shape *out, char *why, size_t n_why)
{
    const jdt_shape *st = &in[0]->shape, *si = &in[1]->shape;
    if (st->ndim != 2 || !is_float(in[0]->dtype)) return WHY("table must be a 2-D float (V, C)");
    if (in[1]->dtype != JDT_DTYPE_I32) return WHY("indices must be i32");
    if (si->ndim + 1 > JDT_MAX_DIMS) return WHY("indices rank too large");
    *out = *si;
    out->dims[out->ndim++] = st->dims[1];
    *dt = in[0]->dtype;
    return true;
}

static bool shape_SCATTER_ADD(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                              jdt_shape *out, char *why, size_t n_why)
{
    const jdt_shape *ss = &in[0]->shape, *si = &in[1]->shape;
    if (ss->ndim < 1 || !is_float(in[0]->dtype)) return WHY("src must be float with rank >= 1");
    if (in[1]->dtype != JDT_DTYPE_I32) return WHY("indices must be i32");
    if (si->ndim != ss->ndim - 1) return WHY("indices shape must be src's without the last dim");
    for (int i = 0; i < si->ndim; i++)
        if (si->dims[i] != ss->dims[i])
            return WHY("indices shape must be src's without the last dim");
    if (a->i[0] <= 0) return WHY("row count %lld must be > 0", (long long)a->i[0]);
    out->ndim = 2;
    out->dims[0] = a->i[0];
    out->dims[1] = ss->dims[ss->ndim - 1];
    *dt = in[0]->dtype;
    return true;
}

static bool shape_IOTA(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                       jdt_shape *out, char *why, size_t n_why)
{
    if (!valid_shape(out, why, n_why)) return false;
    if (!is_num(*dt)) return WHY("dtype %s unsupported", jdt_dtype_name(*dt));
    if (a->i[0] < 0 || a->i[0] >= out->ndim)
        return WHY("axis %lld out of range", (long long)a->i[0]);
    return true;
}

static bool shape_CAUSAL_MASK(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                              jdt_shape *out, char *why, size_t n_why)
{
    if (!valid_shape(out, why, n_why)) return false;
    if (!is_float(*dt)) return WHY("dtype must be f32 or f64");
    if (out->ndim != 2 || out->dims[0] != out->dims[1]) return WHY("shape must be (T, T)");
    return true;
}

static bool shape_SOFTMAX_XENT(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                               jdt_shape *out, char *why, size_t n_why)
{
    /* logits (..., V), one target per row: targets, dloss and loss have the logits' leading
     * dims (N = their product) */
    const jdt_shape *sl = &in[0]->shape, *st = &in[1]->shape;
    if (sl->ndim < 2 || !is_float(in[0]->dtype))
        return WHY("logits must be a float (..., V) of rank >= 2");
    bool rows = st->ndim == sl->ndim - 1;
    for (int d = 0; rows && d < st->ndim; d++) rows = st->dims[d] == sl->dims[d];
    if (in[1]->dtype != JDT_DTYPE_I32 || !rows)
        return WHY("targets must be i32 of the logits' shape without its last dim");
    if (n_in == 4) {
        for (int k = 2; k < 4; k++) {
            bool same = in[k]->dtype == in[0]->dtype && in[k]->shape.ndim == st->ndim;
            for (int d = 0; same && d < st->ndim; d++) same = in[k]->shape.dims[d] == st->dims[d];
            if (!same) return WHY("%s must have the targets' shape and the logits' dtype", k == 2 ? "dloss" : "loss");
        }
        *out = *sl;
    } else {
        *out = *st;
    }
    *dt = in[0]->dtype;
    return true;
}
#define shape_SOFTMAX_XENT_BWD shape_SOFTMAX_XENT

static bool shape_ROPE(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                       jdt_shape *out, char *why, size_t n_why)
{
    if (!same_float(in, 1, dt, out, why, n_why)) return false;
    if (out->ndim != 4 || out->dims[3] % 2) return WHY("x must be (B, T, H, D) with D even");
    if (!(a->f[0] > 0)) return WHY("theta %g must be > 0", a->f[0]);
    if (a->f[1] != 0 && !(a->f[1] >= 1 && a->f[2] > 0 && a->f[3] > a->f[2] && a->i[3] > 0))
        return WHY("scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor and an "
                   "original context > 0 (got %g, %g, %g, %lld)",
                   a->f[1], a->f[2], a->f[3], (long long)a->i[3]);
    return true;
}

static bool shape_ATTENTION(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                            jdt_shape *out, char *why, size_t n_why)
{
    if (!same_float(in, n_in, dt, out, why, n_why)) return false;
    if (out->ndim != 4) return WHY("q, k, v must be (B, H, T, D)");
    if (n_in == 5) {
        out->ndim = 5;
        memmove(out->dims + 1, out->dims, 4 * sizeof(int64_t));
        out->dims[0] = 3;
    }
    return true;
}
#define shape_ATTENTION_BWD shape_ATTENTION

/* ---- VJP rules ------------------------------------------------------------------------------ */

#define vjp_PARAM NULL
#define vjp_INPUT NULL
#define vjp_CONSTANT NULL
#define vjp_GT NULL
#define vjp_GE NULL
#define vjp_IOTA NULL
#define vjp_CAUSAL_MASK NULL
/* Fused backward ops are not differentiated again (no second order). */
#define vjp_GELU_GRAD NULL
#define vjp_SILU_GRAD NULL
#define vjp_SOFTMAX_BWD NULL
#define vjp_LOG_SOFTMAX_BWD NULL
#define vjp_SOFTMAX_XENT_BWD NULL
#define vjp_NORMALIZE_BWD NULL
#define vjp_RMS_NORMALIZE_BWD NULL
#define vjp_ATTENTION_BWD NULL

#define IN(k) (node->inputs[k])

static jdt_tensor *zeros_like(jdt_graph *g, const jdt_tensor *t)
{
    return jdt_graph_full(g, t->dtype, t->shape.ndim, t->shape.dims, 0.0);
}

static void vjp_NEG(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                    jdt_tensor **dx)
{
    dx[0] = jdt_graph_neg(g, dy);
}

static void vjp_EXP(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                    jdt_tensor **dx)
{
    dx[0] = jdt_graph_mul(g, dy, node);
}

static void vjp_LOG(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                    jdt_tensor **dx)
{
    dx[0] = jdt_graph_div(g, dy, IN(0));
}

static void vjp_TANH(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                     jdt_tensor **dx)
{
    /* dy * (1 - y^2) */
    jdt_tensor *y2 = jdt_graph_mul(g, node, node);
    dx[0] = jdt_graph_mul(g, dy, jdt_graph_add_scalar(g, jdt_graph_neg(g, y2), 1.0));
}

static void vjp_SQRT(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                     jdt_tensor **dx)
{
    dx[0] = jdt_graph_div(g, jdt_graph_mul_scalar(g, dy, 0.5), node);
}

static void vjp_RSQRT(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                      jdt_tensor **dx)
{
    /* d x^(-1/2) = -1/2 y^3 */
    jdt_tensor *y3 = jdt_graph_pow_scalar(g, node, 3.0);
    dx[0] = jdt_graph_mul(g, jdt_graph_mul_scalar(g, dy, -0.5), y3);
}

static void vjp_RELU(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                     jdt_tensor **dx)
{
    dx[0] = jdt_graph_mul(g, dy, jdt_graph_gt(g, IN(0), zeros_like(g, IN(0))));
}

static void vjp_GELU(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                     jdt_tensor **dx)
{
    dx[0] = jdt_graph_gelu_grad(g, IN(0), dy);
}

static void vjp_SILU(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                     jdt_tensor **dx)
{
    dx[0] = jdt_graph_silu_grad(g, IN(0), dy);
}

static void vjp_SIGMOID(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                        jdt_tensor **dx)
{
    jdt_tensor *one_minus = jdt_graph_add_scalar(g, jdt_graph_neg(g, node), 1.0);
    dx[0] = jdt_graph_mul(g, dy, jdt_graph_mul(g, node, one_minus));
}

static void vjp_ABS(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                    jdt_tensor **dx)
{
    /* sign(x), 0 at 0 */
    jdt_tensor *z = zeros_like(g, IN(0));
    jdt_tensor *sign = jdt_graph_sub(g, jdt_graph_gt(g, IN(0), z), jdt_graph_gt(g, z, IN(0)));
    dx[0] = jdt_graph_mul(g, dy, sign);
}

static void vjp_ADD(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                    jdt_tensor **dx)
{
    dx[0] = dy;
    dx[1] = dy;
}

static void vjp_SUB(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                    jdt_tensor **dx)
{
    dx[0] = dy;
    if (need[1]) dx[1] = jdt_graph_neg(g, dy);
}

static void vjp_MUL(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                    jdt_tensor **dx)
{
    if (need[0]) dx[0] = jdt_graph_mul(g, dy, IN(1));
    if (need[1]) dx[1] = jdt_graph_mul(g, dy, IN(0));
}

static void vjp_DIV(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                    jdt_tensor **dx)
{
    jdt_tensor *da = jdt_graph_div(g, dy, IN(1));
    dx[0] = da;
    /* d(a/b)/db = -a/b^2 = -(dy/b) * y */
    if (need[1]) dx[1] = jdt_graph_neg(g, jdt_graph_mul(g, da, node));
}

/* MAX/MIN: the gradient goes to a where a wins (ties go to a), else to b. */
static void minmax(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                   jdt_tensor **dx, bool is_max)
{
    jdt_tensor *a_wins = is_max ? jdt_graph_ge(g, IN(0), IN(1)) : jdt_graph_ge(g, IN(1), IN(0));
    if (need[0]) dx[0] = jdt_graph_mul(g, dy, a_wins);
    if (need[1])
        dx[1] = jdt_graph_mul(g, dy, jdt_graph_add_scalar(g, jdt_graph_neg(g, a_wins), 1.0));
}

static void vjp_MAX(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                    jdt_tensor **dx)
{
    minmax(g, node, dy, need, dx, true);
}

static void vjp_MIN(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                    jdt_tensor **dx)
{
    minmax(g, node, dy, need, dx, false);
}

static void vjp_ADD_SCALAR(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                           jdt_tensor **dx)
{
    dx[0] = dy;
}

static void vjp_MUL_SCALAR(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                           jdt_tensor **dx)
{
    dx[0] = jdt_graph_mul_scalar(g, dy, node->attrs.f[0]);
}

static void vjp_POW_SCALAR(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                           jdt_tensor **dx)
{
    double p = node->attrs.f[0];
    jdt_tensor *d = jdt_graph_mul_scalar(g, jdt_graph_pow_scalar(g, IN(0), p - 1.0), p);
    dx[0] = jdt_graph_mul(g, dy, d);
}

static void vjp_SELECT(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                       jdt_tensor **dx)
{
    jdt_tensor *z = zeros_like(g, dy);
    if (need[1]) dx[1] = jdt_graph_select(g, IN(0), dy, z);
    if (need[2]) dx[2] = jdt_graph_select(g, IN(0), z, dy);
}

/* Casts dy back to the input's cotangent dtype: a bf16 value's cotangent is f32
 * (jdt_dtype_cotangent), so the VJP of f32 -> bf16 passes the f32 cotangent through unrounded
 * (the gradients stay f32) and that of bf16 -> f32 is the identity too. */
static void vjp_CAST(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                     jdt_tensor **dx)
{
    if (!is_real(IN(0)->dtype) || !is_real(node->dtype) || !dy) return;
    jdt_dtype want = jdt_dtype_cotangent(IN(0)->dtype);
    dx[0] = dy->dtype == want ? dy : jdt_graph_cast(g, dy, want);
}

static void vjp_STOP_GRADIENT(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                              jdt_tensor **dx)
{
    (void)dx; /* no gradient flows through */
}

static void vjp_DROPOUT(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                        jdt_tensor **dx)
{
    jdt_tensor *in[4] = {dy, IN(1), node->n_inputs > 2 ? IN(2) : NULL,
                         node->n_inputs > 3 ? IN(3) : NULL};
    dx[0] = jdt_graph_op(g, JDT_OP_DROPOUT, node->n_inputs, in, &node->attrs, dy->dtype, NULL);
}

static void vjp_BROADCAST(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                          jdt_tensor **dx)
{
    dx[0] = jdt_graph_unbroadcast(g, dy, &IN(0)->shape);
}

/* The cotangent of a reduction, broadcast back to the input's shape. */
static jdt_tensor *unreduce(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy)
{
    const jdt_shape *s = &IN(0)->shape;
    jdt_shape kd = *s;
    for (int i = 0; i < s->ndim; i++)
        if (node->attrs.i[0] & (1 << i)) kd.dims[i] = 1;
    jdt_tensor *r = node->attrs.i[1] ? dy : jdt_graph_reshape(g, dy, kd.ndim, kd.dims);
    return jdt_graph_broadcast(g, r, s->ndim, s->dims);
}

static void vjp_REDUCE_SUM(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                           jdt_tensor **dx)
{
    dx[0] = unreduce(g, node, dy);
}

static void vjp_REDUCE_MEAN(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                            jdt_tensor **dx)
{
    int64_t n = jdt_shape_numel(&IN(0)->shape) / jdt_shape_numel(&node->shape);
    dx[0] = jdt_graph_mul_scalar(g, unreduce(g, node, dy), 1.0 / (double)n);
}

static void vjp_REDUCE_MAX(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                           jdt_tensor **dx)
{
    /* The gradient is shared equally among the elements equal to the max (as JAX does). */
    jdt_tensor *mx = unreduce(g, node, node);
    jdt_tensor *hit = jdt_graph_ge(g, IN(0), mx);
    jdt_attrs a = node->attrs;
    a.i[1] = 1;
    jdt_tensor *cnt = jdt_graph_op(g, JDT_OP_REDUCE_SUM, 1, &hit, &a, hit ? hit->dtype : 0, NULL);
    jdt_tensor *cntb =
        cnt ? jdt_graph_broadcast(g, cnt, IN(0)->shape.ndim, IN(0)->shape.dims) : NULL;
    dx[0] = jdt_graph_div(g, jdt_graph_mul(g, unreduce(g, node, dy), hit), cntb);
}

static void vjp_RESHAPE(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                        jdt_tensor **dx)
{
    dx[0] = jdt_graph_reshape(g, dy, IN(0)->shape.ndim, IN(0)->shape.dims);
}

static void vjp_TRANSPOSE(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                          jdt_tensor **dx)
{
    int inv[JDT_MAX_DIMS];
    for (int k = 0; k < node->shape.ndim; k++)
        inv[node->attrs.i[k]] = k;
    dx[0] = jdt_graph_transpose(g, dy, inv);
}

static void vjp_SLICE(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                      jdt_tensor **dx)
{
    /* zero-pad dy back to the input's extent along the axis */
    int ax = (int)node->attrs.i[0];
    int64_t lo = node->attrs.i[1], hi = node->attrs.i[2], full = IN(0)->shape.dims[ax];
    jdt_tensor *parts[3];
    int n = 0;
    jdt_shape s = dy->shape;
    if (lo > 0) {
        s.dims[ax] = lo;
        parts[n++] = jdt_graph_full(g, dy->dtype, s.ndim, s.dims, 0.0);
    }
    parts[n++] = dy;
    if (hi < full) {
        s.dims[ax] = full - hi;
        parts[n++] = jdt_graph_full(g, dy->dtype, s.ndim, s.dims, 0.0);
    }
    dx[0] = n == 1 ? dy : jdt_graph_concat(g, n, parts, ax);
}

static void vjp_CONCAT(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                       jdt_tensor **dx)
{
    int ax = (int)node->attrs.i[0];
    int64_t off = 0;
    for (int k = 0; k < node->n_inputs; k++) {
        int64_t len = IN(k)->shape.dims[ax];
        if (need[k]) dx[k] = node->n_inputs == 1 ? dy : jdt_graph_slice(g, dy, ax, off, off + len);
        off += len;
    }
}

/* matmul(a, b, ta, tb) for the VJP: a 2-D left operand against a batched right one is
 * broadcast first (the op only shares a 2-D RIGHT operand across batches). */
static jdt_tensor *mm(jdt_graph *g, jdt_tensor *a, jdt_tensor *b, bool ta, bool tb)
{
    if (a && b && a->shape.ndim == 2 && b->shape.ndim > 2) {
        jdt_shape s = b->shape;
        s.dims[s.ndim - 2] = a->shape.dims[0];
        s.dims[s.ndim - 1] = a->shape.dims[1];
        a = jdt_graph_broadcast(g, a, s.ndim, s.dims);
    }
    return jdt_graph_matmul(g, a, b, ta, tb);
}

static void vjp_matmul_f(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                         jdt_tensor **dx);

/* The gradient GEMMs compute in the precision of the forward one (attrs i[2]). A bf16 GEMM's
 * gradient GEMMs both round the f32 cotangent dy to bf16: under the cast form
 * (jdt_graph_bf16_weights) they read one CAST of it instead, which the compiler fuses into dy's
 * producer (a bf16 store beside the f32 one the bias gradient and the residual path read), so
 * the backend converts nothing per GEMM; the same numbers (both round to nearest even). Not
 * for the cross-entropy's dlogits: the compiler stores that as bf16 itself when only GEMMs read
 * it (fuse.c mark_bf16_storage), and a CAST would make it an f32 store plus a copy. */
/* A bf16 operand that is a CAST of an f32 value, or a reshape or gather of one (a weight's
 * bf16 copy, sequence parallelism's gathered rows): its cotangent belongs to the f32 value. */
static bool cast_form(const jdt_tensor *t)
{
    while (t->op == JDT_OP_RESHAPE || t->op == JDT_OP_ALL_GATHER)
        t = t->inputs[0];
    return t->op == JDT_OP_CAST;
}

static void vjp_MATMUL(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                       jdt_tensor **dx)
{
    bool prev = jdt_graph_matmul_bf16(g);
    const bool bf16 = node->attrs.i[2] != 0;
    jdt_graph_set_matmul_bf16(g, bf16);
    jdt_tensor *src = dy;
    while (src && src->op == JDT_OP_RESHAPE)
        src = src->inputs[0];
    if (bf16 && dy && dy->dtype == JDT_DTYPE_F32 && jdt_graph_bf16_weights(g) &&
        src->op != JDT_OP_SOFTMAX_XENT_BWD && (need[0] || need[1])) {
        /* cast before the reshapes (a view of the copy), so the cast reads its producer at
         * the loop index and can join its kernel */
        jdt_tensor *c = jdt_graph_cast(g, src, JDT_DTYPE_BF16);
        dy = src == dy ? c : jdt_graph_reshape(g, c, dy->shape.ndim, dy->shape.dims);
    }
    vjp_matmul_f(g, node, dy, need, dx);
    /* the cotangent of a bf16 activation operand, rounded to bf16 (jdt_graph_bf16_grads) */
    for (int k = 0; k < 2 && bf16 && jdt_graph_bf16_grads(g); k++)
        if (need[k] && dx[k] && dx[k]->dtype == JDT_DTYPE_F32 &&
            IN(k)->dtype == JDT_DTYPE_BF16 && !cast_form(IN(k)))
            dx[k] = jdt_graph_cast(g, jdt_graph_cast(g, dx[k], JDT_DTYPE_BF16), JDT_DTYPE_F32);
    jdt_graph_set_matmul_bf16(g, prev);
}

static void vjp_matmul_f(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                         jdt_tensor **dx)
{
    jdt_tensor *a = IN(0), *b = IN(1);
    bool ta = node->attrs.i[0] != 0, tb = node->attrs.i[1] != 0;
    if (need[0]) {
        if (!ta)
            dx[0] = tb ? mm(g, dy, b, 0, 0) : mm(g, dy, b, 0, 1);
        else
            dx[0] = tb ? mm(g, b, dy, 1, 1) : mm(g, b, dy, 0, 1);
    }
    if (need[1]) {
        jdt_tensor *db;
        if (!ta && b->shape.ndim == 2 && a->shape.ndim > 2) {
            /* A 2-D b shared by every batch (x (B, T, C) @ w (C, N)): flatten the batch into the
             * rows and contract over them with one 2-D matmul, instead of a batched matmul
             * producing (B, K, N) followed by a reduction. */
            int64_t rows = jdt_shape_numel(&a->shape) / a->shape.dims[a->shape.ndim - 1];
            jdt_tensor *af =
                jdt_graph_reshape(g, a, 2, (int64_t[]){rows, a->shape.dims[a->shape.ndim - 1]});
            jdt_tensor *df =
                jdt_graph_reshape(g, dy, 2, (int64_t[]){rows, dy->shape.dims[dy->shape.ndim - 1]});
            dx[1] = tb ? jdt_graph_matmul(g, df, af, true, false)
                       : jdt_graph_matmul(g, af, df, true, false);
            return;
        }
        if (!tb)
            db = ta ? mm(g, a, dy, 0, 0) : mm(g, a, dy, 1, 0);
        else
            db = ta ? mm(g, dy, a, 1, 1) : mm(g, dy, a, 1, 0);
        if (db && b->shape.ndim == 2 && db->shape.ndim > 2) {
            uint32_t mask = (1u << (db->shape.ndim - 2)) - 1; /* sum over the batch dims */
            db = jdt_graph_reduce_sum(g, db, mask, false);
        }
        dx[1] = db;
    }
}

static void vjp_GATHER(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                       jdt_tensor **dx)
{
    if (need[0]) dx[0] = jdt_graph_scatter_add(g, dy, IN(1), IN(0)->shape.dims[0]);
}

static void vjp_SCATTER_ADD(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                            jdt_tensor **dx)
{
    if (need[0]) dx[0] = jdt_graph_gather(g, dy, IN(1));
}

static void vjp_SOFTMAX(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                        jdt_tensor **dx)
{
    dx[0] = jdt_graph_softmax_bwd(g, node, dy);
}

static void vjp_LOG_SOFTMAX(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                            jdt_tensor **dx)
{
    dx[0] = jdt_graph_log_softmax_bwd(g, node, dy);
}

static void vjp_SOFTMAX_XENT(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                             jdt_tensor **dx)
{
    if (need[0]) dx[0] = jdt_graph_softmax_xent_bwd(g, IN(0), IN(1), dy, node);
}

static void vjp_NORMALIZE(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                          jdt_tensor **dx)
{
    dx[0] = jdt_graph_normalize_bwd(g, IN(0), dy, node->attrs.f[0]);
}

static void vjp_RMS_NORMALIZE(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                              jdt_tensor **dx)
{
    dx[0] = jdt_graph_rms_normalize_bwd(g, IN(0), dy, node->attrs.f[0]);
}

static void vjp_ROPE(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                     jdt_tensor **dx)
{
    double sc[4];
    jdt_rope_scaling_of(&node->attrs, sc);
    dx[0] = jdt_graph_rope_scaled(g, dy, node->attrs.f[0], node->attrs.i[0] == 0, sc);
}

static void vjp_ATTENTION(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                          jdt_tensor **dx)
{
    bool prev = jdt_graph_matmul_bf16(g); /* the backward computes as the forward did */
    jdt_graph_set_matmul_bf16(g, node->attrs.i[0] != 0);
    jdt_tensor *packed =
        jdt_graph_attention_bwd(g, IN(0), IN(1), IN(2), node, dy, node->attrs.f[0]);
    jdt_graph_set_matmul_bf16(g, prev);
    /* (3, B, ...) viewed as (3B, ...), then sliced: the slices have the gradients' shape, so no
     * reshape follows them and the compiler composes each slice into its consumer's read */
    jdt_shape flat = node->shape;
    int64_t B = flat.dims[0];
    flat.dims[0] *= 3;
    jdt_tensor *packed_flat = jdt_graph_reshape(g, packed, flat.ndim, flat.dims);
    for (int k = 0; k < 3; k++)
        if (need[k]) dx[k] = jdt_graph_slice(g, packed_flat, 0, k * B, (k + 1) * B);
}

static bool shape_ALL_REDUCE(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                             jdt_shape *out, char *why, size_t n_why)
{
    if (in[0]->dtype != JDT_DTYPE_F32 && in[0]->dtype != JDT_DTYPE_F64)
        return WHY("all_reduce needs a float tensor, got %s", jdt_dtype_name(in[0]->dtype));
    if (a->i[0] < 0) return WHY("group %lld < 0", (long long)a->i[0]);
    if (a->i[1] != 0 && a->i[1] != 1) return WHY("reduce op %lld not 0 (sum) or 1 (max)", (long long)a->i[1]);
    *dt = in[0]->dtype;
    *out = in[0]->shape;
    return true;
}

static void vjp_ALL_REDUCE(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                           jdt_tensor **dx)
{
    if (node->attrs.i[1] != 0) {
        jdt_graph_fail(g, JDT_ERR_UNSUPPORTED, "all_reduce(max) has no gradient rule");
        return;
    }
    jdt_tensor *in[1] = {dy};
    dx[0] = jdt_graph_op(g, JDT_OP_ALL_REDUCE, 1, in, &node->attrs, dy->dtype, NULL);
}

/* ALL_GATHER / REDUCE_SCATTER: i[0] group, i[1] axis, i[2] k members. An all-gather also
 * moves bf16 (a byte copy: FSDP gathers the bf16 copies of weight shards); a reduce-scatter
 * sums, in f32 or f64. */
static bool check_shard_collective(jdt_tensor *const *in, const jdt_attrs *a, const char *what,
                                   char *why, size_t n_why)
{
    const bool gather = strcmp(what, "all_gather") == 0;
    if (in[0]->dtype != JDT_DTYPE_F32 && in[0]->dtype != JDT_DTYPE_F64 &&
        !(gather && in[0]->dtype == JDT_DTYPE_BF16))
        return WHY("%s needs a float tensor%s, got %s", what, gather ? " (or bf16)" : "",
                   jdt_dtype_name(in[0]->dtype));
    if (a->i[0] < 0) return WHY("group %lld < 0", (long long)a->i[0]);
    if (a->i[2] < 1) return WHY("group size %lld < 1", (long long)a->i[2]);
    if (a->i[1] < 0 || a->i[1] >= in[0]->shape.ndim)
        return WHY("axis %lld out of range for rank %d", (long long)a->i[1], in[0]->shape.ndim);
    return true;
}

static bool shape_ALL_GATHER(jdt_tensor *const *in, int n_in, const jdt_attrs *a, jdt_dtype *dt,
                             jdt_shape *out, char *why, size_t n_why)
{
    (void)n_in;
    if (!check_shard_collective(in, a, "all_gather", why, n_why)) return false;
    *dt = in[0]->dtype;
    *out = in[0]->shape;
    out->dims[a->i[1]] *= a->i[2];
    return true;
}

static bool shape_REDUCE_SCATTER(jdt_tensor *const *in, int n_in, const jdt_attrs *a,
                                 jdt_dtype *dt, jdt_shape *out, char *why, size_t n_why)
{
    (void)n_in;
    if (!check_shard_collective(in, a, "reduce_scatter", why, n_why)) return false;
    if (in[0]->shape.dims[a->i[1]] % a->i[2])
        return WHY("axis %lld of size %lld does not split into %lld parts", (long long)a->i[1],
                   (long long)in[0]->shape.dims[a->i[1]], (long long)a->i[2]);
    *dt = in[0]->dtype;
    *out = in[0]->shape;
    out->dims[a->i[1]] /= a->i[2];
    return true;
}

/* The transposes over the stacked per-rank values (see graph.h): gather <-> scatter-sum. */
static void vjp_ALL_GATHER(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                           jdt_tensor **dx)
{
    (void)need;
    const jdt_attrs *a = &node->attrs;
    dx[0] = jdt_graph_reduce_scatter(g, dy, (int)a->i[0], (int)a->i[2], (int)a->i[1], 1.0);
}

static void vjp_REDUCE_SCATTER(jdt_graph *g, jdt_tensor *node, jdt_tensor *dy, const bool *need,
                               jdt_tensor **dx)
{
    (void)need;
    const jdt_attrs *a = &node->attrs;
    jdt_tensor *d = jdt_graph_all_gather(g, dy, (int)a->i[0], (int)a->i[2], (int)a->i[1]);
    dx[0] = a->f[0] == 1.0 ? d : jdt_graph_mul_scalar(g, d, a->f[0]);
}

/* ---- partition kinds (engine/shard implements one rule per kind) ---------------------------- */

#define part_PARAM JDT_PART_LEAF
#define part_INPUT JDT_PART_LEAF
#define part_CONSTANT JDT_PART_LEAF
#define part_NEG JDT_PART_ELEMENTWISE
#define part_EXP JDT_PART_ELEMENTWISE
#define part_LOG JDT_PART_ELEMENTWISE
#define part_TANH JDT_PART_ELEMENTWISE
#define part_SQRT JDT_PART_ELEMENTWISE
#define part_RSQRT JDT_PART_ELEMENTWISE
#define part_RELU JDT_PART_ELEMENTWISE
#define part_GELU JDT_PART_ELEMENTWISE
#define part_SILU JDT_PART_ELEMENTWISE
#define part_SIGMOID JDT_PART_ELEMENTWISE
#define part_ABS JDT_PART_ELEMENTWISE
#define part_ADD JDT_PART_ELEMENTWISE
#define part_SUB JDT_PART_ELEMENTWISE
#define part_MUL JDT_PART_ELEMENTWISE
#define part_DIV JDT_PART_ELEMENTWISE
#define part_MAX JDT_PART_ELEMENTWISE
#define part_MIN JDT_PART_ELEMENTWISE
#define part_GT JDT_PART_ELEMENTWISE
#define part_GE JDT_PART_ELEMENTWISE
#define part_ADD_SCALAR JDT_PART_ELEMENTWISE
#define part_MUL_SCALAR JDT_PART_ELEMENTWISE
#define part_POW_SCALAR JDT_PART_ELEMENTWISE
#define part_SELECT JDT_PART_ELEMENTWISE
#define part_CAST JDT_PART_ELEMENTWISE
#define part_STOP_GRADIENT JDT_PART_ELEMENTWISE
#define part_DROPOUT JDT_PART_ELEMENTWISE
#define part_BROADCAST JDT_PART_BROADCAST
#define part_REDUCE_SUM JDT_PART_REDUCTION
#define part_REDUCE_MAX JDT_PART_REDUCTION
#define part_REDUCE_MEAN JDT_PART_REDUCTION
#define part_RESHAPE JDT_PART_RESHAPE
#define part_TRANSPOSE JDT_PART_TRANSPOSE
#define part_SLICE JDT_PART_AXIS_WHOLE
#define part_CONCAT JDT_PART_AXIS_WHOLE
#define part_MATMUL JDT_PART_MATMUL
#define part_GATHER JDT_PART_GATHER
#define part_IOTA JDT_PART_GENERATOR
#define part_CAUSAL_MASK JDT_PART_GENERATOR
#define part_SOFTMAX JDT_PART_ROWS
#define part_LOG_SOFTMAX JDT_PART_ROWS
#define part_NORMALIZE JDT_PART_ROWS
#define part_RMS_NORMALIZE JDT_PART_ROWS
#define part_SOFTMAX_XENT JDT_PART_XENT
#define part_ROPE JDT_PART_ROPE
#define part_ATTENTION JDT_PART_ATTENTION
/* Backward-only ops (the partitioner runs before autodiff) and the collectives it inserts. */
#define part_GELU_GRAD JDT_PART_NONE
#define part_SILU_GRAD JDT_PART_NONE
#define part_SCATTER_ADD JDT_PART_NONE
#define part_SOFTMAX_BWD JDT_PART_NONE
#define part_LOG_SOFTMAX_BWD JDT_PART_NONE
#define part_SOFTMAX_XENT_BWD JDT_PART_NONE
#define part_NORMALIZE_BWD JDT_PART_NONE
#define part_RMS_NORMALIZE_BWD JDT_PART_NONE
#define part_ATTENTION_BWD JDT_PART_NONE
#define part_ALL_REDUCE JDT_PART_NONE
#define part_ALL_GATHER JDT_PART_NONE
#define part_REDUCE_SCATTER JDT_PART_NONE

/* ---- op flags (JDT_OPF_*, graph.h; 0: none of them) ---------------------------------------- */

#define flags_PARAM 0
#define flags_INPUT 0
#define flags_CONSTANT JDT_OPF_EXACT_BF16
#define flags_NEG JDT_OPF_EXACT_BF16
#define flags_EXP 0
#define flags_LOG 0
#define flags_TANH 0
#define flags_SQRT 0
#define flags_RSQRT 0
#define flags_RELU JDT_OPF_EXACT_BF16
#define flags_GELU 0
#define flags_SILU 0
#define flags_SIGMOID 0
#define flags_ABS JDT_OPF_EXACT_BF16
#define flags_ADD 0
#define flags_SUB 0
#define flags_MUL 0
#define flags_DIV 0
#define flags_MAX JDT_OPF_EXACT_BF16
#define flags_MIN JDT_OPF_EXACT_BF16
#define flags_GT JDT_OPF_EXACT_BF16
#define flags_GE JDT_OPF_EXACT_BF16
#define flags_ADD_SCALAR 0
#define flags_MUL_SCALAR 0
#define flags_POW_SCALAR 0
#define flags_GELU_GRAD 0
#define flags_SILU_GRAD 0
#define flags_SELECT JDT_OPF_EXACT_BF16
#define flags_CAST JDT_OPF_ID_IF_SAME_TYPE
#define flags_STOP_GRADIENT (JDT_OPF_EXACT_BF16 | JDT_OPF_ID_IF_SAME_TYPE)
#define flags_DROPOUT 0
#define flags_BROADCAST (JDT_OPF_EXACT_BF16 | JDT_OPF_ID_IF_SAME_TYPE)
#define flags_REDUCE_SUM 0
#define flags_REDUCE_MAX 0
#define flags_REDUCE_MEAN 0
#define flags_RESHAPE JDT_OPF_ID_IF_SAME_TYPE
#define flags_TRANSPOSE JDT_OPF_EXACT_BF16
#define flags_SLICE JDT_OPF_EXACT_BF16
#define flags_CONCAT 0
#define flags_MATMUL 0
#define flags_GATHER 0
#define flags_SCATTER_ADD 0
#define flags_IOTA 0
#define flags_CAUSAL_MASK 0
#define flags_SOFTMAX 0
#define flags_SOFTMAX_BWD 0
#define flags_LOG_SOFTMAX 0
#define flags_LOG_SOFTMAX_BWD 0
#define flags_SOFTMAX_XENT 0
#define flags_SOFTMAX_XENT_BWD 0
#define flags_NORMALIZE 0
#define flags_NORMALIZE_BWD 0
#define flags_RMS_NORMALIZE 0
#define flags_RMS_NORMALIZE_BWD 0
#define flags_ROPE 0
#define flags_ATTENTION 0
#define flags_ATTENTION_BWD 0
#define flags_ALL_REDUCE 0
#define flags_ALL_GATHER 0
#define flags_REDUCE_SCATTER 0

/* ---- the table ---------------------------------------------------------------------------- */

static const jdt_op_info OP_INFO[] = {
#define X_(name, str, n_in, cls) {str, n_in, shape_##name, vjp_##name, part_##name, flags_##name},
    JDT_OP_LIST(X_)
#undef X_
};
_Static_assert(JDT_ARRAY_LEN(OP_INFO) == JDT_OP_COUNT, "op registry incomplete");

const jdt_op_info *jdt_op_info_get(jdt_op op)
{
    return &OP_INFO[op];
}

jdt_part_kind jdt_op_partition(jdt_op op)
{
    return (int)op >= 0 && (int)op < JDT_OP_COUNT ? OP_INFO[op].part : JDT_PART_NONE;
}

uint32_t jdt_op_flags(jdt_op op)
{
    return (int)op >= 0 && (int)op < JDT_OP_COUNT ? OP_INFO[op].flags : 0;
}
