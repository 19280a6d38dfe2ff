/*
 * codegen.c — C source for every fused group: one translation unit per program, one static
 * function per group, exported through a table `jdt_kernels[]` (the runtime dlsym's it).
 *
 * A group is a loop nest over its domain. Every memory access (reads of external inputs,
 * stores of materialised members, the reduction output) is an affine map of the loop indices
 * (stride per dim + base), which covers identity reads, broadcasts (stride 0), transposes
 * (permuted strides) and slices (base offset). Adjacent dims are merged whenever every access
 * allows it, so plain elementwise chains become one flat loop and row reductions a
 * (rows, cols) nest with an `omp simd` accumulator. Shapes, strides and scalars are literals:
 * the kernel is specialised to the program. The outer loop gets `omp parallel for` when the
 * domain is big enough. Math is <tgmath.h> in the node's own type (float stays float) and no
 * fast-math flag is used, so NaN/Inf propagate as in the reference.
 */
#include "compile/compile-impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define PAR_MIN_ELEMS 32768

typedef struct {
    char *buf;
    size_t len, cap;
    bool oom;
    int bad_node; /* 1 + the id of the first node no emitter handles; 0: none */
} sbuf;

static void sb_printf(sbuf *s, const char *fmt, ...) JDT_PRINTF(2, 3);
static void sb_printf(sbuf *s, const char *fmt, ...)
{
    if (s->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(s->buf ? s->buf + s->len : NULL, s->buf ? s->cap - s->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            s->oom = true;
            return;
        }
        if (s->buf && s->len + (size_t)n < s->cap) {
            s->len += (size_t)n;
            return;
        }
        size_t nc = s->cap ? s->cap * 2 : 65536;
        while (nc < s->len + (size_t)n + 1)
            nc *= 2;
        char *p = jdt_realloc(s->buf, nc);
        if (!p) {
            s->oom = true;
            return;
        }
        s->buf = p;
        s->cap = nc;
    }
}

static const char *ctype(jdt_dtype dt)
{
    switch (dt) {
    case JDT_DTYPE_F32:
        return "float";
    case JDT_DTYPE_F64:
        return "double";
    case JDT_DTYPE_I32:
        return "int32_t";
    case JDT_DTYPE_U8:
        return "uint8_t";
    case JDT_DTYPE_U16:
        return "uint16_t";
    case JDT_DTYPE_U32:
        return "uint32_t";
    case JDT_DTYPE_BF16: /* refused before codegen (passes.c check_node) */
    case JDT_DTYPE_COUNT:
        break;
    }
    return "void";
}

static bool is_float(jdt_dtype dt)
{
    return dt == JDT_DTYPE_F32 || dt == JDT_DTYPE_F64;
}

/* A literal of type dt ("((float)0.5)", "((float)INFINITY)", "((int32_t)3)"). */
static void lit(char *out, size_t n, jdt_dtype dt, double v)
{
    const char *t = ctype(dt);
    if (!is_float(dt))
        snprintf(out, n, "((%s)%lld)", t, (long long)v);
    else if (isnan(v))
        snprintf(out, n, "((%s)NAN)", t);
    else if (isinf(v))
        snprintf(out, n, "(%s(%s)INFINITY)", v < 0 ? "-" : "", t);
    else
        snprintf(out, n, "((%s)%.17g)", t, v);
}

/* ---- accesses and dim collapsing ------------------------------------------------------------ */

#define MAX_ACC (JDT_GROUP_MAX_READS + JDT_GROUP_MAX_STORES + 2)

typedef struct {
    int64_t stride[JDT_MAX_DIMS];
    int64_t base;
    int node;   /* the buffer's node (read) or the stored node (write) */
    int reader; /* reads through a MAP member: that member; identity/scalar: -1 */
    bool write;
} access;

typedef struct {
    const cprog *c;
    const cgroup *g;
    int n; /* dims after collapsing */
    int64_t dims[JDT_MAX_DIMS];
    bool kept[JDT_MAX_DIMS];
    access acc[MAX_ACC];
    int n_acc;
    int flat; /* access index of the contiguous flat index */
} nest;

static void contiguous(const jdt_shape *s, int64_t *st)
{
    int64_t k = 1;
    for (int d = s->ndim - 1; d >= 0; d--) {
        st[d] = s->dims[d] == 1 ? 0 : k;
        k *= s->dims[d];
    }
}

/* Strides (in domain coords) of a MAP member's read. Each strided op is an affine index map
 * in = S * out + o (S selects dims: broadcast drops/zeros, transpose permutes, slice offsets);
 * maps of absorbed producers compose, then the buffer's contiguous strides give the offsets. */
static void map_strides(const cprog *c, const cnode *m, access *a)
{
    int nd = m->shape.ndim;
    int64_t M[JDT_MAX_DIMS][JDT_MAX_DIMS], o[JDT_MAX_DIMS];
    memset(M, 0, sizeof M);
    memset(o, 0, sizeof o);
    for (int k = 0; k < nd; k++)
        M[k][k] = 1; /* cur index = M * domain index + o, cur = m's output */
    const cnode *cur = m;
    const cnode *x = &c->nodes[cur->in[0]];
    for (;;) {
        int cd = cur->shape.ndim, xd = x->shape.ndim;
        int64_t S[JDT_MAX_DIMS][JDT_MAX_DIMS], so[JDT_MAX_DIMS], M2[JDT_MAX_DIMS][JDT_MAX_DIMS],
            o2[JDT_MAX_DIMS];
        memset(S, 0, sizeof S);
        memset(so, 0, sizeof so);
        if (cur->op == JDT_OP_BROADCAST) {
            int lead = cd - xd;
            for (int l = 0; l < xd; l++)
                if (x->shape.dims[l] != 1) S[l][l + lead] = 1;
        } else if (cur->op == JDT_OP_TRANSPOSE) {
            for (int k = 0; k < cd; k++)
                S[cur->attrs.i[k]][k] = 1;
        } else { /* SLICE */
            for (int l = 0; l < xd; l++)
                S[l][l] = 1;
            so[cur->attrs.i[0]] = cur->attrs.i[1];
        }
        for (int l = 0; l < xd; l++) {
            o2[l] = so[l];
            for (int j = 0; j < cd; j++)
                o2[l] += S[l][j] * o[j];
            for (int k = 0; k < nd; k++) {
                M2[l][k] = 0;
                for (int j = 0; j < cd; j++)
                    M2[l][k] += S[l][j] * M[j][k];
            }
        }
        memcpy(M, M2, sizeof M);
        memcpy(o, o2, sizeof o);
        if (!x->absorbed) break;
        cur = x;
        x = &c->nodes[cur->in[0]];
    }
    int64_t in_st[JDT_MAX_DIMS];
    contiguous(&x->shape, in_st);
    memset(a->stride, 0, sizeof a->stride);
    a->base = 0;
    for (int l = 0; l < x->shape.ndim; l++) {
        a->base += in_st[l] * o[l];
        for (int k = 0; k < nd; k++)
            a->stride[k] += in_st[l] * M[l][k];
    }
}

static int add_access(nest *N, int node, int reader, bool write)
{
    for (int i = 0; i < N->n_acc; i++)
        if (N->acc[i].node == node && N->acc[i].reader == reader && N->acc[i].write == write)
            return i;
    if (N->n_acc >= MAX_ACC) return -1;
    const cprog *c = N->c;
    access *a = &N->acc[N->n_acc];
    memset(a, 0, sizeof *a);
    a->node = node;
    a->reader = reader;
    a->write = write;
    const jdt_shape *dom = &N->g->domain;
    if (reader >= 0) {
        map_strides(c, &c->nodes[reader], a);
    } else if (write && c->nodes[node].kind == CK_REDUCE) {
        /* kept dims contiguous over the kept shape, reduced dims 0 */
        int64_t k = 1;
        for (int d = dom->ndim - 1; d >= 0; d--) {
            if (cnode_reduces_axis(&c->nodes[node], d)) continue;
            a->stride[d] = dom->dims[d] == 1 ? 0 : k;
            k *= dom->dims[d];
        }
    } else if (jdt_shape_numel(&c->nodes[node].shape) == 1 && jdt_shape_numel(dom) != 1) {
        /* scalar read (DROPOUT's step) */
    } else {
        contiguous(dom, a->stride);
    }
    return N->n_acc++;
}

static void collapse(nest *N)
{
    const jdt_shape *dom = &N->g->domain;
    int64_t st[MAX_ACC][JDT_MAX_DIMS];
    int n = 0;
    /* drop size-1 dims */
    for (int d = 0; d < dom->ndim; d++) {
        if (dom->dims[d] == 1) continue;
        N->dims[n] = dom->dims[d];
        N->kept[n] = !N->g->is_reduce || !cnode_reduces_axis(&N->c->nodes[N->g->root], d);
        for (int a = 0; a < N->n_acc; a++)
            st[a][n] = N->acc[a].stride[d];
        n++;
    }
    /* merge k, k+1 when every access allows it */
    for (int k = n - 2; k >= 0; k--) {
        bool ok = N->kept[k] == N->kept[k + 1];
        for (int a = 0; a < N->n_acc && ok; a++)
            ok = st[a][k] == st[a][k + 1] * N->dims[k + 1];
        if (!ok) continue;
        N->dims[k] *= N->dims[k + 1];
        for (int a = 0; a < N->n_acc; a++)
            st[a][k] = st[a][k + 1];
        for (int j = k + 1; j < n - 1; j++) {
            N->dims[j] = N->dims[j + 1];
            N->kept[j] = N->kept[j + 1];
            for (int a = 0; a < N->n_acc; a++)
                st[a][j] = st[a][j + 1];
        }
        n--;
    }
    if (n == 0) { /* a single element */
        N->dims[0] = 1;
        N->kept[0] = true;
        for (int a = 0; a < N->n_acc; a++)
            st[a][0] = 0;
        n = 1;
    }
    N->n = n;
    for (int a = 0; a < N->n_acc; a++) {
        memset(N->acc[a].stride, 0, sizeof N->acc[a].stride);
        for (int k = 0; k < n; k++)
            N->acc[a].stride[k] = st[a][k];
    }
}

static void offset_expr(const nest *N, int a, char *out, size_t n)
{
    size_t off = (size_t)snprintf(out, n, "%lld", (long long)N->acc[a].base);
    for (int k = 0; k < N->n && off < n; k++) {
        int64_t s = N->acc[a].stride[k];
        if (s == 0) continue;
        if (s == 1)
            off += (size_t)snprintf(out + off, n - off, " + i%d", k);
        else
            off += (size_t)snprintf(out + off, n - off, " + %lldLL * i%d", (long long)s, k);
    }
}

/* ---- values ---------------------------------------------------------------------------------- */

/* The expression naming input k of member m: a literal, a member value or a loaded read. */
static void operand(const nest *N, const cnode *m, int k, char *out, size_t n)
{
    const cprog *c = N->c;
    int x = cnode_read_src(c, m->in[k]);
    const cnode *xn = &c->nodes[x];
    if (xn->kind == CK_SPLAT)
        lit(out, n, xn->dtype, xn->splat);
    else if (xn->group == m->group && m->group >= 0 && m->kind != CK_MAP)
        snprintf(out, n, "v%d", x);
    else {
        for (int a = 0; a < N->n_acc; a++)
            if (!N->acc[a].write && N->acc[a].node == x &&
                N->acc[a].reader == (m->kind == CK_MAP ? (int)(m - c->nodes) : -1)) {
                snprintf(out, n, "x%d", a);
                return;
            }
        snprintf(out, n, "0 /* missing */");
    }
}

static void emit_value(sbuf *s, const nest *N, int id)
{
    const cprog *c = N->c;
    const cnode *m = &c->nodes[id];
    const char *T = ctype(m->dtype);
    char a[96] = "", b[96] = "", d[96] = "";
    if (m->n_in > 0) operand(N, m, 0, a, sizeof a);
    if (m->n_in > 1) operand(N, m, 1, b, sizeof b);
    if (m->n_in > 2) operand(N, m, 2, d, sizeof d);
    double f = m->attrs.f[0];
    const char *EXP = m->dtype == JDT_DTYPE_F32 ? "jdt_expf" : "exp";
    const char *TANH = m->dtype == JDT_DTYPE_F32 ? "jdt_tanhf" : "tanh";
    char F[64];
    lit(F, sizeof F, m->dtype, f);
    sb_printf(s, "        const %s v%d = ", T, id);
    switch (m->op) {
    case JDT_OP_CONSTANT: {
        char L[64];
        lit(L, sizeof L, m->dtype, m->splat);
        sb_printf(s, "%s;\n", L);
        return;
    }
    case JDT_OP_BROADCAST:
    case JDT_OP_TRANSPOSE:
    case JDT_OP_SLICE:
        sb_printf(s, "%s;\n", a);
        return;
    case JDT_OP_NEG:
        sb_printf(s, "-%s;\n", a);
        return;
    case JDT_OP_EXP:
        sb_printf(s, "%s(%s);\n", EXP, a);
        return;
    case JDT_OP_LOG:
        sb_printf(s, "log(%s);\n", a);
        return;
    case JDT_OP_TANH:
        sb_printf(s, "%s(%s);\n", TANH, a);
        return;
    case JDT_OP_SQRT:
        sb_printf(s, "sqrt(%s);\n", a);
        return;
    case JDT_OP_RSQRT:
        sb_printf(s, "(%s)1 / sqrt(%s);\n", T, a);
        return;
    case JDT_OP_RELU:
        sb_printf(s, "%s > (%s)0 ? %s : (%s)0;\n", a, T, a, T);
        return;
    case JDT_OP_GELU:
        sb_printf(s,
                  "(%s)0.5 * %s * ((%s)1 + %s((%s)0.7978845608028654 * (%s + (%s)0.044715 * %s * "
                  "%s * %s)));\n",
                  T, a, T, TANH, T, a, T, a, a, a);
        return;
    case JDT_OP_SILU:
        sb_printf(s, "%s / ((%s)1 + %s(-%s));\n", a, T, EXP, a);
        return;
    case JDT_OP_SIGMOID:
        sb_printf(s, "(%s)1 / ((%s)1 + %s(-%s));\n", T, T, EXP, a);
        return;
    case JDT_OP_ABS:
        sb_printf(s, "fabs(%s);\n", a);
        return;
    case JDT_OP_ADD:
        sb_printf(s, "%s + %s;\n", a, b);
        return;
    case JDT_OP_SUB:
        sb_printf(s, "%s - %s;\n", a, b);
        return;
    case JDT_OP_MUL:
        sb_printf(s, "%s * %s;\n", a, b);
        return;
    case JDT_OP_DIV:
        sb_printf(s, "%s / %s;\n", a, b);
        return;
    case JDT_OP_MAX:
        sb_printf(s, "%s >= %s ? %s : %s;\n", a, b, a, b);
        return;
    case JDT_OP_MIN:
        sb_printf(s, "%s <= %s ? %s : %s;\n", a, b, a, b);
        return;
    case JDT_OP_GT:
        sb_printf(s, "%s > %s ? (%s)1 : (%s)0;\n", a, b, T, T);
        return;
    case JDT_OP_GE:
        sb_printf(s, "%s >= %s ? (%s)1 : (%s)0;\n", a, b, T, T);
        return;
    case JDT_OP_ADD_SCALAR:
        sb_printf(s, "%s + %s;\n", a, F);
        return;
    case JDT_OP_MUL_SCALAR:
        sb_printf(s, "%s * %s;\n", a, F);
        return;
    case JDT_OP_POW_SCALAR:
        if (f == 2.0)
            sb_printf(s, "%s * %s;\n", a, a);
        else if (f == 3.0)
            sb_printf(s, "%s * %s * %s;\n", a, a, a);
        else if (f == -1.0)
            sb_printf(s, "(%s)1 / %s;\n", T, a);
        else if (f == 0.5) /* GCC's vectoriser turns pow(x, 0.5) into sqrt(x), which differs at
                              -0 and -inf: spell out pow's values there */
            sb_printf(s, "%s == -(%s)INFINITY ? (%s)INFINITY : sqrt(%s) + (%s)0;\n", a, T, T, a, T);
        else
            sb_printf(s, "pow(%s, %s);\n", a, F);
        return;
    case JDT_OP_SELECT:
        sb_printf(s, "%s != 0 ? %s : %s;\n", a, b, d);
        return;
    case JDT_OP_CAST:
        if (m->dtype == JDT_DTYPE_I32 && is_float(N->c->nodes[m->in[0]].dtype))
            /* saturating, NaN -> 0: a plain C cast is undefined out of range */
            sb_printf(s,
                      "%s != %s ? 0 : %s >= 2147483647.0 ? INT32_MAX : %s <= -2147483648.0 ? "
                      "INT32_MIN : (int32_t)%s;\n",
                      a, a, a, a, a);
        else
            sb_printf(s, "(%s)%s;\n", T, a);
        return;
    case JDT_OP_STOP_GRADIENT:
        sb_printf(s, "%s;\n", a);
        return;
    case JDT_OP_DROPOUT: {
        double p = f, scale = p < 1.0 ? 1.0 / (1.0 - p) : 0.0;
        char P[64], SC[64];
        lit(P, sizeof P, JDT_DTYPE_F32, p);
        lit(SC, sizeof SC, m->dtype, scale);
        sb_printf(s,
                  "jdt_unit(jdt_philox_w0(%lluULL, (uint64_t)(int64_t)%s, (uint64_t)flat)) >= %s "
                  "? %s * %s : (%s)0;\n",
                  (unsigned long long)m->attrs.i[0], b, P, a, SC, T);
        return;
    }
    case JDT_OP_IOTA: {
        int ax = (int)m->attrs.i[0];
        int64_t inner = 1;
        for (int k = ax + 1; k < m->shape.ndim; k++)
            inner *= m->shape.dims[k];
        sb_printf(s, "(%s)((flat / %lldLL) %% %lldLL);\n", T, (long long)inner,
                  (long long)m->shape.dims[ax]);
        return;
    }
    case JDT_OP_CAUSAL_MASK: {
        long long t = (long long)m->shape.dims[1];
        sb_printf(s, "(flat %% %lldLL) <= (flat / %lldLL) ? (%s)0 : -(%s)INFINITY;\n", t, t, T, T);
        return;
    }
    case JDT_OP_PARAM:
    case JDT_OP_INPUT:
    case JDT_OP_GELU_GRAD:
    case JDT_OP_SILU_GRAD:
    case JDT_OP_REDUCE_SUM:
    case JDT_OP_REDUCE_MAX:
    case JDT_OP_REDUCE_MEAN:
    case JDT_OP_RESHAPE:
    case JDT_OP_CONCAT:
    case JDT_OP_MATMUL:
    case JDT_OP_GATHER:
    case JDT_OP_SCATTER_ADD:
    case JDT_OP_SOFTMAX:
    case JDT_OP_SOFTMAX_BWD:
    case JDT_OP_LOG_SOFTMAX:
    case JDT_OP_LOG_SOFTMAX_BWD:
    case JDT_OP_SOFTMAX_XENT:
    case JDT_OP_SOFTMAX_XENT_BWD:
    case JDT_OP_NORMALIZE:
    case JDT_OP_NORMALIZE_BWD:
    case JDT_OP_RMS_NORMALIZE:
    case JDT_OP_RMS_NORMALIZE_BWD:
    case JDT_OP_ROPE:
    case JDT_OP_ATTENTION:
    case JDT_OP_ATTENTION_BWD:
    case JDT_OP_ALL_REDUCE:
    case JDT_OP_ALL_GATHER:
    case JDT_OP_REDUCE_SCATTER:
        /* leaves and views are loaded (emit_loads), GELU_GRAD/SILU_GRAD are emit_value_full's,
         * reductions are the group root, the rest are builtin calls: none should reach here */
        break;
    }
    if (!s->bad_node) s->bad_node = id + 1; /* jdt_compile_codegen turns it into the error */
}

/* GELU_GRAD/SILU_GRAD need a temporary; written as a statement block. */
static void emit_value_full(sbuf *s, const nest *N, int id)
{
    const cnode *m = &N->c->nodes[id];
    if (m->op != JDT_OP_GELU_GRAD && m->op != JDT_OP_SILU_GRAD) {
        emit_value(s, N, id);
        return;
    }
    const char *T = ctype(m->dtype);
    const char *EXP = m->dtype == JDT_DTYPE_F32 ? "jdt_expf" : "exp";
    const char *TANH = m->dtype == JDT_DTYPE_F32 ? "jdt_tanhf" : "tanh";
    char x[96], dy[96];
    operand(N, m, 0, x, sizeof x);
    operand(N, m, 1, dy, sizeof dy);
    if (m->op == JDT_OP_GELU_GRAD) {
        sb_printf(s,
                  "        const %s t%d = %s((%s)0.7978845608028654 * (%s + (%s)0.044715 * %s * %s "
                  "* %s));\n",
                  T, id, TANH, T, x, T, x, x, x);
        sb_printf(s,
                  "        const %s v%d = %s * ((%s)0.5 * ((%s)1 + t%d) + (%s)0.5 * %s * ((%s)1 - "
                  "t%d * t%d) * (%s)0.7978845608028654 * ((%s)1 + (%s)0.134145 * %s * %s));\n",
                  T, id, dy, T, T, id, T, x, T, id, id, T, T, T, x, x);
    } else {
        sb_printf(s, "        const %s t%d = (%s)1 / ((%s)1 + %s(-%s));\n", T, id, T, T, EXP, x);
        sb_printf(s, "        const %s v%d = %s * t%d * ((%s)1 + %s * ((%s)1 - t%d));\n", T, id, dy,
                  id, T, x, T, id);
    }
}

static bool needs_flat(const nest *N)
{
    for (int i = 0; i < N->g->n_members; i++) {
        jdt_op op = N->c->nodes[N->g->members[i]].op;
        if (op == JDT_OP_DROPOUT || op == JDT_OP_IOTA || op == JDT_OP_CAUSAL_MASK) return true;
    }
    return false;
}

static void emit_loads(sbuf *s, const nest *N)
{
    char off[512];
    for (int a = 0; a < N->n_acc; a++) {
        if (N->acc[a].write || a == N->flat) continue;
        offset_expr(N, a, off, sizeof off);
        sb_printf(s, "        const %s x%d = r%d[%s];\n", ctype(N->c->nodes[N->acc[a].node].dtype),
                  a, a, off);
    }
    if (N->flat >= 0) {
        offset_expr(N, N->flat, off, sizeof off);
        sb_printf(s, "        const int64_t flat = %s;\n", off);
    }
}

static void emit_loops(sbuf *s, const nest *N, int from, int to)
{
    for (int k = from; k < to; k++)
        sb_printf(s, "    for (int64_t i%d = 0; i%d < %lldLL; i%d++)\n", k, k,
                  (long long)N->dims[k], k);
}

static void emit_parallel(sbuf *s, const nest *N, int n_outer, int nt)
{
    if (jdt_shape_numel(&N->g->domain) < PAR_MIN_ELEMS || n_outer < 1 || !N->kept[0]) return;
    int col = 1;
    int64_t prod = N->dims[0];
    while (col < n_outer && N->kept[col] && prod < 4 * nt)
        prod *= N->dims[col++];
    if (prod < 2) return;
    if (col > 1)
        sb_printf(s, "    #pragma omp parallel for num_threads(%d) collapse(%d)\n", nt, col);
    else
        sb_printf(s, "    #pragma omp parallel for num_threads(%d)\n", nt);
}

static void emit_group(sbuf *s, const cprog *c, int gi, int kernel, int nt, jdt_err *e,
                       jdt_status *st)
{
    const cgroup *g = &c->groups[gi];
    nest N;
    memset(&N, 0, sizeof N);
    N.c = c;
    N.g = g;
    N.flat = -1;
    /* accesses */
    for (int i = 0; i < g->n_members; i++) {
        const cnode *m = &c->nodes[g->members[i]];
        for (int k = 0; k < m->n_in; k++) {
            int xi = cnode_read_src(c, m->in[k]);
            const cnode *x = &c->nodes[xi];
            if (x->kind == CK_SPLAT || (x->group == gi && m->kind != CK_MAP)) continue;
            int r = m->kind == CK_MAP ? g->members[i] : -1;
            if (add_access(&N, xi, r, false) < 0) goto too_many;
        }
        if (m->store && add_access(&N, g->members[i], -1, true) < 0) goto too_many;
    }
    if (needs_flat(&N)) {
        if (N.n_acc >= MAX_ACC) goto too_many;
        N.flat = N.n_acc++;
        memset(&N.acc[N.flat], 0, sizeof(access));
        N.acc[N.flat].node = -1;
        N.acc[N.flat].reader = -2;
        contiguous(&g->domain, N.acc[N.flat].stride);
    }
    collapse(&N);

    const cnode *root = &c->nodes[g->root];
    sb_printf(s, "/* group %d: %d op(s), root node %d (%s), domain", gi, g->n_members, g->root,
              jdt_op_name(root->op));
    for (int k = 0; k < N.n; k++)
        sb_printf(s, " %lld%s", (long long)N.dims[k], N.kept[k] ? "" : "r");
    sb_printf(s, " */\nstatic void k%d(void *const *p)\n{\n", kernel);
    for (int a = 0; a < N.n_acc; a++) {
        if (a == N.flat) continue;
        const cnode *x = &c->nodes[N.acc[a].node];
        if (N.acc[a].write)
            sb_printf(s, "    %s *w%d = (%s *)p[%d];\n", ctype(x->dtype), a, ctype(x->dtype),
                      x->buf);
        else
            sb_printf(s, "    const %s *r%d = (const %s *)p[%d];\n", ctype(x->dtype), a,
                      ctype(x->dtype), x->buf);
    }
    char off[512];
    if (!g->is_reduce) {
        emit_parallel(s, &N, N.n > 1 ? N.n - 1 : 1, nt);
        emit_loops(s, &N, 0, N.n);
        sb_printf(s, "    {\n");
        emit_loads(s, &N);
        for (int i = 0; i < g->n_members; i++)
            emit_value_full(s, &N, g->members[i]);
        for (int a = 0; a < N.n_acc; a++) {
            if (!N.acc[a].write) continue;
            offset_expr(&N, a, off, sizeof off);
            sb_printf(s, "        w%d[%s] = v%d;\n", a, off, N.acc[a].node);
        }
        sb_printf(s, "    }\n}\n\n");
        return;
    }
    /* reductions */
    const cnode *in = &c->nodes[root->in[0]];
    const char *T = ctype(root->dtype);
    int w = -1;
    for (int a = 0; a < N.n_acc; a++)
        if (N.acc[a].write) w = a;
    char init[64], src[96];
    lit(init, sizeof init, root->dtype, root->op == JDT_OP_REDUCE_MAX ? -INFINITY : 0.0);
    operand(&N, root, 0, src, sizeof src);
    int64_t count = jdt_shape_numel(&in->shape) /
                    (jdt_shape_numel(&root->shape) ? jdt_shape_numel(&root->shape) : 1);
    bool is_max = root->op == JDT_OP_REDUCE_MAX, is_mean = root->op == JDT_OP_REDUCE_MEAN;
    bool acc_pattern = !N.kept[N.n - 1];
    for (int k = 0; k < N.n - 1; k++)
        acc_pattern = acc_pattern && N.kept[k];
    if (acc_pattern) {
        int n_outer = N.n - 1;
        if (n_outer > 0) emit_parallel(s, &N, n_outer, nt);
        emit_loops(s, &N, 0, n_outer);
        sb_printf(s, "    {\n    %s acc = %s;\n", T, init);
        if (n_outer == 0 && jdt_shape_numel(&g->domain) >= PAR_MIN_ELEMS)
            sb_printf(s, "    #pragma omp parallel for simd num_threads(%d) reduction(%s : acc)\n",
                      nt, is_max ? "max" : "+");
        else
            sb_printf(s, "    #pragma omp simd reduction(%s : acc)\n", is_max ? "max" : "+");
        emit_loops(s, &N, n_outer, N.n);
        sb_printf(s, "    {\n");
        emit_loads(s, &N);
        for (int i = 0; i < g->n_members; i++)
            if (g->members[i] != g->root) emit_value_full(s, &N, g->members[i]);
        if (is_max)
            sb_printf(s, "        acc = %s > acc ? %s : acc;\n", src, src);
        else
            sb_printf(s, "        acc += %s;\n", src);
        sb_printf(s, "    }\n");
        offset_expr(&N, w, off, sizeof off);
        if (is_mean)
            sb_printf(s, "    w%d[%s] = acc / (%s)%lld;\n", w, off, T, (long long)count);
        else
            sb_printf(s, "    w%d[%s] = acc;\n", w, off);
        sb_printf(s, "    }\n}\n\n");
        return;
    }
    int64_t out_n = jdt_shape_numel(&root->shape);
    sb_printf(s, "    for (int64_t o = 0; o < %lldLL; o++) w%d[o] = %s;\n", (long long)out_n, w,
              init);
    int64_t last = N.dims[N.n - 1];
    bool col_tiles = !N.kept[0] && N.n > 1 && N.kept[N.n - 1] && nt > 1 && last >= 32 &&
                     jdt_shape_numel(&g->domain) >= PAR_MIN_ELEMS;
    if (col_tiles) {
        /* a leading reduced dim (bias gradients): threads own column tiles of the innermost
         * kept dim, so every thread accumulates into its own outputs and reads stay
         * contiguous */
        int64_t tile = (last + 4 * nt - 1) / (4 * nt);
        tile = (tile + 15) / 16 * 16;
        sb_printf(s, "    #pragma omp parallel for num_threads(%d)\n", nt);
        sb_printf(s, "    for (int64_t cb = 0; cb < %lldLL; cb += %lldLL)\n", (long long)last,
                  (long long)tile);
        emit_loops(s, &N, 0, N.n - 1);
        sb_printf(s,
                  "    for (int64_t i%d = cb; i%d < (cb + %lldLL < %lldLL ? cb + %lldLL : %lldLL); "
                  "i%d++)\n",
                  N.n - 1, N.n - 1, (long long)tile, (long long)last, (long long)tile,
                  (long long)last, N.n - 1);
    } else {
        if (N.kept[0]) emit_parallel(s, &N, 1, nt);
        emit_loops(s, &N, 0, N.n);
    }
    sb_printf(s, "    {\n");
    emit_loads(s, &N);
    for (int i = 0; i < g->n_members; i++)
        if (g->members[i] != g->root) emit_value_full(s, &N, g->members[i]);
    offset_expr(&N, w, off, sizeof off);
    if (is_max)
        sb_printf(s, "        if (%s > w%d[%s]) w%d[%s] = %s;\n", src, w, off, w, off, src);
    else
        sb_printf(s, "        w%d[%s] += %s;\n", w, off, src);
    sb_printf(s, "    }\n");
    if (is_mean)
        sb_printf(s, "    for (int64_t o = 0; o < %lldLL; o++) w%d[o] /= (%s)%lld;\n",
                  (long long)out_n, w, T, (long long)count);
    sb_printf(s, "}\n\n");
    return;
too_many:
    *st = jdt_err_set(e, JDT_ERR_UNSUPPORTED, "compile: group of node %d reads too many buffers",
                      g->root);
}

static const char PRELUDE[] =
    "/* generated by jdt-train's CPU backend: one function per fused group */\n"
    "#include <stdint.h>\n#include <tgmath.h>\n\n"
    "typedef void (*jdt_kernel_fn)(void *const *);\n"
    "__attribute__((unused)) static inline uint32_t jdt_philox_w0(uint64_t key, uint64_t hi, "
    "uint64_t lo)\n{\n"
    "    uint32_t c0 = (uint32_t)lo, c1 = (uint32_t)(lo >> 32), c2 = (uint32_t)hi, c3 = "
    "(uint32_t)(hi >> 32);\n"
    "    uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);\n"
    "    for (int r = 0; r < 10; r++) {\n"
    "        uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;\n"
    "        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;\n"
    "        c1 = (uint32_t)p1; c3 = (uint32_t)p0; c0 = n0; c2 = n2;\n"
    "        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;\n"
    "    }\n"
    "    return c0;\n}\n"
    "__attribute__((unused)) static inline float jdt_unit(uint32_t x) { return (float)(x >> 8) * "
    "(1.0f / 16777216.0f); }\n"
    /* exp and tanh for f32 written so the loop vectoriser can inline them (glibc's are scalar
     * calls without -ffast-math). exp: Cody-Waite range reduction and the Cephes polynomial,
     * max relative error 8e-8 measured; NaN and +-Inf are handled explicitly. */
    "__attribute__((unused)) static inline float jdt_expf(float x)\n{\n"
    "    float xc = x > 88.8f ? 88.8f : x < -104.0f ? -104.0f : x;\n"
    "    float n = floorf(xc * 1.44269504088896341f + 0.5f);\n"
    "    float r = xc - n * 0.693359375f + n * 2.12194440e-4f;\n"
    "    float p = 1.9875691500e-4f;\n"
    "    p = p * r + 1.3981999507e-3f; p = p * r + 8.3334519073e-3f; p = p * r + "
    "4.1665795894e-2f;\n"
    "    p = p * r + 1.6666665459e-1f; p = p * r + 5.0000001201e-1f;\n"
    "    float y = p * r * r + r + 1.0f;\n"
    "    int32_t ni = (int32_t)n, n1 = ni >> 1, n2 = ni - n1;\n" /* two factors: no overflow */
    "    union { uint32_t u; float f; } b1, b2;\n"
    "    b1.u = (uint32_t)(n1 + 127) << 23; b2.u = (uint32_t)(n2 + 127) << 23;\n"
    "    y = y * b1.f * b2.f;\n"
    "    y = x > 88.7228394f ? (float)INFINITY : x < -103.9720840f ? 0.0f : y;\n"
    "    return x != x ? x : y;\n}\n"
    /* tanh: a [13/6] rational minimax approximation on [-7.905, 7.905] (the form Eigen uses
     * for float tanh): one division, no exp; max relative error 3.8e-7 measured */
    "__attribute__((unused)) static inline float jdt_tanhf(float x)\n{\n"
    "    const float c = 7.90531110763549805f;\n"
    "    float xc = x > c ? c : x < -c ? -c : x, x2 = xc * xc;\n"
    "    float p = -2.76076847742355e-16f;\n"
    "    p = p * x2 + 2.00018790482477e-13f; p = p * x2 - 8.60467152213735e-11f;\n"
    "    p = p * x2 + 5.12229709037114e-08f; p = p * x2 + 1.48572235717979e-05f;\n"
    "    p = p * x2 + 6.37261928875436e-04f; p = p * x2 + 4.89352455891786e-03f;\n"
    "    float q = 1.19825839466702e-06f;\n"
    "    q = q * x2 + 1.18534705686654e-04f; q = q * x2 + 2.26843463243900e-03f;\n"
    "    q = q * x2 + 4.89352518554385e-03f;\n"
    "    float r = p * xc / q;\n"
    "    r = fabsf(x) < 0.0004f ? x : r;\n"
    "    r = x > 9.0f ? 1.0f : x < -9.0f ? -1.0f : r;\n" /* exactly +-1 like tanhf: inf*0 stays NaN
                                                          */
    "    return x != x ? x : r;\n}\n\n";

jdt_status jdt_compile_codegen(const cprog *c, char **src, jdt_err *e)
{
    sbuf s = {0};
    jdt_status st = JDT_OK;
    *src = NULL;
    sb_printf(&s, "%s", PRELUDE);
    int n_k = 0;
    for (int i = 0; i < c->n_steps && st == JDT_OK; i++) {
        if (c->steps[i].kind != STEP_KERNEL) continue;
        emit_group(&s, c, c->steps[i].group, c->steps[i].kernel, c->nt, e, &st);
        n_k++;
    }
    sb_printf(&s, "const jdt_kernel_fn jdt_kernels[%d] = {", n_k ? n_k : 1);
    for (int k = 0; k < n_k; k++)
        sb_printf(&s, "%sk%d", k ? ", " : "", k);
    if (!n_k) sb_printf(&s, "0");
    sb_printf(&s, "};\nconst int jdt_n_kernels = %d;\n", n_k);
    if (st == JDT_OK && s.bad_node)
        st = jdt_err_set(e, JDT_ERR_UNSUPPORTED, "codegen: node %d: op '%s' (%d) has no C emitter",
                         s.bad_node - 1, jdt_op_name(c->nodes[s.bad_node - 1].op),
                         (int)c->nodes[s.bad_node - 1].op);
    if (st == JDT_OK && s.oom) st = jdt_err_set(e, JDT_ERR_NOMEM, "codegen: source buffer");
    if (st != JDT_OK) {
        jdt_free(s.buf);
        return st;
    }
    *src = s.buf;
    return JDT_OK;
}
