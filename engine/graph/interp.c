/*
 * interp.c — the reference interpreter (interp.h). Each node's value is kept twice: in double
 * (`v`, what the loops read and write) and in the node's dtype (`buf`, what callers see). The
 * loops are deliberately naive: one obvious nested loop per op, no blocking, no threads.
 */
#include "graph/interp.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    double *v; /* (numel) value in double, already rounded to the node's dtype */
    void *buf; /* (numel) value in the node's dtype */
    int64_t numel;
} node_val;

struct jdt_interp {
    const jdt_graph *g;
    node_val *vals; /* (n_alloc) */
    int n_alloc;
    bool ran;
    jdt_collective_fn collective; /* ALL_REDUCE; NULL: unsupported */
    void *collective_ctx;
};

void jdt_interp_set_collective(jdt_interp *it, jdt_collective_fn fn, void *ctx)
{
    it->collective = fn;
    it->collective_ctx = ctx;
}

jdt_status jdt_interp_new(const jdt_graph *g, jdt_interp **out, jdt_err *e)
{
    *out = NULL;
    if (!g) return jdt_err_set(e, JDT_ERR_INVALID, "interp: graph is NULL");
    if (jdt_graph_error_msg(g))
        return jdt_err_set(e, JDT_ERR_INVALID, "interp: graph has a builder error: %s",
                           jdt_graph_error_msg(g));
    jdt_interp *it = jdt_calloc(1, sizeof *it);
    if (!it) return jdt_err_set(e, JDT_ERR_NOMEM, "interp: out of memory");
    it->g = g;
    *out = it;
    return JDT_OK;
}

static void free_vals(jdt_interp *it)
{
    for (int i = 0; i < it->n_alloc; i++) {
        jdt_free(it->vals[i].v);
        jdt_free(it->vals[i].buf);
    }
    jdt_free(it->vals);
    it->vals = NULL;
    it->n_alloc = 0;
}

void jdt_interp_free(jdt_interp *it)
{
    if (!it) return;
    free_vals(it);
    jdt_free(it);
}

static bool supported(jdt_dtype dt)
{
    return dt == JDT_DTYPE_F32 || dt == JDT_DTYPE_F64 || dt == JDT_DTYPE_I32 ||
           dt == JDT_DTYPE_BF16;
}

static jdt_status alloc_vals(jdt_interp *it, jdt_err *e)
{
    int n = jdt_graph_n_nodes(it->g);
    if (n == it->n_alloc) return JDT_OK;
    jdt_status st = JDT_OK;
    node_val *nv = jdt_realloc(it->vals, (size_t)(n ? n : 1) * sizeof *nv);
    if (!nv) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "interp: out of memory");
        goto fail_free_vals;
    }
    it->vals = nv;
    for (int i = it->n_alloc; i < n; i++) {
        jdt_tensor *t = jdt_graph_node(it->g, i);
        node_val *v = &nv[i];
        memset(v, 0, sizeof *v);
        it->n_alloc = i + 1;
        if (!supported(t->dtype)) {
            st = jdt_err_set(e, JDT_ERR_UNSUPPORTED,
                             "interp: node %d (%s) has dtype %s (f32, f64, i32, bf16 supported)", i,
                             jdt_op_name(t->op), jdt_dtype_name(t->dtype));
            goto fail_free_vals;
        }
        v->numel = jdt_shape_numel(&t->shape);
        v->v = jdt_malloc((size_t)v->numel * sizeof(double));
        v->buf = jdt_malloc((size_t)v->numel * jdt_dtype_size(t->dtype));
        if (!v->v || !v->buf) {
            st = jdt_err_set(e, JDT_ERR_NOMEM,
                             "interp: out of memory for node %d (%s, %lld elements)", i,
                             jdt_op_name(t->op), (long long)v->numel);
            goto fail_free_vals;
        }
    }
    return JDT_OK;
fail_free_vals:
    /* all or nothing: a later run starts the allocation over */
    free_vals(it);
    return st;
}

/* ---- dtype conversion --------------------------------------------------------------------- */

static double load(jdt_dtype dt, const void *p, int64_t i)
{
    switch (dt) {
    case JDT_DTYPE_F32:
        return ((const float *)p)[i];
    case JDT_DTYPE_F64:
        return ((const double *)p)[i];
    case JDT_DTYPE_I32:
        return ((const int32_t *)p)[i];
    case JDT_DTYPE_BF16: { /* the upper 16 bits of an f32 */
        uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case JDT_DTYPE_U16: /* not reached: alloc_vals refuses other dtypes before a run */
    case JDT_DTYPE_U32:
    case JDT_DTYPE_U8:
    case JDT_DTYPE_COUNT:
        break;
    }
    return NAN;
}

/* Rounds every v[i] to dt and stores it into buf. A bf16 value is the f32 result rounded to
 * bf16 (nearest even): bf16 nodes are computed in f32 and rounded where stored, and this order
 * (double -> f32 -> bf16) is what the compiled kernels do. */
static void round_store(jdt_dtype dt, double *v, void *buf, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (dt == JDT_DTYPE_F32) {
            float f = (float)v[i];
            ((float *)buf)[i] = f;
            v[i] = f;
        } else if (dt == JDT_DTYPE_BF16) {
            float f = jdt_bf16_round((float)v[i]);
            uint32_t u;
            memcpy(&u, &f, 4);
            ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
            v[i] = f;
        } else if (dt == JDT_DTYPE_F64) {
            ((double *)buf)[i] = v[i];
        } else {
            double x = v[i];
            int32_t k = isnan(x)             ? 0
                        : x >= 2147483647.0  ? INT32_MAX
                        : x <= -2147483648.0 ? INT32_MIN
                                             : (int32_t)x;
            ((int32_t *)buf)[i] = k;
            v[i] = k;
        }
    }
}

/* ---- index helpers ------------------------------------------------------------------------ */

static void unravel(const jdt_shape *s, int64_t flat, int64_t *coord)
{
    for (int d = s->ndim - 1; d >= 0; d--) {
        coord[d] = flat % s->dims[d];
        flat /= s->dims[d];
    }
}

static int64_t ravel(const jdt_shape *s, const int64_t *coord)
{
    int64_t f = 0;
    for (int d = 0; d < s->ndim; d++)
        f = f * s->dims[d] + coord[d];
    return f;
}

/* product of dims [lo, hi) */
static int64_t span(const jdt_shape *s, int lo, int hi)
{
    int64_t n = 1;
    for (int d = lo; d < hi; d++)
        n *= s->dims[d];
    return n;
}

static double gelu(double x)
{
    const double c = sqrt(2.0 / M_PI);
    return 0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x)));
}

static double gelu_deriv(double x)
{
    const double c = sqrt(2.0 / M_PI);
    double t = tanh(c * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x);
}

static double sigmoid(double x)
{
    return 1.0 / (1.0 + exp(-x));
}

/* ---- ops ---------------------------------------------------------------------------------- */

#define FAIL(code, ...)                                                                            \
    (jdt_err_set(e, code, __VA_ARGS__),                                                            \
     jdt_err_prefix(e, "interp: node %d (%s)", t->id, jdt_op_name(t->op)))

/* One node's evaluation: its value y (n doubles, rounded to the dtype by the caller), its
 * inputs' values and shapes. last = the output's last-axis length, rows = n / last. */
typedef struct {
    jdt_interp *it;
    const jdt_tensor *t;
    double *y;
    int64_t n, last, rows;
    const jdt_attrs *a;
    const double *x0, *x1, *x2, *x3; /* inputs 0..3 (NULL when absent) */
    const jdt_shape *s0, *so;   /* input 0's shape (NULL without inputs), the node's */
    jdt_err *e;
} node_ctx;

/* PARAM / INPUT: the bound data (an unbound leaf is an error naming it) */
static jdt_status eval_leaf(const node_ctx *nd)
{
    const jdt_tensor *t = nd->t;
    double *y = nd->y;
    const int64_t n = nd->n;
    jdt_err *e = nd->e;
    if (!t->data)
        return FAIL(JDT_ERR_INVALID, "leaf '%s' has no bound data (set t->data)",
                    t->name ? t->name : "?");
    for (int64_t i = 0; i < n; i++)
        y[i] = load(t->dtype, t->data, i);
    return JDT_OK;
}

/* DROPOUT: keep element j iff philox(key i[0], step x1, j) >= rate f[0], scaled 1/(1-rate) */
static jdt_status eval_dropout(const node_ctx *nd)
{
    double *y = nd->y;
    const int64_t n = nd->n;
    const jdt_attrs *a = nd->a;
    const double *x0 = nd->x0;
    const double *x1 = nd->x1;
    double p = a->f[0], scale = 1.0 / (1.0 - p);
    uint64_t step = (uint64_t)(int64_t)x1[0];
    const jdt_shape *s = &nd->t->shape;
    for (int64_t j = 0; j < n; j++) {
        /* a sharded block's element: its global flat index (base + local index . strides) */
        int64_t ctr = j;
        if (nd->t->n_inputs > 2) {
            ctr = (int64_t)nd->x2[0] * a->i[2] + (nd->t->n_inputs > 3 ? (int64_t)nd->x3[0] : 0);
            for (int64_t k = s->ndim - 1, rest = j; k >= 0; k--) {
                ctr += rest % s->dims[k] * a->i[2 + k];
                rest /= s->dims[k];
            }
        }
        jdt_philox_ctr r = jdt_philox((uint64_t)a->i[0], step, (uint64_t)ctr);
        y[j] = jdt_u32_to_unit_float(r.v[0]) >= p ? x0[j] * scale : 0.0;
    }
    return JDT_OK;
}

/* BROADCAST to the node's shape (size-1 and leading dims expanded) */
static jdt_status eval_broadcast(const node_ctx *nd)
{
    double *y = nd->y;
    const int64_t n = nd->n;
    const double *x0 = nd->x0;
    const jdt_shape *s0 = nd->s0;
    const jdt_shape *so = nd->so;
    int64_t co[JDT_MAX_DIMS], ci[JDT_MAX_DIMS];
    int lead = so->ndim - s0->ndim;
    for (int64_t i = 0; i < n; i++) {
        unravel(so, i, co);
        for (int d = 0; d < s0->ndim; d++)
            ci[d] = s0->dims[d] == 1 ? 0 : co[d + lead];
        y[i] = x0[ravel(s0, ci)];
    }
    return JDT_OK;
}

/* REDUCE_SUM / REDUCE_MEAN / REDUCE_MAX over the axes of mask i[0] (i[1]: keepdims) */
static jdt_status eval_reduce(const node_ctx *nd)
{
    const jdt_tensor *t = nd->t;
    double *y = nd->y;
    const int64_t n = nd->n;
    const jdt_attrs *a = nd->a;
    const double *x0 = nd->x0;
    const jdt_shape *s0 = nd->s0;
    const jdt_shape *so = nd->so;
    int64_t ci[JDT_MAX_DIMS], co[JDT_MAX_DIMS];
    int64_t n_in = jdt_shape_numel(s0);
    bool is_max = t->op == JDT_OP_REDUCE_MAX;
    for (int64_t i = 0; i < n; i++)
        y[i] = is_max ? -INFINITY : 0.0;
    for (int64_t i = 0; i < n_in; i++) {
        unravel(s0, i, ci);
        int k = 0;
        for (int d = 0; d < s0->ndim; d++) {
            if (!(a->i[0] & (1 << d)))
                co[k++] = ci[d];
            else if (a->i[1])
                co[k++] = 0;
        }
        int64_t o = ravel(so, co);
        if (is_max)
            y[o] = x0[i] > y[o] ? x0[i] : y[o];
        else
            y[o] += x0[i];
    }
    if (t->op == JDT_OP_REDUCE_MEAN) {
        double cnt = (double)(n_in / n);
        for (int64_t i = 0; i < n; i++)
            y[i] /= cnt;
    }
    return JDT_OK;
}

/* TRANSPOSE by the permutation i[0..ndim) */
static jdt_status eval_transpose(const node_ctx *nd)
{
    double *y = nd->y;
    const int64_t n = nd->n;
    const jdt_attrs *a = nd->a;
    const double *x0 = nd->x0;
    const jdt_shape *s0 = nd->s0;
    const jdt_shape *so = nd->so;
    int64_t co[JDT_MAX_DIMS], ci[JDT_MAX_DIMS];
    for (int64_t i = 0; i < n; i++) {
        unravel(so, i, co);
        for (int k = 0; k < so->ndim; k++)
            ci[a->i[k]] = co[k];
        y[i] = x0[ravel(s0, ci)];
    }
    return JDT_OK;
}

/* SLICE [i[1], i[1] + out dim) along axis i[0] */
static jdt_status eval_slice(const node_ctx *nd)
{
    double *y = nd->y;
    const jdt_attrs *a = nd->a;
    const double *x0 = nd->x0;
    const jdt_shape *s0 = nd->s0;
    const jdt_shape *so = nd->so;
    int ax = (int)a->i[0];
    int64_t outer = span(s0, 0, ax), inner = span(s0, ax + 1, s0->ndim);
    int64_t din = s0->dims[ax], dout = so->dims[ax], lo = a->i[1];
    for (int64_t o = 0; o < outer; o++)
        for (int64_t k = 0; k < dout; k++)
            for (int64_t r = 0; r < inner; r++)
                y[(o * dout + k) * inner + r] = x0[(o * din + lo + k) * inner + r];
    return JDT_OK;
}

/* CONCAT along axis i[0] */
static jdt_status eval_concat(const node_ctx *nd)
{
    node_val *nv = nd->it->vals;
    const jdt_tensor *t = nd->t;
    double *y = nd->y;
    const jdt_attrs *a = nd->a;
    const jdt_shape *so = nd->so;
    int ax = (int)a->i[0];
    int64_t outer = span(so, 0, ax), inner = span(so, ax + 1, so->ndim), dout = so->dims[ax];
    int64_t off = 0;
    for (int q = 0; q < t->n_inputs; q++) {
        const double *xq = nv[t->inputs[q]->id].v;
        int64_t dq = t->inputs[q]->shape.dims[ax];
        for (int64_t o = 0; o < outer; o++)
            for (int64_t k = 0; k < dq; k++)
                for (int64_t r = 0; r < inner; r++)
                    y[(o * dout + off + k) * inner + r] = xq[(o * dq + k) * inner + r];
        off += dq;
    }
    return JDT_OK;
}

/* MATMUL, batched, with transposes i[0]/i[1], a shared 2-D right operand and, when i[2], bf16
 * compute (inputs rounded to bf16, accumulation in double) */
static jdt_status eval_matmul(const node_ctx *nd)
{
    const jdt_tensor *t = nd->t;
    double *y = nd->y;
    const jdt_attrs *a = nd->a;
    const double *x0 = nd->x0;
    const double *x1 = nd->x1;
    const jdt_shape *s0 = nd->s0;
    const jdt_shape *so = nd->so;
    const jdt_shape *sa = s0, *sb = &t->inputs[1]->shape;
    bool ta = a->i[0] != 0, tb = a->i[1] != 0;
    int64_t M = so->dims[so->ndim - 2], N = so->dims[so->ndim - 1];
    int64_t K = sa->dims[sa->ndim - (ta ? 2 : 1)];
    int64_t batch = span(so, 0, so->ndim - 2);
    bool shared_b = sb->ndim == 2, bf16 = a->i[2] != 0;
    for (int64_t bt = 0; bt < batch; bt++) {
        const double *A = x0 + bt * M * K, *B = x1 + (shared_b ? 0 : bt * K * N);
        for (int64_t m = 0; m < M; m++)
            for (int64_t nn = 0; nn < N; nn++) {
                double acc = 0;
                for (int64_t k = 0; k < K; k++) {
                    double x = ta ? A[k * M + m] : A[m * K + k];
                    double w = tb ? B[nn * K + k] : B[k * N + nn];
                    if (bf16) /* bf16 compute: the inputs are rounded, the sum is not */
                        x = jdt_bf16_round((float)x), w = jdt_bf16_round((float)w);
                    acc += x * w;
                }
                y[(bt * M + m) * N + nn] = acc;
            }
    }
    return JDT_OK;
}

/* GATHER rows of the table by index (index range checked) */
static jdt_status eval_gather(const node_ctx *nd)
{
    const jdt_tensor *t = nd->t;
    double *y = nd->y;
    const int64_t rows = nd->rows;
    const double *x0 = nd->x0;
    const double *x1 = nd->x1;
    const jdt_shape *s0 = nd->s0;
    jdt_err *e = nd->e;
    int64_t V = s0->dims[0], C = s0->dims[1];
    for (int64_t r = 0; r < rows; r++) {
        int64_t id = (int64_t)x1[r];
        if (id < 0 || id >= V)
            return FAIL(JDT_ERR_INVALID, "index %lld at position %lld out of range [0, %lld)",
                        (long long)id, (long long)r, (long long)V);
        memcpy(y + r * C, x0 + id * C, (size_t)C * sizeof(double));
    }
    return JDT_OK;
}

/* SCATTER_ADD rows into zeros (index range checked) */
static jdt_status eval_scatter_add(const node_ctx *nd)
{
    const jdt_tensor *t = nd->t;
    double *y = nd->y;
    const int64_t n = nd->n;
    const double *x0 = nd->x0;
    const double *x1 = nd->x1;
    const jdt_shape *s0 = nd->s0;
    const jdt_shape *so = nd->so;
    jdt_err *e = nd->e;
    int64_t V = so->dims[0], C = so->dims[1], R = jdt_shape_numel(s0) / C;
    memset(y, 0, (size_t)n * sizeof(double));
    for (int64_t r = 0; r < R; r++) {
        int64_t id = (int64_t)x1[r];
        if (id < 0 || id >= V)
            return FAIL(JDT_ERR_INVALID, "index %lld at position %lld out of range [0, %lld)",
                        (long long)id, (long long)r, (long long)V);
        for (int64_t c = 0; c < C; c++)
            y[id * C + c] += x0[r * C + c];
    }
    return JDT_OK;
}

/* IOTA: the index along axis i[0] */
static jdt_status eval_iota(const node_ctx *nd)
{
    double *y = nd->y;
    const int64_t n = nd->n;
    const jdt_attrs *a = nd->a;
    const jdt_shape *so = nd->so;
    int64_t co[JDT_MAX_DIMS];
    for (int64_t i = 0; i < n; i++) {
        unravel(so, i, co);
        y[i] = (double)co[a->i[0]];
    }
    return JDT_OK;
}

/* CAUSAL_MASK (T, T): 0 on and below the diagonal, -inf above */
static jdt_status eval_causal_mask(const node_ctx *nd)
{
    double *y = nd->y;
    const jdt_shape *so = nd->so;
    int64_t T = so->dims[0];
    for (int64_t r = 0; r < T; r++)
        for (int64_t c = 0; c < T; c++)
            y[r * T + c] = c <= r ? 0.0 : -INFINITY;
    return JDT_OK;
}

/* SOFTMAX / LOG_SOFTMAX over the last axis */
static jdt_status eval_softmax(const node_ctx *nd)
{
    const jdt_tensor *t = nd->t;
    double *y = nd->y;
    const int64_t last = nd->last;
    const int64_t rows = nd->rows;
    const double *x0 = nd->x0;
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x0 + r * last;
        double mx = -INFINITY, sum = 0;
        for (int64_t c = 0; c < last; c++)
            mx = xr[c] > mx ? xr[c] : mx;
        for (int64_t c = 0; c < last; c++)
            sum += exp(xr[c] - mx);
        for (int64_t c = 0; c < last; c++)
            y[r * last + c] =
                t->op == JDT_OP_SOFTMAX ? exp(xr[c] - mx) / sum : xr[c] - mx - log(sum);
    }
    return JDT_OK;
}

/* SOFTMAX_BWD / LOG_SOFTMAX_BWD */
static jdt_status eval_softmax_bwd(const node_ctx *nd)
{
    const jdt_tensor *t = nd->t;
    double *y = nd->y;
    const int64_t last = nd->last;
    const int64_t rows = nd->rows;
    const double *x0 = nd->x0;
    const double *x1 = nd->x1;
    for (int64_t r = 0; r < rows; r++) {
        const double *yr = x0 + r * last, *dr = x1 + r * last;
        double acc = 0;
        for (int64_t c = 0; c < last; c++)
            acc += t->op == JDT_OP_SOFTMAX_BWD ? dr[c] * yr[c] : dr[c];
        for (int64_t c = 0; c < last; c++)
            y[r * last + c] =
                t->op == JDT_OP_SOFTMAX_BWD ? yr[c] * (dr[c] - acc) : dr[c] - exp(yr[c]) * acc;
    }
    return JDT_OK;
}

/* SOFTMAX_XENT (per-row loss) and SOFTMAX_XENT_BWD (target range checked) */
static jdt_status eval_softmax_xent(const node_ctx *nd)
{
    const jdt_tensor *t = nd->t;
    double *y = nd->y;
    const double *x0 = nd->x0;
    const double *x1 = nd->x1;
    const double *x2 = nd->x2;
    const jdt_shape *s0 = nd->s0;
    jdt_err *e = nd->e;
    const int64_t V = s0->dims[s0->ndim - 1], N = V ? jdt_shape_numel(s0) / V : 0;
    for (int64_t r = 0; r < N; r++) {
        const double *xr = x0 + r * V;
        int64_t tg = (int64_t)x1[r];
        if (tg >= V)
            return FAIL(JDT_ERR_INVALID, "target %lld in row %lld out of range [0, %lld)",
                        (long long)tg, (long long)r, (long long)V);
        double mx = -INFINITY, sum = 0;
        for (int64_t c = 0; c < V; c++)
            mx = xr[c] > mx ? xr[c] : mx;
        for (int64_t c = 0; c < V; c++)
            sum += exp(xr[c] - mx);
        double lse = mx + log(sum);
        if (t->op == JDT_OP_SOFTMAX_XENT) {
            y[r] = tg < 0 ? 0.0 : lse - xr[tg];
        } else {
            for (int64_t c = 0; c < V; c++)
                y[r * V + c] =
                    tg < 0 ? 0.0 : (exp(xr[c] - lse) - (c == tg ? 1.0 : 0.0)) * x2[r];
        }
    }
    return JDT_OK;
}

/* NORMALIZE (layernorm without affine) and its backward */
static jdt_status eval_normalize(const node_ctx *nd)
{
    const jdt_tensor *t = nd->t;
    double *y = nd->y;
    const int64_t last = nd->last;
    const int64_t rows = nd->rows;
    const jdt_attrs *a = nd->a;
    const double *x0 = nd->x0;
    const double *x1 = nd->x1;
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x0 + r * last;
        double mean = 0, var = 0;
        for (int64_t c = 0; c < last; c++)
            mean += xr[c];
        mean /= (double)last;
        for (int64_t c = 0; c < last; c++)
            var += (xr[c] - mean) * (xr[c] - mean);
        var /= (double)last;
        double rstd = 1.0 / sqrt(var + a->f[0]);
        if (t->op == JDT_OP_NORMALIZE) {
            for (int64_t c = 0; c < last; c++)
                y[r * last + c] = (xr[c] - mean) * rstd;
        } else {
            const double *gr = x1 + r * last;
            double mg = 0, mgx = 0;
            for (int64_t c = 0; c < last; c++) {
                mg += gr[c];
                mgx += gr[c] * (xr[c] - mean) * rstd;
            }
            mg /= (double)last;
            mgx /= (double)last;
            for (int64_t c = 0; c < last; c++)
                y[r * last + c] = rstd * (gr[c] - mg - (xr[c] - mean) * rstd * mgx);
        }
    }
    return JDT_OK;
}

/* RMS_NORMALIZE and its backward */
static jdt_status eval_rms_normalize(const node_ctx *nd)
{
    const jdt_tensor *t = nd->t;
    double *y = nd->y;
    const int64_t last = nd->last;
    const int64_t rows = nd->rows;
    const jdt_attrs *a = nd->a;
    const double *x0 = nd->x0;
    const double *x1 = nd->x1;
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x0 + r * last;
        double ms = 0;
        for (int64_t c = 0; c < last; c++)
            ms += xr[c] * xr[c];
        double rr = 1.0 / sqrt(ms / (double)last + a->f[0]);
        if (t->op == JDT_OP_RMS_NORMALIZE) {
            for (int64_t c = 0; c < last; c++)
                y[r * last + c] = xr[c] * rr;
        } else {
            const double *gr = x1 + r * last;
            double mgx = 0;
            for (int64_t c = 0; c < last; c++)
                mgx += gr[c] * xr[c];
            mgx /= (double)last;
            for (int64_t c = 0; c < last; c++)
                y[r * last + c] = rr * gr[c] - xr[c] * rr * rr * rr * mgx;
        }
    }
    return JDT_OK;
}

/* ROPE on pairs (2i, 2i+1); i[0] = 1 rotates backwards */
static jdt_status eval_rope(const node_ctx *nd)
{
    double *y = nd->y;
    const jdt_attrs *a = nd->a;
    const double *x0 = nd->x0;
    const jdt_shape *so = nd->so;
    int64_t B = so->dims[0], T = so->dims[1], H = so->dims[2], D = so->dims[3];
    double sign = a->i[0] ? -1.0 : 1.0, sc[4];
    jdt_rope_scaling_of(a, sc);
    for (int64_t b = 0; b < B; b++)
        for (int64_t tt = 0; tt < T; tt++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t i = 0; i < D / 2; i++) {
                    double ang = sign * (double)tt * jdt_rope_freq(a->f[0], i, D, sc);
                    int64_t o = ((b * T + tt) * H + h) * D + 2 * i;
                    double c = cos(ang), sn = sin(ang), u = x0[o], w = x0[o + 1];
                    y[o] = u * c - w * sn;
                    y[o + 1] = u * sn + w * c;
                }
    return JDT_OK;
}

/* x rounded to bf16 when `on` (bf16 compute: where a product's input is rounded) */
static inline double bf16_if(bool on, double x)
{
    return on ? (double)jdt_bf16_round((float)x) : x;
}

/* ATTENTION (plain T x T causal softmax) and ATTENTION_BWD. bf16 compute (i[0]): q, k, v,
 * dout, the probabilities and dS are rounded where they enter a product, and the backward's
 * delta_i is dO_i . O_i with O_i from those rounded products, as the kernels compute them. */
static jdt_status eval_attention(const node_ctx *nd)
{
    node_val *nv = nd->it->vals;
    const jdt_tensor *t = nd->t;
    double *y = nd->y;
    const int64_t n = nd->n;
    const jdt_attrs *a = nd->a;
    const double *x0 = nd->x0;
    const double *x1 = nd->x1;
    const double *x2 = nd->x2;
    const jdt_shape *s0 = nd->s0;
    jdt_err *e = nd->e;
    const jdt_shape *sq = s0;
    int64_t BH = sq->dims[0] * sq->dims[1], T = sq->dims[2], D = sq->dims[3];
    int64_t per = T * D, tot = BH * per;
    double sc = a->f[0];
    const double *dout = t->op == JDT_OP_ATTENTION_BWD ? nv[t->inputs[4]->id].v : NULL;
    double *p = jdt_malloc((size_t)T * sizeof(double)),
           *dp = jdt_malloc((size_t)T * sizeof(double));
    if (!p || !dp) {
        jdt_free(p);
        jdt_free(dp);
        return FAIL(JDT_ERR_NOMEM, "out of memory");
    }
    memset(y, 0, (size_t)n * sizeof(double));
    const bool bf = a->i[0] != 0;
#define R_(x) bf16_if(bf, (x))
    for (int64_t bh = 0; bh < BH; bh++) {
        const double *q = x0 + bh * per, *k = x1 + bh * per, *v = x2 + bh * per;
        for (int64_t i = 0; i < T; i++) {
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j <= i; j++) {
                double s = 0;
                for (int64_t d = 0; d < D; d++)
                    s += R_(q[i * D + d]) * R_(k[j * D + d]);
                p[j] = s * sc;
                mx = p[j] > mx ? p[j] : mx;
            }
            for (int64_t j = 0; j <= i; j++)
                sum += (p[j] = exp(p[j] - mx));
            for (int64_t j = 0; j <= i; j++)
                p[j] /= sum;
            if (t->op == JDT_OP_ATTENTION) {
                for (int64_t j = 0; j <= i; j++)
                    for (int64_t d = 0; d < D; d++)
                        y[bh * per + i * D + d] += R_(p[j]) * R_(v[j * D + d]);
                continue;
            }
            const double *doi = dout + bh * per + i * D;
            double *dq = y + bh * per, *dk = y + tot + bh * per, *dv = y + 2 * tot + bh * per;
            double pdp = 0;
            for (int64_t j = 0; j <= i; j++) {
                dp[j] = 0;
                for (int64_t d = 0; d < D; d++)
                    dp[j] += R_(doi[d]) * R_(v[j * D + d]);
                pdp += p[j] * dp[j];
            }
            if (bf) { /* delta = dO . O with O from the rounded products, as the kernels */
                pdp = 0;
                for (int64_t d = 0; d < D; d++) {
                    double od = 0;
                    for (int64_t j = 0; j <= i; j++)
                        od += R_(p[j]) * R_(v[j * D + d]);
                    pdp += doi[d] * od;
                }
            }
            for (int64_t j = 0; j <= i; j++) {
                double ds = p[j] * (dp[j] - pdp) * sc;
                for (int64_t d = 0; d < D; d++) {
                    dv[j * D + d] += R_(p[j]) * R_(doi[d]);
                    dq[i * D + d] += R_(ds) * R_(k[j * D + d]);
                    dk[j * D + d] += R_(ds) * R_(q[i * D + d]);
                }
            }
        }
    }
#undef R_
    jdt_free(p);
    jdt_free(dp);
    return JDT_OK;
}

/* ALL_REDUCE through the caller's collective (f32 on the wire) */
static jdt_status eval_all_reduce(const node_ctx *nd)
{
    jdt_interp *it = nd->it;
    const jdt_tensor *t = nd->t;
    double *y = nd->y;
    const int64_t n = nd->n;
    const jdt_attrs *a = nd->a;
    const double *x0 = nd->x0;
    jdt_err *e = nd->e;
    /* the wire format is f32: reduce a float copy, then widen back */
    if (!it->collective) return FAIL(JDT_ERR_UNSUPPORTED, "all_reduce needs a communicator");
    float *tmp = jdt_malloc((size_t)(n ? n : 1) * sizeof *tmp);
    if (!tmp) return FAIL(JDT_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < n; i++) tmp[i] = (float)x0[i];
    jdt_status cst = it->collective(it->collective_ctx, (int)a->i[0], (int)a->i[1],
                                    JDT_DTYPE_F32, tmp, (size_t)n, e);
    for (int64_t i = 0; i < n && cst == JDT_OK; i++) y[i] = (double)tmp[i] * a->f[0];
    jdt_free(tmp);
    if (cst != JDT_OK) return cst;
    return JDT_OK;
}

/* ALL_GATHER and REDUCE_SCATTER: the full tensor viewed as (outer, k, blk) along the axis; the
 * wire wants (k, outer, blk). The wire format is f32 (a bf16 gather's values are exact in it;
 * compiled programs move those as bf16). */
static jdt_status eval_gather_scatter(const node_ctx *nd)
{
    jdt_interp *it = nd->it;
    const jdt_tensor *t = nd->t;
    double *y = nd->y;
    const jdt_attrs *a = nd->a;
    const double *x0 = nd->x0;
    jdt_err *e = nd->e;
    const bool gather = t->op == JDT_OP_ALL_GATHER;
    if (!it->collective)
        return FAIL(JDT_ERR_UNSUPPORTED, "%s needs a communicator",
                    gather ? "all_gather" : "reduce_scatter");
    const jdt_shape *full = gather ? nd->so : nd->s0;
    const int ax = (int)a->i[1];
    const int64_t k = a->i[2], nf = jdt_shape_numel(full), nl = nf / k;
    int64_t outer = 1;
    for (int d = 0; d < ax; d++) outer *= full->dims[d];
    const int64_t blk = outer ? nl / outer : 0;
    float *tmp = jdt_malloc((size_t)(2 * nf + 1) * sizeof *tmp);
    if (!tmp) return FAIL(JDT_ERR_NOMEM, "out of memory");
    float *tmp2 = tmp + nf;
    if (gather) {
        for (int64_t i = 0; i < nl; i++) tmp[i] = (float)x0[i];
    } else {
        for (int64_t i = 0; i < nf; i++) tmp2[i] = (float)x0[i];
        jdt_permute_blocks_f32(tmp2, tmp, k, outer, blk, false);
    }
    jdt_status cst = it->collective(it->collective_ctx, (int)a->i[0],
                                    gather ? JDT_COLL_ALLGATHER : JDT_COLL_REDUCE_SCATTER,
                                    JDT_DTYPE_F32, tmp, (size_t)nf, e);
    if (cst == JDT_OK && gather) {
        jdt_permute_blocks_f32(tmp, tmp2, k, outer, blk, true);
        for (int64_t i = 0; i < nf; i++) y[i] = (double)tmp2[i];
    } else if (cst == JDT_OK) {
        for (int64_t i = 0; i < nl; i++) y[i] = (double)tmp[i] * a->f[0];
    }
    jdt_free(tmp);
    return cst;
}

/* Computes node t's value from its inputs' values: one-line elementwise loops inline, every
 * other op in its eval_<op> function above; then rounds it to t's dtype. */
static jdt_status eval_node(jdt_interp *it, jdt_tensor *t, jdt_err *e)
{
    node_val *nv = it->vals;
    node_ctx nd;
    nd.it = it;
    nd.t = t;
    nd.e = e;
    double *y = nd.y = nv[t->id].v;
    const int64_t n = nd.n = nv[t->id].numel;
    const jdt_attrs *a = nd.a = &t->attrs;
    const double *x0 = nd.x0 = t->n_inputs > 0 ? nv[t->inputs[0]->id].v : NULL;
    const double *x1 = nd.x1 = t->n_inputs > 1 ? nv[t->inputs[1]->id].v : NULL;
    const double *x2 = nd.x2 = t->n_inputs > 2 ? nv[t->inputs[2]->id].v : NULL;
    nd.x3 = t->n_inputs > 3 ? nv[t->inputs[3]->id].v : NULL;
    nd.s0 = t->n_inputs > 0 ? &t->inputs[0]->shape : NULL;
    const jdt_shape *so = nd.so = &t->shape;
    nd.last = so->ndim ? so->dims[so->ndim - 1] : 1;
    nd.rows = nd.last ? n / nd.last : 0;
    jdt_status st = JDT_OK;

    /* the switch lists every op (-Wswitch-enum); a value outside the enum stops here */
    if ((int)jdt_op_class_of(t->op) == JDT_OPC_COUNT)
        return FAIL(JDT_ERR_UNSUPPORTED, "op %d is not in the op table", (int)t->op);
    switch (t->op) {
    case JDT_OP_PARAM:
    case JDT_OP_INPUT:
        st = eval_leaf(&nd);
        break;
    case JDT_OP_CONSTANT:
        for (int64_t i = 0; i < n; i++)
            y[i] = t->data ? load(t->dtype, t->data, i) : a->f[0];
        break;
    case JDT_OP_NEG:
        for (int64_t i = 0; i < n; i++)
            y[i] = -x0[i];
        break;
    case JDT_OP_EXP:
        for (int64_t i = 0; i < n; i++)
            y[i] = exp(x0[i]);
        break;
    case JDT_OP_LOG:
        for (int64_t i = 0; i < n; i++)
            y[i] = log(x0[i]);
        break;
    case JDT_OP_TANH:
        for (int64_t i = 0; i < n; i++)
            y[i] = tanh(x0[i]);
        break;
    case JDT_OP_SQRT:
        for (int64_t i = 0; i < n; i++)
            y[i] = sqrt(x0[i]);
        break;
    case JDT_OP_RSQRT:
        for (int64_t i = 0; i < n; i++)
            y[i] = 1.0 / sqrt(x0[i]);
        break;
    case JDT_OP_RELU:
        for (int64_t i = 0; i < n; i++)
            y[i] = x0[i] > 0 ? x0[i] : 0.0;
        break;
    case JDT_OP_GELU:
        for (int64_t i = 0; i < n; i++)
            y[i] = gelu(x0[i]);
        break;
    case JDT_OP_SILU:
        for (int64_t i = 0; i < n; i++)
            y[i] = x0[i] * sigmoid(x0[i]);
        break;
    case JDT_OP_SIGMOID:
        for (int64_t i = 0; i < n; i++)
            y[i] = sigmoid(x0[i]);
        break;
    case JDT_OP_ABS:
        for (int64_t i = 0; i < n; i++)
            y[i] = fabs(x0[i]);
        break;
    case JDT_OP_ADD:
        for (int64_t i = 0; i < n; i++)
            y[i] = x0[i] + x1[i];
        break;
    case JDT_OP_SUB:
        for (int64_t i = 0; i < n; i++)
            y[i] = x0[i] - x1[i];
        break;
    case JDT_OP_MUL:
        for (int64_t i = 0; i < n; i++)
            y[i] = x0[i] * x1[i];
        break;
    case JDT_OP_DIV:
        for (int64_t i = 0; i < n; i++)
            y[i] = x0[i] / x1[i];
        break;
    case JDT_OP_MAX:
        for (int64_t i = 0; i < n; i++)
            y[i] = x0[i] >= x1[i] ? x0[i] : x1[i];
        break;
    case JDT_OP_MIN:
        for (int64_t i = 0; i < n; i++)
            y[i] = x0[i] <= x1[i] ? x0[i] : x1[i];
        break;
    case JDT_OP_GT:
        for (int64_t i = 0; i < n; i++)
            y[i] = x0[i] > x1[i] ? 1.0 : 0.0;
        break;
    case JDT_OP_GE:
        for (int64_t i = 0; i < n; i++)
            y[i] = x0[i] >= x1[i] ? 1.0 : 0.0;
        break;
    case JDT_OP_ADD_SCALAR:
        for (int64_t i = 0; i < n; i++)
            y[i] = x0[i] + a->f[0];
        break;
    case JDT_OP_MUL_SCALAR:
        for (int64_t i = 0; i < n; i++)
            y[i] = x0[i] * a->f[0];
        break;
    case JDT_OP_POW_SCALAR:
        for (int64_t i = 0; i < n; i++)
            y[i] = pow(x0[i], a->f[0]);
        break;
    case JDT_OP_GELU_GRAD:
        for (int64_t i = 0; i < n; i++)
            y[i] = x1[i] * gelu_deriv(x0[i]);
        break;
    case JDT_OP_SILU_GRAD:
        for (int64_t i = 0; i < n; i++) {
            double sg = sigmoid(x0[i]);
            y[i] = x1[i] * sg * (1.0 + x0[i] * (1.0 - sg));
        }
        break;
    case JDT_OP_SELECT:
        for (int64_t i = 0; i < n; i++)
            y[i] = x0[i] != 0 ? x1[i] : x2[i];
        break;
    case JDT_OP_CAST:
    case JDT_OP_STOP_GRADIENT:
    case JDT_OP_RESHAPE:
        memcpy(y, x0, (size_t)n * sizeof(double));
        break;
    case JDT_OP_DROPOUT:
        st = eval_dropout(&nd);
        break;
    case JDT_OP_BROADCAST:
        st = eval_broadcast(&nd);
        break;
    case JDT_OP_REDUCE_SUM:
    case JDT_OP_REDUCE_MEAN:
    case JDT_OP_REDUCE_MAX:
        st = eval_reduce(&nd);
        break;
    case JDT_OP_TRANSPOSE:
        st = eval_transpose(&nd);
        break;
    case JDT_OP_SLICE:
        st = eval_slice(&nd);
        break;
    case JDT_OP_CONCAT:
        st = eval_concat(&nd);
        break;
    case JDT_OP_MATMUL:
        st = eval_matmul(&nd);
        break;
    case JDT_OP_GATHER:
        st = eval_gather(&nd);
        break;
    case JDT_OP_SCATTER_ADD:
        st = eval_scatter_add(&nd);
        break;
    case JDT_OP_IOTA:
        st = eval_iota(&nd);
        break;
    case JDT_OP_CAUSAL_MASK:
        st = eval_causal_mask(&nd);
        break;
    case JDT_OP_SOFTMAX:
    case JDT_OP_LOG_SOFTMAX:
        st = eval_softmax(&nd);
        break;
    case JDT_OP_SOFTMAX_BWD:
    case JDT_OP_LOG_SOFTMAX_BWD:
        st = eval_softmax_bwd(&nd);
        break;
    case JDT_OP_SOFTMAX_XENT:
    case JDT_OP_SOFTMAX_XENT_BWD:
        st = eval_softmax_xent(&nd);
        break;
    case JDT_OP_NORMALIZE:
    case JDT_OP_NORMALIZE_BWD:
        st = eval_normalize(&nd);
        break;
    case JDT_OP_RMS_NORMALIZE:
    case JDT_OP_RMS_NORMALIZE_BWD:
        st = eval_rms_normalize(&nd);
        break;
    case JDT_OP_ROPE:
        st = eval_rope(&nd);
        break;
    case JDT_OP_ATTENTION:
    case JDT_OP_ATTENTION_BWD:
        st = eval_attention(&nd);
        break;
    case JDT_OP_ALL_REDUCE:
        st = eval_all_reduce(&nd);
        break;
    case JDT_OP_ALL_GATHER:
    case JDT_OP_REDUCE_SCATTER:
        st = eval_gather_scatter(&nd);
        break;
    }
    if (st != JDT_OK) return st;
    round_store(t->dtype, y, nv[t->id].buf, n);
    return JDT_OK;
}

jdt_status jdt_interp_run(jdt_interp *it, jdt_err *e)
{
    if (!it) return jdt_err_set(e, JDT_ERR_INVALID, "interp: NULL interpreter");
    if (jdt_graph_error_msg(it->g))
        return jdt_err_set(e, JDT_ERR_INVALID, "interp: graph has a builder error: %s",
                           jdt_graph_error_msg(it->g));
    it->ran = false;
    jdt_status st = alloc_vals(it, e);
    if (st != JDT_OK) return st;
    int n = jdt_graph_n_nodes(it->g);
    for (int i = 0; i < n; i++) {
        st = eval_node(it, jdt_graph_node(it->g, i), e);
        if (st != JDT_OK) return st;
    }
    for (int u = 0; u < jdt_graph_n_updates(it->g); u++) {
        jdt_tensor *target, *value;
        jdt_graph_update(it->g, u, &target, &value);
        if (!target->data)
            return jdt_err_set(e, JDT_ERR_INVALID, "interp: update target '%s' has no bound data",
                               target->name ? target->name : "?");
    }
    for (int u = 0; u < jdt_graph_n_updates(it->g); u++) {
        jdt_tensor *target, *value;
        jdt_graph_update(it->g, u, &target, &value);
        memcpy(target->data, it->vals[value->id].buf,
               (size_t)it->vals[value->id].numel * jdt_dtype_size(value->dtype));
    }
    it->ran = true;
    return JDT_OK;
}

static bool has_value(const jdt_interp *it, const jdt_tensor *t)
{
    return it && t && it->ran && t->id >= 0 && t->id < it->n_alloc &&
           jdt_graph_node(it->g, t->id) == t;
}

const void *jdt_interp_value(const jdt_interp *it, const jdt_tensor *t)
{
    return has_value(it, t) ? it->vals[t->id].buf : NULL;
}

jdt_status jdt_interp_read_f64(const jdt_interp *it, const jdt_tensor *t, double *out, jdt_err *e)
{
    if (!has_value(it, t))
        return jdt_err_set(e, JDT_ERR_INVALID, "interp: no value for this tensor (run first)");
    memcpy(out, it->vals[t->id].v, (size_t)it->vals[t->id].numel * sizeof(double));
    return JDT_OK;
}

jdt_status jdt_interp_copy_outputs(const jdt_interp *it, void *const *outs, jdt_err *e)
{
    if (!it || !outs)
        return jdt_err_set(e, JDT_ERR_INVALID, "interp: NULL interpreter or output array");
    for (int i = 0; i < jdt_graph_n_outputs(it->g); i++) {
        const jdt_tensor *t = jdt_graph_output(it->g, i);
        if (!has_value(it, t))
            return jdt_err_set(e, JDT_ERR_INVALID, "interp: no value for output %d (run first)", i);
        memcpy(outs[i], it->vals[t->id].buf,
               (size_t)it->vals[t->id].numel * jdt_dtype_size(t->dtype));
    }
    return JDT_OK;
}
